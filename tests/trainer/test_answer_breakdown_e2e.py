"""`cohort eval` and `cohort train` on the letter_counting example (SmolLM2-135M-Instruct through vLLM, reasoning-gym's
own scorer) print the constant-answer baseline, the accuracy beyond the two most common answers and pass@k, and
summary.json has them.

Shrunk to minutes: the example's first 16 held-out questions (`data.task_eval_size=16`), 2 samples per prompt for
pass@k, one training step of 2 prompts x G=4. Hand-counted from the split (entries 0..15 of reasoning-gym's dataset
for seed 0; entries are deterministic per index, whatever the dataset's size): the key is "1" for 12, "2" for 3 and
"4" for 1 (question 15). So a constant "1" scores 12/16 = 75.0%, the two most common answers are "1" and "2", and one
prompt lies beyond them.
"""

from __future__ import annotations

import json

import pytest

from cohort import cli
from cohort.runs.answer_stats import chance_verdict

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

EXAMPLE = "examples/reasoning_gym_letter_counting.yaml"
SMALL = ["data.task_eval_size=16", "run.eval_num_samples=2", "run.eval_pass_k=2"]


def test_cohort_eval_prints_the_breakdown(smollm2_dir, tmp_path, capsys):
    code = cli.main(["eval", EXAMPLE, *SMALL, f"run.output_dir={tmp_path / 'run'}"])
    captured = capsys.readouterr()
    out = json.loads(captured.out[captured.out.index("{\n"):])  # (vLLM, in this process, may print a line before it)
    assert code == 0 and out["num_prompts"] == 16
    assert out["constant_answer"] == "1" and out["constant_accuracy"] == 0.75
    assert out["common_answers"] == ["1", "2"] and out["beyond_common_prompts"] == 1
    assert out["beyond_common_accuracy"] in (0.0, 1.0)  # one prompt: right or wrong
    assert out["pass_samples"] == 2 and out["pass_temperature"] == 0.7  # the example's rollout.temperature
    assert 0.0 <= out["pass@1"] <= out["pass@2"] <= 1.0
    answers = out["answers"]
    assert sum(count for _, count in answers["top"]) + answers["no_answer"] <= 16 and answers["distinct"] >= 1
    # the three references cover every item: chance = 12/16 x said("1") + 3/16 x said("2") + 1/16 x said("4"), and
    # beyond the common answers (question 15, key "4") it is how often the model says "4"
    by_ref = {answer: (items, accuracy, said) for answer, items, accuracy, said in out["by_reference"]}
    assert {answer: items for answer, (items, _, _) in by_ref.items()} == {"1": 12, "2": 3, "4": 1}
    assert out["chance_accuracy"] == pytest.approx(sum(items / 16 * said for items, _, said in by_ref.values()), abs=1e-12)
    assert out["beyond_common_chance"] == pytest.approx(by_ref["4"][2], abs=1e-12)
    verdict = chance_verdict(out["beyond_common_accuracy"], out["beyond_common_chance"], 1)
    line = captured.err.splitlines()[-1]
    assert line.startswith(f"eval: accuracy {out['accuracy']:.1%} on 16 held-out prompts; constant answer \"1\": 75.0%; "
                           f"if its answers ignored the question: {out['chance_accuracy']:.1%}; "
                           f"beyond the two most common answers (\"1\", \"2\"; 1 prompts): {verdict}; "
                           f"right on each reference vs how often it says it: \"1\" {by_ref['1'][1]:.1%} vs {by_ref['1'][2]:.1%}, "
                           f"\"2\" {by_ref['2'][1]:.1%} vs {by_ref['2'][2]:.1%}, \"4\" {by_ref['4'][1]:.1%} vs {by_ref['4'][2]:.1%}; "
                           f"pass@1 {out['pass@1']:.1%}, pass@2 {out['pass@2']:.1%} (2 samples at T=0.7); answers: ")


def test_cohort_train_prints_the_breakdown_and_summary_has_it(smollm2_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = cli.main(["train", EXAMPLE, *SMALL, "train.max_steps=1", "train.prompts_per_step=2", "rollout.num_generations=4",
                     "train.micro_batch_size=8", f"run.output_dir={run_dir}", "run.progress=false"])
    out = capsys.readouterr().out
    assert code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    for label in ("before", "after"):
        assert summary[f"eval/constant_answer_{label}"] == "1" and summary[f"eval/constant_accuracy_{label}"] == 0.75
        assert summary[f"eval/common_answers_{label}"] == ["1", "2"] and summary[f"eval/beyond_common_prompts_{label}"] == 1
        assert 0.0 <= summary[f"eval/pass@1_{label}"] <= summary[f"eval/pass@2_{label}"] <= 1.0
        assert summary[f"eval/pass_samples_{label}"] == 2 and "top" in summary[f"eval/answers_{label}"]
    before, after = summary["eval/accuracy_before"], summary["eval/accuracy_after"]
    beyond = summary["eval/beyond_common_accuracy_before"], summary["eval/beyond_common_accuracy_after"]
    verdict = chance_verdict(beyond[1], summary["eval/beyond_common_chance_after"], 1)
    gain = (f"{(after - before) * 100:+.1f} points; beyond the two most common answers: {(beyond[1] - beyond[0]) * 100:+.1f}, "
            f"after training {verdict}")
    assert summary["eval/gain"] == gain
    assert f"held-out greedy accuracy: {before:.1%} before → {after:.1%} after ({gain})" in out
    assert (f'  a constant "1" scores 75.0%; beyond the two most common answers (1 prompts): {beyond[0]:.1%} → '
            f"{beyond[1]:.1%} (chance after: {summary['eval/beyond_common_chance_after']:.1%})") in out
    assert (f"  pass@1 {summary['eval/pass@1_before']:.1%} → {summary['eval/pass@1_after']:.1%}, pass@2 "
            f"{summary['eval/pass@2_before']:.1%} → {summary['eval/pass@2_after']:.1%} (2 samples per prompt at T=0.7)") in out
    records = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [r["label"] for r in records] == ["before", "after"] and all(r["constant_accuracy"] == 0.75 for r in records)
    # the answers/* metrics of the step: 8 completions in 2 groups of 4
    (metrics,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"answers/' in line]
    assert 1.0 <= metrics["answers/distinct_per_group"] <= 4.0 and 0.125 <= metrics["answers/top_share"] <= 1.0
    assert metrics["answers/reference_top_share"] in (0.5, 1.0)  # 2 prompts: the same key or two
