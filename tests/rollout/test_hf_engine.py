"""The transformers engine's log-probs, read off generation (no second forward), equal the trainer's."""

from __future__ import annotations

import pytest
import torch

from cohort.models.pretrained import load_policy
from cohort.models.logprobs import completion_logprobs
from cohort.rollout.base import SamplingConfig
from cohort.rollout.engines.hf import HFEngine
from cohort.models.batching import pack_right_padded

EOS = 256


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return load_policy(tiny_model_dir, "float32")


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_engine_logprobs_equal_trainer_logprobs(policy, temperature):
    engine = HFEngine(policy, pad_token_id=EOS, stop_token_ids=[EOS])
    prompts = [[49, 50, 43, 51, 61], [55, 45, 51, 61], [57, 61]] * 3  # ragged prompts: left padding in generate
    outs = engine.generate(prompts, SamplingConfig(max_tokens=10, temperature=temperature), seeds=[3] * len(prompts))
    completions = [o.token_ids for o in outs]
    assert all(len(o.logprobs) == len(o.token_ids) > 0 for o in outs)
    b = pack_right_padded(prompts, completions, EOS)
    with torch.no_grad():
        trainer, _ = completion_logprobs(policy, b.input_ids, b.attention_mask, b.prompt_lengths, b.completion_ids,
                                         b.completion_mask, temperature=temperature or 1.0)
    for i, o in enumerate(outs):
        assert torch.allclose(torch.tensor(o.logprobs), trainer[i, : len(o.token_ids)], atol=1e-5), i


def test_top_k_zero_samples_the_whole_vocabulary(tiny_model_dir):
    # Zero output weights → all logits 0 → uniform over 259 tokens. 300 first tokens from one prompt then hit
    # ~259·(1 − e^(−300/259)) ≈ 177 distinct ids; a hidden top-k of 50 (transformers' default when top_k is None)
    # would allow at most 50.
    model = load_policy(tiny_model_dir, "float32")
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()
    engine = HFEngine(model, pad_token_id=EOS, stop_token_ids=[EOS])
    outs = engine.generate([[49, 50, 61]] * 300, SamplingConfig(max_tokens=1, temperature=1.0, top_k=0), seeds=[0] * 300)
    assert len({o.token_ids[0] for o in outs}) > 100


def test_engines_on_the_trainers_module_refuse_in_flight_weight_updates(policy, tiny_model_dir):
    from cohort.distributed.fsdp import LocalContext
    from cohort.distributed.rank0 import DetachedHFEngine, MainOnlyEngine

    engine = HFEngine(policy, pad_token_id=EOS, stop_token_ids=[EOS])
    assert engine.in_flight_updates is False
    with pytest.raises(RuntimeError, match=r"HFEngine cannot update weights with requests in flight .*engine.name=vllm"):
        engine.update_weights(policy.named_parameters(), 1, in_flight=True)
    assert engine.policy_version == 0
    engine.update_weights(policy.named_parameters(), 1)  # the synchronous sync still works
    assert engine.policy_version == 1

    detached = DetachedHFEngine(load_policy(tiny_model_dir, "float32"), pad_token_id=EOS, stop_token_ids=[EOS])
    assert detached.in_flight_updates is False
    with pytest.raises(RuntimeError, match=r"DetachedHFEngine cannot update weights with requests in flight"):
        detached.update_weights(policy.named_parameters(), 1, in_flight=True)
    assert detached.policy_version == 0

    main_only = MainOnlyEngine(engine, LocalContext())  # multi-process training's wrapper samples batch-wise
    assert main_only.in_flight_updates is False
    with pytest.raises(RuntimeError, match=r"MainOnlyEngine \(multi-process training\) cannot update weights with requests in flight"):
        main_only.update_weights(policy.named_parameters(), 2, in_flight=True)
    assert (main_only.policy_version, engine.policy_version) == (0, 1)


def test_a_transformers_without_the_continuous_batching_api_falls_back_to_generate(policy, monkeypatch):
    """A config with neither `page_size` (5.19) nor `block_size` (5.17; the adapter passes that) nor `return_logprobs`
    stands in for a transformers the adapter cannot drive: the engine warns once, naming what is missing, and samples
    with plain generate, the trainer's log-probs read off it as ever. (5.17 itself streams: test_hf_requests.py in the
    lane.)"""
    import dataclasses

    from cohort.rollout.engines import hf_continuous

    @dataclasses.dataclass
    class ConfigOfNone:
        num_blocks: int | None = None
        max_batch_tokens: int | None = None
        max_requests_per_batch: int | None = None
        allow_block_sharing: bool = True
        use_async_batching: bool | None = None
        seed: int | None = None

    monkeypatch.setattr(hf_continuous, "ContinuousBatchingConfig", ConfigOfNone)
    assert hf_continuous.missing_api() == ("ContinuousBatchingConfig.return_logprobs, "
                                           "ContinuousBatchingConfig.page_size (or block_size)")
    engine = HFEngine(policy, pad_token_id=EOS, stop_token_ids=[EOS])
    with pytest.warns(UserWarning, match=r"continuous batching lacks ContinuousBatchingConfig.return_logprobs.*plain generate"):
        (out,) = engine.generate([[49, 50, 43, 51, 61]], SamplingConfig(max_tokens=6, temperature=0.7), seeds=[3])
    assert engine.continuous is None and len(out.logprobs) == len(out.token_ids) > 0
