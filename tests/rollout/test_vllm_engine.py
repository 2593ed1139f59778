"""The vLLM engine samples from the trainer's policy, before and after in-place weight updates."""

from __future__ import annotations

import logging

import pytest
import torch

from cohort.models.pretrained import load_policy, load_tokenizer
from cohort.models.logprobs import sequence_logprobs
from cohort.rollout.base import SamplingConfig
from cohort.rollout.engines.vllm import RELOAD_LOGGER, expected_reload_warnings_dropped

pytestmark = pytest.mark.vllm


def test_generation_logprobs_match_trainer_and_survive_weight_updates(vllm_engine, tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    policy = load_policy(tiny_model_dir, "float32")
    vllm_engine.update_weights(policy.named_parameters(), 0)  # other tests may have changed the shared engine
    prompt = tok("12+34=", add_special_tokens=False)["input_ids"]
    outs = vllm_engine.generate([prompt] * 4, SamplingConfig(8, 0.7), [11, 12, 13, 14])
    assert len(outs) == 4 and all(len(o.token_ids) == len(o.logprobs) > 0 for o in outs)
    # processed log-probs: temperature applied, as the trainer computes them
    for o in outs:
        assert torch.allclose(torch.tensor(o.logprobs), sequence_logprobs(policy, prompt, o.token_ids, temperature=0.7), atol=1e-4)
    canary = outs[0].token_ids
    generator = torch.Generator().manual_seed(0)
    for version in (1, 2, 3):
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * 0.05)
        stale = torch.tensor(vllm_engine.score([prompt], [canary])[0])
        fresh = sequence_logprobs(policy, prompt, canary)
        assert (stale - fresh).abs().max() > 1e-2  # the perturbation is visible ...
        vllm_engine.update_weights(policy.named_parameters(), version)
        # ... and after the in-place update the engine (tied LM head included) agrees to 1e-4 in float32
        assert torch.allclose(torch.tensor(vllm_engine.score([prompt], [canary])[0]), fresh, atol=1e-4)
        assert vllm_engine.policy_version == version
    regenerated = vllm_engine.generate([prompt], SamplingConfig(8, 1.0), [5])[0]
    assert torch.allclose(torch.tensor(regenerated.logprobs), sequence_logprobs(policy, prompt, regenerated.token_ids), atol=1e-4)


def test_seeded_generation_is_reproducible(vllm_engine, tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    prompt = tok("7-3=", add_special_tokens=False)["input_ids"]
    first = vllm_engine.generate([prompt] * 3, SamplingConfig(6, 1.0), [1, 2, 3])
    again = vllm_engine.generate([prompt] * 3, SamplingConfig(6, 1.0), [1, 2, 3])
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert len({tuple(o.token_ids) for o in first}) > 1  # different seeds, different samples


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_expected_reload_warnings_are_dropped_and_others_kept(vllm_engine, tiny_model_dir):
    records = _Records()
    reload_logger = logging.getLogger(RELOAD_LOGGER)
    reload_logger.addHandler(records)
    policy = load_policy(tiny_model_dir, "float32")
    try:
        # a bare reload (what update_weights wraps) warns for the two layers that receive no tensor ...
        tensors = [(n, t.detach()) for n, t in policy.named_parameters()]
        vllm_engine.llm.collective_rpc(lambda w: w.model_runner.reload_weights(weights_iterator=iter(tensors)))
        assert sorted(records.messages) == ["ParallelLMHead: Failed to load weights", "RotaryEmbedding: Failed to load weights"]
        records.messages.clear()
        vllm_engine.update_weights(policy.named_parameters(), 0)  # ... update_weights (tied head) drops both
        assert records.messages == []
    finally:
        reload_logger.removeHandler(records)
        vllm_engine.update_weights(policy.named_parameters(), 0)  # re-tie the head after the bare reload
    # an untied head that failed to load is a real problem: its warning passes
    with expected_reload_warnings_dropped(tied_head=False):
        kept = [logging.LogRecord(RELOAD_LOGGER, logging.WARNING, "layerwise.py", 1, "%s: Failed to load weights", (layer,), None)
                for layer in ("ParallelLMHead", "RotaryEmbedding", "QKVParallelLinear")]
        assert [reload_logger.filter(r) for r in kept] == [True, False, True]


def test_an_engine_survives_another_engine_of_the_process_being_closed(vllm_engine, tiny_model_dir):
    # vLLM keeps its parallel groups in process globals and an engine's shutdown destroys them for the whole process:
    # before VLLMEngine._ensure_parallel_state, the surviving engine failed with "pipeline model parallel group is not
    # initialized" (a notebook that builds a second trainer, or this suite's own engines).
    from cohort.rollout.engines.vllm import VLLMEngine

    vllm_engine.update_weights(load_policy(tiny_model_dir, "float32").named_parameters(), 0)
    before = vllm_engine.generate([[1, 2, 3]], SamplingConfig(4), [7])[0].token_ids
    other = VLLMEngine(tiny_model_dir, dtype="float32", max_model_len=64, seed=0)
    other.close()
    assert vllm_engine.generate([[1, 2, 3]], SamplingConfig(4), [7])[0].token_ids == before  # same seed, same tokens
    assert len(vllm_engine.score([[1, 2, 3]], [before])[0]) == len(before)
