"""The tools block in a tools run's prompts (TRL's `apply_chat_template(..., tools=)`), the refusal of a template without
one, `model.chat_template` (a file, or one inside the checkpoint) with `model.chat_template_kwargs`, and the tool loop
through TRL 1.16's original Qwen3 template with thinking off (a template that rewrites an earlier turn once a tool
message follows it: docs/tools.md, "Chat templates")."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from cohort.config import ConfigError, load_config
from cohort.plan.run_environment import RunEnvironment, run_data
from cohort.models.pretrained import load_policy, load_run_tokenizer, load_tokenizer, resolve_model_dir, stop_token_ids
from cohort.plan.validate import validate_config
from cohort.prompts import encode_prompts
from cohort.rollout.base import Request, SamplingConfig, Trajectory
from cohort.rollout.engines.hf import HFEngine
from cohort.tools.loop import ToolEngine
from cohort.tools.tool_schemas import resolve_tools

ENVS = Path(__file__).resolve().parent / "envs"
TRL = importlib.util.find_spec("trl")
QWEN3 = Path(TRL.submodule_search_locations[0]) / "chat_templates" / "qwen3.jinja" if TRL else None
needs_trl = pytest.mark.skipif(QWEN3 is None, reason="TRL 1.16 (the dev extra) ships chat_templates/qwen3.jinja")
NO_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # Qwen3's generation prompt with enable_thinking false


@pytest.fixture
def envs_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVS))


def _data(tmp_path) -> str:
    rows = [{"prompt": [{"role": "user", "content": "Echo the word apple."}], "word": "apple"}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(tmp_path / "train.jsonl")


def _long_copy(model_dir, tmp_path) -> Path:
    """A copy of the random tiny chat checkpoint with 4096 positions (a tools block is ~1000 of its tokens)."""
    copy = tmp_path / "checkpoint"
    shutil.copytree(model_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(dict(config, max_position_embeddings=4096)))
    return copy


def _prompt_text(cfg, model_dir) -> str:
    tokenizer = load_run_tokenizer(model_dir, cfg.model)
    environment = RunEnvironment(cfg)
    train, evals, _ = run_data(cfg, environment)
    encoded = encode_prompts(cfg, tokenizer, model_dir, train, evals, environment.tools)
    return tokenizer.decode(encoded.train_ids[0])


def test_a_tools_runs_prompt_shows_each_tools_name_description_and_arguments(tiny_chat_model_dir, tmp_path, envs_on_path):
    tiny_chat_model_dir = _long_copy(tiny_chat_model_dir, tmp_path)
    cfg = load_config(None, [f"model.path={tiny_chat_model_dir}", f"data.train_files=[{_data(tmp_path)}]",
                             "tools.functions=[cohort.tools.builtin.calculator]", "tools.environment=trl_shape.EchoEnv"])
    text = _prompt_text(cfg, tiny_chat_model_dir)
    # the schemas transformers builds from the signatures and docstrings, each as the template's `tool | tojson` writes it
    calculator = {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression such as 123*45 or (7+3)/4.",
        "parameters": {"type": "object", "properties": {"expression": {
            "type": "string", "description": "numbers with + - * / // % ** and parentheses"}}, "required": ["expression"]}}}
    echo = {"name": "echo", "description": "Echo the message back.", "parameters": {"type": "object", "properties": {
        "message": {"type": "string", "description": "The message to echo"}}, "required": ["message"]}}
    assert json.dumps(calculator["function"]["parameters"]) in text
    assert '"name": "calculator"' in text and calculator["function"]["description"] in text
    assert json.dumps(echo["parameters"]) in text and '"name": "echo"' in text and echo["description"] in text
    assert text.index("<tools>") < text.index('"name": "calculator"') < text.rindex("</tools>") < text.index("Echo the word")
    # tools.in_prompt false: the same prompt without the block (a checkpoint trained without it)
    cfg.tools.in_prompt = False
    assert "<tools>" not in _prompt_text(cfg, tiny_chat_model_dir)


def test_a_template_without_a_tools_block_is_refused_before_anything_loads_with_the_fix(tiny_chat_model_dir, tmp_path):
    # a ChatML template that ignores `tools`, as SmolLM2-135M-Instruct's does (the slow test below refuses SmolLM2's
    # own); the run is refused at its checks, naming model.chat_template and tools.in_prompt
    chatml = tmp_path / "chatml.jinja"
    chatml.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    model_dir = _long_copy(tiny_chat_model_dir, tmp_path)
    cfg = load_config(None, [f"model.path={model_dir}", f"model.chat_template={chatml}", f"data.train_files=[{_data(tmp_path)}]",
                             "tools.functions=[cohort.tools.builtin.calculator]", f"run.output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError) as refused:
        validate_config(cfg)
    (problem,) = refused.value.problems
    assert problem.startswith(f"tools.in_prompt: model.chat_template = {str(chatml)!r} has no tools block")
    assert "name a template that renders tools as model.chat_template" in problem and "tools.in_prompt: false" in problem
    cfg.model.chat_template = None  # the checkpoint's own (Qwen2.5-style) template has one
    validate_config(cfg)


@pytest.mark.slow
def test_smollm2s_own_template_is_refused_with_the_fix(smollm2_dir, tmp_path):
    cfg = load_config(None, [f"model.path={smollm2_dir}", f"data.train_files=[{_data(tmp_path)}]",
                             "tools.functions=[cohort.tools.builtin.calculator]", f"run.output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match="has no tools block .* name a template that renders tools as model.chat_template"):
        validate_config(cfg)


@needs_trl
def test_chat_template_from_a_path_or_the_checkpoint_with_its_kwargs_changes_every_rendering(tiny_chat_model_dir, tmp_path):
    checkpoint = _long_copy(tiny_chat_model_dir, tmp_path)
    user = [{"role": "user", "content": "Hi"}]
    own = load_tokenizer(checkpoint).apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    assert own.startswith("<|im_start|>system\n")  # the tiny template's default system turn; Qwen3's has none
    (checkpoint / "additional_chat_templates").mkdir()  # where transformers keeps a checkpoint's named templates
    shutil.copy(QWEN3, checkpoint / "additional_chat_templates" / "qwen3.jinja")
    for spec in (str(QWEN3), "additional_chat_templates/qwen3.jinja"):
        cfg = load_config(None, [f"model.path={checkpoint}", f"model.chat_template={spec}",
                                 "model.chat_template_kwargs={enable_thinking: false}", f"data.train_files=[{_data(tmp_path)}]"])
        tokenizer = load_run_tokenizer(checkpoint, cfg.model)
        text = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        assert text == "<|im_start|>user\nHi<|im_end|>\n" + NO_THINK
        # a keyword a caller passes still wins over the default
        thinking = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True, enable_thinking=True)
        assert thinking == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        assert _prompt_text(cfg, checkpoint) == "<|im_start|>user\nEcho the word apple.<|im_end|>\n" + NO_THINK
    # without the kwargs Qwen3 thinks: no empty think block after the header
    plain = load_tokenizer(checkpoint, str(QWEN3)).apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    assert plain.endswith("<|im_start|>assistant\n")
    # the saved checkpoint keeps the template and its kwargs (save_pretrained writes chat_template.jinja)
    saved = tmp_path / "saved"
    tokenizer.save_pretrained(str(saved))
    assert load_tokenizer(saved).apply_chat_template(user, tokenize=False, add_generation_prompt=True) == text
    with pytest.raises(ValueError, match=r"model.chat_template = 'nope.jinja': no such file here nor inside the checkpoint .*"
                                         r"additional_chat_templates/qwen3.jinja"):
        load_tokenizer(checkpoint, "nope.jinja")


@needs_trl
@pytest.mark.builtin_models("tool_calc")
def test_the_tool_loop_trains_qwen3s_template_with_thinking_off_token_for_token(envs_on_path):
    """tiny:tool_calc samples every turn through TRL's qwen3.jinja with enable_thinking false; trl_shape.parse reads each
    turn as a call to `echo` (this model writes no clean call after Qwen3's empty think block), so every turn is a
    call, its result appended as the template renders it, and the next turn sampled after it."""
    import trl_shape

    model_dir = resolve_model_dir("tiny:tool_calc")
    tokenizer = load_tokenizer(model_dir, str(QWEN3), {"enable_thinking": False})
    stops = stop_token_ids(model_dir, tokenizer)
    policy = load_policy(model_dir, "float32").eval()
    schemas = None  # tools.in_prompt false: tiny:tool_calc was trained without a tools block (and its 128 positions)
    engine = ToolEngine(HFEngine(policy, pad_token_id=tokenizer.pad_token_id, stop_token_ids=stops), tokenizer,
                        parser=trl_shape.parse, tools=resolve_tools([]), environment=trl_shape.EchoEnv, max_turns=3,
                        schemas=schemas, rows=lambda request: {"word": "apple"})
    question = [{"role": "user", "content": "984*19="}]
    prompt = tokenizer(tokenizer.apply_chat_template(question, tools=schemas, tokenize=False, add_generation_prompt=True),
                       add_special_tokens=False)["input_ids"]
    requests = [Request(f"r{k}", tuple(prompt), SamplingConfig(200, 1.0, 1.0), k) for k in range(8)]
    engine.submit(requests)
    done = []
    while len(done) < len(requests):
        done += engine.poll(1.0)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    head = tokenizer.apply_chat_template(question, tools=schemas, tokenize=False, add_generation_prompt=False)
    calls = 0
    for t in done:
        episode = t.episode
        kinds = [kind for _, _, kind in episode.segments]
        assert kinds == ["assistant", "tool"] * (len(kinds) // 2) + ["assistant"] * (len(kinds) % 2)
        assert episode.turns == len(kinds) - len(kinds) // 2 and sum(episode.calls.values()) == len(kinds) // 2
        calls += len(kinds) // 2
        # token by token: every assistant token has mask 1, every tool token mask 0, and they tile the completion
        assert episode.segments[0][0] == 0 and episode.segments[-1][1] == len(t.token_ids)
        for (start, end, kind), (next_start, _, _) in zip(episode.segments, episode.segments[1:] + [(len(t.token_ids), 0, "")]):
            assert end == next_start and t.loss_mask[start:end] == [1 if kind == "assistant" else 0] * (end - start)
        # the conversation as the model saw it: each turn rendered while it was the last one (after its empty think
        # block; the template's re-rendering of the whole conversation drops the earlier ones), each turn that called
        # ending with the <|im_end|> it sampled, each result as qwen3.jinja writes a tool message (a user turn of
        # <tool_response>), then the next header with its empty think block
        turns = [tokenizer.decode(t.token_ids[start:end]) for start, end, kind in episode.segments if kind == "assistant"]
        results = [m["content"] for m in episode.conversation if m["role"] == "tool"]
        assert all(t.token_ids[end - 1] == im_end for (_, end, kind), nxt in zip(episode.segments, kinds[1:]) if nxt == "tool")
        expected = head + NO_THINK + "".join(
            f"{turn}\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n{NO_THINK}"
            for turn, result in zip(turns, results)) + (turns[-1] if len(turns) > len(results) else "")
        assert tokenizer.decode(list(prompt) + t.token_ids) == expected
        # the results are echo's answers to the calls trl_shape.parse read from those turns (their first 8 characters)
        texts = [m["content"] for m in episode.conversation if m["role"] == "assistant"]
        assert results == [text.strip()[:8] or "x" for text in texts[:len(results)]]
    assert calls >= 4  # 8 trajectories of up to 3 turns, every turn that ends with <|im_end|> a call (measured: 16 of the 16 possible)
    # the template's own rendering of a whole conversation differs: the first turn loses its think block
    whole = tokenizer.apply_chat_template(question + [{"role": "assistant", "content": "a"}, {"role": "tool", "content": "x"}],
                                          tools=schemas, tokenize=False)
    assert "<|im_start|>assistant\na<|im_end|>" in whole and "<think>" not in whole


def test_the_agent_endpoint_refuses_tools_it_cannot_show_and_renders_them_otherwise(tiny_chat_model_dir, tmp_path):
    # a verifiers MCP tool or an OpenAI client's `tools=` reaches the endpoint as a request's tools: under a template
    # without a tools block (SmolLM2's plain ChatML) the call is refused with the fix instead of rendered without them
    from cohort.agents.chat import ChatCompletions, ChatRequestError

    chatml = tmp_path / "chatml.jinja"
    chatml.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    schema = {"type": "function", "function": {"name": "calculator", "description": "Evaluate an expression.",
                                               "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}
    body = {"model": "m", "messages": [{"role": "user", "content": "12*34="}], "tools": [schema], "max_tokens": 4}
    sampled = []

    def sample(requests):
        sampled.extend(requests)
        return [Trajectory([5, 6], [-0.1, -0.2], "stop", 0, prompt_ids=list(r.prompt_ids), request_id=r.request_id)
                for r in requests]

    plain = load_tokenizer(tiny_chat_model_dir, str(chatml))
    with pytest.raises(ChatRequestError, match="tools: the model's chat template has no tools block.*model.chat_template"):
        ChatCompletions(plain, [5], sample, max_model_len=4096).create(body)
    assert sampled == []  # nothing was sampled
    ChatCompletions(plain, [5], sample, max_model_len=4096, render_tools=False).create(body)  # left out knowingly
    own = load_tokenizer(tiny_chat_model_dir)  # the checkpoint's Qwen2.5-style template: rendered into the prompt
    ChatCompletions(own, [5], sample, max_model_len=4096).create(body)
    assert '"description": "Evaluate an expression."' in own.decode(list(sampled[-1].prompt_ids))
