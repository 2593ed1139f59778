"""grpo, rloo, reinforce_pp(_baseline) and ppo through the one driver loop.

Three kinds of test:
- the advantage functions of `cohort.algorithms.specs`, on small batches worked by hand
  (RLOO's leave-one-out baseline with and without the KL in the reward, REINFORCE++'s
  whitened reward-to-go, PPO's GAE on three tokens with the KL in the reward);
- the resolution of the `auto` fields and the parts each algorithm builds (no critic
  unless ppo, no reference model unless beta != 0, old log-probs only when needed);
- the loop itself with the random tiny model and the transformers engine: switching the
  algorithm changes nothing but the maths (same prompts, completions, rewards at step 1,
  same prompts at step 2), the adaptive KL controller moves beta by Ziegler's rule once
  per generation batch, the critic reads the right hidden states, and every algorithm
  learns a toy reward (the share of "7"s in the completion, as in test_train_e2e.py).
"""

from __future__ import annotations

import textwrap
import typing

import pytest
import torch

from cohort.algorithms import (AGGREGATIONS, POLICY_LOSSES, aggregate_loss, aggregation_count, compute_advantages, policy_loss,
                               top_entropy_mask)
from cohort.algorithms.specs import ALGORITHMS, LOSS_TYPES, AdvantageInputs
from cohort.config import AlgorithmConfig
from cohort.config.resolve import load_config
from cohort.trainer.algorithms import resolve
from tests.builders import write_doubling


def t32(values):
    return torch.tensor(values, dtype=torch.float32)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, t32(expected), rtol=0, atol=atol)


# --------------------------------------------------------------------------- the advantage functions by hand


def test_rloo_leave_one_out_baseline_by_hand():
    # One group of 4, rewards [1, 0, 0, 1]: the baseline of completion i is the mean of the other three.
    # r=1: 1 - (0 + 0 + 1)/3 = 2/3;  r=0: 0 - (1 + 0 + 1)/3 = -2/3. Broadcast over each completion's tokens, 0 on padding.
    mask = t32([[1, 1], [1, 0], [1, 1], [1, 0]])
    out = ALGORITHMS.get("rloo").advantages(AdvantageInputs(rewards=t32([1, 0, 0, 1]), mask=mask, group_size=4))
    close(out.advantages, [[2 / 3, 2 / 3], [-2 / 3, 0], [-2 / 3, -2 / 3], [2 / 3, 0]])
    assert out.returns is None


def test_rloo_kl_in_the_reward_by_hand():
    # Group of 2, both rewards 1. Per-token KL: row 0 [0.2, 0.4] (sum 0.6); row 1 [0.1, pad = 5.0, which must not count].
    # beta = 0.5: shaped rewards 1 - 0.5 * 0.6 = 0.7 and 1 - 0.5 * 0.1 = 0.95.
    # RLOO with G = 2: A_0 = 0.7 - 0.95 = -0.25, A_1 = +0.25: the completion further from the reference loses.
    mask = t32([[1, 1], [1, 0]])
    x = AdvantageInputs(rewards=t32([1, 1]), mask=mask, group_size=2, kl=t32([[0.2, 0.4], [0.1, 5.0]]), kl_coef=0.5)
    close(ALGORITHMS.get("rloo").advantages(x).advantages, [[-0.25, -0.25], [0.25, 0.0]])
    # kl_coef 0 (the KL is in the loss instead): the equal rewards give no signal at all.
    zero = AdvantageInputs(rewards=t32([1, 1]), mask=mask, group_size=2, kl=x.kl, kl_coef=0.0)
    close(ALGORITHMS.get("rloo").advantages(zero).advantages, [[0, 0], [0, 0]])


def test_reinforce_pp_whitened_reward_to_go_by_hand():
    # Row 0: 2 tokens, outcome 1, KL [0.2, 0.4]; row 1: 1 token, outcome 0, KL [0.1]; beta = 0.5, gamma = 1.
    # Token rewards: row 0 [-0.1, -0.2 + 1] = [-0.1, 0.8]; row 1 [-0.05].
    # Reward-to-go: row 0 [0.7, 0.8]; row 1 [-0.05].
    # Whitened over the 3 active tokens: mean 1.45 / 3 = 0.483333; deviations [0.216667, 0.316667, -0.533333];
    # Bessel variance 0.431667 / 2 = 0.215833; divided by sqrt(0.215833 + 1e-8) = 0.464578:
    # [0.466372, 0.681621, -1.147994].
    x = AdvantageInputs(rewards=t32([1, 0]), mask=t32([[1, 1], [1, 0]]), group_size=1,
                        kl=t32([[0.2, 0.4], [0.1, 9.0]]), kl_coef=0.5, gamma=1.0)
    close(ALGORITHMS.get("reinforce_pp").advantages(x).advantages, [[0.466372, 0.681621], [-1.147994, 0.0]])


def test_reinforce_pp_baseline_subtracts_the_group_mean_first():
    # One group [1, 0] -> centred [0.5, -0.5]; no KL. Reward-to-go: row 0 [0.5, 0.5], row 1 [-0.5].
    # Whitened over 3 tokens: mean 1/6, deviations [1/3, 1/3, -2/3], variance (1/9 + 1/9 + 4/9) / 2 = 1/3:
    # [1/3, 1/3, -2/3] / sqrt(1/3) = [0.577350, 0.577350, -1.154701].
    x = AdvantageInputs(rewards=t32([1, 0]), mask=t32([[1, 1], [1, 0]]), group_size=2)
    close(ALGORITHMS.get("reinforce_pp_baseline").advantages(x).advantages, [[0.577350, 0.577350], [-1.154701, 0.0]])
    # Without the baseline the constant part stays: rows [1, 1] and [0] -> mean 2/3, deviations [1/3, 1/3, -2/3]: the same
    # numbers here; with a second group [1, 1] they differ: the baseline zeroes the constant group, plain REINFORCE++ does not.
    x2 = AdvantageInputs(rewards=t32([1, 0, 1, 1]), mask=t32([[1], [1], [1], [1]]), group_size=2)
    with_baseline = ALGORITHMS.get("reinforce_pp_baseline").advantages(x2).advantages
    without = ALGORITHMS.get("reinforce_pp").advantages(x2).advantages
    # with: centred [0.5, -0.5, 0, 0], mean 0, variance 0.5 / 3 -> [1.224745, -1.224745, 0, 0]
    close(with_baseline, [[1.224745], [-1.224745], [0.0], [0.0]])
    # without: [1, 0, 1, 1], mean 0.75, variance 0.75 / 3 = 0.25 -> [0.5, -1.5, 0.5, 0.5]
    close(without, [[0.5], [-1.5], [0.5], [0.5]])


def test_ppo_gae_three_tokens_with_kl_in_the_reward_by_hand():
    # One completion of 3 tokens, outcome 1 on the last token, KL [0.1, 0.2, 0.3], beta = 0.5:
    # token rewards [-0.05, -0.1, -0.15 + 1] = [-0.05, -0.1, 0.85]; values [0.5, 0.6, 0.7]; gamma 0.9, lam 0.8.
    # t=2: delta = 0.85 - 0.7 = 0.15;                       A2 = 0.15
    # t=1: delta = -0.1 + 0.9 * 0.7 - 0.6 = -0.07;          A1 = -0.07 + 0.72 * 0.15  = 0.038
    # t=0: delta = -0.05 + 0.9 * 0.6 - 0.5 = -0.01;         A0 = -0.01 + 0.72 * 0.038 = 0.01736
    # returns = A + V = [0.51736, 0.638, 0.85] (the critic's targets, unwhitened).
    # Whitened advantages: mean 0.0684533, deviations [-0.0510933, -0.0304533, 0.0815467], variance 0.00509390
    # -> [-0.715878, -0.426687, 1.142565].
    # A second, unscorable completion (NaN reward) gets advantage 0 and keeps its own values as targets.
    x = AdvantageInputs(rewards=t32([1, float("nan")]), mask=t32([[1, 1, 1], [1, 1, 0]]), group_size=1,
                        kl=t32([[0.1, 0.2, 0.3], [0.4, 0.4, 0.0]]), kl_coef=0.5,
                        values=t32([[0.5, 0.6, 0.7], [0.3, 0.2, 0.0]]), gamma=0.9, lam=0.8)
    out = ALGORITHMS.get("ppo").advantages(x)
    close(out.advantages, [[-0.715878, -0.426687, 1.142565], [0, 0, 0]])
    close(out.returns, [[0.51736, 0.638, 0.85], [0.3, 0.2, 0.0]])


def test_grpo_is_the_outcome_estimator_broadcast():
    rewards, mask = t32([1, 0, 0, 0, 2, 2]), t32([[1, 1], [1, 0], [1, 1], [1, 1], [1, 0], [1, 1]])
    for scale in ("group", "batch", "none"):
        out = ALGORITHMS.get("grpo").advantages(AdvantageInputs(rewards=rewards, mask=mask, group_size=3, scale=scale))
        expected = compute_advantages("grpo", rewards, 3, scale=scale)[:, None] * mask
        torch.testing.assert_close(out.advantages, expected, rtol=0, atol=0)


# --------------------------------------------------------------------------- specs and config agree


def test_specs_match_the_config():
    names = set(typing.get_args(AlgorithmConfig.model_fields["name"].annotation))
    assert names == set(ALGORITHMS.names())
    # the algorithm facts validation and the planner read, by hand: a within-group baseline needs 2 completions (grpo,
    # rloo, reinforce_pp_baseline); advantages that read only their group's rewards: grpo and rloo (reinforce_pp*
    # whiten over the batch, ppo has a critic); a constant group gets advantage 0 wherever the group mean is removed.
    # distill: the teacher's per-token signal needs no group (1), reads only the completion's own tokens (group-local),
    # and a constant-reward group still carries the teacher's advantage (so dynamic sampling would drop signal)
    facts = {name: (ALGORITHMS.get(name).min_group_size, ALGORITHMS.get(name).group_local,
                    ALGORITHMS.get(name).zero_for_constant_group) for name in ALGORITHMS.names()}
    assert facts == {"grpo": (2, True, True), "rloo": (2, True, True), "reinforce_pp": (1, False, False),
                     "reinforce_pp_baseline": (2, False, True), "ppo": (1, False, False), "distill": (1, True, False)}
    for name in ALGORITHMS.names():
        spec = ALGORITHMS.get(name)
        assert spec.kl_placement in ("loss", "reward") and spec.needs_critic == (name == "ppo")


@pytest.mark.parametrize("overrides, loss_name, placement, estimator, old_logp", [
    (["algorithm.name=grpo"], "ppo_clip", None, "k1", False),  # beta 0: no KL term anywhere
    (["algorithm.name=grpo", "algorithm.beta=0.04"], "ppo_clip", "loss", "k3", False),  # TRL's GRPO
    (["algorithm.name=grpo", "algorithm.importance_sampling_level=sequence"], "gspo", None, "k1", False),
    (["algorithm.name=rloo", "algorithm.beta=0.05"], "seq_sum_clip", "reward", "k1", True),  # TRL's RLOO
    (["algorithm.name=rloo", "algorithm.beta=0.05", "algorithm.kl_placement=loss"], "seq_sum_clip", "loss", "k3", False),
    (["algorithm.name=rloo", "algorithm.beta=0.05", "algorithm.kl_placement=loss", "algorithm.kl_controller=adaptive"],
     "seq_sum_clip", "loss", "k3", True),  # the controller measures the KL at generation time
    (["algorithm.name=reinforce_pp", "algorithm.beta=0.01", "algorithm.kl_estimator=k2"], "ppo_clip", "reward", "k2", True),
    (["algorithm.name=ppo"], "ppo_clip", None, "k1", False),
    (["algorithm.name=ppo", "algorithm.num_iterations=2"], "ppo_clip", None, "k1", True),  # off-policy
    # distill on-policy: no student pass (the teacher's advantage is taken against the current log-probs detached)
    (["algorithm.name=distill", "teacher.path=tiny:arith"], "ppo_clip", None, "k1", False),
    (["algorithm.name=distill", "teacher.path=tiny:arith", "algorithm.num_iterations=2"], "ppo_clip", None, "k1", True),
    # TRL's loss types with an entry of their own: that entry, whatever the algorithm's ratio level
    (["algorithm.loss_type=cispo"], "cispo", None, "k1", False),
    (["algorithm.name=rloo", "algorithm.loss_type=sapo"], "sapo", None, "k1", False),
    (["algorithm.loss_type=luspo"], "luspo", None, "k1", False),
    (["algorithm.name=ppo", "algorithm.loss_type=vespo"], "vespo", None, "k1", False),
    (["algorithm.loss_type=gmpo"], "gmpo", None, "k1", False),  # verl's geo_mean
])
def test_auto_fields_resolve_per_algorithm(overrides, loss_name, placement, estimator, old_logp):
    cfg = load_config(None, overrides)
    from cohort.plan.batch import batch_plan

    choice = resolve(cfg, off_policy=batch_plan(cfg).off_policy)
    assert (choice.loss_name, choice.kl_placement, choice.kl_estimator, choice.score_old_logp) == (
        loss_name, placement, estimator, old_logp)
    assert choice.loss_name in POLICY_LOSSES


def test_loss_params_carry_trls_meanings():
    # cispo's cap is epsilon_high itself (TRL), the dual clip is clip_ratio_c, the aggregation is the loss type's row.
    cfg = load_config(None, ["algorithm.loss_type=cispo", "algorithm.epsilon_high=5.0", "algorithm.sapo_temperature_neg=2.0"])
    choice = resolve(cfg, off_policy=False)
    assert choice.aggregation == "token_mean" and choice.loss_params["cispo_cap"] == 5.0
    assert choice.loss_params["sapo_tau_neg"] == 2.0 and choice.loss_params["dual_clip"] is None
    choice = resolve(load_config(None, ["algorithm.loss_type=grpo", "algorithm.clip_ratio_c=3"]), off_policy=False)
    assert (choice.loss_name, choice.aggregation, choice.loss_params["dual_clip"]) == ("ppo_clip", "seq_mean_token_mean", 3.0)


def test_loss_types_match_the_config():
    assert set(typing.get_args(AlgorithmConfig.model_fields["loss_type"].annotation)) == set(LOSS_TYPES)
    for row in LOSS_TYPES.values():
        assert row.policy_loss is None or row.policy_loss in POLICY_LOSSES
        assert row.aggregation in AGGREGATIONS


def test_config_checks_the_loss_fields():
    from cohort.config import ConfigError
    from cohort.plan.validate import validate_config

    validate_config(load_config(None, ["algorithm.loss_type=luspo", "algorithm.importance_sampling_level=sequence",
                                       "algorithm.clip_ratio_c=3", "algorithm.entropy_coeff=0.01",
                                       "algorithm.top_entropy_quantile=0.2"]), check_files=False)
    with pytest.raises(ConfigError) as err:
        validate_config(load_config(None, ["algorithm.loss_type=sapo", "algorithm.clip_ratio_c=3", "algorithm.delta=2",
                                           "algorithm.importance_sampling_level=sequence", "algorithm.top_entropy_quantile=0",
                                           "algorithm.sapo_temperature_pos=0", "algorithm.vespo_k_neg=-1"]),
                        check_files=False)
    text = str(err.value)
    assert "algorithm.clip_ratio_c = 3.0 with algorithm.loss_type = sapo: that loss has no hard clip" in text
    assert "unset algorithm.delta or use a clipped loss type (grpo, dapo, bnpo, dr_grpo, luspo)" in text
    assert "algorithm.loss_type = sapo computes its own token-level ratio, but algorithm.importance_sampling_level = sequence" in text
    assert "algorithm.top_entropy_quantile = 0.0: must be in (0, 1]" in text
    assert "algorithm.sapo_temperature_pos = 0.0: must be > 0 (TRL's default is 1.0)" in text
    assert "algorithm.vespo_k_neg = -1.0: must be >= 0 (TRL's default is 3.0)" in text
    with pytest.raises(ConfigError, match=r"algorithm.clip_ratio_c = 1.0: must be > 1"):
        validate_config(load_config(None, ["algorithm.clip_ratio_c=1"]), check_files=False)


def test_config_checks_group_size_and_kl_controller():
    from cohort.config import ConfigError
    from cohort.plan.validate import validate_config

    validate_config(load_config(None, ["algorithm.name=ppo", "rollout.num_generations=1"]), check_files=False)
    validate_config(load_config(None, ["algorithm.name=reinforce_pp", "rollout.num_generations=1"]), check_files=False)
    with pytest.raises(ConfigError) as err:
        validate_config(load_config(None, ["algorithm.name=rloo", "rollout.num_generations=1", "algorithm.kl_controller=adaptive",
                                           "algorithm.lam=1.5", "critic.cliprange_value=0"]), check_files=False)
    text = str(err.value)
    assert "algorithm.name = rloo needs at least 2 completions per prompt" in text
    assert "the controller multiplies beta, so it would stay 0" in text
    assert "algorithm.lam = 1.5: must be in [0, 1]" in text and "critic.cliprange_value = 0.0: must be > 0" in text


# --------------------------------------------------------------------------- the loop


SEVENS = textwrap.dedent('''
    def sevens(prompts, completions, **kwargs):
        return [c.count("7") / max(1, len(c)) for c in completions]
''')


@pytest.fixture
def toy(tmp_path, monkeypatch):
    (tmp_path / "algo_rewards.py").write_text(SEVENS)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "train.jsonl"
    write_doubling(data, 32)
    return tmp_path, data


def _trainer(toy, model_dir, name, *extra, steps=30, engine=None):
    from cohort.trainer.trainer import Trainer

    tmp_path, data = toy
    cfg = load_config(None, [
        f"model.path={model_dir}", f"data.train_files=[{data}]", "data.max_prompt_length=16", "engine.name=hf",
        "rollout.num_generations=4", "rollout.max_completion_length=6", "train.prompts_per_step=4", "train.micro_batch_size=8",
        f"train.max_steps={steps}", "train.learning_rate=3e-3", "rewards=[{name: 'algo_rewards:sevens'}]",
        f"algorithm.name={name}", f"run.output_dir={tmp_path / ('run-' + name)}", "run.progress=false", "run.loggers=[jsonl]",
        *extra,
    ])
    return Trainer(cfg, engine=engine)


@pytest.mark.slow
def test_switching_algorithm_changes_nothing_else_in_the_loop(toy, tiny_model_dir):
    seen = {}
    for name, extra in [("grpo", ()), ("rloo", ()), ("reinforce_pp", ()), ("reinforce_pp_baseline", ()), ("ppo", ()),
                        ("rloo", ("algorithm.beta=0.05",)), ("ppo", ("algorithm.beta=0.05",))]:
        trainer = _trainer(toy, tiny_model_dir, name, *extra)
        # the parts match the algorithm: a critic only for ppo, a reference model only with a KL term
        assert (trainer.parts.critic is not None) == (name == "ppo")
        assert (trainer.parts.ref_model is not None) == bool(extra)
        if trainer.parts.critic is not None:
            policy_storage = {p.data_ptr() for p in trainer.parts.policy.parameters()}
            assert not policy_storage & {p.data_ptr() for p in trainer.parts.critic.model.parameters()}  # its own copy
        first = trainer.step()
        batch = trainer.state.batch
        # old log-probs only when the KL is measured at generation time (on-policy otherwise)
        assert (batch.old_logp is not None) == bool(extra)
        assert (batch.values is not None) == (name == "ppo") and ("timing/critic_s" in first) == (name == "ppo")
        trainer.step()
        seen[(name, extra)] = (batch.row_indices, batch.prompt_ids, batch.completion_ids, batch.rewards.tolist(),
                               first["reward"], trainer.state.batch.row_indices)
        trainer.close()
    reference = seen[("grpo", ())]
    for key, value in seen.items():
        assert value == reference, key  # same prompts, seeds, completions and rewards at step 1; same prompts at step 2


@pytest.mark.slow
def test_adaptive_kl_controller_moves_beta_once_per_generation_batch(toy, tiny_model_dir):
    trainer = _trainer(toy, tiny_model_dir, "rloo", "algorithm.beta=0.1", "algorithm.kl_controller=adaptive",
                       "algorithm.kl_target=0.01", "algorithm.kl_horizon=100")
    first = trainer.step()
    # Step 1: the policy is the reference, so the measured KL is 0: error -1, clipped to -0.2; 16 completions:
    # beta = 0.1 * (1 - 0.2 * 16 / 100) = 0.0968.
    assert first["kl"] == 0.0 and first["kl_coef"] == 0.1
    with torch.no_grad():  # move the policy away from the reference (the toy reward alone barely moves it in one step)
        torch.manual_seed(0)
        for param in trainer.parts.policy.parameters():
            param.add_(0.02 * torch.randn_like(param))
    second = trainer.step()
    assert second["kl_coef"] == pytest.approx(0.0968, abs=1e-12)
    assert second["kl"] > 0
    # Step 2 measured KL k: beta *= 1 + clip(k / 0.01 - 1, -0.2, 0.2) * 16 / 100.
    error = min(max(second["kl"] / 0.01 - 1, -0.2), 0.2)
    assert trainer.parts.kl_controller.value == pytest.approx(0.0968 * (1 + error * 0.16), rel=1e-12)
    trainer.close()


def test_critic_values_read_the_state_before_each_completion_token(toy, tiny_model_dir):
    from cohort.models.batching import pack_right_padded

    trainer = _trainer(toy, tiny_model_dir, "ppo")
    critic = trainer.parts.critic.model
    assert all(float(v.detach().abs().max()) == 0.0 for v in [critic.head.weight, critic.head.bias])  # starts at V = 0
    with torch.no_grad():
        critic.head.weight.normal_()
        critic.head.bias.fill_(0.3)
    pb = pack_right_padded([[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]], trainer.parts.pad_id)
    with torch.no_grad():
        values = critic(pb.input_ids, pb.attention_mask, pb.prompt_lengths, pb.completion_mask)
        hidden = critic.body(input_ids=pb.input_ids, attention_mask=pb.attention_mask).last_hidden_state
    # row 0: prompt of 3, completion tokens at positions 3, 4: their states are the hidden states at 2 and 3;
    # row 1: prompt of 2, completion at 2, 3, 4: states at 1, 2, 3. Padding (row 0, column 2) is 0.
    head = lambda h: float(h @ critic.head.weight[0] + 0.3)  # noqa: E731
    expected = [[head(hidden[0, 2]), head(hidden[0, 3]), 0.0], [head(hidden[1, 1]), head(hidden[1, 2]), head(hidden[1, 3])]]
    torch.testing.assert_close(values, t32(expected), rtol=0, atol=1e-5)
    trainer.close()


@pytest.mark.slow
def test_critic_and_kl_controller_are_checkpointed(toy, tiny_model_dir):
    trainer = _trainer(toy, tiny_model_dir, "ppo", "algorithm.beta=0.05", "algorithm.kl_controller=adaptive")
    parts = trainer.checkpointed().stateful
    assert "critic" in parts and "kl_controller" in parts
    trainer.step()
    state = {k: v for k, v in parts["critic"].state_dict().items()}
    fresh = _trainer(toy, tiny_model_dir, "ppo", "algorithm.beta=0.05", "algorithm.kl_controller=adaptive")
    fresh.parts.critic.load_state_dict(state)
    for a, b in zip(trainer.parts.critic.model.parameters(), fresh.parts.critic.model.parameters()):
        assert torch.equal(a, b)
    assert fresh.parts.critic.lr_schedule.last_epoch == trainer.parts.critic.lr_schedule.last_epoch == 1
    trainer.close()
    fresh.close()


@pytest.mark.parametrize("name, extra", [
    ("rloo", ()), ("reinforce_pp", ()), ("reinforce_pp_baseline", ()),
    ("ppo", ("critic.learning_rate=1e-3",)),
])
@pytest.mark.slow
def test_every_algorithm_learns_the_toy_reward(toy, tiny_model_dir, name, extra):
    # The random tiny model starts near 0 (about 1 token in 259 is "7"). Measured with these settings: the first five
    # steps average 0.02, the reward first passes 0.9 at step 18 (rloo), 14 (reinforce_pp), 16 (_baseline), 13 (ppo),
    # and the last five average 1.0 for each (grpo, the control, passes 0.9 at step 18; test_train_e2e.py covers it).
    # A sign error, advantages that ignore the reward or a loop that skips the update leave it near 0.
    trainer = _trainer(toy, tiny_model_dir, name, *extra)
    rewards, critic_errors = [], []
    for _ in range(30):
        metrics = trainer.step()
        rewards.append(metrics["reward"])
        critic_errors.append(metrics.get("value/error"))
    trainer.close()
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first < 0.15 and last > 0.8, (first, last)
    if name == "ppo":  # the critic learned the (now nearly constant) return: its error rose to ~0.24, then fell to ~0.003
        assert critic_errors[-1] < 0.05 < max(critic_errors), critic_errors


def test_entropy_bonus_and_top_entropy_reach_the_loss(toy, tiny_model_dir):
    # The trainer's gradient over a generated batch (two micro-batches of 8) equals, per micro-batch m, that of
    #   policy_loss(logp, adv, token_weights = top_entropy_mask(H, mask, 1 - 0.5)) - 0.1 * aggregate_loss(H, mask)
    # with both terms divided by the step's token count (dapo: token_mean), logp and H taken from the full logits
    # (naive_completion_logprobs: H carries autograd's gradient). Only the kept tokens carry the policy loss; the
    # bonus covers every token (verl's entropy_coeff; the quantile only selects the policy loss's tokens).
    from collections import defaultdict

    from cohort.models.logprobs import naive_completion_logprobs

    trainer = _trainer(toy, tiny_model_dir, "grpo", "algorithm.entropy_coeff=0.1", "algorithm.top_entropy_quantile=0.5",
                       "rollout.temperature=1.0", steps=2)
    batch = trainer.generate_batch()
    g = torch.Generator().manual_seed(0)  # the random model scores ~0 everywhere: give every completion an advantage
    batch.advantages = torch.randn(len(batch), 1, generator=g) * trainer.advantage_mask(batch)
    indices = list(range(len(batch)))
    micro = trainer.micro_batches(batch, indices)
    packed = [trainer.pack(batch, mb) for mb in micro]
    num_items = sum(aggregation_count(p.mask, "token_mean") for p in packed)
    sums = defaultdict(float)
    trainer.parts.optimizer.zero_grad(set_to_none=True)
    trainer.backward_micro_batches(batch, micro, packed, num_items, sums)
    ours = [p.grad.clone() for p in trainer.parts.policy.parameters()]
    trainer.parts.optimizer.zero_grad(set_to_none=True)
    kept = 0.0
    for mb, mbi in zip(micro, packed):
        pb, mask = mbi.packed, mbi.mask
        logp, entropy = naive_completion_logprobs(trainer.parts.policy, pb.input_ids, pb.attention_mask, pb.prompt_lengths,
                                                  pb.completion_ids, mask)
        keep = top_entropy_mask(entropy.detach(), mask, 0.5)
        kept += float(keep.sum())
        adv = batch.advantages[mb][:, : logp.shape[1]]
        loss, _ = policy_loss("ppo_clip", logp, logp.detach(), adv, mask, token_weights=keep, num_items=num_items)
        (loss - 0.1 * aggregate_loss(entropy, mask, "token_mean", num_items=num_items)).backward()
    for got, p in zip(ours, trainer.parts.policy.parameters()):
        torch.testing.assert_close(got, p.grad, rtol=0, atol=2e-5)
    assert float(sums["entropy/kept_frac"]) == kept and 0.4 < kept / float(num_items) < 0.7  # about half the tokens
    metrics = trainer.step()  # and through a whole step: the kept fraction is reported
    assert 0.4 < metrics["entropy/kept_frac"] < 0.7
    trainer.close()


@pytest.mark.parametrize("loss_type", ["cispo", "vespo"])
def test_a_trl_loss_type_trains_end_to_end(toy, tiny_model_dir, loss_type):
    # Two steps by name. On-policy every ratio is 1: cispo's weight min(1, 5) = 1 and vespo's phi(1) = 1, so both are
    # the plain policy gradient -A logp: ratio/mean is exactly 1 and nothing is capped. (A reward that varies within
    # a group from the first step: the completion's length mod 3.)
    (toy[0] / "loss_rewards.py").write_text("def varied(prompts, completions, **kw):\n    return [len(c) % 3 for c in completions]\n")
    trainer = _trainer(toy, tiny_model_dir, "grpo", f"algorithm.loss_type={loss_type}", "algorithm.epsilon_high=5",
                       "rewards=[{name: 'loss_rewards:varied'}]", steps=2)
    assert (trainer.parts.loss_name, trainer.parts.aggregation) == (loss_type, "token_mean")
    for _ in range(2):
        metrics = trainer.step()
        assert metrics["ratio/mean"] == pytest.approx(1.0, abs=1e-6) and metrics["clip_ratio/high"] == 0.0
        assert metrics["grad_norm"] > 0
    trainer.close()


def test_gmpo_trains_end_to_end(toy, tiny_model_dir):
    # verl's geo_mean by name, two steps: on-policy every log-ratio is 0, so s = exp(0) = 1, nothing is clipped, and
    # the loss is the mean over sequences of -A (seq_mean_token_sum of each row's 1/T shares)
    (toy[0] / "gmpo_rewards.py").write_text("def varied(prompts, completions, **kw):\n    return [len(c) % 3 for c in completions]\n")
    trainer = _trainer(toy, tiny_model_dir, "grpo", "algorithm.loss_type=gmpo", "algorithm.epsilon_low=0.4",
                       "algorithm.epsilon_high=0.4", "rewards=[{name: 'gmpo_rewards:varied'}]", steps=2)
    assert (trainer.parts.loss_name, trainer.parts.aggregation) == ("gmpo", "seq_mean_token_sum")
    for _ in range(2):
        metrics = trainer.step()
        assert metrics["ratio/mean"] == pytest.approx(1.0, abs=1e-6) and metrics["clip_ratio/region"] == 0.0
        assert metrics["grad_norm"] > 0
    trainer.close()


@pytest.mark.vllm
def test_ppo_with_a_kl_term_learns_through_the_shared_vllm_engine(toy, tiny_model_dir, vllm_engine):
    # The engine is a separate copy of the policy here (pushed after every step and checked with the canary), so the
    # old log-probs of the KL in the reward come from the trainer, not the engine; the critic, the reference model and
    # the adaptive controller all run. Measured: reward 0.0-0.03 over steps 1-5, 0.95-1.0 over steps 36-40 (it passes
    # 0.9 at step ~29); canary gap 4e-6; trainer-engine log-prob gap at most 1.4e-5.
    trainer = _trainer(toy, tiny_model_dir, "ppo", "engine.name=vllm", "critic.learning_rate=1e-3", "algorithm.beta=0.01",
                       "algorithm.kl_controller=adaptive", "algorithm.kl_target=1.0", engine=vllm_engine)
    assert trainer.parts.engine_shares_policy is False and trainer.parts.ref_model is not None and trainer.parts.critic is not None
    history = [trainer.step() for _ in range(40)]
    trainer.close()
    rewards = [m["reward"] for m in history]
    assert sum(rewards[:5]) / 5 < 0.15 and sum(rewards[-5:]) / 5 > 0.8, rewards
    assert all(m["mismatch/logprob_abs_max"] < 1e-3 for m in history)  # trainer vs engine on the sampled tokens
    assert trainer.sync.last_canary_gap < 1e-4
    assert history[-1]["kl_coef"] != 0.01  # the controller moved beta


def test_example_configs_are_the_demo_preset_with_the_algorithm_switched():
    # Each example is `cohort train`'s preset with only its algorithm's own sections changed, so their before/after
    # numbers compare the algorithms and nothing else.
    from pathlib import Path

    from cohort.plan.validate import validate_config

    for name in ("grpo", "rloo", "reinforce_pp", "ppo"):
        cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / f"{name}_arith.yaml")
        validate_config(cfg, check_files=False)
        assert cfg.algorithm.name == name
        preset = load_config(None)  # no config: the demo preset (examples/arith.yaml), settled as the example was
        validate_config(preset, check_files=False)
        preset, example = preset.to_dict(), cfg.to_dict()
        for section in ("algorithm", "critic"):
            preset.pop(section), example.pop(section)
        assert example == preset, name
