"""verl's options through VERL_RULES: the unit conversions, with the arithmetic derived by hand in the comments."""

from __future__ import annotations

from cohort.config.fields import describe_fields
from cohort.convert.core import convert

AR = "actor_rollout_ref."
BASE = {"algorithm.adv_estimator": "grpo", "data.train_batch_size": 1024, AR + "rollout.n": 5,
        AR + "actor.ppo_mini_batch_size": 256}


def fields(given, rows=None):
    conversion = convert("verl", given, origin="a test", rows=rows, rows_from="a test")
    return {e.field: e for e in conversion.entries}, {u.key: u for u in conversion.unmapped}


def test_batch_sizes_in_prompts_become_completions_and_steps():
    out, _ = fields(BASE)
    # 1024 prompts × n=5 = 5120 completions per generation batch
    assert out["rollout.generation_batch_size"].value == 5120
    assert "data.train_batch_size=1024 prompts × actor_rollout_ref.rollout.n=5" in out["rollout.generation_batch_size"].comment
    # ppo_mini_batch_size is prompts per optimizer step in verl (it multiplies by n itself): 256, 1024 / 256 = 4 steps
    assert out["train.prompts_per_step"].value == 256 and "= 4 optimizer steps" in out["train.prompts_per_step"].comment


def test_epochs_become_optimizer_steps_when_the_rows_are_known():
    out, missing = fields({**BASE, "trainer.total_epochs": 15, AR + "actor.ppo_epochs": 2}, rows=7473)
    # floor(7473 / 1024) = 7 generation batches per epoch (the last partial batch dropped) × 15 = 105;
    # each trains 1024 / 256 = 4 slices × ppo_epochs 2 = 8 optimizer steps: 840
    assert out["train.max_steps"].value == 840 and out["algorithm.num_iterations"].value == 2
    _, missing = fields({**BASE, "trainer.total_epochs": 15})
    assert "train.max_steps = trainer.total_epochs=15 × floor(rows / 1024" in missing["trainer.total_epochs"].reason


def test_total_training_steps_and_warmup_count_generation_batches():
    out, missing = fields({**BASE, "trainer.total_training_steps": 100, "trainer.total_epochs": 3,
                           AR + "actor.optim.lr_warmup_steps": 10})
    assert out["train.max_steps"].value == 400  # 100 generation batches × 4 optimizer steps
    assert out["train.warmup_steps"].value == 40  # verl's schedule steps once per generation batch: 10 × 4
    assert "total_training_steps is set" in missing["trainer.total_epochs"].reason
    out, _ = fields({**BASE, "trainer.total_training_steps": 100, AR + "actor.optim.lr_warmup_steps_ratio": 0.1})
    assert out["train.warmup_steps"].value == 40  # int(0.1 × 100 batches) = 10 batches × 4 steps


def test_global_micro_batch_is_divided_over_the_gpus():
    out, _ = fields({**BASE, AR + "actor.ppo_micro_batch_size": 320, "trainer.n_gpus_per_node": 8})
    assert out["train.micro_batch_size"].value == 40 and out["train.num_processes"].value == 8  # 320 / 8
    _, missing = fields({**BASE, "data.train_batch_size": 1000})  # 1000 / 256 = 3.9: no whole number of steps
    assert "not a whole number" in missing["actor_rollout_ref.actor.ppo_mini_batch_size"].reason


def test_kl_placement_coefficient_and_estimator():
    out, missing = fields({**BASE, AR + "actor.use_kl_loss": True, AR + "actor.kl_loss_coef": 0.001})
    assert (out["algorithm.kl_placement"].value, out["algorithm.beta"].value) == ("loss", 0.001)
    assert out["algorithm.kl_estimator"].value == "low_var_kl" and "(verl's default)" in out["algorithm.kl_estimator"].comment
    out, missing = fields({**BASE, "algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.kl_coef": 0.02,
                           AR + "actor.kl_loss_coef": 0.5})
    assert (out["algorithm.kl_placement"].value, out["algorithm.beta"].value) == ("reward", 0.02)
    assert "no effect in verl" in missing[AR + "actor.kl_loss_coef"].reason


def test_values_without_counterpart_and_unknown_keys_are_listed_with_a_reason():
    _, missing = fields({**BASE, "data.truncation": "right", "trainer.some_new_option": 3, AR + "rollout.name": "sglang"})
    assert "only on the left" in missing["data.truncation"].reason
    assert "no counterpart known" in missing["trainer.some_new_option"].reason
    assert "sglang has no cohort counterpart" in missing[AR + "rollout.name"].reason


def test_fields_of_the_losses_branch_map_when_cohort_has_them():
    out, missing = fields({**BASE, AR + "actor.entropy_coeff": 0.01, AR + "actor.clip_ratio_c": 3.0})
    known = {key for key, *_ in describe_fields()}
    for key, field in ((AR + "actor.entropy_coeff", "algorithm.entropy_coeff"), (AR + "actor.clip_ratio_c", "algorithm.clip_ratio_c")):
        assert (field in out) if field in known else ("does not have yet" in missing[key].reason)
