"""The training loop: a whole run of `Trainer.step()` calls, with eval before, logs, checkpoints, eval after, outputs.

`run_training(trainer)` drives a `Trainer` (its one step: cohort/trainer/trainer.py) from above: the loop itself is
`_run`'s `while`: one step, its metrics line, diagnostics, sampled completions, a mid-run eval, a checkpoint, until
train.max_steps or a stop signal. The helpers around it take what they read: the trainer's parts (`TrainerParts`),
its `TrainerState`, or what a checkpoint holds (`trainer.checkpointed()`, cohort/trainer/checkpoint.py).

Outputs in the run directory: `config.yaml` (the resolved config), `metrics.jsonl`
(one line per step, flushed), `completions.jsonl` (samples every
`run.log_completions_every` steps), `eval.jsonl`, `warnings.jsonl` (diagnostics),
`checkpoints/step-N/` (every `run.save_every` steps, on a stop, and at the end when
saving is on), `final/` (a transformers checkpoint with tokenizer), `summary.json`
and `reward_curve.png`.

Stopping: the first SIGINT/SIGTERM finishes the current step, saves a checkpoint
and returns (the CLI exits 0 and prints how to resume); a second one aborts. A
non-finite loss or gradient norm rewinds to the start of that step (the weights
never changed), saves that last good state and raises `RunHalted`. Any other
failure saves the last consistent state the same way where there is one and
raises `RunFailed` (cohort/trainer/failure.py says which state that is); so does a
run whose every episode failed for run.max_failed_steps steps in a row (a step's
failed episodes are said on the console and in warnings.jsonl:
cohort/trainer/episode_failures.py), after that step's lines are written.
Resuming (`resume_from`) restores a checkpoint (the newest intact one of a run
directory: damaged ones are named and set aside, cohort/trainer/checkpoint.py),
drops log lines written after it by the interrupted process, skips the "before"
eval and appends.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import torch
import yaml

from cohort.models.pretrained import write_config_dtype
from cohort.data.datasets import PromptDataset
from cohort.rollout.base import with_observation
from cohort.trainer import checkpoint, failure
from cohort.trainer.diagnostics import Diagnostics
from cohort.trainer.episode_failures import EpisodeFailures, FailureWatch
from cohort.trainer.evaluate import evaluate
from cohort.trainer.parts import TrainerParts
from cohort.trainer.state import Checkpointed, TrainerState
from cohort.trainer.trainer import Trainer
from cohort.runs.jsonl import read_jsonl
from cohort.runs.loggers import JsonlWriter, MetricsLogger
from cohort.runs.answer_stats import eval_parts, gain_line
from cohort.runs.report import load_run, plot_reward
from cohort.trainer.stopping import GracefulStop, NonFiniteError, RunHalted

CONSOLE_COLUMNS = 80  # the eval's indented lines fit a terminal of this width (a pipe's rich console is 80 wide)


def run_eval(trainer: Trainer, label: str, sink: JsonlWriter) -> dict:
    """The held-out eval (greedy, every eval prompt; before and after training also pass@k from run.eval_num_samples
    samples per prompt) with the current policy pushed first; its record, also in `sink` (cohort/trainer/evaluate.py
    says what it holds)."""
    parts, cfg = trainer.parts, trainer.cfg
    if parts.eval_data is None:
        return {}
    trainer.sync.push()
    start = time.perf_counter()
    # through the rollout scheduler, which shares the engine with the groups in flight
    result = evaluate(trainer.scheduler, parts.tokenizer, parts.eval_data, parts.eval_ids, parts.rewards,
                      max_tokens=cfg.rollout.max_completion_length,
                      num_samples=0 if label == "during" else cfg.run.eval_num_samples, pass_k=cfg.run.eval_pass_k,
                      temperature=cfg.rollout.temperature, seed=cfg.rollout.seed,
                      first_row=len(parts.train_data.rows))
    result.pop("completions")
    record = {"label": label, "step": trainer.state.step, **result, "seconds": time.perf_counter() - start}
    sink.write(record)
    return record


def _eval_work(cfg, prompts: int) -> str:
    """What the before/after eval does, for the line said while it runs (within the console's 80 columns)."""
    samples = cfg.run.eval_num_samples
    extra = f" + {samples} samples each at T={cfg.rollout.temperature:g}" if samples else ""
    return f"{prompts} held-out prompts, greedy{extra}"


def _print_eval(logger: MetricsLogger, label: str, record: dict) -> None:
    """An eval's result: its first part after the label, each other part on indented lines within CONSOLE_COLUMNS, so a
    terminal's wrapping never makes an unprefixed line."""
    head, *rest = eval_parts(record)
    logger.print(f"{label}: {head}")
    for part in rest:  # (a long part, such as why there is no breakdown, goes on over indented lines of its own)
        for line in textwrap.wrap(part, width=CONSOLE_COLUMNS - 2, subsequent_indent="  "):
            logger.print(f"  {line}")


def _log_completions(state: TrainerState, data: PromptDataset, sink: JsonlWriter, n: int) -> None:
    """The first `n` (run.num_completions_to_log) completions the step just taken trained on (a slice of the batch when
    it spans several steps), with their prompts from the train `data`."""
    batch, key, step = state.batch, data.prompt_key, state.step
    for i in state.step_indices[:n]:
        row, tools = data.rows[batch.row_indices[i]], batch.tool_record(i)
        prompt = with_observation(row[key], tools["observation"]) if "observation" in tools else row[key]  # as shown
        sink.write({"step": step, "prompt": prompt, "completion": batch.completions_text[i],
                    "reward": float(batch.rewards[i]), "advantage": batch.sequence_advantage(i),
                    "finish_reason": "length" if batch.truncated[i] else "stop",
                    **tools})  # multi-turn: the conversation, tool turns marked by role "tool"


def _report_failures(failures: EpisodeFailures | None, watch: FailureWatch, step: int, logger: MetricsLogger,
                     sink: JsonlWriter) -> None:
    """A step's failed episodes: the count and the first message on the console and in warnings.jsonl; `EpisodesFailed`
    raised once every episode failed for run.max_failed_steps steps in a row (cohort/trainer/episode_failures.py).
    `failures` None: the step trained on a batch generated earlier, already reported."""
    if failures is None:
        return
    warning = watch.observe(step, failures)
    if warning is not None:
        logger.print(warning.text)
        sink.write(warning.record())
    if watch.stop is not None:
        raise watch.stop


def save_model(parts: TrainerParts, directory: Path, *, lora_merged: bool = False) -> None:
    """The trained model as a transformers checkpoint in model.dtype (float32 master weights cast down when mixed);
    under LoRA the adapter, and the merged model too with `lora_merged` (lora.save_merged)."""
    if parts.lora is not None:  # LoRA: final/adapter/, and final/ merged when asked (models/lora.py)
        parts.lora.save_final(directory, parts.tokenizer, parts.precision.compute_dtype, merged=lora_merged)
        return
    state = parts.dist.full_state_dict(parts.policy)  # multi-process: gathered on rank 0 (collective); else None
    if not parts.dist.is_main:
        return
    directory.mkdir(parents=True, exist_ok=True)
    precision = parts.precision
    if precision.mixed:
        state = cast_state_dict(state or parts.policy.state_dict(), precision.compute_dtype)
    parts.policy.save_pretrained(str(directory), safe_serialization=True, state_dict=state)
    if precision.mixed:
        write_config_dtype(directory, precision.compute_dtype)
    parts.tokenizer.save_pretrained(str(directory))


def cast_state_dict(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor cast to `dtype`; names that shared one tensor (tied embeddings) still share one, so it is saved once."""
    cast: dict[int, torch.Tensor] = {}  # data pointer -> its cast copy (every original stays alive in `state`)
    out = {}
    for name, tensor in state.items():
        if tensor.data_ptr() not in cast:
            cast[tensor.data_ptr()] = tensor.detach().to(dtype)
        out[name] = cast[tensor.data_ptr()]
    return out


def run_training(trainer: Trainer, resume_from: str | Path | None = None) -> dict:
    """Run `trainer` to train.max_steps (see the module docstring); `resume_from`: a run directory (its newest intact
    checkpoint) or one checkpoint directory. A failure after setup raises `RunFailed` once the last good state is saved."""
    try:
        return _run(trainer, resume_from)
    except (RunHalted, checkpoint.CheckpointError):
        raise
    except Exception as exc:
        raise failure.run_failed(trainer.checkpointed(), exc) from exc


def _run(trainer: Trainer, resume_from: str | Path | None) -> dict:
    cfg, parts, state = trainer.cfg, trainer.parts, trainer.state
    run_dir, saved = parts.run_dir, trainer.checkpointed()  # (what each checkpoint saves: the same parts all run long)
    wall_start = time.perf_counter()
    resumed = _resume(saved, resume_from) if resume_from is not None else None
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    eval_sink = JsonlWriter(run_dir / "eval.jsonl")
    samples = JsonlWriter(run_dir / "completions.jsonl")
    warnings_sink = JsonlWriter(run_dir / "warnings.jsonl")
    logger = MetricsLogger(run_dir, cfg.run.loggers, total_steps=cfg.train.max_steps, progress=cfg.run.progress,
                           config=cfg.to_dict(), start_step=state.step, wandb_project=cfg.run.wandb_project)
    diagnostics = Diagnostics(max_completion_length=cfg.rollout.max_completion_length,
                              teacher_signal=cfg.algorithm.name == "distill") if cfg.run.diagnostics else None
    failures = FailureWatch(cfg.run.max_failed_steps)  # failed episodes: each step's line, the stop when all fail
    before = _opening(trainer, logger, eval_sink, resumed)
    history, saved_step, stopped = [], (state.step if resumed else None), None
    stop = GracefulStop(logger.print)
    try:
        with stop:
            # every process follows rank 0's decision, so none starts a step the others skip
            while state.step < cfg.train.max_steps and not (stopped := parts.dist.broadcast_object(stop.requested)):
                metrics = _guarded_step(trainer)
                step = state.step
                history.append({"step": step, **metrics})
                logger.log(step, metrics)
                for warning in diagnostics.observe(step, metrics) if diagnostics else []:
                    logger.print(warning.text)
                    warnings_sink.write(warning.record())
                if cfg.run.log_completions_every and (step % cfg.run.log_completions_every == 0 or step == 1):
                    _log_completions(state, parts.train_data, samples, cfg.run.num_completions_to_log)
                _report_failures(trainer.take_failures(), failures, step, logger, warnings_sink)  # may stop the run
                if cfg.run.eval_every and step % cfg.run.eval_every == 0 and step < cfg.train.max_steps:
                    mid = run_eval(trainer, "during", eval_sink)
                    logger.log(step, {"eval/accuracy": mid["accuracy"]}) if mid else None
                if cfg.run.save_every and step % cfg.run.save_every == 0:
                    checkpoint.save_checkpoint(saved)
                    saved_step = step
    finally:
        logger.close()
        warnings_sink.close()
    if stopped:
        summary = _summary(state.step, run_dir, history, before, {}, time.perf_counter() - wall_start)
        summary.update(stopped=stopped, message=_stop_message(saved, stopped, saved_step))
    else:
        if parts.eval_data is not None:
            logger.print(f"eval after training: {_eval_work(cfg, len(parts.eval_data.rows))} ...")
        after = run_eval(trainer, "after", eval_sink)
        if after:
            _print_eval(logger, "eval after training", after)
        save_model(parts, run_dir / "final", lora_merged=cfg.lora.save_merged)
        if cfg.run.save_every and saved_step != state.step:
            checkpoint.save_checkpoint(saved)
        summary = _summary(state.step, run_dir, history, before, after, time.perf_counter() - wall_start)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _plot_rewards(run_dir, before, summary.get("eval/accuracy_after"), algorithm=cfg.algorithm.name)
    eval_sink.close()
    samples.close()
    return summary


def _opening(trainer: Trainer, logger: MetricsLogger, eval_sink: JsonlWriter, resumed: str | None) -> dict | None:
    """The console's lines before the first step (what was resumed, the prompts filtered) and the eval before training
    (a resumed run's is read back from eval.jsonl, not run again); returns that eval's result."""
    parts = trainer.parts
    if resumed:
        logger.print(resumed)
    if parts.prompts_filtered:
        renderer = parts.renderer
        logger.print(f"filtered {parts.prompts_filtered} prompt(s) longer than {renderer.limit_name} = {renderer.max_prompt_length}")
    if parts.eval_data is not None and not resumed:  # (minutes on a real model: say what the silence is)
        logger.print(f"eval before training: {_eval_work(trainer.cfg, len(parts.eval_data.rows))} ...")
    before = _earlier_eval(parts.run_dir, "before") if resumed else run_eval(trainer, "before", eval_sink)
    if before and not resumed:
        _print_eval(logger, "eval before training", before)
    return before


def _stop_message(saved: Checkpointed, signal_name: str, saved_step: int | None) -> str:
    """Save the state of a stopped run (unless just saved) and say how to resume it."""
    step, run_dir = saved.state.step, saved.parts.run_dir
    done = f"stopped by {signal_name} after step {step}"
    if (reason := checkpoint.unsupported(saved.parts.dist)) is not None:
        return f"{done}; no checkpoint: {reason}"
    path = checkpoint.save_checkpoint(saved) if saved_step != step else checkpoint.latest_checkpoint(run_dir)
    return f"{done}; checkpoint {path}. Resume with: cohort train --resume {run_dir}"


def _guarded_step(trainer: Trainer) -> dict:
    """`trainer.step()`; on a failure, the trainer is settled in its newest consistent state (cohort/trainer/failure.py):
    a non-finite loss or gradient rewinds to the step's start, saves it and raises `RunHalted`; any other failure
    raises `StepFailed` from the error."""
    saved = trainer.checkpointed()
    start = failure.StepStart.take(saved)
    watch = failure.OptimizerWatch(trainer.parts.optimizer)
    try:
        with watch:
            return trainer.step()
    except Exception as exc:
        phase = trainer.phases.failed  # read before settle() rewinds the phase timers
        verdict = failure.settle(saved, trainer.phases, start, watch.stepped)
        if isinstance(exc, NonFiniteError):  # (raised before the optimizer step: always rewound)
            raise failure.halted(saved, exc) from exc
        raise failure.StepFailed(start.state.step + 1, phase, verdict) from exc


def _resume(saved: Checkpointed, resume_from: str | Path) -> str:
    """Restore the newest intact checkpoint of a run directory (or the given checkpoint); returns the lines for the log."""
    resumed = checkpoint.resume(Path(resume_from), lambda path: checkpoint.load_checkpoint(saved, path))
    meta = resumed.meta
    dropped = checkpoint.truncate_logs(saved.parts.run_dir, meta["step"])
    lost = sum(dropped.values())
    extra = f"; dropped {lost} log line(s) written after it" if lost else ""
    if resumed.verdict.status == "unverified":
        extra += "; unverified: it has no manifest (written before checkpoints were verified)"
    line = f"resumed from {resumed.path} at step {meta['step']} (policy version {meta['policy_version']}){extra}"
    return "\n".join([*resumed.notes, line])


def _earlier_eval(run_dir: Path, label: str) -> dict:
    found = [r for r in read_jsonl(run_dir / "eval.jsonl") if r.get("label") == label]
    return found[-1] if found else {}


# an eval record's fields that summary.json repeats, as eval/<key>_before and eval/<key>_after (docs/runs.md)
SUMMARY_EVAL_KEYS = ("accuracy", "constant_answer", "constant_accuracy", "chance_accuracy", "common_answers",
                     "beyond_common_accuracy", "beyond_common_prompts", "beyond_common_chance", "by_reference", "answers", "breakdown_missing",
                     "pass_samples", "pass_temperature")


def _summary(steps: int, run_dir: Path, history: list[dict], before: dict, after: dict, wall_s: float) -> dict:
    """summary.json: steps taken, wall time, the last step's metrics, the median step time, the evals' accuracies."""
    last = history[-1] if history else {}
    summary = {"steps": steps, "wall_s": wall_s, "run_dir": str(run_dir),
               "final_metrics": {k: v for k, v in last.items() if isinstance(v, (int, float))}}
    if history:
        step_times = sorted(h["timing/step_s"] for h in history[1:]) or [history[0]["timing/step_s"]]
        summary["median_step_s"] = step_times[len(step_times) // 2]
    for label, record in (("before", before), ("after", after)):
        summary.update({f"eval/{key}_{label}": value for key, value in record.items() if key in SUMMARY_EVAL_KEYS
                        or key.startswith("pass@")})
    if before and after:
        summary["eval/gain"] = gain_line(before, after)
    return summary


def _plot_rewards(run_dir: Path, before, after_accuracy, *, algorithm: str = "grpo") -> None:
    """RUN_DIR/reward_curve.png: `cohort report`'s reward plot (cohort/runs/report.py), titled with the held-out accuracy."""
    title = f"cohort {algorithm.upper()}"
    if before and after_accuracy is not None:
        title += f" — held-out greedy accuracy {before['accuracy']:.1%} → {after_accuracy:.1%}"
    plot_reward(load_run(run_dir), run_dir, file_name="reward_curve.png", title=title)
