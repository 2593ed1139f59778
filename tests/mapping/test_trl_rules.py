"""TRL's options through TRL_RULES: the unit conversions, with the arithmetic derived by hand in the comments."""

from __future__ import annotations

from cohort.convert.core import convert


def fields(given, rows=None, processes=1):
    conversion = convert("trl", given, origin="a test", rows=rows, rows_from="a test", num_processes=processes)
    return {e.field: e for e in conversion.entries}, {u.key: u for u in conversion.unmapped}


def test_completions_per_device_become_prompts_per_step():
    out, _ = fields({"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4, "num_generations": 8}, processes=2)
    # 16 completions × 2 processes × 4 accumulation = 128 completions per optimizer step / 8 = 16 prompts
    assert out["train.prompts_per_step"].value == 16 and out["train.micro_batch_size"].value == 16
    assert "= 128 completions per optimizer step / num_generations=8 = 16 prompts" in out["train.prompts_per_step"].comment
    _, missing = fields({"per_device_train_batch_size": 6, "num_generations": 8})  # 6 / 8: no whole group per step
    assert "not a whole number" in missing["gradient_accumulation_steps"].reason


def test_steps_per_generation_in_micro_steps_and_generation_batch_in_completions():
    out, _ = fields({"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4, "steps_per_generation": 8})
    assert out["train.steps_per_generation"].value == 2  # 8 micro-steps / 4 per optimizer step
    out, missing = fields({"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4, "generation_batch_size": 160})
    # TRL takes 160 (a multiple of its 16 per micro-step); cohort trains whole optimizer steps of 16 × 4 = 64: 2.5 is not
    assert "use a multiple of 64" in missing["generation_batch_size"].reason
    out, _ = fields({"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4, "generation_batch_size": 256})
    assert out["rollout.generation_batch_size"].value == 256  # 256 / 64 = 4 optimizer steps per generation batch


def test_epochs_and_warmup_ratio_become_steps_when_the_rows_are_known():
    given = {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4, "num_generations": 8,
             "num_train_epochs": 2, "warmup_steps": 0.05}
    out, _ = fields(given, rows=1000)
    # a generation batch = 16 × 1 × 4 = 64 completions = 8 prompts, one optimizer step; floor(1000 / 8) = 125 per
    # epoch × 2 epochs = 250 steps; warm-up ceil(0.05 × 250) = ceil(12.5) = 13
    assert out["train.max_steps"].value == 250 and out["train.warmup_steps"].value == 13
    _, missing = fields(given)
    assert "--rows N" in missing["num_train_epochs"].reason and "ceil(0.05 × train.max_steps)" in missing["warmup_steps"].reason
    out, missing = fields({"max_steps": 300, "num_train_epochs": 2})
    assert out["train.max_steps"].value == 300 and "ignores num_train_epochs" in missing["num_train_epochs"].reason


def test_trl_defaults_that_differ_from_cohorts_are_converted_and_marked():
    out, _ = fields({})
    # TRL: linear schedule, 512-token completions, gradient checkpointing on, 8 completions per device = 1 prompt
    assert out["train.lr_scheduler"].value == "linear" and "(TRL's default)" in out["train.lr_scheduler"].comment
    assert (out["rollout.max_completion_length"].value, out["train.gradient_checkpointing"].value) == (512, True)
    assert out["train.prompts_per_step"].value == 1  # 8 × 1 × 1 = 8 completions / 8 generations


def test_rewards_weights_loss_names_and_turns():
    out, _ = fields({"reward_funcs": ["accuracy_reward", "my_rewards.brevity"], "reward_weights": [1.0, 0.1],
                     "loss_type": "dr_grpo", "max_tool_calling_iterations": 3, "epsilon": 0.2})
    assert out["rewards"].value == [{"name": "accuracy", "weight": 1.0}, {"name": "my_rewards.brevity", "weight": 0.1}]
    assert out["algorithm.loss_type"].value == "dr_grpo"
    assert out["tools.max_turns"].value == 4  # 3 tool-calling turns + the answer
    assert out["algorithm.epsilon_high"].value == 0.2  # TRL: epsilon_high defaults to epsilon


def test_two_options_setting_one_field_differently_keep_the_first_and_list_the_second():
    out, missing = fields({"dtype": "float32", "bf16": True})
    assert out["model.dtype"].value == "float32" and "already set it to float32" in missing["bf16"].reason
