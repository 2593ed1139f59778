"""The fast path: token-budget micro-batches, and no wasted forward passes.

- Token-budget micro-batches are checked by hand, and the update's gradient with
  them equals the gradient with one big micro-batch (token_mean aggregation:
  the loss is a sum over tokens divided by the step's token count, so any
  split of the rows gives the same gradient).
- Pass counting: with beta = 0 and on-policy no extra scoring pass runs at
  all; with beta > 0 and a generation batch serving 2 optimizer steps, the
  reference and old log-probs are computed exactly once per generation batch;
  the update runs exactly one policy forward per micro-batch.
"""

from __future__ import annotations

import dataclasses

import math
from collections import defaultdict

import pytest
import torch

from cohort.config.resolve import load_config
from cohort.models.batching import length_sorted_micro_batches
from cohort.trainer.trainer import Trainer
from tests.builders import write_doubling


def test_token_budget_micro_batches_by_hand():
    lengths = [10, 3, 8, 2, 9, 3]
    # sorted longest first: 0 (10), 4 (9), 2 (8), 1 (3), 5 (3), 3 (2)
    # budget 20 cells: [0, 4] is 2 × 10 = 20; adding 2 would be 3 × 10 = 30 > 20 → new batch [2] (8):
    # [2, 1] = 2 × 8 = 16, [2, 1, 5] = 24 > 20 → new batch [5] (3): [5, 3] = 6.
    assert length_sorted_micro_batches(lengths, 8, max_tokens=20) == [[0, 4], [2, 1], [5, 3]]
    # the row cap still applies under a large budget
    assert length_sorted_micro_batches(lengths, 4, max_tokens=1000) == [[0, 4, 2, 1], [5, 3]]
    # a sequence longer than the budget travels alone
    assert length_sorted_micro_batches([50, 4, 4], 8, max_tokens=10) == [[0], [1, 2]]
    # no budget: the old behaviour
    assert length_sorted_micro_batches(lengths, 4) == [[0, 4, 2, 1], [5, 3]]


@pytest.fixture
def data_file(tmp_path, monkeypatch):
    # A reward with spread on a random model (the share of digits), so advantages and gradients are not all zero.
    (tmp_path / "fast_path_rewards.py").write_text(
        "def digit_share(completions, **kwargs):\n"
        "    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "train.jsonl"
    write_doubling(path, 16)
    return path


def _trainer(tmp_path, data_file, model_dir, *extra):
    cfg = load_config(None, [
        f"model.path={model_dir}", f"data.train_files=[{data_file}]", "data.max_prompt_length=16", "engine.name=hf",
        "rollout.num_generations=4", "rollout.max_completion_length=12", "train.prompts_per_step=4", "train.micro_batch_size=16",
        "train.max_steps=4", "train.learning_rate=1e-3", "train.max_grad_norm=0", "algorithm.loss_type=dapo",
        "rewards=[{name: 'fast_path_rewards:digit_share'}]", f"run.output_dir={tmp_path / 'run'}", "run.progress=false", "run.loggers=[jsonl]",
        *extra,
    ])
    return Trainer(cfg, log=lambda *a, **k: None)


def _gradients_of_update(trainer, batch, indices):
    """The raw gradients one update leaves behind (no clipping: max_grad_norm = 0; the optimizer step is skipped)."""
    trainer.parts.optimizer.step = lambda *a, **k: None
    trainer.update(batch, indices)
    return {n: p.grad.clone() for n, p in trainer.parts.policy.named_parameters() if p.grad is not None}


@pytest.mark.slow
def test_token_budget_update_equals_one_micro_batch(tmp_path, data_file, tiny_model_dir):
    trainer = _trainer(tmp_path, data_file, tiny_model_dir)
    batch = trainer.generate_batch()
    indices = list(range(len(batch)))
    assert len(set(len(c) for c in batch.completion_ids)) > 1  # ragged lengths, so the split matters
    assert float(batch.advantages.abs().sum()) > 0
    whole = _gradients_of_update(trainer, batch, indices)
    trainer.cfg.train.max_tokens_per_microbatch = 40
    micro = trainer.micro_batches(batch, indices)
    assert len(micro) > 2
    assert all(len(mb) * max(len(batch.prompt_ids[i]) + len(batch.completion_ids[i]) for i in mb) <= 40 or len(mb) == 1
               for mb in micro)
    split = _gradients_of_update(trainer, batch, indices)
    assert whole.keys() == split.keys()
    for name in whole:
        assert torch.allclose(whole[name], split[name], atol=1e-6, rtol=1e-4), name
    trainer.close()


class PassCounter:
    """Counts the no-grad scoring passes per model (`_score`: the old-policy, reference and teacher passes all go
    through it, one pass over the batch per model asked) and policy-body forwards inside `update`."""

    def __init__(self, trainer):
        self.score_calls = {"policy": 0, "reference": 0}
        self.update_forwards = 0
        self.micro_batches = 0
        self._in_update = False
        original_score, original_update, original_micro = trainer._score, trainer.update, trainer.micro_batches

        def score(batch, scorers):
            for model, _ in scorers.values():
                self.score_calls["policy" if model is trainer.parts.policy else "reference"] += 1
            return original_score(batch, scorers)

        def update(batch, indices):
            self._in_update = True
            try:
                return original_update(batch, indices)
            finally:
                self._in_update = False

        def micro_batches(batch, indices):
            out = original_micro(batch, indices)
            if self._in_update:
                self.micro_batches += len(out)
            return out

        def count_forward(module, args, kwargs):
            if self._in_update:
                self.update_forwards += 1

        trainer._score, trainer.update, trainer.micro_batches = score, update, micro_batches
        body = getattr(trainer.parts.policy, trainer.parts.policy.base_model_prefix)
        body.register_forward_pre_hook(count_forward, with_kwargs=True)


@pytest.mark.slow
def test_no_extra_passes_on_policy_without_kl(tmp_path, data_file, tiny_model_dir):
    trainer = _trainer(tmp_path, data_file, tiny_model_dir, "algorithm.beta=0", "train.max_tokens_per_microbatch=64")
    counter = PassCounter(trainer)
    for _ in range(3):
        trainer.step()
    assert trainer.parts.ref_model is None  # beta = 0: no reference model at all
    assert counter.score_calls == {"policy": 0, "reference": 0}  # on-policy: old log-probs = current, detached
    assert counter.micro_batches >= 3
    assert counter.update_forwards == counter.micro_batches  # one forward per micro-batch, nothing else
    trainer.close()


@pytest.mark.slow
def test_reference_and_old_logprobs_once_per_generation_batch(tmp_path, data_file, tiny_model_dir):
    # 2 optimizer steps per generation batch (off-policy on the second), beta > 0 with the KL in the loss:
    # 4 steps = 2 generation batches → exactly 2 reference passes and 2 old-log-prob passes.
    trainer = _trainer(tmp_path, data_file, tiny_model_dir, "algorithm.beta=0.05", "train.steps_per_generation=2",
                       "train.micro_batch_size=8")
    counter = PassCounter(trainer)
    for _ in range(4):
        trainer.step()
    assert trainer.scheduler.generation_index == 2
    assert counter.score_calls == {"policy": 2, "reference": 2}
    assert counter.update_forwards == counter.micro_batches == 4 * 2  # 16 completions per step / 8 per micro-batch
    trainer.close()


# --------------------------------------------------------------------------- the staleness bound 1 and rollout correction


def test_staleness_bound_1_is_checked(tmp_path, data_file, tiny_model_dir):
    from cohort.config import ConfigError
    from cohort.plan.validate import validate_config

    base = [f"model.path={tiny_model_dir}", f"data.train_files=[{data_file}]", "pipeline.max_staleness=1", "data.max_prompt_length=16",
            "rollout.max_completion_length=8",
            "rewards=[{name: 'fast_path_rewards:digit_share'}]"]
    # (the old name pipeline.max_staleness=1 is read as pipeline.max_staleness=1: tests/test_config_renames.py)
    with pytest.raises(ConfigError, match="pipeline.max_staleness with engine.name = hf"):
        validate_config(load_config(None, base + ["engine.name=hf"]))
    with pytest.raises(ConfigError, match="one optimizer step per generation batch"):
        validate_config(load_config(None, base + ["train.steps_per_generation=2"]))
    with pytest.raises(ConfigError, match="rollout_correction_cap"):
        validate_config(load_config(None, base + ["algorithm.rollout_correction_cap=0"]))
    validate_config(load_config(None, base))  # vllm, one step per generation batch: fine


@pytest.mark.slow
def test_rollout_correction_weights_by_hand(tmp_path, data_file, tiny_model_dir):
    # Engine log-probs below the trainer's by log 1.5 → weight 1.5; by log 3 → ratio 3, truncated at the cap 2;
    # above by log 2 → 0.5. Padding gets 0. mode=mask drops the capped token (0) instead.
    trainer = _trainer(tmp_path, data_file, tiny_model_dir, "algorithm.rollout_correction=truncate")
    batch = trainer.generate_batch()
    mb = [i for i in range(len(batch)) if len(batch.completion_ids[i]) >= 4][:2]
    width = max(len(batch.completion_ids[i]) for i in mb)
    logp = -torch.rand(2, width)  # the trainer's log-probs (any values)
    mask = torch.zeros(2, width)
    shifts = torch.zeros(width)
    shifts[:4] = torch.tensor([math.log(1.5), math.log(3.0), -math.log(2.0), 0.0])  # trainer − engine, per position
    for row, i in enumerate(mb):
        n = len(batch.completion_ids[i])
        mask[row, :n] = 1
        batch.engine_logp[i] = (logp[row, :n] - shifts[:n]).tolist()
    sums = defaultdict(float)
    mbi = dataclasses.replace(trainer.pack(batch, mb), mask=mask)  # (packed after the engine's log-probs are set)
    _, weights = trainer._off_policy(batch, mb, mbi, logp, logp, sums)  # prox = the trainer's log-probs
    expected = torch.ones(width)
    expected[:4] = torch.tensor([1.5, 2.0, 0.5, 1.0])
    assert torch.allclose(weights, expected[None, :] * mask, atol=1e-5)
    assert sums["correction/frac_capped"] > 0
    trainer.cfg.algorithm.rollout_correction = "mask"
    _, masked = trainer._off_policy(batch, mb, mbi, logp, logp, defaultdict(float))
    expected[1] = 0.0
    assert torch.allclose(masked, expected[None, :] * mask, atol=1e-5)
    trainer.cfg.algorithm.rollout_correction = "auto"  # hf shares the policy: never stale, so no weights
    assert trainer._off_policy(batch, mb, mbi, logp, logp, defaultdict(float))[1] is None
    trainer.close()


def _steps_with_versions(trainer, steps: int) -> tuple[list[dict], list[tuple[int, int]]]:
    """Run `steps` steps; also return, per update, (the policy version that sampled the batch, the current version)."""
    seen = []
    original_update = trainer.update

    def update(batch, indices):
        seen.append((batch.policy_version, trainer.state.policy_version))
        return original_update(batch, indices)

    trainer.update = update
    return [trainer.step() for _ in range(steps)], seen


def test_overlap_is_one_step_stale_corrected_and_learns(tmp_path, data_file, tiny_model_dir, vllm_engine):
    # Same workload as the end-to-end test (digit share; a working loop goes from ~0.1 to > 0.8 within 30 steps),
    # with the next batch generated behind each update.
    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"data.train_files=[{data_file}]", "data.max_prompt_length=16", "engine.name=vllm",
        "pipeline.max_staleness=1", "rollout.num_generations=4", "rollout.max_completion_length=6", "train.prompts_per_step=4",
        "train.micro_batch_size=16", "train.max_steps=30", "train.learning_rate=3e-3",
        "rewards=[{name: 'fast_path_rewards:digit_share'}]", f"run.output_dir={tmp_path / 'run'}", "run.progress=false",
        "run.loggers=[jsonl]",
    ])
    trainer = Trainer(cfg, engine=vllm_engine, log=lambda *a, **k: None)
    history, seen = _steps_with_versions(trainer, 30)
    trainer.close()
    assert seen[0] == (0, 0)  # the first batch is generated in the foreground, on-policy
    assert all(sampled == current - 1 for sampled, current in seen[1:])  # then always exactly one step stale
    assert "correction/kl" not in history[0] and all("correction/kl" in h for h in history[1:])
    assert all(h["correction/kl"] < 0.5 for h in history[1:])
    first, last = sum(h["reward"] for h in history[:5]) / 5, sum(h["reward"] for h in history[-5:]) / 5
    assert first < 0.3 and last > 0.8, (first, last)


@pytest.mark.slow
def test_local_server_overlap_runs_engine_and_trainer_on_separate_cores_and_learns(tmp_path, data_file, tiny_model_dir,
                                                                                    monkeypatch):
    # engine.mode=local_server: vLLM in a `cohort serve` child bound to the last core(s), the trainer on the rest, the next
    # batch generated there while this one trains. Same workload and bar as the in-process overlap test above.
    import os

    from cohort.rollout.server.app import split_cores

    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"data.train_files=[{data_file}]", "data.max_prompt_length=16", "engine.name=vllm",
        "engine.mode=local_server", "pipeline.max_staleness=1", "rollout.num_generations=4", "rollout.max_completion_length=6",
        "train.prompts_per_step=4", "train.micro_batch_size=16", "train.max_steps=30", "train.learning_rate=3e-3",
        "rewards=[{name: 'fast_path_rewards:digit_share'}]", f"run.output_dir={tmp_path / 'run'}", "run.progress=false",
        "run.loggers=[jsonl]",
    ])
    cores = sorted(os.sched_getaffinity(0))
    engine_cores, trainer_threads = split_cores(cores, None, True)
    # a spy, not a stand-in: once the session's in-process vLLM engine exists, vLLM has replaced torch.set_num_threads
    # in this process with a no-op, so the trainer's choice is read from its call
    asked = []
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    trainer = Trainer(cfg, log=lambda *a, **k: None)
    try:
        child = trainer.parts.engine.server.process
        env = dict(line.split("=", 1) for line in open(f"/proc/{child.pid}/environ").read().split("\0") if "=" in line)
        assert engine_cores == cores[-max(1, len(cores) // 2):]  # on this 2-core machine: core 1 generates, core 0 trains
        assert env["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(map(str, engine_cores))
        assert env["OMP_NUM_THREADS"] == str(len(engine_cores))
        assert asked == [trainer_threads] and trainer_threads == max(1, len(cores) - len(engine_cores))
        history, seen = _steps_with_versions(trainer, 30)
        assert seen[0] == (0, 0) and all(sampled == current - 1 for sampled, current in seen[1:])
        assert all(h["sync/bytes_sent"] > 0 for h in history[:-1])  # new weights went to the child after every step
        assert trainer.sync.last_canary_gap < 1e-4  # the child samples from exactly the trainer's weights
        # Unlike the in-process run above, this one is not reproducible: the child batches requests as they arrive, and
        # another batch shape changes the logits in the last bits, so runs part from the third batch on. So its bars are on
        # the whole run. Ten runs here (2026-12-03, load 5-30): one-step-stale KL per step 0.00-0.30 in seven, a spike
        # over 0.5 after a large update in two, means 0.04-0.07; rewards 0.05 at the start, last ten steps 0.65-0.96.
        # A child that kept old weights drifts further behind every step (KL growing, no learning): both bars fail.
        kls = [h["correction/kl"] for h in history[1:]]
        assert sum(kls) / len(kls) < 0.15 and sorted(kls)[len(kls) // 2] < 0.1, [round(k, 3) for k in kls]
        first, last = sum(h["reward"] for h in history[:5]) / 5, sum(h["reward"] for h in history[-10:]) / 10
        assert first < 0.3 and last > 0.6, (first, last)
    finally:
        trainer.close()
    assert child.poll() is not None  # the child stops with the run


def _state_after_update(trainer, batch, indices, *, skip: bool):
    """The policy's parameters after one update (its optimizer step included) from the same start, and the update's
    metrics; `skip=False` backpropagates every micro-batch as before the inert ones were skipped."""
    start = {n: p.detach().clone() for n, p in trainer.parts.policy.named_parameters()}
    optimizer_state = {k: v for k, v in trainer.parts.optimizer.state_dict().items()}
    original = trainer.inert_micro_batches
    if not skip:
        trainer.inert_micro_batches = lambda batch, micro, packed: [False] * len(micro)
    try:
        metrics = trainer.update(batch, indices)
    finally:
        trainer.inert_micro_batches = original
    after = {n: p.detach().clone() for n, p in trainer.parts.policy.named_parameters()}
    with torch.no_grad():  # back to the start for the other run
        for n, p in trainer.parts.policy.named_parameters():
            p.copy_(start[n])
    trainer.parts.optimizer.load_state_dict(optimizer_state)
    return after, metrics


@pytest.mark.slow
def test_micro_batches_of_zero_advantage_skip_their_backward_and_the_step_is_unchanged(tmp_path, data_file, tiny_model_dir):
    # 16 rows in 4 micro-batches of 4; the rows of micro-batches 0 and 2 get zero advantages (as constant groups do), so
    # their gradient is exactly 0: skipping their backward leaves the optimizer step bit for bit as it was, and the
    # update reports 2 inert micro-batches. With every group at zero, no backward runs at all and the step (AdamW with
    # zero gradients: weight decay only) is still the same as with four zero backward passes.
    trainer = _trainer(tmp_path, data_file, tiny_model_dir, "train.micro_batch_size=4", "train.weight_decay=0.1")
    batch = trainer.generate_batch()
    indices = list(range(len(batch)))
    micro = trainer.micro_batches(batch, indices)  # 4 micro-batches of 4 rows (sorted by length, not by group)
    assert [len(mb) for mb in micro] == [4, 4, 4, 4]
    for mb in (micro[0], micro[2]):
        batch.advantages[mb] = 0.0
    assert all(bool((batch.advantages[mb] != 0).any()) for mb in (micro[1], micro[3]))
    skipped, metrics = _state_after_update(trainer, batch, indices, skip=True)
    full, full_metrics = _state_after_update(trainer, batch, indices, skip=False)
    assert metrics["update/inert_micro_batches"] == 2.0 and full_metrics["update/inert_micro_batches"] == 0.0
    assert all(torch.equal(skipped[n], full[n]) for n in full)
    assert metrics["entropy"] == full_metrics["entropy"] and metrics["loss"] == full_metrics["loss"]
    batch.advantages.zero_()
    skipped, metrics = _state_after_update(trainer, batch, indices, skip=True)
    full, _ = _state_after_update(trainer, batch, indices, skip=False)
    assert metrics["update/inert_micro_batches"] == 4.0 and metrics["grad_norm"] == 0.0
    assert all(torch.equal(skipped[n], full[n]) for n in full)
    assert any(not torch.equal(full[n], p) for n, p in trainer.parts.policy.named_parameters())  # weight decay moved them
    trainer.close()
