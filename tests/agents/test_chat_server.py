"""`/v1/chat/completions` and `/v1/models` on the rollout server (cohort/rollout/server/app.py), over loopback HTTP with
plain urllib: a scripted engine behind the real request stream (fast), then `cohort serve`'s wiring with vLLM and
tiny:tool_calc (slow)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from cohort.agents.chat import ChatCompletions
from cohort.data.tasks import tool_calc_rows
from cohort.models.pretrained import load_tokenizer, resolve_model_dir, stop_token_ids
from cohort.rollout.base import BatchRequests, Trajectory
from cohort.rollout.server.app import RolloutService, serve_in_thread

TOKEN = "chat-token"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>'
CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.",
                                               "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                              "required": ["expression"]}}}


class CallingEngine(BatchRequests):
    """Answers every request with the same calculator call; `gate` (when set) holds each batch until it is opened."""

    def __init__(self, tok):
        self.policy_version = 4
        self.stop_token_ids = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
        self.turn = list(tok(CALL, add_special_tokens=False)["input_ids"]) + [self.stop_token_ids[0]]
        self.gate: threading.Event | None = None

    def _sample(self, requests):
        if self.gate is not None:
            self.gate.wait(10)
        return [Trajectory(self.turn, [-0.5] * len(self.turn), "stop", self.policy_version) for _ in requests]

    def close(self):
        pass


@pytest.fixture
def served(tiny_chat_model_dir):
    tok = load_tokenizer(tiny_chat_model_dir)
    engine = CallingEngine(tok)
    chat = lambda sample: ChatCompletions(tok, engine.stop_token_ids, sample, model_name="tiny:chat", max_model_len=128)
    service = RolloutService(engine, TOKEN, model="/models/tiny-chat", max_model_len=128, vocab_size=len(tok), chat=chat)
    server, url = serve_in_thread(service)
    yield engine, url, service
    server.shutdown()
    server.server_close()
    service.close()


def _call(url: str, body: dict | None = None, token: str | None = TOKEN, method: str = "POST") -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_tools_request_gets_an_openai_tool_call(served):
    engine, url, _ = served
    status, body = _call(f"{url}/v1/chat/completions", {"model": "tiny:chat", "messages": [{"role": "user", "content": "12*34="}],
                                                        "n": 2, "seed": 1})
    assert status == 200 and body["object"] == "chat.completion" and body["model"] == "tiny:chat"
    assert [c["finish_reason"] for c in body["choices"]] == ["tool_calls", "tool_calls"]
    call = body["choices"][1]["message"]["tool_calls"][0]
    assert call["function"] == {"name": "calculator", "arguments": '{"expression": "12*34"}'} and call["type"] == "function"
    assert body["usage"]["completion_tokens"] == 2 * len(engine.turn)


def test_models_and_errors_in_openais_shape(served, tiny_chat_model_dir):
    _, url, _ = served
    assert _call(f"{url}/v1/models", method="GET") == (200, {"object": "list", "data": [
        {"id": "tiny:chat", "object": "model", "created": 0, "owned_by": "cohort", "max_model_len": 128}]})
    status, body = _call(f"{url}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": -1})
    assert status == 400 and body == {"error": {"message": "temperature: must be a number in [0, 2], got -1",
                                                "type": "invalid_request_error", "param": "temperature", "code": None}}
    status, body = _call(f"{url}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, token="wrong")
    assert status == 401 and body["error"]["type"] == "authentication_error"
    assert _call(f"{url}/v1/models", method="GET", token=None)[0] == 401
    status, body = _call(f"{url}/v1/nope", {})
    assert status == 404 and body["error"]["type"] == "not_found_error"
    assert _call(f"{url}/poll", {"timeout_s": 0}, )[1]["in_flight"] == 0  # the old endpoints keep their shape


def test_a_chat_call_never_reaches_the_trainers_poll(served):
    """A trainer's request finished and not yet polled stays the trainer's while a chat call runs; while the chat's
    request is generating (the engine held at its gate), the trainer's /poll sees nothing in flight and returns at
    once; the chat call gets its own trajectory."""
    engine, url, service = served
    prompt = {"request_id": "trainer/0", "prompt_ids": [5, 6], "sampling": {"max_tokens": 30}}
    assert _call(f"{url}/submit", {"requests": [prompt]})[0] == 200
    deadline = time.monotonic() + 10  # (the trainer's request finished before the gate closes: else it waits there too)
    while "trainer/0" not in service.stream.outbox and time.monotonic() < deadline:
        time.sleep(0.01)
    engine.gate = threading.Event()
    result: dict = {}
    chat = threading.Thread(target=lambda: result.update(reply=_call(f"{url}/v1/chat/completions",
                                                                       {"messages": [{"role": "user", "content": "1*2="}]})))
    chat.start()
    deadline = time.monotonic() + 10
    while not service.stream.claimed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(service.stream.claimed) == 1
    status, polled = _call(f"{url}/poll", {"timeout_s": 5})
    assert [c["request_id"] for c in polled["completions"]] == ["trainer/0"] and polled["in_flight"] == 0
    start = time.monotonic()
    status, polled = _call(f"{url}/poll", {"timeout_s": 5})
    assert polled == {"completions": [], "in_flight": 0, "policy_version": 4} and time.monotonic() - start < 2.5
    engine.gate.set()
    chat.join(30)
    assert result["reply"][0] == 200 and result["reply"][1]["choices"][0]["finish_reason"] == "tool_calls"
    assert not service.stream.claimed and not service.stream.pending


def test_a_server_without_the_endpoint_says_so(tiny_chat_model_dir):
    engine = CallingEngine(load_tokenizer(tiny_chat_model_dir))
    service = RolloutService(engine, TOKEN, model="m")
    server, url = serve_in_thread(service)
    try:
        status, body = _call(f"{url}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert status == 404 and "no OpenAI-compatible endpoint" in body["error"]["message"]
    finally:
        server.shutdown()
        server.server_close()
        service.close()


# --------------------------------------------------------------------------- cohort serve's wiring, with vLLM


@pytest.fixture(scope="module")
def tool_calc_server():
    """`cohort serve tiny:tool_calc --no-tools-in-prompt`'s service (cmd_serve's construction) on a loopback thread."""
    pytest.importorskip("vllm")
    from cohort.rollout.engines.vllm import VLLMEngine

    model_dir = resolve_model_dir("tiny:tool_calc")
    tok = load_tokenizer(model_dir)
    engine = VLLMEngine(model_dir, dtype="float32", max_model_len=128, seed=0)
    chat = lambda sample: ChatCompletions(tok, engine.stop_token_ids, sample, parser="hermes", model_name="tiny:tool_calc",
                                          max_model_len=128, render_tools=False)
    service = RolloutService(engine, TOKEN, model=str(model_dir), max_model_len=128, vocab_size=len(tok), chat=chat)
    server, url = serve_in_thread(service)
    yield url, tok, model_dir
    server.shutdown()
    server.server_close()
    service.close()
    engine.close()


@pytest.mark.vllm
@pytest.mark.builtin_models('tool_calc')
def test_cohort_serve_answers_a_tools_request_with_a_parsed_tool_call(tool_calc_server):
    """tiny:tool_calc opens a calculator call greedily on most held-out style prompts ("123*45=" and 13 of the first 21
    held-out ones where it was built first; which ones varies with the machine that built it, as its float sums do) and,
    given the tool's answer, copies it. The test asks "123*45=" and then the held-out prompts in order, and checks the
    first that calls. It was trained without the template's tools block, which would not fit its 128 positions anyway
    (~400 tokens with this BPE), so the server renders no tools (`--no-tools-in-prompt`) and the request's tools list
    only travels along, as an OpenAI client sends it."""
    url, tok, model_dir = tool_calc_server
    assert set(stop_token_ids(model_dir, tok)) == {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    asked = ["123*45="] + [row["prompt"][0]["content"] for row in tool_calc_rows(0)[1][:21]]
    for question in asked:
        user = [{"role": "user", "content": question}]
        status, body = _call(f"{url}/v1/chat/completions", {"model": "tiny:tool_calc", "messages": user, "tools": [CALCULATOR],
                                                            "temperature": 0, "max_tokens": 40, "logprobs": True})
        assert status == 200, body
        (choice,) = body["choices"]
        if choice["finish_reason"] == "tool_calls":
            break
        assert choice["finish_reason"] in ("stop", "length") and choice["message"]["content"] is not None, choice
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None, f"no greedy call on {asked}"
    (call,) = choice["message"]["tool_calls"]
    a, b = (int(x) for x in question.rstrip("=").split("*"))
    assert call["function"]["name"] == "calculator" and json.loads(call["function"]["arguments"]) == {"expression": f"{a}*{b}"}
    content = choice["logprobs"]["content"]  # one entry per sampled token but the stop token
    assert len(content) == body["usage"]["completion_tokens"] - 1 and all(c["logprob"] <= 0 for c in content)
    tool = {"role": "tool", "tool_call_id": call["id"], "content": str(a * b)}  # e.g. 123 * 45 = 5535
    status, body = _call(f"{url}/v1/chat/completions", {"messages": user + [choice["message"], tool], "tools": [CALCULATOR],
                                                        "temperature": 0, "max_tokens": 40})
    assert status == 200 and body["choices"][0]["message"] == {"role": "assistant", "content": str(a * b)}
    assert body["choices"][0]["finish_reason"] == "stop"


# --------------------------------------------------------------------------- cohort serve --chat-template, as a process

# A template of the kind a user names (a Jinja file): ChatML turns after a system line that only this template writes,
# holding its keyword argument `house` (default "none") so that --chat-template-kwargs shows in the rendered prompt.
HOUSE_TEMPLATE = ("<|im_start|>system\nHouse rules: {{ house | default('none') }}.<|im_end|>\n"
                  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _serve(model_dir, *args, env=None):
    import os
    import subprocess
    import sys

    env = dict(os.environ if env is None else env, COHORT_SERVER_TOKEN=TOKEN)
    return subprocess.Popen([sys.executable, "-m", "cohort.cli", "serve", str(model_dir), "--port", "0", "--max-model-len",
                             "256", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_cohort_serve_refuses_a_chat_template_that_is_not_there_before_the_engine_loads(tiny_chat_model_dir, tmp_path):
    server = _serve(tiny_chat_model_dir, "--chat-template", str(tmp_path / "missing.jinja"))
    out, err = server.communicate(timeout=120)
    assert server.returncode == 2, out + err
    assert f"model.chat_template = '{tmp_path / 'missing.jinja'}': no such file here" in err
    assert "listening on" not in out  # refused before vLLM started


@pytest.mark.vllm
def test_cohort_serve_renders_chat_requests_with_the_named_template_and_its_kwargs(tiny_chat_model_dir, tmp_path):
    """The child `cohort serve` (what engine.mode=local_server starts with model.chat_template) renders
    /v1/chat/completions with --chat-template and --chat-template-kwargs: its usage.prompt_tokens is the length of this
    process's rendering with the same file and kwargs (the system line reads "House rules: no hats."), which differs
    from the checkpoint's own template's (no such line)."""
    template = tmp_path / "house.jinja"
    template.write_text(HOUSE_TEMPLATE)
    server = _serve(tiny_chat_model_dir, "--chat-template", str(template), "--chat-template-kwargs", '{"house": "no hats"}')
    try:
        url = None
        for line in server.stdout:
            if "listening on " in line:
                url = line.rsplit("listening on ", 1)[1].strip()
                break
        assert url, server.stderr.read()
        messages = [{"role": "user", "content": "hello there"}]
        status, body = _call(f"{url}/v1/chat/completions", {"messages": messages, "max_tokens": 4, "temperature": 0})
        assert status == 200, body
        ours = load_tokenizer(tiny_chat_model_dir, str(template), {"house": "no hats"})
        text = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text.startswith("<|im_start|>system\nHouse rules: no hats.<|im_end|>\n<|im_start|>user\nhello there")
        expected = len(ours(text, add_special_tokens=False)["input_ids"])
        own = load_tokenizer(tiny_chat_model_dir).apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert "House rules" not in own and len(ours(own, add_special_tokens=False)["input_ids"]) != expected
        assert body["usage"]["prompt_tokens"] == expected
    finally:
        server.terminate()
        server.wait(60)
