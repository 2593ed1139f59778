"""A tool turn round-trips through the real vLLM engine: the tool loop appends the template's tool tokens, vLLM
continues from the token ids, and the engine's own scoring of the whole completion agrees with the log-probs the
trajectory recorded on every sampled token (so vLLM conditioned on exactly prompt + earlier turns + tool tokens).

The model is `quick_stop_chat_model` (tests/tools/conftest.py: the random tiny chat checkpoint whose turns end after a
few tokens); the parser (a user parser given by import path) reads every turn as a call to `count`, so each trajectory
runs max_turns = 3 assistant turns with 2 tool turns between them.
"""

from __future__ import annotations

import pytest

from cohort.models.pretrained import load_tokenizer, stop_token_ids
from cohort.rollout.base import Request, SamplingConfig, generate_requests
from cohort.tools.loop import ToolEngine
from cohort.tools.parsers import ParsedTurn, ToolCall, get_parser
from cohort.tools.tool_schemas import resolve_tools


def count() -> int:
    """Count the things.
    """
    return 7


def every_turn_calls_count(text: str) -> ParsedTurn:
    return ParsedTurn(calls=[ToolCall("count", {})])


@pytest.mark.vllm
def test_tool_turns_round_trip_through_vllm(quick_stop_chat_model):
    pytest.importorskip("vllm")
    from cohort.rollout.engines.vllm import VLLMEngine

    tok = load_tokenizer(quick_stop_chat_model)
    inner = VLLMEngine(quick_stop_chat_model, dtype="float32", max_model_len=256, seed=0)
    try:
        assert len(inner.stop_token_ids) > 100 and set(inner.stop_token_ids) == set(stop_token_ids(quick_stop_chat_model, tok))
        engine = ToolEngine(inner, tok, parser=get_parser(f"{__name__}.every_turn_calls_count"), tools=resolve_tools([count]),
                            max_turns=3)
        prompt = tok(tok.apply_chat_template([{"role": "user", "content": "12*34="}], tokenize=False,
                                             add_generation_prompt=True), add_special_tokens=False)["input_ids"]
        requests = [Request(f"t/{i}", tuple(prompt), SamplingConfig(120), seed=100 + i) for i in range(4)]
        outs = generate_requests(engine, requests)
        tool_ids = engine.renderer.tool_ids([("count", {})], [("count", "7")])
        # "\n" after <|im_end|>, the tool turn, the next assistant header
        assert tok.decode(tool_ids) == "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        scored = inner.score([prompt] * len(outs), [t.token_ids for t in outs], 1.0)
        for t, engine_logp in zip(outs, scored):
            episode = t.episode
            assert episode.turns == 3 and episode.status == "truncated" and dict(episode.calls) == {"count": 2}
            tools = [(a, b) for a, b, role in episode.segments if role == "tool"]
            assert len(tools) == 2
            for a, b in tools:
                assert t.token_ids[a:b] == tool_ids and t.loss_mask[a:b] == [0] * len(tool_ids)
                assert t.logprobs[a:b] == [0.0] * len(tool_ids)
            sampled = [i for i, m in enumerate(t.loss_mask) if m]
            assert len(sampled) + 2 * len(tool_ids) == len(t.token_ids) == len(t.logprobs)
            for i in sampled:  # vLLM's log-prob when sampling == its log-prob scoring the whole completion
                assert abs(t.logprobs[i] - engine_logp[i]) < 1e-4, (t.request_id, i)
    finally:
        inner.close()
