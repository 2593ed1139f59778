"""`cohort report` and `cohort compare`: PNGs that hold the curves, one self-contained HTML page.

A hand-written run directory pins what goes where (which plot exists for which
metrics, escaping, embedding); a real 6-step run checks the whole path from
`cohort train` to the page, including a diagnostics warning.
"""

from __future__ import annotations

import base64
import json
import re

import matplotlib.image
import pytest

from cohort import cli
from cohort.runs.report import PHASE_KEY, _facts, load_run, moving_mean, write_report


def write_run(run_dir, *, steps=20, with_kl=True, reward_offset=0.0):
    run_dir.mkdir(parents=True)
    lines = []
    for s in range(1, steps + 1):
        record = {"step": s, "reward": reward_offset + s / steps, "rewards/accuracy/mean": s / steps, "rewards/format/mean": 0.5,
                  "entropy": 2.0 - s / steps, "completions/mean_length": 10.0 + s, "completions/min_length": 5.0,
                  "completions/max_length": 20.0 + s, "completions/clipped_ratio": 0.1, "clip_ratio/low": 0.01 * s,
                  "clip_ratio/high": 0.0, "clip_ratio/region": 0.01 * s, "loss": 0.0, "grad_norm": 1.0, "learning_rate": 1e-5,
                  "timing/generate_s": 1.0, "timing/reward_s": 0.2, "timing/update_s": 0.5, "timing/reward/accuracy_s": 9.0,
                  "timing/step_s": 1.8}
        if with_kl:
            record["kl"] = 0.001 * s
        lines.append(json.dumps(record))
    lines.append(json.dumps({"step": 10, "eval/accuracy": 0.4}))  # the eval line the driver adds
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "eval.jsonl").write_text("".join(json.dumps({"label": l, "step": s, "accuracy": a}) + "\n"
                                                for l, s, a in (("before", 0, 0.25), ("during", 10, 0.4), ("after", steps, 0.75))))
    (run_dir / "completions.jsonl").write_text("".join(
        json.dumps({"step": s, "prompt": "2+2=", "completion": "<script>alert(1)</script> 4", "reward": 1.0, "advantage": 0.5,
                    "finish_reason": "stop"}) + "\n" for s in (1, 10, 20)))
    (run_dir / "warnings.jsonl").write_text(json.dumps({"step": 7, "kind": "length_limit", "metric": "completions/clipped_ratio",
                                                        "value": 0.9, "message": "most completions stop at the limit"}) + "\n")
    (run_dir / "config.yaml").write_text("train:\n  max_steps: 20\n")
    (run_dir / "summary.json").write_text(json.dumps({"steps": steps, "wall_s": 36.0, "eval/accuracy_before": 0.25,
                                                      "eval/accuracy_after": 0.75}))
    return run_dir


@pytest.mark.slow
def test_report_writes_every_plot_and_embeds_them(tmp_path):
    run_dir = write_run(tmp_path / "run")
    page = write_report(run_dir)
    out = run_dir / "report"
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["accuracy.png", "clipping.png", "kl_entropy.png", "length.png", "optimization.png", "reward.png", "timing.png"]
    assert matplotlib.image.imread(out / "reward.png").shape[:2] == (440, 1210)  # 11 × 4 in at 110 dpi (two panels)
    text = page.read_text()
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert sorted(base64.b64decode(e) for e in embedded) == sorted((out / p).read_bytes() for p in pngs)
    assert "&lt;script&gt;alert(1)&lt;/script&gt; 4" in text and "<script>" not in text  # completions are escaped
    assert text.count("<details") == 3 and "step 20: 1 completions, mean reward 1.000" in text
    assert "most completions stop at the limit" in text and "(step 7)" in text
    assert "max_steps: 20" in text
    assert "25.0% → 75.0%" in text


def test_plots_only_what_was_logged(tmp_path):
    run_dir = tmp_path / "bare"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": 0.1 * s, "entropy": 1.0}) + "\n"
                                                   for s in range(1, 4)))
    write_report(run_dir, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").glob("*.png")) == ["kl_entropy.png", "reward.png"]
    assert "No completions logged" in (tmp_path / "out" / "report.html").read_text()


def test_timing_plot_uses_phases_only(tmp_path):
    run = load_run(write_run(tmp_path / "run"))
    phases = sorted({m.group(1) for k in run.keys() if (m := PHASE_KEY.match(k))})
    assert phases == ["generate", "reward", "step", "update"]  # timing/reward/accuracy_s is a reward function, not a phase


def test_moving_mean():
    assert moving_mean([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]


def test_compare_overlays_runs(tmp_path, capsys):
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", with_kl=False, reward_offset=1.0)
    assert cli.main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    assert "comparison:" in capsys.readouterr().out
    names = sorted(p.name for p in (tmp_path / "cmp").glob("*.png"))
    assert names == ["compare_accuracy.png", "compare_completions_mean_length.png", "compare_entropy.png", "compare_kl.png",
                     "compare_reward.png", "compare_timing_step_s.png"]
    assert (tmp_path / "cmp" / "compare.html").read_text().count("data:image/png;base64,") == len(names)


@pytest.fixture(scope="module")
def real_run(tiny_model_dir, tmp_path_factory):
    from cohort.config.resolve import load_config
    from cohort.trainer.trainer import Trainer
    from cohort.trainer.run import run_training

    root = tmp_path_factory.mktemp("report-run")
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(12)))
    run_dir = root / "run"
    # max_completion_length 4: the random model rarely stops that early, so the length-limit warning fires at step 3
    trainer = Trainer(load_config(None, [
        f"model.path={tiny_model_dir}", f"data.train_files=[{data}]", f"data.eval_files=[{data}]", "data.max_prompt_length=16",
        "engine.name=hf", "rollout.num_generations=4", "rollout.max_completion_length=4", "train.prompts_per_step=2",
        "train.micro_batch_size=8", "train.max_steps=6", "train.learning_rate=1e-3", "algorithm.beta=0.01",
        "rewards=[{name: numeric_match}]", f"run.output_dir={run_dir}", "run.progress=false",
        "run.loggers=[jsonl, tensorboard]", "run.log_completions_every=2"]))
    run_training(trainer)
    trainer.close()
    return run_dir


@pytest.mark.slow
def test_report_on_a_real_run(real_run, capsys):
    assert cli.main(["report", str(real_run)]) == 0
    assert f"report: {real_run}/report/report.html" in capsys.readouterr().out
    pngs = sorted(p.name for p in (real_run / "report").glob("*.png"))
    assert pngs == ["accuracy.png", "clipping.png", "kl_entropy.png", "length.png", "optimization.png", "reward.png", "timing.png"]
    warnings = [json.loads(line) for line in (real_run / "warnings.jsonl").read_text().splitlines()]
    # numeric_match scores the random model 0 everywhere: every group has zero std, and every completion hits the limit
    assert [(w["step"], w["kind"]) for w in warnings] == [(3, "reward_zero_std"), (3, "length_limit")]
    html = (real_run / "report" / "report.html").read_text()
    assert "rollout.max_completion_length = 4 tokens" in html
    assert html.count("<details") == 4  # completions logged at steps 1, 2, 4, 6


@pytest.mark.slow  # (real_run trains)
def test_tensorboard_events_hold_the_metrics(real_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(real_run / "tensorboard"))
    events.Reload()
    metrics = [json.loads(line) for line in (real_run / "metrics.jsonl").read_text().splitlines()]
    scalars = events.Scalars("reward")
    assert [e.step for e in scalars] == [m["step"] for m in metrics if "reward" in m] == [1, 2, 3, 4, 5, 6]
    assert [e.value for e in scalars] == pytest.approx([m["reward"] for m in metrics if "reward" in m], rel=1e-6)
    assert "kl" in events.Tags()["scalars"] and "timing/update_s" in events.Tags()["scalars"]


def test_report_facts_show_the_answer_breakdown(tmp_path):
    run_dir = write_run(tmp_path / "run", steps=3)
    before = {"label": "before", "step": 0, "accuracy": 0.187, "num_prompts": 300, "constant_answer": "1",
              "constant_accuracy": 0.57, "common_answers": ["1", "2"], "beyond_common_accuracy": 0.106,
              "beyond_common_prompts": 47, "answers": {"top": [["10", 150], ["1", 88]], "distinct": 9, "no_answer": 0}}
    after = {**before, "label": "after", "step": 3, "accuracy": 0.557, "beyond_common_accuracy": 0.0,
             "answers": {"top": [["1", 292]], "distinct": 3, "no_answer": 0}}
    (run_dir / "eval.jsonl").write_text(json.dumps(before) + "\n" + json.dumps(after) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"steps": 3, "eval/accuracy_before": 0.187, "eval/accuracy_after": 0.557,
                                                      "eval/gain": "+37.0 points; beyond the two most common answers: -10.6"}))
    facts = _facts(load_run(run_dir))
    assert "18.7% → 55.7% (+37.0 points; beyond the two most common answers: -10.6)" in facts
    assert ("<td><b>eval after</b></td><td>accuracy 55.7% on 300 held-out prompts; constant answer &quot;1&quot;: 57.0%; "
            "beyond the two most common answers (&quot;1&quot;, &quot;2&quot;; 47 prompts): 0.0%; answers: &quot;1&quot; x292 "
            "(3 distinct)</td>") in facts
    assert "<td><b>eval before</b></td><td>accuracy 18.7%" in facts
