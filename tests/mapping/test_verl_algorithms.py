"""verl options whose port used to change the run: units of the schedule, PPO's and verl's defaults, RLOO's ratio,
CISPO's and GMPO's clip ranges, the reward model, DAPO's reward manager and overlong buffer, values cohort refuses."""

from __future__ import annotations

import yaml

from cohort.convert.core import convert, render

BASE = {"algorithm.adv_estimator": "grpo", "data.train_batch_size": 512, "actor_rollout_ref.rollout.n": 8,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 32, "actor_rollout_ref.actor.ppo_epochs": 2,
        "trainer.n_gpus_per_node": 1, "trainer.nnodes": 1, "trainer.total_training_steps": 10}


def _run(**given):
    conversion = convert("verl", {**BASE, **{k.replace("__", "."): v for k, v in given.items()}}, origin="test")
    assert yaml.safe_load(render(conversion)) == conversion.tree()
    return conversion, conversion.tree(), {u.key: u.reason for u in conversion.unmapped}


def test_frequencies_and_warmups_count_generation_batches_in_verl():
    # 512 / 32 = 16 optimizer steps per generation batch × ppo_epochs 2 = 32 optimizer steps per verl step
    _, tree, _ = _run(trainer__test_freq=5, trainer__save_freq=10, actor_rollout_ref__actor__optim__lr_warmup_steps=3)
    assert tree["run"]["eval_every"] == 5 * 32 and tree["run"]["save_every"] == 10 * 32
    assert tree["train"]["warmup_steps"] == 3 * 32
    _, tree, _ = _run(algorithm__adv_estimator="gae", critic__optim__lr_warmup_steps=2, trainer__test_freq=-1)
    assert tree["critic"]["warmup_steps"] == 64 and tree["run"]["eval_every"] == 0


def test_ppo_carries_verls_own_defaults():
    conversion, tree, _ = _run(algorithm__adv_estimator="gae")
    # verl: lam 1.0, cliprange_value 0.5, the dual clip 3.0 always (cohort: 0.95, 0.2, off)
    assert tree["algorithm"]["lam"] == 1.0 and tree["critic"]["cliprange_value"] == 0.5
    assert tree["algorithm"]["clip_ratio_c"] == 3.0
    text = render(conversion)
    assert "algorithm.lam=1.0 (verl's default)" in text and "critic.cliprange_value=0.5 (verl's default)" in text
    # for GRPO the PPO-only defaults are not written, and a PPO-only option given is refused with the reason
    _, tree, reasons = _run(algorithm__lam=0.9)
    assert "lam" not in tree["algorithm"] and "cliprange_value" not in tree.get("critic", {})
    assert reasons["algorithm.lam"].startswith("read only by PPO")


def test_rloo_trains_on_verls_token_ratio():
    _, tree, _ = _run(algorithm__adv_estimator="rloo")
    assert tree["algorithm"]["name"] == "rloo" and tree["algorithm"]["importance_sampling_level"] == "token"
    _, tree, _ = _run(algorithm__adv_estimator="rloo", actor_rollout_ref__actor__policy_loss__loss_mode="gspo")
    assert tree["algorithm"]["importance_sampling_level"] == "sequence"


def test_a_reward_model_is_the_reward():
    _, tree, _ = _run(reward_model__enable=True, reward_model__model__path="/models/rm",
                      reward_model__micro_batch_size_per_gpu=16)
    assert tree["rewards"] == [{"name": "reward_model", "model": "/models/rm", "batch_size": 16}]


def test_cispos_clip_range_becomes_cohorts_cap_never_ppos_epsilon():
    # verl: weight clamped to [1 - 10, 1 + 0.2]; cohort's cispo caps at epsilon_high itself: 1.2, no lower bound
    _, tree, reasons = _run(actor_rollout_ref__actor__policy_loss__loss_mode="cispo",
                            actor_rollout_ref__actor__clip_ratio_low=10, actor_rollout_ref__actor__clip_ratio_high=0.2)
    assert tree["algorithm"]["loss_type"] == "cispo" and tree["algorithm"]["epsilon_high"] == 1.2
    assert "epsilon_low" not in tree["algorithm"] and "clip_ratio_c" not in tree["algorithm"] and not reasons
    # a lower clamp that binds (1 - 0.2 > 0) has no counterpart: refused with the reason
    _, tree, reasons = _run(actor_rollout_ref__actor__policy_loss__loss_mode="cispo")
    assert "cohort's cispo has no lower bound" in reasons["actor_rollout_ref.actor.policy_loss.loss_mode"]
    assert "loss_type" not in tree["algorithm"]


def test_gmpo_is_its_own_loss_with_log_ratio_bounds():
    _, tree, reasons = _run(actor_rollout_ref__actor__policy_loss__loss_mode="geo_mean",
                            actor_rollout_ref__actor__clip_ratio_low=0.4, actor_rollout_ref__actor__clip_ratio_high=0.4,
                            actor_rollout_ref__actor__loss_agg_mode="seq-mean-token-mean")
    assert tree["algorithm"]["loss_type"] == "gmpo"
    assert (tree["algorithm"]["epsilon_low"], tree["algorithm"]["epsilon_high"]) == (0.4, 0.4) and not reasons


def test_dapos_reward_manager_and_overlong_buffer():
    _, tree, reasons = _run(reward_model__reward_manager="dapo", data__max_response_length=8192,
                            reward_model__overlong_buffer__enable=True, reward_model__overlong_buffer__len=4096,
                            reward_model__overlong_buffer__penalty_factor=0.5, reward_model__overlong_buffer__log=False)
    # the score (verl_default routes DAPO's math_dapo/aime* data to dapo_math) plus the penalty: 0 up to
    # 8192 - 4096 tokens, then linear down to -0.5 at 8192 (soft_overlong weighted by the penalty factor)
    assert tree["rewards"] == [{"name": "verl_default"}, {"name": "soft_overlong", "max_completion_length": 8192,
                                                         "cache_length": 4096, "weight": 0.5}]
    assert list(reasons) == ["reward_model.overlong_buffer.log"]
    _, tree, _ = _run(algorithm__filter_groups__enable=True, algorithm__filter_groups__max_num_gen_batches=10)
    assert tree["pipeline"] == {"dynamic_sampling": True, "max_refill_rounds": 9}


def test_values_cohort_refuses_are_refused_with_the_reason_or_written_in_the_output():
    _, tree, reasons = _run(actor_rollout_ref__actor__clip_ratio_low=1, actor_rollout_ref__actor__fsdp_config__param_offload=True)
    assert tree["train"]["max_steps"] == 10 * 32  # (10 verl steps × 32 optimizer steps each)
    assert "epsilon_low" not in tree["algorithm"] and "must be < 1" in reasons["actor_rollout_ref.actor.clip_ratio_low"]
    assert "needs train.num_processes > 1" in reasons["actor_rollout_ref.actor.fsdp_config.param_offload"]
    # a refusal of cohort's own checks that no option can be blamed for is written at the end of the output
    conversion, _, _ = _run(algorithm__adv_estimator="gae", trainer__n_gpus_per_node=2)
    assert any("critic is not sharded" in p for p in conversion.refusals)
    assert all(p in render(conversion) for p in conversion.refusals)


def test_algorithms_cohort_lacks_are_refused_by_name():
    _, tree, reasons = _run(algorithm__adv_estimator="remax")
    assert reasons["algorithm.adv_estimator"].startswith("remax: ReMax's baseline is a second, greedy rollout")
    _, _, reasons = _run(actor_rollout_ref__actor__policy_loss__loss_mode="clip_cov",
                         actor_rollout_ref__actor__policy_loss__clip_cov_ratio=0.0002)
    assert reasons["actor_rollout_ref.actor.policy_loss.loss_mode"].startswith("clip_cov: Clip-Cov")
    assert "clip_cov" in reasons["actor_rollout_ref.actor.policy_loss.clip_cov_ratio"]


def test_several_machines_run_on_ray():
    _, tree, _ = _run(trainer__nnodes=4, trainer__n_gpus_per_node=8)
    assert tree["train"]["num_processes"] == 32
    assert tree["distributed"] == {"backend": "ray", "ray_address": "auto", "gpus_per_trainer": 1.0}
