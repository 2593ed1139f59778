"""The realistic tiny chat checkpoint: loads unchanged through AutoTokenizer and vLLM, and chat prompts train on it."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from tokenizers import Tokenizer

from cohort.config.resolve import load_config
from cohort.models.pretrained import chat_end_of_turn_id, load_policy, load_tokenizer, stop_token_ids
from cohort.models.logprobs import sequence_logprobs
from cohort.rollout.base import SamplingConfig
from cohort.rollout.engines.hf import HFEngine
from cohort.trainer.trainer import Trainer
from cohort.trainer.run import run_training

TEXTS = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n47+8=<|im_end|>\n<|im_start|>assistant\n",
    "héllo wörld 12345 don't\n\n  x\t<|endoftext|>",  # non-ASCII, digits, a contraction, blank lines, a special token
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "47+8"}}\n</tool_call><|im_end|>',
]


@pytest.fixture(scope="module")
def chat_tok(tiny_chat_model_dir):
    return load_tokenizer(tiny_chat_model_dir)


def test_loads_through_autotokenizer_encoding_exactly_as_built(tiny_chat_model_dir, chat_tok):
    built = Tokenizer.from_file(str(tiny_chat_model_dir / "tokenizer.json"))
    # transformers 5 swaps in Qwen2Tokenizer for model_type qwen2 and rebuilds the pipeline: it must change nothing
    assert type(chat_tok).__name__ == "Qwen2Tokenizer"
    for text in TEXTS:
        ids = chat_tok(text, add_special_tokens=False)["input_ids"]
        assert ids == built.encode(text, add_special_tokens=False).ids
        assert chat_tok.decode(ids) == text
    # special tokens after the BPE vocabulary, pad distinct from EOS, merges really learnt
    vocab = len(chat_tok)
    assert [chat_tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [vocab - 3, vocab - 2, vocab - 1]
    assert chat_tok.pad_token == "<|endoftext|>" and chat_tok.eos_token == "<|im_end|>" and chat_tok.pad_token_id != chat_tok.eos_token_id
    assert len(chat_tok("assistant", add_special_tokens=False)["input_ids"]) == 1  # a merged word, not 9 bytes


def test_stop_ids_are_end_of_turn_and_end_of_text(tiny_chat_model_dir, chat_tok):
    generation = json.loads((tiny_chat_model_dir / "generation_config.json").read_text())
    pad, im_end = chat_tok.pad_token_id, chat_tok.convert_tokens_to_ids("<|im_end|>")
    assert generation["eos_token_id"] == [im_end, pad]  # as Qwen2.5-Instruct: end-of-turn, end-of-text
    assert chat_end_of_turn_id(chat_tok) == im_end
    assert stop_token_ids(tiny_chat_model_dir, chat_tok) == sorted([pad, im_end])


def test_chat_template_renders_qwen_style_turns_and_tool_calls(chat_tok):
    assert chat_tok.apply_chat_template([{"role": "user", "content": "47+8="}], tokenize=False, add_generation_prompt=True) == TEXTS[0]
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "47+8"}}}
    conversation = [{"role": "system", "content": "S"}, {"role": "user", "content": "47+8="},
                    {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "55"}]
    assert chat_tok.apply_chat_template(conversation, tokenize=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n47+8=<|im_end|>\n<|im_start|>assistant\n" + TEXTS[2]
        + "\n<|im_start|>user\n<tool_response>\n55\n</tool_response><|im_end|>\n")


REWARDS = textwrap.dedent('''
    SEEN = []

    def short_answer(prompts, completions, **kwargs):
        SEEN.extend(c[0]["content"] for c in completions)
        return [1.0 / (1 + len(c[0]["content"])) for c in completions]
''')


def _train_chat(tmp_path, model_dir, engine: str, monkeypatch):
    """2 GRPO steps on chat prompts; returns (the first generation batch, the trainer's stop set, metrics lines)."""
    (tmp_path / "chat_rewards_tiny.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"{a}+{a % 10}="}]}) + "\n" for a in range(16)))
    cfg = load_config(None, [f"model.path={model_dir}", f"data.train_files=[{data}]", f"engine.name={engine}",
                             "rollout.num_generations=4", "rollout.max_completion_length=16", "data.max_prompt_length=64",
                             "train.prompts_per_step=4", "train.micro_batch_size=16", "train.max_steps=2",
                             "rewards=[{name: 'chat_rewards_tiny:short_answer'}]", f"run.output_dir={tmp_path / 'run'}",
                             "run.progress=false", "run.loggers=[jsonl]"])
    trainer = Trainer(cfg)
    try:
        stops = stop_token_ids(trainer.parts.model_dir, trainer.parts.tokenizer)
        assert trainer.parts.engine.stop_token_ids == stops
        batch = trainer.generate_batch()
        run_training(trainer)
    finally:
        trainer.close()
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return batch, stops, lines


@pytest.mark.slow  # (each engine trains)
@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_chat_prompts_train_through_each_engine(tmp_path, tiny_chat_model_dir, engine, monkeypatch):
    if engine == "vllm":
        pytest.importorskip("vllm")
    batch, stops, lines = _train_chat(tmp_path, tiny_chat_model_dir, engine, monkeypatch)
    import chat_rewards_tiny

    for ids, truncated, text in zip(batch.completion_ids, batch.truncated, batch.completions_text):
        assert not set(ids[:-1]) & set(stops)  # nothing sampled past a stop id (the pad id is one of them)
        assert truncated == (ids[-1] not in stops) and (not truncated or len(ids) == 16)
        assert "<|im_end|>" not in text and "<|endoftext|>" not in text
    assert batch.metrics["completions/clipped_ratio"] == sum(batch.truncated) / len(batch)
    assert len(lines) == 2 and all(torch.isfinite(torch.tensor(l["loss"])) for l in lines)
    assert all("<|im_end|>" not in t for t in chat_rewards_tiny.SEEN)


@pytest.mark.vllm
def test_vllm_serves_the_chat_checkpoint_as_transformers_does(tiny_chat_model_dir, chat_tok):
    pytest.importorskip("vllm")
    from cohort.rollout.engines.vllm import VLLMEngine

    policy = load_policy(tiny_chat_model_dir, "float32")
    hf = HFEngine(policy, pad_token_id=chat_tok.pad_token_id, stop_token_ids=stop_token_ids(tiny_chat_model_dir, chat_tok))
    engine = VLLMEngine(tiny_chat_model_dir, dtype="float32", max_model_len=128, seed=0)
    try:
        assert engine.llm.get_tokenizer()(TEXTS[0], add_special_tokens=False)["input_ids"] == chat_tok(TEXTS[0], add_special_tokens=False)["input_ids"]
        prompt = chat_tok(TEXTS[0], add_special_tokens=False)["input_ids"]
        greedy = SamplingConfig(max_tokens=16, temperature=0.0)
        assert engine.generate([prompt], greedy)[0].token_ids == hf.generate([prompt], greedy)[0].token_ids
        for o in engine.generate([prompt] * 8, SamplingConfig(max_tokens=16, temperature=1.0), list(range(8))):
            assert torch.allclose(torch.tensor(o.logprobs), sequence_logprobs(policy, prompt, o.token_ids), atol=1e-4)
    finally:
        engine.close()
