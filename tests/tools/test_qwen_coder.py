"""The real model that calls tools, Qwen2.5-Coder-0.5B-Instruct (`make qwen2.5-coder-0.5b`), through the tool loop and
vLLM: what it writes is read as a call, counted by its form, run, and what it does after the tool's answer is what
the rewards see. Needs the fetched model (`make test` fetches it before the tests; tests/conftest.py converts it
outside any test's timeout)."""

from __future__ import annotations

import json

import pytest

from cohort.models.gguf import gguf_parameters
from cohort.models.pretrained import checkpoint_parameters, load_tokenizer, stop_token_ids
from cohort.rewards.numeric import numeric_match
from cohort.rollout.base import Request, SamplingConfig, decode_completion, generate_requests
from cohort.rollout.collect import as_completion
from cohort.tools.builtin import calculator
from cohort.tools.loop import ToolEngine
from cohort.tools.parsers import call_forms, get_parser, parse_hermes
from cohort.tools.tool_schemas import resolve_tools

QWEN = "gguf:qwen2.5-coder-0.5b-instruct"


def test_the_fetched_model_is_the_pinned_qwen2(qwen_coder_dir):
    # 630,167,424 parameters as stored (the LM head untied: 151,936 x 896 = 136,134,656 more than upstream's tied 494M),
    # the same count from the GGUF header (model.dtype=auto before the conversion) and the converted safetensors
    assert gguf_parameters(QWEN) == checkpoint_parameters(qwen_coder_dir) == 630_167_424
    config = json.loads((qwen_coder_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["num_hidden_layers"] == 24
    assert config["hidden_size"] == 896 and config["tie_word_embeddings"] is False
    tok = load_tokenizer(qwen_coder_dir)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end in stop_token_ids(qwen_coder_dir, tok)
    rendered = tok.apply_chat_template([{"role": "user", "content": "12*34="}], tools=[t.schema for t in resolve_tools([calculator])],
                                       tokenize=False, add_generation_prompt=True)
    assert "<tools>" in rendered and '"name": "calculator"' in rendered and "<tool_call>" in rendered  # the tools block


@pytest.mark.vllm
def test_its_calls_are_read_counted_by_form_and_run_and_its_answer_is_what_the_rewards_see(qwen_coder_dir):
    pytest.importorskip("vllm")
    from cohort.rollout.engines.vllm import VLLMEngine

    tok = load_tokenizer(qwen_coder_dir)
    tools = resolve_tools([calculator])
    schemas = [t.schema for t in tools]
    problems = [(897, 37), (64, 48), (494, 82)]
    messages = [[{"role": "user", "content": f"{a}*{b}="}] for a, b in problems]
    prompts = [tok(tok.apply_chat_template(m, tools=schemas, tokenize=False, add_generation_prompt=True),
                   add_special_tokens=False)["input_ids"] for m in messages]
    inner = VLLMEngine(qwen_coder_dir, dtype="float32", max_model_len=512, seed=0)
    try:
        engine = ToolEngine(inner, tok, parser=get_parser("json"), tools=tools, max_turns=2, schemas=schemas)
        outs = generate_requests(engine, [Request(f"q/{i}", tuple(p), SamplingConfig(128, temperature=0.0))
                                          for i, p in enumerate(prompts)])
    finally:
        inner.close()
    for (a, b), t, prompt in zip(problems, outs, messages):
        episode = t.episode
        first = tok.decode(t.token_ids[episode.segments[0][0]:episode.segments[0][1]], skip_special_tokens=True)
        # its first turn is the calculator call, the template's object without the <tool_call> tags: hermes reads no
        # call in it, json reads one, and the loop counted it by its form (fenced or bare), never as tagged
        assert parse_hermes(first).calls == [] and sum(call_forms(first).values()) == 1 and "tagged" not in call_forms(first)
        assert episode.conversation[0]["tool_calls"][0]["function"]["name"] == "calculator"
        assert episode.call_forms["tagged"] == 0 and episode.ignored_calls == 0
        # the call ran with the right product (whatever spacing the expression has), and its result came back
        assert episode.calls == {"calculator": 1} and episode.conversation[1] == {"role": "tool", "name": "calculator",
                                                                                  "content": str(a * b)}
        # the round trip, untrained: after the <tool_response> it calls again instead of answering (the second call not
        # run: max_turns 2), so the trajectory has no answer; the decoded text holds the product, the rewards do not
        text = decode_completion(tok, t)
        assert str(a * b) in text and episode.status == "truncated" and episode.conversation[-1]["role"] == "assistant"
        assert numeric_match()(completions=[as_completion(prompt, text, episode)], answer=[str(a * b)]) == [0.0]
