"""open-r1's own options (its GRPOScriptArguments and its additions to GRPOConfig), read with TRL's table: the rules
`OPEN_R1_RULES` and the reward names of its recipes' `reward_funcs`, mapped (`OPEN_R1_REWARDS`) or refused by name
(`OPEN_R1_REFUSED`, each with the reason). Imports nothing of cohort beyond cohort.mapping.rules.
"""

from __future__ import annotations

from cohort.mapping.rules import Rule, none_of

# open-r1's reward names (src/open_r1/rewards.py, `reward_funcs` in its recipes): those with a cohort built-in of
# the same meaning, and the others refused by name (their import path works where open-r1 is installed).
OPEN_R1_REWARDS = {"accuracy": {"name": "accuracy"}}
OPEN_R1_REFUSED = {
    "format": "open-r1's format wants <think>\\n…\\n</think>\\n<answer>\\n…\\n</answer> exactly; cohort's think_format checks "
              "the <think> block only",
    "tag_count": "counts each of the four <think>/<answer> tags (0.25 apiece); no built-in counterpart",
    "reasoning_steps": "counts 'Step 1:'-style markers; no built-in counterpart",
    "cosine": "scales correctness by the completion's length on a cosine schedule; no built-in counterpart",
    "repetition_penalty": "penalises repeated n-grams; no built-in counterpart",
    "length": "Kimi 1.5's length reward across a group; no built-in counterpart",
    "code": "runs the code in open-r1's E2B/Morph sandboxes; cohort's code_tests runs tests in its own sandbox from a "
            "tests column",
    "binary_code": "runs the code in open-r1's E2B/Morph sandboxes; cohort's code_tests runs tests in its own sandbox",
    "ioi_code": "IOI problems judged by open-r1's piston workers; no counterpart",
    "cf_code": "Codeforces problems judged by open-r1's piston workers; no counterpart",
    "code_format": "open-r1's code-block format check; no built-in counterpart",
}


OPEN_R1_RULES: tuple[Rule, ...] = (
    none_of("system_prompt", "cohort takes the prompt as the data holds it: add this text as the first (system) "
            "message of each prompt in the data, as open-r1 does when it builds the conversation"),
    none_of("chat_template", "a template's text: write it into a .jinja file and name that file as model.chat_template"),
    none_of("dataset_configs", "a dataset mixture (open-r1): save the mixture as one file (data.train_files)"),
    none_of("hub_model_revision", "cohort saves to run.output_dir only"),
    none_of("callbacks", "open-r1's Hub-push callbacks; cohort saves to run.output_dir only"),
    none_of("benchmarks", "open-r1's lighteval benchmarks after saving; run `cohort eval` on the final model instead"),
    none_of("wandb_entity", "set WANDB_ENTITY in the environment (run.loggers: wandb reads it)"),
    none_of("wandb_project", "set WANDB_PROJECT in the environment (run.loggers: wandb reads it)"),
    none_of("wandb_run_group", "set WANDB_RUN_GROUP in the environment"),
    none_of("wandb_log_unique_prompts", "cohort writes sample completions to completions.jsonl"),
    *(none_of(k, "a parameter of open-r1's code rewards (E2B/Morph sandboxes), which have no counterpart") for k in (
        "code_language", "code_eval_test_batch_size", "code_eval_scoring_mode", "parallel_code_exec_per_proc",
        "e2b_router_url", "morph_router_url", "code_provider", "ioi_provider", "enforce_same_language")),
    *(none_of(k, "a parameter of open-r1's cosine and repetition rewards, which have no counterpart") for k in (
        "cosine_min_value_wrong", "cosine_max_value_wrong", "cosine_min_value_correct", "cosine_max_value_correct",
        "cosine_max_len", "repetition_n_grams", "repetition_max_penalty")),
    Rule("max_completion_len", ("rewards",), lambda v, o: [], "open-r1's soft_overlong_punishment: its max_completion_length"),
    Rule("soft_punish_cache", ("rewards",), lambda v, o: [], "open-r1's soft_overlong_punishment: its cache_length"),
)
