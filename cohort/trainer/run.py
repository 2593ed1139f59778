"""A whole training run around the step loop: eval before, steps, eval after, outputs.

Outputs in the run directory: `config.yaml` (the resolved config), `metrics.jsonl`
(one line per step, flushed), `completions.jsonl` (samples every
`run.log_completions_every` steps), `eval.jsonl`, `final/` (a transformers
checkpoint with tokenizer), `summary.json` and `reward_curve.png`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from cohort.trainer.evaluate import evaluate
from cohort.trainer.loggers import JsonlWriter, MetricsLogger


def run_eval(trainer, label: str, sink: JsonlWriter) -> dict:
    if trainer.eval_data is None:
        return {}
    trainer.sync_weights()
    start = time.perf_counter()
    result = evaluate(trainer.engine, trainer.tokenizer, trainer.eval_data, trainer.eval_ids, trainer.rewards,
                      max_tokens=trainer.cfg.rollout.max_completion_length)
    record = {"label": label, "step": trainer.step_count, "accuracy": result["accuracy"], "reward": result["reward"],
              "num_prompts": result["num_prompts"], "seconds": time.perf_counter() - start}
    sink.write(record)
    return record


def _log_completions(trainer, sink: JsonlWriter, step: int) -> None:
    batch, n = trainer.batch, trainer.cfg.run.num_completions_to_log
    key = trainer.train_data.prompt_key
    for i in range(min(n, len(batch))):
        row = trainer.train_data.rows[batch.row_indices[i]]
        sink.write({"step": step, "prompt": row[key], "completion": batch.completions_text[i],
                    "reward": float(batch.rewards[i]), "advantage": float(batch.advantages[i]),
                    "finish_reason": "length" if batch.truncated[i] else "stop"})


def save_model(trainer, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    trainer.policy.save_pretrained(str(directory), safe_serialization=True)
    trainer.tokenizer.save_pretrained(str(directory))


def run_training(trainer) -> dict:
    cfg, run_dir = trainer.cfg, trainer.run_dir
    wall_start = time.perf_counter()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    eval_sink = JsonlWriter(run_dir / "eval.jsonl")
    samples = JsonlWriter(run_dir / "completions.jsonl")
    logger = MetricsLogger(run_dir, cfg.run.loggers, total_steps=cfg.train.max_steps, progress=cfg.run.progress,
                           config=cfg.to_dict())
    if trainer.prompts_filtered:
        logger.print(f"filtered {trainer.prompts_filtered} prompt(s) longer than data.max_prompt_length = {cfg.data.max_prompt_length}")
    before = run_eval(trainer, "before", eval_sink)
    if before:
        logger.print(f"eval before training: accuracy {before['accuracy']:.3f} on {before['num_prompts']} held-out prompts")
    history = []
    try:
        while trainer.step_count < cfg.train.max_steps:
            metrics = trainer.step()
            step = trainer.step_count
            history.append({"step": step, **metrics})
            logger.log(step, metrics)
            if cfg.run.log_completions_every and (step % cfg.run.log_completions_every == 0 or step == 1):
                _log_completions(trainer, samples, step)
            if cfg.run.eval_every and step % cfg.run.eval_every == 0 and step < cfg.train.max_steps:
                mid = run_eval(trainer, "during", eval_sink)
                logger.log(step, {"eval/accuracy": mid["accuracy"]}) if mid else None
            if cfg.run.save_every and step % cfg.run.save_every == 0:
                save_model(trainer, run_dir / f"checkpoint-{step}")
    finally:
        logger.close()
    after = run_eval(trainer, "after", eval_sink)
    save_model(trainer, run_dir / "final")
    summary = _summary(trainer, history, before, after, time.perf_counter() - wall_start)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _plot_rewards(history, run_dir / "reward_curve.png", before, after)
    eval_sink.close()
    samples.close()
    return summary


def _summary(trainer, history, before, after, wall_s) -> dict:
    last = history[-1] if history else {}
    summary = {"steps": trainer.step_count, "wall_s": wall_s, "run_dir": str(trainer.run_dir),
               "final_metrics": {k: v for k, v in last.items() if isinstance(v, (int, float))}}
    if history:
        step_times = sorted(h["timing/step_s"] for h in history[1:]) or [history[0]["timing/step_s"]]
        summary["median_step_s"] = step_times[len(step_times) // 2]
    if before:
        summary["eval/accuracy_before"] = before["accuracy"]
    if after:
        summary["eval/accuracy_after"] = after["accuracy"]
    return summary


def _plot_rewards(history, path: Path, before, after) -> None:
    if not history:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    rewards = [h.get("reward", float("nan")) for h in history]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rewards, alpha=0.35, label="reward (per generation batch)")
    window = max(1, len(rewards) // 15)
    smooth = [sum(rewards[max(0, i - window + 1): i + 1]) / len(rewards[max(0, i - window + 1): i + 1]) for i in range(len(rewards))]
    ax.plot(steps, smooth, label=f"reward (moving mean, {window} steps)")
    title = "cohort GRPO"
    if before and after:
        title += f" — held-out greedy accuracy {before['accuracy']:.1%} → {after['accuracy']:.1%}"
    ax.set(xlabel="optimizer step", ylabel="mean reward", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
