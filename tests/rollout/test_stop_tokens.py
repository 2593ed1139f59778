"""Every engine stops at the checkpoint's whole stop set (`stop_token_ids`), and the trainer's view agrees.

The checkpoint: a tiny random Llama with the char tokenizer (EOS 256, chat end-of-turn
`<|im_end|>` 258) whose generation_config.json says `eos_token_id: [256, 75]`, as
instruct checkpoints list end-of-turn and end-of-text. Its weights are edited so that
id 75 ("K", a plain token) is sampled often (`favour_token`), so a completion that
runs past a stop id would show up: before the shared set, the transformers engine
stopped only at the tokenizer's EOS and ran past 75, while vLLM stopped there.
"""

from __future__ import annotations

import json

import pytest
import torch

from cohort.models.char_tokenizer import EOS_TOKEN_ID, save_char_tokenizer
from cohort.models.pretrained import ModelLoadError, chat_end_of_turn_id, load_policy, load_tokenizer, stop_token_ids
from cohort.models.logprobs import sequence_logprobs
from cohort.rollout.base import SamplingConfig, Trajectory, decode_completion, finish_reason
from cohort.rollout.engines.hf import HFEngine, until_stop

SECOND_STOP = 75  # "K"
IM_END = 258
STOPS = [SECOND_STOP, EOS_TOKEN_ID, IM_END]
PROMPTS = [[49, 50, 43, 51, 61], [55, 45, 51, 61], [57, 61], [52, 42, 50, 61]]


def favour_token(model: torch.nn.Module, token_id: int, *, constant: float = 30.0, gain: float = 4.0) -> None:
    """Make `token_id` likely at every position (p ≈ 0.15-0.3 here), keeping the rest of the distribution context-dependent.

    Hidden dimension 0 becomes a constant channel: every embedding has `constant` there and no layer writes to it
    (row 0 of each o_proj and down_proj is zeroed), so after the final RMSNorm it is constant / rms(x) > 0. Only the
    output row of `token_id` reads it (column 0 of the head is zeroed elsewhere), with weight `gain`; the other rows are
    untouched. Measured on this model: p(75) per step 0.15-0.29 (mean 0.21), so 12 sampled tokens reach 75 ~94% of the time.
    """
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = constant
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0
            layer.mlp.down_proj.weight[0] = 0
        head = model.get_output_embeddings().weight
        head[:, 0] = 0
        head[token_id] = 0
        head[token_id, 0] = gain


@pytest.fixture(scope="module")
def two_stop_dir(random_arch_builder):
    path = random_arch_builder("llama", generation_eos=[EOS_TOKEN_ID, SECOND_STOP])
    model = load_policy(path, "float32")
    favour_token(model, SECOND_STOP)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def _check_stops(outs, max_tokens: int) -> int:
    """Each completion holds a stop id only as its last token; finish_reason says so; returns how many ended at 75."""
    for o in outs:
        assert not set(o.token_ids[:-1]) & set(STOPS), o.token_ids  # never sampled on past a stop id
        ends_in_stop = bool(o.token_ids) and o.token_ids[-1] in STOPS
        assert o.status == ("stop" if ends_in_stop else "length"), o
        assert ends_in_stop or len(o.token_ids) == max_tokens  # no stop id: only the length limit ends it
        assert len(o.logprobs) == len(o.token_ids)
    return sum(o.token_ids[-1] == SECOND_STOP for o in outs)


# ---------------------------------------------------------------- the set


def _tokenizer_dir(tmp_path, config: dict, generation: dict | None):
    save_char_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_stop_set_is_generation_eos_list_plus_tokenizer_eos_plus_chat_end_of_turn(tmp_path):
    path = _tokenizer_dir(tmp_path, {"eos_token_id": 256}, {"eos_token_id": [256, 75]})
    tok = load_tokenizer(path)
    # generation_config {256, 75} ∪ tokenizer EOS {256} ∪ end-of-turn: the template writes "<|im_end|>" (258) after a reply
    assert chat_end_of_turn_id(tok) == IM_END
    assert stop_token_ids(path, tok) == [75, 256, 258]
    tok.chat_template = None  # no template: no end-of-turn token
    assert stop_token_ids(path, tok) == [75, 256]


def test_end_of_turn_is_whatever_special_token_the_template_writes_after_a_reply(tmp_path):
    tok = load_tokenizer(_tokenizer_dir(tmp_path, {"eos_token_id": 256}, None))
    # a Llama-2-style template that closes a reply with " " + EOS: the token after the space, 256
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %} {{ eos_token }}{% endif %}{% endfor %}"
    assert chat_end_of_turn_id(tok) == 256
    tok.chat_template = "{% for m in messages %}{{ m['content'] + '<|im_start|>' }}{% endfor %}"  # any special token
    assert chat_end_of_turn_id(tok) == 257
    tok.chat_template = "{% for m in messages %}{{ m['content'] + '\\n' }}{% endfor %}"  # plain text after a reply: none
    assert chat_end_of_turn_id(tok) is None
    tok.chat_template = "{{ raise_exception('user turns only') }}"  # a template that refuses the probe: none
    assert chat_end_of_turn_id(tok) is None


def test_stop_set_falls_back_to_config_json_and_accepts_an_int(tmp_path):
    path = _tokenizer_dir(tmp_path, {"eos_token_id": [256, 80]}, None)  # no generation_config.json: config.json's list
    tok = load_tokenizer(path)
    assert stop_token_ids(path, tok) == [80, 256, 258]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 90}))  # it wins over config.json, int form
    assert stop_token_ids(path, tok) == [90, 256, 258]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": ["</s>"]}))
    with pytest.raises(ModelLoadError, match=r"generation_config.json: eos_token_id = \['</s>'\]; give a token id"):
        stop_token_ids(path, tok)


def test_until_stop_finish_reason_and_reward_text():
    assert until_stop([5, 75, 256, 256], STOPS) == [5, 75]  # pads after the stop are dropped
    assert until_stop([5, 6], STOPS) == [5, 6]
    assert finish_reason([5, 75], STOPS) == "stop" and finish_reason([5, 6], STOPS) == "length"
    assert finish_reason([], STOPS) == "length"
    tok = build_tokenizer_for_text()
    # "12K" where K (75) is the stop: rewards see "12"; a truncated "12K..." keeps its text; special tokens are skipped
    assert decode_completion(tok, Trajectory([49, 50, 75], [0.0] * 3, "stop")) == "12"
    assert decode_completion(tok, Trajectory([49, 50, 75], [0.0] * 3, "length")) == "12K"
    assert decode_completion(tok, Trajectory([49, IM_END, 50, 256], [0.0] * 4, "stop")) == "12"


def build_tokenizer_for_text():
    from transformers import PreTrainedTokenizerFast

    from cohort.models.char_tokenizer import EOS_TOKEN, build_char_tokenizer

    return PreTrainedTokenizerFast(tokenizer_object=build_char_tokenizer(), eos_token=EOS_TOKEN,
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])


# ---------------------------------------------------------------- the engines


def test_transformers_engine_stops_at_every_stop_id(two_stop_dir):
    tok = load_tokenizer(two_stop_dir)
    stops = stop_token_ids(two_stop_dir, tok)
    assert stops == STOPS
    policy = load_policy(two_stop_dir, "float32")
    engine = HFEngine(policy, pad_token_id=tok.pad_token_id, stop_token_ids=stops)
    prompts = PROMPTS * 8  # 32 completions
    outs = engine.generate(prompts, SamplingConfig(max_tokens=12, temperature=1.0), seeds=[7] * len(prompts))
    # p(75) ≈ 0.21 per step (favour_token): ~94% of 12-token completions reach it; 16 of 32 is far below that
    assert _check_stops(outs, 12) >= 16
    for p, o in zip(prompts, outs):  # log-probs, stop token included, as the trainer scores them
        assert torch.allclose(torch.tensor(o.logprobs), sequence_logprobs(policy, p, o.token_ids), atol=1e-5)


@pytest.mark.vllm
def test_vllm_stops_at_the_same_set_and_matches_transformers_greedy(two_stop_dir):
    pytest.importorskip("vllm")
    from cohort.rollout.engines.vllm import VLLMEngine

    tok = load_tokenizer(two_stop_dir)
    policy = load_policy(two_stop_dir, "float32")
    hf = HFEngine(policy, pad_token_id=tok.pad_token_id, stop_token_ids=stop_token_ids(two_stop_dir, tok))
    engine = VLLMEngine(two_stop_dir, dtype="float32", max_model_len=64, seed=0)
    try:
        assert engine.stop_token_ids == hf.stop_token_ids == STOPS
        prompts = PROMPTS * 8
        outs = engine.generate(prompts, SamplingConfig(max_tokens=12, temperature=1.0), seeds=list(range(len(prompts))))
        assert _check_stops(outs, 12) >= 16
        for p, o in zip(prompts, outs):
            assert torch.allclose(torch.tensor(o.logprobs), sequence_logprobs(policy, p, o.token_ids), atol=1e-4)
        # greedy: both engines pick the same tokens and stop at the same one
        greedy = SamplingConfig(max_tokens=12, temperature=0.0)
        assert [o.token_ids for o in engine.generate(PROMPTS, greedy)] == [o.token_ids for o in hf.generate(PROMPTS, greedy)]
    finally:
        engine.close()
