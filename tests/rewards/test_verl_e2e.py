"""`cohort train` on a verl parquet with `accuracy` and a verl-contract function, hf engine, tiny model, 3 steps.

Every completion of every step is logged, so each logged reward can be recomputed by
hand: accuracy against the row's `reward_model.ground_truth`, plus 0.5 × the verl
function's score. Before this change the run died at step 1 (`accuracy` found no
`solution` or `answer`) and the verl function got TRL's keyword arguments.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from cohort import cli
from cohort.rewards import get

pytest.importorskip("math_verify")

VERL_MODULE = textwrap.dedent('''
    CALLS = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        CALLS.append((data_source, ground_truth, extra_info["index"]))
        return {"score": solution_str.count("7") / 8, "chars": len(solution_str)}
''')
QUESTIONS = [("lighteval/MATH", "Half of 1?", r"\frac{1}{2}"), ("openai/gsm8k", "6*12?", "72"),
             ("lighteval/MATH", "Root of 4?", "2"), ("openai/gsm8k", "7+0?", "7")]


@pytest.mark.slow
def test_cohort_train_on_a_verl_parquet_with_accuracy_and_a_verl_function(tmp_path, monkeypatch, tiny_model_dir, verl_parquet, capsys):
    (tmp_path / "user_verl_e2e.py").write_text(VERL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = verl_parquet(QUESTIONS)
    run_dir = tmp_path / "run"
    code = cli.main([
        "train", f"model.path={tiny_model_dir}", f"data.train_files=[{data}]", "data.max_prompt_length=64",
        "engine.name=hf", "rollout.num_generations=2", "rollout.max_completion_length=8", "train.prompts_per_step=2",
        "train.micro_batch_size=4", "train.max_steps=3", "train.learning_rate=1e-3",
        "rewards=[{name: accuracy, num_workers: 1}, {name: user_verl_e2e.compute_score, weight: 0.5}]",
        f"run.output_dir={run_dir}", "run.progress=false", "run.loggers=[jsonl]", "run.log_completions_every=1",
        "run.num_completions_to_log=4",
    ])
    assert code == 0, capsys.readouterr()
    import user_verl_e2e

    truths = {question: (source, truth, i) for i, (source, question, truth) in enumerate(QUESTIONS)}
    # 3 steps x 2 prompts x 2 generations: 12 calls, one per completion, each with its row's verl fields
    assert len(user_verl_e2e.CALLS) == 12 and set(user_verl_e2e.CALLS) <= set(truths.values())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    logged = [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == 12
    accuracy = get("accuracy", num_workers=1)
    try:
        for row in logged:
            source, truth, _ = truths[row["prompt"][0]["content"]]
            [acc] = accuracy(completions=[row["completion"]], ground_truth=[truth])
            assert row["reward"] == pytest.approx(acc + 0.5 * row["completion"].count("7") / 8, abs=1e-6)
    finally:
        accuracy.close()
    for step in metrics:  # the dict's extra key, averaged over the step's 4 completions
        texts = [r["completion"] for r in logged if r["step"] == step["step"]]
        assert step["rewards/compute_score/chars"] == pytest.approx(sum(map(len, texts)) / 4)
        assert "rewards/accuracy/mean" in step
