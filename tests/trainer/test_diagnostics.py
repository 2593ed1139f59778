"""Diagnostics on synthetic metric streams: each rule fires after `patience` bad observations, once, and re-arms."""

from __future__ import annotations

from cohort.trainer.diagnostics import Diagnostics


def run(stream, patience=3):
    diagnostics = Diagnostics(max_completion_length=256, patience=patience)
    return [(w.step, w.kind, w.value) for step, metrics in enumerate(stream, 1) for w in diagnostics.observe(step, metrics)]


def test_zero_std_groups_warn_after_three_batches_once_and_rearm():
    stream = [{"frac_reward_zero_std": v, "reward": 0.98} for v in (0.95, 0.95, 0.95, 0.97, 0.5, 0.95, 0.95, 0.92)]
    # steps 1-3 bad -> warn at 3; 4 still bad -> silent; 5 clears; 6, 7, 8 bad -> warn again at 8
    assert run(stream) == [(3, "reward_zero_std", 0.95), (8, "reward_zero_std", 0.92)]


def test_distillation_is_not_warned_about_constant_reward_groups():
    # under algorithm.name = distill the teacher gives every token an advantage: all-equal rewards are no stall
    diagnostics = Diagnostics(max_completion_length=256, patience=3, teacher_signal=True)
    assert [w for step in range(1, 6) for w in diagnostics.observe(step, {"frac_reward_zero_std": 1.0})] == []


def test_exactly_the_threshold_is_not_a_problem():
    assert run([{"frac_reward_zero_std": 0.9}] * 5) == []


def test_steps_without_the_metric_do_not_break_the_streak():
    # steps_per_generation = 2: generation metrics appear every other step
    stream = [{"frac_reward_zero_std": 1.0}, {"loss": 0.0}, {"frac_reward_zero_std": 1.0}, {}, {"frac_reward_zero_std": 1.0}]
    assert run(stream) == [(5, "reward_zero_std", 1.0)]


def test_zero_std_advice_names_the_metric_and_fixes():
    diagnostics = Diagnostics(max_completion_length=256, patience=1)
    (warning,) = diagnostics.observe(12, {"frac_reward_zero_std": 1.0, "reward": 0.0})
    assert warning.text.startswith("warning at step 12 [reward_zero_std]: frac_reward_zero_std = 1.00 (> 0.9)")
    assert "mean reward 0" in warning.message and "rollout.num_generations" in warning.message
    assert warning.record() == {"step": 12, "kind": "reward_zero_std", "metric": "frac_reward_zero_std", "value": 1.0,
                                "message": warning.message}


def test_length_limit():
    stream = [{"completions/clipped_ratio": v} for v in (0.6, 0.5, 0.7, 0.8, 0.9)]
    # 0.5 is not above the 0.5 threshold: the streak restarts at step 3 and completes at step 5
    warnings = Diagnostics(max_completion_length=64).observe
    out = [w for step, m in enumerate(stream, 1) for w in warnings(step, m)]
    assert [(w.step, w.kind) for w in out] == [(5, "length_limit")]
    assert "rollout.max_completion_length = 64 tokens" in out[0].message


def test_logprob_mismatch():
    stream = [{"mismatch/logprob_abs_max": v, "mismatch/logprob_abs_mean": 0.02} for v in (1e-5, 2.5, 3.0, 1.5)]
    assert run(stream) == [(4, "logprob_mismatch", 1.5)]
    assert run([{"mismatch/logprob_abs_max": 0.9}] * 6) == []  # below 1 nat: float noise, bf16 rounding


def test_slow_reward_phase():
    fast = {"timing/generate_s": 2.0, "timing/reward_s": 0.3, "timing/update_s": 1.0, "timing/step_s": 3.3}
    slow = {"timing/generate_s": 2.0, "timing/reward_s": 5.0, "timing/update_s": 1.0, "timing/step_s": 8.0}
    assert run([fast, slow, slow, fast, slow, slow, slow]) == [(7, "slow_reward", 5.0)]


def test_slow_reward_ignores_the_whole_step_and_per_function_timings():
    # timing/step_s is the sum, timing/reward/<fn>_s are inside the reward phase: neither is a competing phase
    metrics = {"timing/generate_s": 1.0, "timing/reward_s": 0.5, "timing/step_s": 9.0, "timing/reward/code_tests_s": 7.0}
    assert run([metrics] * 4) == []
    assert run([{"timing/reward_s": 3.0, "timing/step_s": 3.0}] * 4) == []  # one phase alone: nothing to compare with


def collapse_stream(top_shares, reference_shares, distinct=None):
    return [{"answers/top_share": t, "answers/reference_top_share": r,
             "answers/distinct_per_group": (distinct or [4.0] * len(top_shares))[i], "frac_reward_zero_std": 0.5}
            for i, (t, r) in enumerate(zip(top_shares, reference_shares))]


def test_answer_collapse_fires_when_one_answer_outgrows_the_prior():
    # references' top share per batch: 0.5, 0.75, 0.625, 0.625, 0.5 -> running means 0.5, 0.625, 0.625, 0.625, 0.6
    # thresholds max(0.5, mean + 0.1): 0.6, 0.725, 0.725, 0.725, 0.7; top shares 0.3 (no), 0.8, 0.9, 0.95 (3 in a row)
    stream = collapse_stream([0.3, 0.8, 0.9, 0.95, 0.97], [0.5, 0.75, 0.625, 0.625, 0.5])
    assert run(stream) == [(4, "answer_collapse", 0.95)]


def test_answer_collapse_is_quiet_when_the_answers_follow_the_references():
    # a task whose key is "yes" for 70%: a policy that is right says "yes" about 70% of the time; 0.75 < 0.7 + 0.1
    assert run(collapse_stream([0.72, 0.75, 0.7, 0.74], [0.7] * 4)) == []
    # spread answers (the demo's sums): far below one half
    assert run(collapse_stream([0.05, 0.04, 0.06, 0.05], [0.04] * 4)) == []
    # no reference read: the prior counts as 0, the 0.5 floor holds: 0.49 is not a collapse
    assert run([{"answers/top_share": 0.49}] * 4) == []


def test_answer_collapse_advice_names_the_numbers_and_the_options():
    diagnostics = Diagnostics(max_completion_length=48, patience=3)
    stream = collapse_stream([0.9, 0.92, 0.95], [0.6, 0.6, 0.6], distinct=[4.5, 2.0, 1.25])
    (warning,) = [w for step, m in enumerate(stream, 1) for w in diagnostics.observe(step, m)]
    assert warning.message.startswith("answers/top_share = 0.95: one answer is 95% of the completions for 3 generation "
                                      "batches, while the most common reference answer is 60% of them; 1.2 distinct "
                                      "answers per group (was 4.5 on the first batch); 50% of the groups without signal")
    for option in ("rollout.num_generations", "rollout.temperature", "pipeline.dynamic_sampling=true", "balanced by answer"):
        assert option in warning.message


# answers/* of real runs, as metrics.jsonl logged them (rounded to 4 places)
# `cohort train train.max_steps=3` (the demo, tiny:arith, 64 prompts x G=8), 2026-12-06:
DEMO_STEPS = [(4.3281, 0.0273, 0.0625), (4.1406, 0.0410, 0.0469), (3.9844, 0.0410, 0.0625)]


def test_answer_collapse_is_quiet_on_the_demo():
    stream = [{"answers/distinct_per_group": d, "answers/top_share": t, "answers/reference_top_share": r,
               "frac_reward_zero_std": 0.17} for d, t, r in DEMO_STEPS] * 5  # 15 batches like the demo's first three
    assert run(stream) == []


# examples/reasoning_gym_letter_counting.yaml as it is (SmolLM2-135M-Instruct, 8 prompts x G=8, T=0.7): its first 18
# steps' answers/* and frac_reward_zero_std as metrics.jsonl logged them (rounded to 4 places), 2026-12-07 (float32,
# 150-210 s a step under load 6-16; the evals cut to 8 held-out prompts, which the training steps do not read; stopped
# after step 18). Its own console printed the warning at step 16.
LETTER_COUNTING_STEPS = [  # (distinct answers per group, top share, reference top share, groups without signal)
    (4.125, 0.0781, 0.625, 0.375), (6.5, 0.0625, 0.375, 0.125), (7.25, 0.0781, 0.75, 0.25), (7.375, 0.0625, 0.5, 0.0),
    (7.75, 0.0625, 0.5, 0.0), (6.375, 0.1094, 0.375, 0.125), (7.5, 0.0938, 0.5, 0.125), (6.625, 0.2344, 0.75, 0.125),
    (5.125, 0.2812, 0.5, 0.0), (5.0, 0.3594, 0.875, 0.25), (4.25, 0.5469, 0.875, 0.125), (4.5, 0.5469, 0.875, 0.5),
    (3.25, 0.6875, 0.5, 0.625), (1.625, 0.7344, 0.75, 0.75), (1.5, 0.9375, 0.5, 0.625), (1.125, 0.9844, 0.5, 0.875),
    (1.25, 0.9062, 0.625, 0.875), (1.25, 0.9531, 0.875, 0.75)]


def test_answer_collapse_fires_on_letter_counting():
    # The bar is max(0.5, mean reference top share so far + 0.1), and the warning comes at the third batch in a row
    # at or above it. Sums of the reference shares: steps 1-12 7.5, 13: 8.0, 14: 8.75, 15: 9.25, 16: 9.75. Step 12:
    # 0.5469 < 7.5/12 + 0.1 = 0.725; 13: 0.6875 < 8.0/13 + 0.1 = 0.715 (the policy says "1" as often as the
    # references hold it, 57% of this task's keys: not yet a collapse); 14: 0.7344 >= 8.75/14 + 0.1 = 0.725 (first);
    # 15: 0.9375 >= 9.25/15 + 0.1 = 0.717 (second); 16: 0.9844 >= 9.75/16 + 0.1 = 0.709 (third): the warning at step
    # 16 with step 16's share, once (17 and 18 stay above the bar, so it does not re-arm).
    stream = [{"answers/distinct_per_group": d, "answers/top_share": t, "answers/reference_top_share": r,
               "frac_reward_zero_std": z} for d, t, r, z in LETTER_COUNTING_STEPS]
    warnings = run(stream)
    assert [(step, kind) for step, kind, _ in warnings] == [(16, "answer_collapse")]
    assert warnings[0][2] == 0.9844


def test_calls_the_parser_ignored_warn_at_once_with_their_forms_and_the_parser_that_reads_them():
    # Qwen2.5-Coder-0.5B under tools.parser hermes: 7 fenced and 1 bare call written, none tagged, so all 8 ignored;
    # the rule has no patience (one batch of silently dropped calls is one too many) and warns once per stretch
    d = Diagnostics(max_completion_length=128)
    step = {"tools/ignored_calls": 8.0, "tools/call_forms/tagged": 0.0, "tools/call_forms/fenced": 7.0,
            "tools/call_forms/bare": 1.0}
    (warning,) = d.observe(1, step)
    assert (warning.kind, warning.metric, warning.value) == ("ignored_calls", "tools/ignored_calls", 8.0)
    assert "wrote 8 tool call(s) that tools.parser does not read" in warning.message
    assert "(calls written this batch by form: fenced 7, bare 1)" in warning.message and "tools.parser: json" in warning.message
    assert d.observe(2, step) == []  # once
    assert d.observe(3, {"tools/ignored_calls": 0.0}) == [] and len(d.observe(4, step)) == 1  # re-armed after it cleared
