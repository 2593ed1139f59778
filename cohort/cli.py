"""The `cohort` command line: train (and --resume), eval, plan, report, compare, config show, convert, tasks, rewards list.

Every command takes an optional YAML config file followed by dotted overrides
(`rollout.num_generations=8`). Configuration problems are reported before any
model loads, each with the fields involved and a fix, and exit with status 2.
`cohort train` shows only cohort's own lines (the rest goes to RUN_DIR/logs/engine.log)
and turns a run-time failure into one message and exit status 4 (docs/runs.md).

Each command imports what it needs inside its own function, on purpose: `cohort --help`,
`cohort plan` and `cohort config show` answer without loading the trainer, vLLM or Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _split_config_args(args: list[str]) -> tuple[str | None, list[str]]:
    """The first argument is a config file unless it looks like an override (has '=')."""
    if args and "=" not in args[0]:
        return args[0], list(args[1:])
    return None, list(args)


def _fields_help() -> str:
    from cohort.config.fields import describe_fields

    lines = ["configuration fields (set in the YAML file or as section.field=value):"]
    for key, typ, default, help_text in describe_fields():
        lines.append(f"  {key} = {default}  [{typ}]")
        lines += ["      " + line for line in textwrap.wrap(help_text, 88)]
    return "\n".join(lines)


def _load(args_list: list[str], *, check_files: bool = True, say_source=None, for_gpu: bool = False, trains: bool = True):
    """The validated run (`RunPlan`: the resolved config, the batch plan, what was read); with say_source (a stream),
    first write the one line that says where the values came from. `for_gpu`: choose model.dtype=auto as on a GPU
    (planning a GPU run from another machine); `trains`: False for `cohort eval` (no training memory to compare)."""
    from cohort.config.resolve import resolve_config
    from cohort.plan.validate import choose_model_dtype, model_dir_of, validate_config

    path, overrides = _split_config_args(args_list)
    resolved = resolve_config(path, overrides)
    _say_notes(resolved.notes)
    if say_source is not None and "WORLD_SIZE" not in os.environ:  # torchrun children: their parent said it
        # (what model.dtype = auto becomes, said before the checks; a train.device problem: validate_config reports it)
        cfg = resolved.config
        chosen = choose_model_dtype(cfg, model_dir_of(cfg) if cfg.model.dtype == "auto" else None, for_gpu=for_gpu)[1]
        print(f"config: {resolved.source}" + (f"; {chosen}" if chosen else ""), file=say_source, flush=True)
    return validate_config(resolved.config, check_files=check_files, for_gpu=for_gpu, trains=trains)


def _say_notes(notes: tuple[str, ...]) -> None:
    """One line on stderr per old field name the config used (torchrun children read their parent's new-layout file)."""
    if "WORLD_SIZE" not in os.environ:
        for note in notes:
            print(f"config: {note}", file=sys.stderr, flush=True)


def _resume_config(target: str, overrides: list[str]):
    """The validated run being resumed (RUN_DIR/config.yaml) with `overrides`; the run directory stays the same."""
    from pathlib import Path

    from cohort.config import ConfigError
    from cohort.config.resolve import resolve_config
    from cohort.trainer.checkpoint import is_checkpoint_dir
    from cohort.plan.validate import validate_config

    path = Path(target)
    run_dir = path.parent.parent if is_checkpoint_dir(path) else path
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError([f"--resume {target}: no config.yaml in {run_dir}; give the run directory of an earlier `cohort train`"])
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError([f"--resume takes overrides only (section.field=value), got {', '.join(bad)}"])
    resolved = resolve_config(run_dir / "config.yaml", overrides)  # a config file: never re-preset
    _say_notes(resolved.notes)  # a run saved before a field was renamed
    if "WORLD_SIZE" not in os.environ:
        print(f"config: {resolved.source} (the run being resumed)", flush=True)
    cfg = resolved.config
    cfg.run.output_dir = str(run_dir)
    return validate_config(cfg)


def cmd_train(ns) -> int:
    plan = _resume_config(ns.resume, ns.config) if ns.resume else _load(ns.config, say_source=sys.stdout)
    from cohort.launch.launch import run_config

    summary = run_config(plan, ["train", *ns.config] + (["--resume", ns.resume] if ns.resume else []), resume=ns.resume)
    if isinstance(summary, int):  # train.num_processes > 1: the torchrun children did the work
        return summary
    if summary is None:  # a rank > 0 of a multi-process run
        return 0
    if summary.get("stopped"):
        print(summary["message"])
        return 0
    before, after = summary.get("eval/accuracy_before"), summary.get("eval/accuracy_after")
    if before is not None and after is not None:
        print(f"held-out greedy accuracy: {before:.1%} before → {after:.1%} after ({summary['eval/gain']})")
        _say_breakdown(summary)
    print(f"{summary['steps']} steps in {summary['wall_s']:.1f} s; run directory: {summary['run_dir']}")
    _say_where(summary["run_dir"])
    return 0


def _say_breakdown(summary: dict) -> None:
    """The result's second line: the constant answer's accuracy, beyond the common answers and pass@k, before → after."""
    get = summary.get
    if get("eval/constant_accuracy_after") is not None:
        beyond_before, beyond_after = get("eval/beyond_common_accuracy_before"), get("eval/beyond_common_accuracy_after")
        print(f'  a constant "{get("eval/constant_answer_after")}" scores {get("eval/constant_accuracy_after"):.1%}; beyond '
              f"the two most common answers ({get('eval/beyond_common_prompts_after')} prompts): {beyond_before:.1%} → "
              f"{beyond_after:.1%}" + _chance_after(summary))
    passes = sorted(k[len("eval/"):-len("_after")] for k in summary if k.startswith("eval/pass@") and k.endswith("_after"))
    if passes and all(f"eval/{p}_before" in summary for p in passes):
        print("  " + ", ".join(f"{p} {get(f'eval/{p}_before'):.1%} → {get(f'eval/{p}_after'):.1%}" for p in passes)
              + f" ({get('eval/pass_samples_after')} samples per prompt at T={get('eval/pass_temperature_after'):g})")


def _chance_after(summary: dict) -> str:
    """' (chance after: 16.0%)': what the trained model's answers score beyond the common answers if they ignored the
    question; '' for a summary without it."""
    chance = summary.get("eval/beyond_common_chance_after")
    return "" if chance is None else f" (chance after: {chance:.1%})"


def _say_where(run_dir: str) -> None:
    """The closing lines of `cohort train`: where the plot, the trained model and the report are (what a first run's
    reader looks for next)."""
    from pathlib import Path

    run = Path(run_dir)
    if (run / "reward_curve.png").is_file():
        print(f"  reward curve: {run / 'reward_curve.png'}")
    if (run / "final").is_dir():
        print(f"  trained model: {run / 'final'} (a transformers checkpoint)")
    print(f"  report (every plot and sample completions, one HTML page): cohort report {run} -> {run / 'report' / 'report.html'}")


def cmd_report(ns) -> int:
    from cohort.runs.report import write_report

    path = write_report(ns.run_dir, ns.out)
    print(f"report: {path}")
    return 0


def cmd_compare(ns) -> int:
    from cohort.runs.report import write_comparison

    path = write_comparison(ns.run_dirs, ns.out)
    print(f"comparison: {path}")
    return 0


def cmd_config_show(ns) -> int:
    import yaml

    cfg = _load(ns.config, check_files=False).config
    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
    return 0


def cmd_plan(ns) -> int:
    run = _load(ns.config, say_source=sys.stdout, for_gpu=ns.gpu_memory_gib is not None)
    from cohort.models.devices import resolve_device
    from cohort.models import host_memory
    from cohort.plan.printout import format_plan
    from cohort.plan.validate import plan_gpu_memory

    total = None if ns.gpu_memory_gib is None else int(ns.gpu_memory_gib * 2**30)
    gpu = plan_gpu_memory(run.config, run.batch, total)  # (None: no GPU split to show)
    on_cpu = total is None and resolve_device(run.config.train.device).type == "cpu"
    print(format_plan(run.config, run.batch, gpu=gpu, machine=host_memory.machine_memory() if on_cpu else None))
    return 0


def cmd_eval(ns) -> int:
    plan = _load(ns.config, say_source=sys.stderr, trains=False)  # stdout is the JSON result
    cfg = plan.config
    import tempfile
    import time
    from pathlib import Path

    from cohort.console import capture_output
    from cohort.runs.answer_stats import eval_line
    from cohort.trainer.evaluate import evaluate_model

    # as in `cohort train`, the engine's and libraries' output goes to a log (eval has no run directory: a temp file)
    handle, log = tempfile.mkstemp(prefix="cohort-eval-", suffix=".log")
    os.close(handle)
    samples = cfg.run.eval_num_samples if ns.num_samples is None else ns.num_samples
    temperature = cfg.rollout.temperature if ns.temperature is None else ns.temperature
    pass_k = cfg.run.eval_pass_k if ns.pass_k is None else ns.pass_k
    if samples < 0 or pass_k < 1:
        print(f"cohort eval: --num-samples must be >= 0 and --pass-k >= 1; got {samples} and {pass_k}", file=sys.stderr)
        return 2
    how = f"greedily, then {samples} samples each at T={temperature:g} for pass@k" if samples else "greedily"
    print(f"eval: loading {cfg.model.path} and scoring the held-out prompts {how} (what the engine prints: {log}) ...",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    with capture_output(Path(log), verbose=cfg.run.verbose):
        result = evaluate_model(cfg, num_samples=samples, pass_k=pass_k, temperature=temperature,
                                environment=plan.environment)
    if result is None:
        print("no eval data: set data.eval_files or data.dataset_test_split (or use a built-in task)", file=sys.stderr)
        return 2
    print(f"eval: {eval_line(result)}; {time.perf_counter() - start:.0f} s", file=sys.stderr)
    result.pop("completions")
    print(json.dumps(result, indent=2))
    return 0


def cmd_convert(ns) -> int:
    from cohort.convert.core import convert_input, render
    from cohort.convert.sources import SourceError

    try:
        conversion = convert_input(ns.source, kind=ns.kind, rows=ns.rows, num_processes=ns.num_processes)
    except (SourceError, OSError) as exc:
        print(f"cohort convert: {exc}", file=sys.stderr)
        return 2
    text = render(conversion)
    if ns.out:
        with open(ns.out, "w") as f:
            f.write(text)
    else:
        print(text, end="")
    where = ns.out or "the YAML above"
    print(f"cohort convert: {len(conversion.entries)} cohort fields set from {conversion.source_name}'s options; "
          f"{len(conversion.unmapped)} not mapped:", file=sys.stderr)
    for item in conversion.unmapped:
        print(f"  - {item.line(conversion.source_name)}", file=sys.stderr)
    for note in conversion.notes:
        print(f"  note: {note}", file=sys.stderr)
    for problem in conversion.refusals:
        print(f"  cohort plan refuses: {problem}", file=sys.stderr)
    print(f"check {where} without loading anything: cohort plan {ns.out or 'CONFIG.yaml'}", file=sys.stderr)
    return 0


def cmd_tasks(ns) -> int:
    from cohort.data import reasoning_gym
    from cohort.data.tasks import get_task, list_tasks

    if ns.source:  # reasoning_gym (all 105 and composite) or reasoning_gym:<name>
        source, _, name = ns.source.partition(":")
        if source != "reasoning_gym":
            print(f"cohort tasks: unknown task source {source!r}; `cohort tasks reasoning_gym` lists reasoning-gym's tasks",
                  file=sys.stderr)
            return 2
        try:
            print(reasoning_gym.format_tasks(name or None), end="")
        except ValueError as exc:
            print(f"cohort tasks: {exc}", file=sys.stderr)
            return 2
        return 0
    for name in list_tasks():
        task = get_task(name)
        print(f"{name}: {task.description} ({len(task.train_rows)} train / {len(task.eval_rows)} eval prompts)")
    print(f"reasoning_gym:<name>: reasoning-gym's {len(reasoning_gym.task_names()) - 1} procedural tasks and its composite mix, "
          "each scored by its own score_answer (data.task_config sets its fields); `cohort tasks reasoning_gym` lists them "
          "with their fields and defaults")
    return 0


def cmd_rewards_list(ns) -> int:
    from cohort.rewards import format_builtins

    print(format_builtins())
    return 0


def _add_convert_command(sub) -> None:
    """`cohort convert`: a verl launch script or a TRL config (or command) as a cohort YAML."""
    conv = sub.add_parser("convert", help="rewrite a verl main_ppo launch script (or its arguments) or a TRL GRPO "
                          "config (YAML or JSON) as a cohort YAML, each line naming the option it came from")
    conv.add_argument("source", nargs="+", help="a verl launch script; verl's key=value arguments (put `--` first when "
                      "they start with python3 -m ...); the YAML `trl grpo --config` takes, or GRPOConfig's keyword "
                      "arguments as a .json file; or a script running `trl grpo` / `accelerate launch SCRIPT.py --key value`")
    conv.add_argument("-o", "--out", help="write the cohort YAML here (default: standard output); what is not mapped "
                      "also goes to standard error")
    conv.add_argument("--from", dest="kind", choices=["verl", "trl", "trl_command"], help="the source (default: "
                      ".yaml/.yml/.json is a TRL config; a script or arguments running `trl grpo` or `accelerate launch` "
                      "is trl_command; anything else verl)")
    conv.add_argument("--rows", type=int, help="training prompts in the data, to turn epochs into train.max_steps when "
                      "the data file is not on this machine")
    conv.add_argument("--num-processes", type=int, default=1, help="TRL: accelerate's --num_processes when the input "
                      "does not give it (the completions of an optimizer step are per_device_train_batch_size × this × gradient_accumulation_steps)")
    conv.set_defaults(func=cmd_convert)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cohort", description="Online RL from verifiable rewards (GRPO, RLOO, REINFORCE++, PPO) for language models.")
    sub = parser.add_subparsers(dest="command")
    train = sub.add_parser("train", help="train a policy (no model or data of your own: the embedded tiny:arith demo "
                           "with its preset, examples/arith.yaml)",
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_fields_help())
    train.add_argument("config", nargs="*", help="[CONFIG.yaml] [section.field=value ...]")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest checkpoint (or from the "
                       "checkpoint directory given), with RUN_DIR/config.yaml plus any overrides")
    train.set_defaults(func=cmd_train)
    report = sub.add_parser("report", help="plots (PNG) and a self-contained HTML page for a run directory")
    report.add_argument("run_dir", help="a run directory written by `cohort train`")
    report.add_argument("--out", help="where to write (default: RUN_DIR/report)")
    report.set_defaults(func=cmd_report)
    compare = sub.add_parser("compare", help="overlay the curves of several runs (PNG + HTML)")
    compare.add_argument("run_dirs", nargs="+", help="two or more run directories")
    compare.add_argument("--out", default="compare-report", help="where to write (default: ./compare-report)")
    compare.set_defaults(func=cmd_compare)
    config = sub.add_parser("config", help="inspect configurations")
    config_sub = config.add_subparsers(dest="config_command")
    show = config_sub.add_parser("show", help="print the resolved config")
    show.add_argument("config", nargs="*", help="[CONFIG.yaml] [section.field=value ...]")
    show.set_defaults(func=cmd_config_show)
    plan = sub.add_parser("plan", help="validate a config and print its batch schedule, loading nothing")
    plan.add_argument("config", nargs="*", help="[CONFIG.yaml] [section.field=value ...]")
    plan.add_argument("--gpu-memory-gib", type=float, default=None,
                      help="also show how a GPU of this many GiB would be split between the trainer and vLLM (on a "
                           "machine whose training device is a GPU, that GPU's split is shown without it)")
    plan.set_defaults(func=cmd_plan)
    ev = sub.add_parser("eval", help="score model.path on the eval data with the configured rewards")
    ev.add_argument("config", nargs="*", help="[CONFIG.yaml] [section.field=value ...]")
    ev.add_argument("--num-samples", type=int, default=None, help="after the greedy pass, this many sampled completions per "
                    "prompt for pass@1 and pass@k (default: run.eval_num_samples, 4; 0: greedy only)")
    ev.add_argument("--pass-k", type=int, default=None, help="the k of pass@k, at most --num-samples (default: run.eval_pass_k, 4)")
    ev.add_argument("--temperature", type=float, default=None, help="the samples' temperature (default: rollout.temperature, "
                    "the run's sampling temperature)")
    ev.set_defaults(func=cmd_eval)
    _add_convert_command(sub)
    tasks = sub.add_parser("tasks", help="list the built-in tasks (and reasoning-gym's: `cohort tasks reasoning_gym`)")
    tasks.add_argument("source", nargs="?", help="reasoning_gym: every reasoning-gym task with its config fields and "
                       "defaults; reasoning_gym:<name>: that one")
    tasks.set_defaults(func=cmd_tasks)
    rewards = sub.add_parser("rewards", help="reward functions")
    rewards_sub = rewards.add_subparsers(dest="rewards_command")
    rl = rewards_sub.add_parser("list", help="list the built-in reward functions with their options")
    rl.set_defaults(func=cmd_rewards_list)
    from cohort.agents.chat import ChatCompletions
    from cohort.rollout.server.app import add_serve_command

    add_serve_command(sub, chat=ChatCompletions)
    return parser


def _user_errors() -> tuple[type[Exception], ...]:
    """Problems of the config, data, model, a checkpoint or a run directory's file: reported as they are worded, exit 2."""
    from cohort.launch.launch import USER_ERRORS

    return USER_ERRORS


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:
        argv = ["train"]
    ns, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(ns, "config", None), list) and not any(arg.startswith("-") for arg in extra):
        ns.config += extra  # overrides after an option (`cohort eval CONFIG --num-samples 0 run.output_dir=D`)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not hasattr(ns, "func"):
        parser.print_help()
        return 2
    from cohort.trainer.failure import RunFailed
    from cohort.trainer.stopping import RunHalted

    try:
        return ns.func(ns)
    except _user_errors() as exc:
        print(f"cohort: {exc}", file=sys.stderr)
        return 2
    except RunHalted as exc:
        print(f"cohort: {exc}", file=sys.stderr)
        return 3
    except RunFailed as exc:
        print(f"cohort: {exc}", file=sys.stderr)
        return 4
    except KeyboardInterrupt:
        print("cohort: interrupted (a second signal, or one before training started); the newest checkpoint under "
              "RUN_DIR/checkpoints, if any, is the last saved state", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
