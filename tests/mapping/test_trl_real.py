"""TRL and open-r1 options whose port used to change the run or break the output: max_prompt_length's left cut,
torch_dtype, num_processes, adaptive entropy, Hub names, open-r1's multi-line system_prompt and reward names."""

from __future__ import annotations

import yaml

from cohort.convert.core import convert, render


def _run(given, num_processes=1):
    conversion = convert("trl", {"max_steps": 10, **given}, origin="test", num_processes=num_processes)
    text = render(conversion)
    assert yaml.safe_load(text) == conversion.tree()  # valid YAML holding exactly what was converted
    return text, conversion.tree(), {u.key: u.reason for u in conversion.unmapped}


def test_max_prompt_length_cuts_on_the_left_as_those_trl_versions_did():
    text, tree, _ = _run({"max_prompt_length": 512})
    assert tree["data"] == {"max_prompt_length": 512, "overlong_prompts": "truncate_left"}
    assert "cut on the left" in text and "cohort's default (filter) would drop it instead" in text


def test_torch_dtype_is_dtype():
    _, tree, _ = _run({"torch_dtype": "bfloat16"})
    assert tree["model"]["dtype"] == "bfloat16" and tree["train"]["precision"] == "pure"


def test_num_processes_enters_the_batch_arithmetic():
    # 16 per device × 4 processes × 2 accumulation = 128 completions = 16 prompts of 8 per optimizer step
    given = {"num_processes": 4, "per_device_train_batch_size": 16, "gradient_accumulation_steps": 2, "num_generations": 8}
    _, tree, _ = _run(given, num_processes=4)  # (convert_input passes the file's own num_processes on like this)
    assert tree["train"]["num_processes"] == 4 and tree["train"]["prompts_per_step"] == 16


def test_adaptive_entropy_is_refused_and_its_coefficient_not_kept_as_a_constant():
    _, tree, reasons = _run({"use_adaptive_entropy": True, "entropy_coef": 0.01, "entropy_target": 0.2})
    assert "entropy_coeff" not in tree.get("algorithm", {})
    assert "adaptive entropy control" in reasons["use_adaptive_entropy"]
    assert "not kept" in reasons["entropy_coef"] and "entropy_target" in reasons
    _, tree, _ = _run({"entropy_coef": 0.01, "loss_type": "grpo"})
    assert tree["algorithm"]["entropy_coeff"] == 0.01  # without it: a constant bonus in both, named as weighted per sequence


def test_hub_names_are_kept_as_they_are():
    text, tree, reasons = _run({"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "model_revision": "main",
                                "dataset_name": "open-r1/OpenR1-Math-220k", "dataset_config": "default",
                                "dataset_train_split": "train", "dataset_test_split": "test",
                                "dataset_prompt_column": "problem"})
    assert tree["model"] == {"path": "Qwen/Qwen2.5-1.5B-Instruct", "revision": "main"}
    assert tree["data"] == {"prompt_key": "problem", "dataset_name": "open-r1/OpenR1-Math-220k", "dataset_config": "default",
                            "dataset_train_split": "train", "dataset_test_split": "test"}
    assert not reasons and "download" not in text


def test_open_r1s_multi_line_system_prompt_stays_in_its_comment():
    prompt = "You are a helpful AI Assistant.\nRespond in the following format:\n<think>\n...\n</think>\nanswer: here"
    text, tree, reasons = _run({"system_prompt": prompt, "learning_rate": 1e-6})
    assert set(tree) == {"train", "rollout", "algorithm"}  # no key made of the prompt's lines
    assert tree["train"]["learning_rate"] == 1e-6
    assert "as the first (system) message of each prompt" in reasons["system_prompt"]
    assert sum(line.startswith("#   system_prompt=") for line in text.splitlines()) == 1


def test_open_r1s_reward_names_mapped_or_refused_by_name():
    text, tree, reasons = _run({"reward_funcs": ["accuracy", "format", "tag_count"], "reward_weights": [1.0, 0.5, 0.25]})
    assert tree["rewards"] == [{"name": "accuracy", "weight": 1.0}]
    assert reasons["reward_funcs"].startswith("partly: format: open-r1's format wants")
    assert "tag_count: counts each of the four" in reasons["reward_funcs"]
    _, tree, reasons = _run({"reward_funcs": ["soft_overlong_punishment"], "max_completion_len": 4096,
                             "soft_punish_cache": 512})
    assert tree["rewards"] == [{"name": "soft_overlong", "max_completion_length": 4096, "cache_length": 512}]
    assert not reasons
