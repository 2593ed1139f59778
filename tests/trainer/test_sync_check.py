"""The weight-sync check (cohort/trainer/sync_check.py): its two tests by hand, and real stale engines caught.

The unit tests use two-token vectors whose statistics are worked out in the
comments. The integration tests run the trainer on a random tiny Qwen2 (tied
embeddings) with a real vLLM engine that is sabotaged from a given version on:
a layer's weights not pushed, the tied LM head left stale (the bug the canary
first caught: vLLM's reload put the old packed head back), or nothing pushed at
all; each must stop the run at the first sync after the sabotage.
"""

from __future__ import annotations

import json

import pytest
import torch

from cohort.config.resolve import load_config
from cohort.rollout.engines import vllm as vllm_engine_module
from cohort.trainer.trainer import Trainer
from cohort.trainer import sync_check
from cohort.trainer.sync_check import SyncCheck, SyncCheckError, judge
from tests.builders import tiny_run, write_doubling

T = torch.tensor


def test_closeness_bound_is_a_multiple_of_the_floor():
    # gap = |[0.1, 0.2] - [0.1, 0.1]| = [0, 0.1], mean 0.05 > 4 × 0.01 = 0.04: fails
    v = judge(T([0.1, 0.2]), T([0.1, 0.1]), None, floor_mean=0.01, floor_rms=0.01)
    assert not v.ok and v.gap_mean == pytest.approx(0.05) and v.bound == pytest.approx(0.04) and "0.05 > 0.04" in v.reason
    # gap [0.01, 0.01], mean 0.01 <= 0.04: passes
    v = judge(T([-1.0, -2.0]), T([-1.01, -2.01]), None, floor_mean=0.01, floor_rms=0.01)
    assert v.ok and v.gap_mean == pytest.approx(0.01) and v.followed is None
    # a float32 floor of 1e-9 would make the bound 4e-9; it is never below MIN_GAP_NATS = 1e-5
    v = judge(T([0.0, 2e-5]), T([0.0, 0.0]), None, floor_mean=1e-9, floor_rms=1e-9)
    assert v.ok and v.bound == pytest.approx(1e-5)  # mean gap 1e-5 <= 1e-5


def test_the_floor_stretches_with_the_trainers_own_rounding_sensitivity_and_never_shrinks():
    check = SyncCheck()
    check.canaries = [([1], [2, 3])]
    check.calibrate(T([-1.0, -2.0]), T([-1.01, -2.01]), sensitivity=0.002)  # floor mean 0.01
    # the trainer's bf16-vs-float32 gap grew from 0.002 to 0.005: the floor is stretched 2.5×, bound 4 × 0.01 × 2.5 = 0.1
    assert check.noise_scale(0.005) == pytest.approx(2.5) and check.noise_scale(0.001) == 1.0 and check.noise_scale(None) == 1.0
    # a mean gap of 0.06 fails the unstretched bound 0.04 but passes the stretched one
    assert not judge(T([0.0, 0.12]), T([0.0, 0.0]), None, floor_mean=0.01, floor_rms=0.01).ok
    assert judge(T([0.0, 0.12]), T([0.0, 0.0]), None, floor_mean=0.01, floor_rms=0.01, noise_scale=2.5).ok
    metrics = check.check(1, T([-1.0, -2.12]), T([-1.0, -2.0]), sensitivity=0.005)
    assert metrics["sync/noise_scale"] == pytest.approx(2.5) and metrics["sync/canary_gap_mean"] == pytest.approx(0.06)


def test_following_catches_an_engine_that_kept_the_old_weights():
    trainer, previous = T([-1.01, -2.01]), T([-1.5, -2.5])
    # update step = t - p = [0.49, 0.49] (rms 0.49 >= 5 × floor rms 0.05, so it is judged);
    # a fresh engine e = [-1.0, -2.0]: <e - p, step> / |step|^2 = (0.5·0.49 + 0.5·0.49) / (2·0.49²) = 1/0.98 = 1.0204
    v = judge(T([-1.0, -2.0]), trainer, previous, floor_mean=0.2, floor_rms=0.05)
    assert v.ok and v.followed == pytest.approx(1 / 0.98, rel=1e-5)
    # a stale engine e = p: gap mean 0.49 passes the loose closeness bound 4 × 0.2 = 0.8, but it followed 0% of the step
    v = judge(previous.clone(), trainer, previous, floor_mean=0.2, floor_rms=0.05)
    assert not v.ok and v.followed == pytest.approx(0.0) and "took 0% of the update" in v.reason
    # an update of rms 0.01 < 5 × 0.05 is too small to tell: following is not judged
    v = judge(T([-1.0, -2.0]), trainer, T([-1.02, -2.02]), floor_mean=0.2, floor_rms=0.05)
    assert v.ok and v.followed is None


def test_following_ignores_a_few_bf16_outlier_tokens_but_not_a_stale_engine():
    # 40 canary tokens; the update moved every one by +0.3 (t - p = 0.3), floor rms 0.01 (signal 0.3 >= 5 x 0.01).
    previous = torch.full((40,), -2.0)
    trainer = previous + 0.3
    # a fresh engine: equal to the trainer except 2 outlier tokens 3.7 nats below it (bf16 noise as measured).
    # Untrimmed: <e - p, step> = 38 x 0.3 x 0.3 + 2 x (0.3 - 3.7) x 0.3 = 3.42 - 2.04 = 1.38, |step|^2 = 40 x 0.09
    # = 3.6, followed 0.383 < 0.5: a false alarm. FOLLOW_TRIM = 0.05 drops int(0.05 x 40) = 2 tokens, the two with
    # the largest gap: the other 38 followed exactly, 1.0.
    fresh = trainer.clone()
    fresh[[3, 17]] -= 3.7
    v = judge(fresh, trainer, previous, floor_mean=0.2, floor_rms=0.01)
    assert v.ok and v.followed == pytest.approx(1.0, abs=1e-6)
    # a stale engine (e = p) with the same 2 outliers: those two have the largest gaps (|p - 3.7 - t| = 4.0 > 0.3),
    # the other 38 took 0% of the update; the mean gap (38 x 0.3 + 2 x 4.0) / 40 = 0.485 passes the loose closeness
    # bound 4 x 0.2 = 0.8, so only following can catch it.
    stale = previous.clone()
    stale[[3, 17]] -= 3.7
    v = judge(stale, trainer, previous, floor_mean=0.2, floor_rms=0.01)
    assert not v.ok and v.followed == pytest.approx(0.0, abs=1e-6) and "took 0% of the update" in v.reason


def test_a_fixed_tolerance_keeps_its_old_meaning():
    # largest per-token gap 0.002 > 1e-3 fails; no calibration is needed
    v = judge(T([0.0, 0.002]), T([0.0, 0.0]), None, floor_mean=float("nan"), floor_rms=float("nan"), fixed_tolerance=1e-3)
    assert not v.ok and "0.002 > engine.sync_check_tolerance = 0.001" in v.reason
    assert judge(T([0.0, 0.0005]), T([0.0, 0.0]), None, floor_mean=float("nan"), floor_rms=float("nan"),
                 fixed_tolerance=1e-3).ok


def test_canaries_take_one_member_per_group_first_and_stop_at_the_token_budget():
    prompts = [[i] for i in range(6)]
    completions = [[1, 2], [3], [], [4, 5, 6], [7], [8, 9]]  # groups of 2: (0, 1), (2, 3), (4, 5)
    check = SyncCheck()
    # order: first members 0, 2 (empty: skipped), 4, then second members 1, 3, 5; budget 4 tokens:
    # 0 (2 tokens) + 4 (1) = 3 < 4, then 1 (1) = 4: stop
    check.choose(prompts, completions, 2, tokens=4)
    assert check.canaries == [([0], [1, 2]), ([4], [7]), ([1], [3])]
    check.choose(prompts, completions, 2, tokens=100, limit=2)
    assert len(check.canaries) == 2


def test_the_canary_budget_is_smaller_only_when_both_sides_compute_in_float32():
    assert sync_check.canary_tokens("float32", torch.float32) == 128
    assert sync_check.canary_tokens("bfloat16", torch.float32) == 512  # a bf16 engine: heavy-tailed noise
    assert sync_check.canary_tokens("float32", torch.bfloat16) == 512  # a trainer in bf16 mixed


def test_state_round_trip_and_a_failed_check_raises_with_the_version():
    check = SyncCheck()
    check.canaries = [([1], [2, 3])]
    assert check.calibrate(T([-1.0, -2.0]), T([-1.0, -2.1])) == {"sync/canary_floor": pytest.approx(0.05)}
    restored = SyncCheck()
    restored.load_state_dict(json.loads(json.dumps(check.state_dict())))  # plain lists and floats: any serializer
    assert restored.floor == pytest.approx((0.05, 0.1 / 2 ** 0.5)) and restored.ready
    with pytest.raises(SyncCheckError, match="policy version 7: the mean per-token gap 1 > 0.2"):
        restored.check(7, T([0.0, 0.0]), T([-1.0, -1.0]))


# --------------------------------------------------------------------------- real engines


def _config(tmp_path, model_dir, data, dtype="float32", lr=3e-3, steps=8):
    return load_config(None, tiny_run(
        model_dir, data, tmp_path / "run", f"model.dtype={dtype}", "rollout.max_completion_length=6", "train.prompts_per_step=4",
        "train.micro_batch_size=16", f"train.max_steps={steps}", f"train.learning_rate={lr}",
        "rewards=[{name: user_rewards_sync_check.sevens}]", "engine.kv_cache_gib=1"))


@pytest.fixture
def sevens_data(tmp_path, monkeypatch):
    (tmp_path / "user_rewards_sync_check.py").write_text(
        "def sevens(prompts, completions, **kw):\n    return [c.count('7') / max(1, len(c)) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "train.jsonl"
    write_doubling(data, 32, answers=False)
    return data


class Sabotaged:
    """A real engine whose pushes from policy version `start` on leave out the weights `keep_old(name)` names."""

    def __init__(self, engine, start: int, keep_old):
        self.engine, self.start, self.keep_old = engine, start, keep_old

    def update_weights(self, named, version):
        if version >= self.start:
            named = [(n, t) for n, t in named if not self.keep_old(n)]
        return self.engine.update_weights(named, version)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _run_until_caught(trainer) -> tuple[int, str]:
    try:
        with pytest.raises(SyncCheckError) as caught:
            for _ in range(trainer.cfg.train.max_steps):
                trainer.step()
    finally:
        trainer.close()
    return int(str(caught.value).split("policy version ")[1].split(":")[0]), str(caught.value)


@pytest.mark.parametrize("keep_old", ["model.layers.1.", "everything"])
def test_a_stale_float32_engine_is_caught_at_the_first_sabotaged_sync(vllm_engine, tiny_model_dir, sevens_data, tmp_path, keep_old):
    engine = Sabotaged(vllm_engine, 3, lambda n: keep_old == "everything" or n.startswith(keep_old))
    trainer = Trainer(_config(tmp_path, tiny_model_dir, sevens_data), engine=engine)
    version, message = _run_until_caught(trainer)
    assert version == 3 and "would sample from a policy other than the one being trained" in message
    assert 0 < trainer.sync.check.floor[0] < 1e-5  # float32: two kernels agree to ~1e-6 nats


def test_a_stale_tied_lm_head_is_caught(vllm_engine, tiny_model_dir, sevens_data, tmp_path, monkeypatch):
    # the original bug: vLLM's reload re-packed the OLD tied head; cohort re-ties it (_refresh_tied_lm_head).
    # Skip that from version 3 on: the embedding is fresh, the head that samples is stale.
    trainer = Trainer(_config(tmp_path, tiny_model_dir, sevens_data), engine=vllm_engine)
    refresh = vllm_engine_module._refresh_tied_lm_head
    monkeypatch.setattr(vllm_engine_module, "_refresh_tied_lm_head",
                        lambda model: refresh(model) if trainer.state.policy_version < 3 else None)
    version, _ = _run_until_caught(trainer)
    assert version == 3


@pytest.mark.slow
def test_bfloat16_run_has_no_false_alarm_and_a_stale_bfloat16_engine_is_caught(tiny_model_dir, sevens_data, tmp_path):
    # one bfloat16 engine for both halves, in a child process (engine.mode=local_server: a second in-process vLLM would
    # tear down the process-wide parallel state the session's engine uses when it closes). First 12 honest syncs (the
    # old max-gap rule of 1e-3 died at version 2: bf16 kernels differ by ~0.05 nats on single tokens); then an engine
    # that keeps every old weight from version 14.
    cfg = _config(tmp_path, tiny_model_dir, sevens_data, dtype="bfloat16", steps=20)
    cfg.engine.mode = "local_server"
    trainer = Trainer(cfg)
    trainer.swap_engine(Sabotaged(trainer.parts.engine, 14, lambda n: True))  # still owned: close() stops the child
    try:
        metrics = [trainer.step() for _ in range(12)]
    except BaseException:
        trainer.close()
        raise
    floor = trainer.sync.check.floor[0]
    assert 1e-4 < floor < 0.05, floor  # bf16 noise: ~1e-3 nats per token on average
    assert all(m["sync/canary_gap_mean"] <= sync_check.FLOOR_MULTIPLE * floor * m["sync/noise_scale"] for m in metrics[:11])
    version, message = _run_until_caught(trainer)
    assert version == 14 and "would sample from a policy other than" in message
