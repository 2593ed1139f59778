"""Asynchronous training (pipeline.max_staleness): k = 0 is the synchronous trainer; k = 2 keeps every trained token
within 2 versions; too-stale tokens are masked or their group dropped; groups admitted and untrained survive a
checkpoint; a dead engine fails the run instead of hanging it. Real vLLM (in-process, or a `cohort serve` child)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import numpy as np
import pytest
import torch

from cohort.config import ConfigError
from cohort.config.resolve import load_config
from cohort.rollout.base import Trajectory
from cohort.rollout.stream import FinishedGroup
from cohort.trainer import checkpoint
from cohort.rollout.scheduler import Origin
from cohort.trainer.trainer import Trainer
from cohort.trainer.weight_sync import WeightSync
from cohort.trainer.rollout_batch import RolloutBatch
from cohort.plan.validate import validate_config
from tests.builders import tiny_run, write_doubling

pytest.importorskip("vllm")
QUIET = dict(log=lambda *a, **k: None)


@pytest.fixture
def data_file(tmp_path, monkeypatch):
    (tmp_path / "async_rewards.py").write_text(
        "def digit_share(completions, **kwargs):\n"
        "    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "train.jsonl"
    write_doubling(path, 12, answers=False)
    return path


def _config(tmp_path, data_file, model_dir, *extra, name="run"):
    return load_config(None, tiny_run(
        model_dir, data_file, tmp_path / name, "rollout.max_completion_length=24", "engine.kv_cache_gib=0.25",
        "train.prompts_per_step=2", "train.micro_batch_size=8", "train.max_steps=5", "train.learning_rate=3e-3",
        "train.max_grad_norm=0", "rewards=[{name: 'async_rewards:digit_share'}]", *extra))


def _run(cfg, steps):
    trainer = Trainer(cfg, **QUIET)
    batches, metrics = [], []
    try:
        for _ in range(steps):
            metrics.append(trainer.step())
            batches.append(trainer.state.batch)
        weights = {k: v.detach().clone() for k, v in trainer.parts.policy.state_dict().items()}
    finally:
        trainer.close()
    return batches, metrics, weights


@pytest.mark.slow
def test_max_staleness_0_is_the_synchronous_trainer(tmp_path, data_file, tiny_model_dir):
    sync = _run(_config(tmp_path, data_file, tiny_model_dir, name="sync"), 5)
    async0 = _run(_config(tmp_path, data_file, tiny_model_dir, "pipeline.max_staleness=0", name="async"), 5)
    for a, b in zip(sync[0], async0[0]):
        assert a.row_indices == b.row_indices and a.completion_ids == b.completion_ids
        np.testing.assert_array_equal(a.rewards, b.rewards)
    # the same code by construction (the scheduler's k = 0): nothing off-policy to report, the same weights bit for bit
    assert all("staleness/max" not in m for m in async0[1])
    for name, value in sync[2].items():
        assert torch.equal(value, async0[2][name]), name


@pytest.mark.slow
def test_max_staleness_2_bounds_every_trained_token(tmp_path, data_file, tiny_model_dir):
    batches, metrics, _ = _run(_config(tmp_path, data_file, tiny_model_dir, "pipeline.max_staleness=2",
                                       "train.max_steps=6", name="k2"), 6)
    for step, (batch, m) in enumerate(zip(batches, metrics)):
        staleness = [step - v for versions in batch.versions for v in versions]  # the policy at step s is version s
        assert m["staleness/max"] == max(staleness) <= 2
    assert max(m["staleness/max"] for m in metrics) >= 1  # generation ran through the updates
    # nothing was generating when batch 0 was admitted, so one batch ahead (batch 1, 2 groups), not k = 2; batches
    # further ahead only while the engine is behind (tests/rollout/test_admission.py)
    assert metrics[0]["async/in_flight_groups"] == 2


@pytest.mark.slow
def test_too_stale_groups_are_masked_or_dropped(tmp_path, data_file, tiny_model_dir):
    # A group whose first two tokens come from version 0, taken when the policy is at 3 with k = 1: the oldest
    # allowed version is 2. mask: the 2 old tokens of each of its 4 members leave the loss (counted: 8); drop: the
    # group is discarded, counted, and a fresh prompt is admitted in its place.
    for mode in ("mask", "drop"):
        trainer = Trainer(_config(tmp_path, data_file, tiny_model_dir, "pipeline.max_staleness=1",
                                  f"pipeline.stale_tokens={mode}", name=mode), **QUIET)
        scheduler = trainer.scheduler
        try:
            trainer.state.policy_version = 3
            members = [Trajectory([5, 6, 7], [-1.0] * 3, "stop", 0, versions=[0, 0, 3]) for _ in range(4)]
            fresh = [Trajectory([5, 6], [-1.0] * 2, "stop", 3, versions=[3, 3]) for _ in range(4)]
            stale, ok = FinishedGroup(100, [0] * 4, members), FinishedGroup(101, [1] * 4, fresh)
            scheduler.origins.update({100: Origin(0, [0] * 4, [1, 2, 3, 4], 0), 101: Origin(0, [1] * 4, [5, 6, 7, 8], 0)})
            if mode == "mask":
                assert scheduler.screen(stale, 3) and scheduler.screen(ok, 3) and scheduler.stale_masked == 8
                batch = RolloutBatch([0], [[1, 2]], [[5, 6, 7]], [[-1.0] * 3], [False], ["x"], np.zeros(1), np.zeros((1, 0)),
                                     torch.zeros(1, 3), versions=[[0, 0, 3]], taken_version=3)
                assert torch.equal(trainer.pack(batch, [0]).mask, torch.tensor([[0.0, 0.0, 1.0]]))
            else:
                assert not scheduler.screen(stale, 3) and scheduler.screen(ok, 3) and scheduler.stale_dropped == 1
                # the replacement is in flight in place of group 100 (101 stays admitted until a batch takes it)
                assert scheduler.stream.pending == 1 and 100 not in scheduler.origins and len(scheduler.origins) == 2
        finally:
            trainer.close()


@pytest.mark.slow
def test_admitted_groups_survive_a_checkpoint_no_prompt_lost_or_repeated(tmp_path, data_file, tiny_model_dir):
    cfg = _config(tmp_path, data_file, tiny_model_dir, "pipeline.max_staleness=1", "train.max_steps=4", name="ckpt")
    trainer = Trainer(cfg, **QUIET)
    trained = Counter()
    try:
        for _ in range(2):
            trainer.step()
            trained.update(trainer.state.batch.row_indices)
        path = checkpoint.save_checkpoint(trainer.checkpointed())
        saved = trainer.scheduler.state_dict()["admitted"]
    finally:
        trainer.close()
    assert saved  # batch 2 was admitted at version 1 and is not trained yet
    resumed = Trainer(_config(tmp_path, data_file, tiny_model_dir, "pipeline.max_staleness=1", "train.max_steps=4", name="ckpt2"), **QUIET)
    try:
        checkpoint.load_checkpoint(resumed.checkpointed(), path)
        for _ in range(2):
            resumed.step()
            trained.update(resumed.state.batch.row_indices)
        left = Counter(i for a in resumed.scheduler.state_dict()["admitted"] for i in a["rows"])
        drawn = resumed.scheduler.generation_index
    finally:
        resumed.close()
    fresh = Trainer(cfg, **QUIET)  # the sampler's rows for generation batches 0 .. drawn-1, in order
    try:
        expected = Counter(i for _ in range(drawn) for i in fresh.parts.sampler.next_batch())
    finally:
        fresh.close()
    assert trained + left == expected


@pytest.mark.slow
def test_a_dead_engine_fails_the_run_within_the_timeout(tmp_path, data_file, tiny_model_dir):
    cfg = _config(tmp_path, data_file, tiny_model_dir, "pipeline.max_staleness=1", "engine.mode=local_server",
                  "engine.server_timeout_s=20", "pipeline.engine_timeout_s=20", "rollout.max_completion_length=120",
                  "train.max_steps=20", name="dead")
    trainer = Trainer(cfg, **QUIET)
    try:
        trainer.step()
        trainer.parts.engine.server.process.kill()  # the `cohort serve` child dies mid-run
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="rollout (engine|server)"):  # (from the pump or a submit)
            for _ in range(5):
                trainer.step()
        assert time.monotonic() - start < 60
    finally:
        trainer.close()


def test_async_config_is_validated_before_any_model_loads(tmp_path, data_file, tiny_model_dir):
    for bad, msg in (("pipeline.max_staleness=-1", "pipeline.max_staleness = -1"),
                     ("engine.name=hf", "pipeline.max_staleness with engine.name = hf"),
                     ("train.steps_per_generation=2", "one optimizer step per generation batch")):
        with pytest.raises(ConfigError, match=msg.replace(".", r"\.")):
            validate_config(_config(tmp_path, data_file, tiny_model_dir, "pipeline.max_staleness=1", bad))


@pytest.mark.slow
def test_an_eval_while_groups_are_in_flight_loses_none_of_them(tmp_path, data_file, tiny_model_dir):
    # k = 2: after step 1, batch 3 is admitted and generating (batches 1-2 may be done). A held-out eval through the shared engine gets
    # its own completions back (greedy, finished), and every admitted group still arrives: the next steps train
    # exactly the rows drawn, none lost (a lost group would stall the run until pipeline.engine_timeout_s).
    from cohort.rollout.base import SamplingConfig
    cfg = _config(tmp_path, data_file, tiny_model_dir, "pipeline.max_staleness=2", "train.max_steps=4",
                  "pipeline.engine_timeout_s=60", "rollout.max_completion_length=100", name="eval")
    trainer = Trainer(cfg, **QUIET)
    trained = Counter()
    try:
        trainer.step()
        trained.update(trainer.state.batch.row_indices)
        trainer.scheduler.admit(1)  # batch 3 may start now (as the next step would admit it)
        assert trainer.scheduler.stream.pending > 0  # groups in flight during the eval
        outs = trainer.scheduler.generate([trainer.parts.train_ids[0], trainer.parts.train_ids[1]], SamplingConfig(8, 0.0), [1, 2])
        assert len(outs) == 2 and all(o.finished and o.token_ids for o in outs)
        for _ in range(3):
            trainer.step()
            trained.update(trainer.state.batch.row_indices)
        assert not trainer.scheduler.origins  # every admitted group was trained
    finally:
        trainer.close()
    fresh = Trainer(cfg, **QUIET)
    try:
        expected = Counter(i for _ in range(4) for i in fresh.parts.sampler.next_batch())
    finally:
        fresh.close()
    assert trained == expected


def test_a_local_server_engine_gets_its_own_cores_under_asynchronous_training(tmp_path, data_file, tiny_model_dir):
    # Generation and the update run at once (as with pipeline.max_staleness=1): on this machine's N cores the engine takes the
    # last N // 2 (at least one) and the trainer's threads default to the rest; synchronous runs share them all.
    from cohort.rollout.server.client import engine_cores
    cores = sorted(os.sched_getaffinity(0))
    k = max(1, len(cores) // 2)
    cfg = _config(tmp_path, data_file, tiny_model_dir, "pipeline.max_staleness=1", "engine.mode=local_server")
    assert engine_cores(cfg) == (cores[-k:], max(1, len(cores) - k))
    assert engine_cores(_config(tmp_path, data_file, tiny_model_dir, "engine.mode=local_server")) == (None, None)


@pytest.mark.slow
def test_dynamic_sampling_and_partial_rollouts_combine_with_a_staleness_bound(tmp_path, tiny_model_dir, monkeypatch):
    # One scheduler, its rules composed. Rows alternate kind const (reward 1.0 for every member: a constant group,
    # dropped under dynamic sampling) and vary (rewards 0, 1, 2, ... by position: never constant). With k = 1 every
    # batch must still hold exactly B = 2 groups, none of them constant, every token at most 1 version old, through
    # the run's last step (where no later batch is admitted: the batch is topped up instead of coming back short).
    (tmp_path / "kind_rewards.py").write_text(
        "def by_kind(completions, kind, **kwargs):\n"
        "    return [1.0 if k == 'const' else float(i) for i, k in enumerate(kind)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "kinds.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "kind": "const" if a % 2 else "vary"}) + "\n"
                            for a in range(12)))
    for extra in (["pipeline.dynamic_sampling=true"], ["pipeline.over_provision=2"]):
        cfg = _config(tmp_path, data, tiny_model_dir, "pipeline.max_staleness=1", "rewards=[{name: 'kind_rewards:by_kind'}]",
                      "train.max_steps=4", *extra, name="combined-" + extra[0].split(".")[1].split("=")[0])
        batches, metrics, _ = _run(cfg, 4)
        for step, (batch, m) in enumerate(zip(batches, metrics)):
            assert len(batch) == 2 * 4 and m["staleness/max"] <= 1
            if "pipeline.dynamic_sampling=true" in extra:
                assert m["frac_reward_zero_std"] == 0.0  # every constant group was dropped and replaced
                assert all(batch.row_indices[i] % 2 == 0 for i in range(len(batch)))  # only vary rows trained


def test_a_calibrated_sync_check_leaves_the_engine_lock_alone():
    """Once the canaries' noise floor is measured, collecting a batch takes no engine lock: under k >= 1 each take
    waited for the driver's poll in progress (0.12 s a step on the arith demo, bench/async_step.py)."""
    from types import SimpleNamespace

    class NoLock:
        def __enter__(self):
            raise AssertionError("the engine lock was taken with nothing to calibrate")

        def __exit__(self, *exc_info):
            return False

    parts = SimpleNamespace(lora=None, engine_shares_policy=False)
    sync = WeightSync(parts, SimpleNamespace(policy_version=3, synced_version=3), NoLock(), phases=None,
                      generation_dtype="float32", group_size=2, fixed_tolerance=None)
    sync.check.floor, sync.check.canaries = (1e-6, 2e-6), [([1], [2])]  # calibrated
    sync.calibrate(2, [[1]], [])
    sync.check.floor, sync.check.fixed_tolerance = None, 0.01  # a fixed tolerance: nothing to measure
    sync.calibrate(2, [[1]], [])
