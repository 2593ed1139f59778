"""cohort against TRL, each as its users run it, on every workload, idle and beside one busy process: one JSON object.

For each workload × variant × load, one subprocess runs N optimizer steps and the driver reads its per-step metrics
(cohort's RUN_DIR/metrics.jsonl; trl_grpo_step.py's --metrics-file in the same names) while sampling the CPU time of
the run's processes from /proc. Each run is a fresh process (its own engine, its own OpenMP runtime).

Workloads (same model directory, prompts, reward, batch shape, lr 1e-4, beta 0, dapo loss on both sides; cohort's precision
is model.dtype=auto's choice: float32 below 3M parameters (tiny, long*), bf16 mixed at m6 and m31 on a CPU with bf16 units, which TRL's
`trl_bf16` matches and `trl_default`, bf16=False, does not):
  tiny     4 prompts × G=8, 16 tokens, the tiny Qwen2 (hidden 128, 4 layers; bench/_common.py)
  long128  8 × 8, 128 tokens, the same model
  long256  8 × 8, 256 tokens (the long-tail one: p50 ≈ 130, a third cut at the limit)
  m6       8 × 8, 128 tokens, a 5.9M Qwen2 (hidden 256, 6 layers, 4 heads, 2 KV heads, intermediate 1024)
  m31      8 × 8, 128 tokens, the 31.5M Qwen2 (hidden 512, 8 layers, 8 heads, 4 KV heads, intermediate 2048)

Variants (`--list` prints them with what each sets). `cohort_default` is `python -m cohort.cli train` with only the
workload's fields: the CLI's own environment and every performance setting at its default. `trl_default` is
bench/trl_grpo_step.py at TRL's defaults (its docstring lists each setting). Every other variant is a labelled
best-settings candidate; `candidate: false` marks those that change the algorithm (one step off-policy), which can
never be a default. The driver removes from the children's environment every variable that changes OpenMP or
thread behaviour (SPEED_VARS: `make` exports OMP_WAIT_POLICY=PASSIVE, say) and then sets only the variant's own.

Loads: `idle`, and `busy`: one competing CPU-bound process started by the driver for the run's whole life:
`python -c "while True: pass"` (one thread, always runnable, nice 0, no CPU affinity: the scheduler gives it about one
of the two cores, as any compile or test job would take). Its CPU is reported (`spinner_cpu_cores`) and left out of
`foreign_cores`, which counts what *other* processes used: a run with foreign_cores >= 0.2 was not alone (`clean`).

Per run: median s/step over steps 2..N (`timing/step_s`, the first step excluded), `wall_per_step_s` (the wall time
between the first and the last metrics line / (N-1): also what the loop does between steps, logging included), per
phase its median and share of the median step, and idle fractions over the same window (first to last metrics line):
- `trainer_cpu_cores`, `engine_cpu_cores`: CPU seconds per wall second of the trainer process (all its threads, from
  /proc/<pid>/stat utime+stime) and of its descendants (engine.mode=local_server: the `cohort serve` engine child;
  colocate: none, the engine is inside the trainer);
- `trainer_idle_fraction` = 1 − trainer_cpu_cores / trainer_cores and `engine_idle_fraction` = 1 − engine_cpu_cores /
  engine_cores: trainer_cores is the number of CPUs in the union of the trainer's threads' affinity masks (all of
  them: it is never bound), engine_cores the cores in the engine child's VLLM_CPU_OMP_THREADS_BIND (its compute
  threads are bound there), else its affinity. A spinning OpenMP thread counts as busy, so under
  OMP_WAIT_POLICY=ACTIVE these understate the waiting;
- `engine_idle_fraction_phase` = 1 − (generate + sync) / step: the share of the step the engine has no work, from the
  timing phases (the only definition for colocate, where engine and trainer share a process; with overlap meaningless).

    .venv/bin/python bench/compare.py [--workloads tiny long128 ...] [--variants cohort_default trl_default ...|@preset]
                                      [--load idle busy] [--steps 6] [--quick] [--out bench/compare.json] [--list]

`--quick`: 2 steps per run (1 measured), to check that every variant runs; its numbers mean nothing.
bench/compare_table.py turns the JSON into the markdown tables that rank the default candidates.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import _common as common
from compare_table import markdown_tables

TRL_PYTHON = common.BENCH_DIR / ".trl-venv" / "bin" / "python"
TRL_VLLM_PYTHON = common.BENCH_DIR / ".trl-vllm-venv" / "bin" / "python"
WHEN_IDLE = common.REPO.parent / "shared" / "tools" / "when-idle"
SPIN_CODE = "while True: pass"
POLL_S = 0.02  # /proc and metrics-file sampling period (a few syscalls; ~1% of a core)
# Variables that change OpenMP, MKL or tokenizer threading: removed from every child's environment, then set per variant.
SPEED_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES",
              "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "KMP_BLOCKTIME", "TOKENIZERS_PARALLELISM", "VLLM_CPU_OMP_THREADS_BIND",
              "VLLM_CPU_KVCACHE_SPACE")


@dataclass(frozen=True)
class Workload:
    prompts_per_step: int
    num_generations: int
    max_completion_length: int
    model: str  # "tiny", "6m" or "31m"
    timeout_s: float


WORKLOADS = {
    "tiny": Workload(4, 8, 16, "tiny", 900),
    "long128": Workload(8, 8, 128, "tiny", 1200),
    "long256": Workload(8, 8, 256, "tiny", 1500),
    "m6": Workload(8, 8, 128, "6m", 1800),
    "m31": Workload(8, 8, 128, "31m", 2400),
}


@dataclass(frozen=True)
class Variant:
    side: str  # "cohort" or "trl"
    note: str
    args: tuple[str, ...] = ()  # cohort: config overrides ({per_step} = completions per step); trl: script flags
    env: dict = field(default_factory=dict)
    candidate: bool = True  # on-policy, so it could be a default
    python: Path | None = None  # trl: the venv's interpreter
    checkout: Path | None = None  # cohort: another checkout's cohort (--before REV), instead of this one


OMP_DEFAULT = {"OMP_WAIT_POLICY": "default"}  # an invalid value: libgomp ignores it = unset (OMP_DISPLAY_ENV shows spin 300000)
LOCAL = ("engine.mode=local_server",)
VARIANTS = {
    "cohort_default": Variant("cohort", "`cohort train` as is: the CLI's environment, every performance setting at its default"),
    "cohort_omp_default": Variant("cohort", "OpenMP's own default wait policy (spin 300k iterations, then sleep) instead of what "
                                  "the CLI sets; OMP_WAIT_POLICY=default is ignored by libgomp as invalid, exactly unset, and "
                                  "reaches the engine child too", env=OMP_DEFAULT),
    "cohort_passive": Variant("cohort", "OMP_WAIT_POLICY=PASSIVE", env={"OMP_WAIT_POLICY": "PASSIVE"}),
    "cohort_active": Variant("cohort", "OMP_WAIT_POLICY=ACTIVE", env={"OMP_WAIT_POLICY": "ACTIVE"}),
    "cohort_spin10k": Variant("cohort", "GOMP_SPINCOUNT=10000 (spin ~0.1 ms, then sleep; overrides the policy's count)",
                              env={"GOMP_SPINCOUNT": "10000"}),
    "cohort_spin1m": Variant("cohort", "GOMP_SPINCOUNT=1000000 (spin ~10 ms, then sleep)", env={"GOMP_SPINCOUNT": "1000000"}),
    "cohort_threads1": Variant("cohort", "train.num_threads=1", ("train.num_threads=1",)),
    "cohort_threads2": Variant("cohort", "train.num_threads=2", ("train.num_threads=2",)),
    "cohort_whole_batch": Variant("cohort", "the whole step as one micro-batch, split by a 2,048-token budget (the old bench's "
                                  "fast path)", ("train.micro_batch_size={per_step}", "train.max_tokens_per_microbatch=2048")),
    "cohort_one_micro": Variant("cohort", "the whole step as one micro-batch (train.micro_batch_size = the step's completions)",
                                ("train.micro_batch_size={per_step}",)),
    "cohort_one_micro_threads2": Variant("cohort", "one micro-batch per step and train.num_threads=2",
                                         ("train.micro_batch_size={per_step}", "train.num_threads=2")),
    "cohort_hf": Variant("cohort", "engine.name=hf (transformers generation on the trainer's own weights)", ("engine.name=hf",)),
    "cohort_hf_omp_default": Variant("cohort", "engine.name=hf, OpenMP's default wait policy", ("engine.name=hf",), OMP_DEFAULT),
    "cohort_hf_threads1": Variant("cohort", "engine.name=hf, train.num_threads=1 (no OpenMP hand-offs at all)",
                                  ("engine.name=hf", "train.num_threads=1")),
    "cohort_local": Variant("cohort", "engine.mode=local_server (vLLM in a child process, on-policy)", LOCAL),
    "cohort_local_split": Variant("cohort", "local_server on-policy, the engine's process on the last core and the trainer on "
                                  "one thread (the update streams over finished groups while the rest generate)",
                                  (*LOCAL, "engine.num_threads=1", "train.num_threads=1")),
    "cohort_local_omp_default": Variant("cohort", "local_server, OpenMP's default wait policy", LOCAL, OMP_DEFAULT),
    "cohort_local_active": Variant("cohort", "local_server, OMP_WAIT_POLICY=ACTIVE", LOCAL, {"OMP_WAIT_POLICY": "ACTIVE"}),
    "cohort_local_overlap": Variant("cohort", "local_server + pipeline.max_staleness=1: one step off-policy (never a default)",
                                    LOCAL + ("pipeline.max_staleness=1",), candidate=False),
    "cohort_partial": Variant("cohort", "pipeline.over_provision=1.5: partial rollouts (resumed prefixes one or more steps "
                              "off-policy, never a default)", ("pipeline.over_provision=1.5",), candidate=False),
    "cohort_partial2": Variant("cohort", "pipeline.over_provision=2: partial rollouts, twice the step's groups in flight "
                               "(never a default)", ("pipeline.over_provision=2",), candidate=False),
    "cohort_partial3": Variant("cohort", "pipeline.over_provision=3: partial rollouts, three times the step's groups in flight "
                               "(never a default)", ("pipeline.over_provision=3",), candidate=False),
    "cohort_async2": Variant("cohort", "pipeline.max_staleness=2: asynchronous, up to 2 versions off-policy (never a default)",
                             ("pipeline.max_staleness=2",), candidate=False),
    "cohort_local_async2": Variant("cohort", "local_server + pipeline.max_staleness=2 (never a default)",
                                   LOCAL + ("pipeline.max_staleness=2",), candidate=False),
    "cohort_float32": Variant("cohort", "model.dtype=float32 (the default before model.dtype=auto)", ("model.dtype=float32",)),
    "cohort_bf16": Variant("cohort", "model.dtype=bfloat16 (bf16 mixed precision, float32 masters)", ("model.dtype=bfloat16",)),
    "trl_default": Variant("trl", "TRL 1.16 GRPOTrainer at its defaults but bf16=False (bench/trl_grpo_step.py's docstring)"),
    "trl_bf16": Variant("trl", "TRL 1.16 GRPOTrainer at its defaults, bf16=True included (use_cpu=True so that it starts)",
                        ("--bf16",)),
    "trl_threads2": Variant("trl", "torch.set_num_threads(2), the issue's user script", ("--threads", "2")),
    "trl_no_gc": Variant("trl", "gradient_checkpointing=False (TRL's default is True)", ("--no-gradient-checkpointing",)),
    "trl_active": Variant("trl", "OMP_WAIT_POLICY=ACTIVE", env={"OMP_WAIT_POLICY": "ACTIVE"}),
    "trl_no_gc_active": Variant("trl", "gradient_checkpointing=False and OMP_WAIT_POLICY=ACTIVE", ("--no-gradient-checkpointing",),
                                {"OMP_WAIT_POLICY": "ACTIVE"}),
    "trl_passive": Variant("trl", "OMP_WAIT_POLICY=PASSIVE: how the withdrawn numbers ran TRL", env={"OMP_WAIT_POLICY": "PASSIVE"}),
    "trl_vllm": Variant("trl", "TRL's colocated vLLM path (bench/.trl-vllm-venv), gradient_checkpointing=False",
                        ("--vllm", "--no-gradient-checkpointing"), python=TRL_VLLM_PYTHON),
}
PRESETS = {
    "@defaults": ["cohort_default", "trl_default"],
    "@decide": ["cohort_default", "cohort_omp_default", "cohort_active", "cohort_spin10k", "cohort_threads1", "cohort_hf",
                "cohort_local", "cohort_local_omp_default", "trl_default", "trl_no_gc", "trl_no_gc_active"],
    "@offpolicy": ["cohort_default", "cohort_partial", "cohort_partial2", "cohort_async2", "cohort_local", "cohort_local_async2"],
    "@all": list(VARIANTS),
}


# --------------------------------------------------------------------------- one run


def child_env(variant: Variant) -> tuple[dict, list[str]]:
    """The driver's environment without SPEED_VARS, plus the variant's own; and the names removed."""
    removed = sorted(k for k in SPEED_VARS if k in os.environ)
    env = {k: v for k, v in os.environ.items() if k not in SPEED_VARS}
    env["PYTHONPATH"] = str(variant.checkout or common.REPO)  # this checkout's cohort (and bench._common for the reward)
    env.update(variant.env)
    return env, removed


def command(variant: Variant, workload: Workload, model_dir: Path, steps: int, run_dir: Path) -> list[str]:
    """The command line a user would type for this run (cohort: the CLI with the workload's fields only)."""
    if variant.side == "trl":
        return [str(variant.python or TRL_PYTHON), str(common.BENCH_DIR / "trl_grpo_step.py"), "--steps", str(steps),
                "--prompts-per-step", str(workload.prompts_per_step), "--num-generations", str(workload.num_generations),
                "--max-completion-length", str(workload.max_completion_length), "--learning-rate", "1e-4",
                "--model-dir", str(model_dir), "--metrics-file", str(run_dir / "metrics.jsonl"), *variant.args]
    per_step = workload.prompts_per_step * workload.num_generations
    return [sys.executable, "-m", "cohort.cli", "train",
            f"model.path={model_dir}", f"data.train_files=[{common.addition_file(64)}]",
            f"rollout.num_generations={workload.num_generations}", f"rollout.max_completion_length={workload.max_completion_length}",
            "rollout.temperature=1.0", "algorithm.beta=0.0", "algorithm.loss_type=dapo",
            f"train.prompts_per_step={workload.prompts_per_step}", "train.learning_rate=1e-4", f"train.max_steps={steps}",
            "rewards=[{name: 'bench._common:addition_reward'}]", f"run.output_dir={run_dir}",
            *(a.format(per_step=per_step) for a in variant.args)]


class Sampler:
    """CPU times of the run's process tree and the machine, snapshotted whenever a new metrics line appears."""

    def __init__(self, pid: int, spinner: int | None, metrics: Path):
        self.pid, self.spinner, self.metrics = pid, spinner, metrics
        self.lines, self.size, self.snapshots = 0, -1, []
        self.engine_cpu: dict[int, float] = {}
        self.engine_cores = 0
        self.children_checked = 0.0

    def poll(self) -> None:
        now = time.time()
        if now - self.children_checked > 0.5:
            for pid in common.descendants(self.pid):
                self.engine_cpu.setdefault(pid, 0.0)
            self.children_checked = now
        for pid in list(self.engine_cpu):
            used = common.process_cpu_s(pid)
            if used is not None:
                self.engine_cpu[pid] = used
        try:
            size = self.metrics.stat().st_size
        except OSError:
            return
        if size == self.size:
            return
        self.size = size
        lines = self.metrics.read_text().count("\n")
        if lines > self.lines:
            self.lines = lines
            self.snapshots.append(self.snapshot(lines))

    def snapshot(self, lines: int) -> dict:
        engines = [p for p in self.engine_cpu if common.process_cpu_s(p) is not None]
        self.engine_cores = max([common.bound_cores(p) for p in engines] or [self.engine_cores])
        return {"t": time.perf_counter(), "lines": lines, "trainer": common.process_cpu_s(self.pid) or 0.0,
                "engine": sum(self.engine_cpu.values()), "machine": common.machine_busy_s(),
                "spinner": common.process_cpu_s(self.spinner) if self.spinner else 0.0,
                "driver": common.process_cpu_s(os.getpid()), "trainer_cores": common.affinity_cores(self.pid),
                "engine_cores": self.engine_cores}


def run_one(name: str, workload_name: str, load: str, steps: int, model_dir: Path, gate: bool) -> dict:
    """One subprocess run of `name` on `workload_name` under `load`; its summary (or an error with the log's tail)."""
    variant, workload = VARIANTS[name], WORKLOADS[workload_name]
    run_dir = common.CACHE / "compare" / f"{workload_name}-{name}-{load}-{os.getpid()}-{int(time.time())}"
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = command(variant, workload, model_dir, steps, run_dir)
    head = {"workload": workload_name, "variant": name, "side": variant.side, "load": load, "candidate": variant.candidate,
            "note": variant.note, "command": " ".join(cmd), "env_set": variant.env}
    if not Path(cmd[0]).is_file():
        return head | {"skipped": f"no {cmd[0]}: run `make bench-env` (TRL) or `make bench-env-vllm` (TRL's vLLM path)"}
    if gate and WHEN_IDLE.is_file():
        subprocess.run([str(WHEN_IDLE), "--max-load", "1.0", "--wait-s", "600", "--", "true"], check=False)
    env, removed = child_env(variant)
    spinner = subprocess.Popen([sys.executable, "-c", SPIN_CODE]) if load == "busy" else None
    log_path = run_dir / "stdout.log"
    start = time.perf_counter()
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, env=env, cwd=variant.checkout or common.REPO, stdout=log, stderr=subprocess.STDOUT)
            sampler = Sampler(proc.pid, spinner.pid if spinner else None, run_dir / "metrics.jsonl")
            while proc.poll() is None:
                sampler.poll()
                if time.perf_counter() - start > workload.timeout_s:
                    proc.kill()
                    break
                time.sleep(POLL_S)
            proc.wait()
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    head |= {"env_removed": removed, "rc": proc.returncode, "wall_s": time.perf_counter() - start, "run_dir": str(run_dir)}
    records = read_metrics(run_dir / "metrics.jsonl")
    if proc.returncode != 0 or len(records) < 2:
        return head | {"error": f"exit {proc.returncode}, {len(records)} steps logged", "log_tail": log_path.read_text()[-3000:]}
    return head | summarise(records, sampler.snapshots)


def read_metrics(path: Path) -> list[dict]:
    """The per-step lines that carry timing/step_s (eval or other lines left out)."""
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "timing/step_s" in r]


def summarise(records: list[dict], snapshots: list[dict]) -> dict:
    """Medians over steps 2..N, phase shares, and the CPU-based figures over the window first → last metrics line."""
    steady = records[1:]
    step_s = common.median([r["timing/step_s"] for r in steady])
    names = sorted({k[len("timing/"):-2] for r in steady for k in r if k.startswith("timing/") and k.endswith("_s")
                    and "/" not in k[len("timing/"):] and k != "timing/step_s"})
    phases = {n: common.median([r.get(f"timing/{n}_s", 0.0) for r in steady]) for n in names}
    out = {"steps": len(records), "median_step_s": step_s, "step_s_all": [round(r["timing/step_s"], 4) for r in records],
           "phases": {n: {"median_s": v, "share": v / step_s if step_s else None} for n, v in phases.items()},
           "other_share": 1 - sum(phases.values()) / step_s if step_s else None,
           "engine_idle_fraction_phase": 1 - (phases.get("generate", 0.0) + phases.get("sync", 0.0)) / step_s if step_s else None,
           "trained_tokens_per_s": common.median([r["tokens/generated"] / r["timing/step_s"] for r in steady
                                                  if "tokens/generated" in r and r["timing/step_s"] > 0]) if steady else None,
           # over the whole window: a mode whose steps alternate (partial rollouts: a step that trains buffered groups
           # without generating, then a long one) is misread by a median of per-step figures
           "mean_step_s": sum(r["timing/step_s"] for r in steady) / len(steady) if steady else None,
           "trained_tokens_per_s_window": (sum(r.get("tokens/generated", 0) for r in steady)
                                           / sum(r["timing/step_s"] for r in steady)) if steady else None,
           "completion_length_mean": common.median([r["completions/mean_length"] for r in steady if "completions/mean_length" in r])
           if any("completions/mean_length" in r for r in steady) else None}
    return out | cpu_figures(snapshots)


def cpu_figures(snapshots: list[dict]) -> dict:
    """Idle fractions and foreign CPU over the steady window (module docstring); empty with fewer than 2 snapshots."""
    if len(snapshots) < 2:
        return {}
    first, last = snapshots[0], snapshots[-1]
    wall = last["t"] - first["t"]
    if wall <= 0:
        return {}

    def rate(key: str) -> float:
        return (last[key] - first[key]) / wall

    trainer, engine, spinner = rate("trainer"), rate("engine"), rate("spinner")
    foreign = max(0.0, rate("machine") - trainer - engine - spinner - rate("driver"))
    out = {"wall_per_step_s": wall / (last["lines"] - first["lines"]), "trainer_cpu_cores": trainer,
           "trainer_cores": last["trainer_cores"],
           "trainer_idle_fraction": 1 - trainer / last["trainer_cores"] if last["trainer_cores"] else None,
           "engine_cpu_cores": engine if last["engine_cores"] else None, "engine_cores": last["engine_cores"] or None,
           "engine_idle_fraction": 1 - engine / last["engine_cores"] if last["engine_cores"] else None,
           "spinner_cpu_cores": spinner, "driver_cpu_cores": rate("driver"), "foreign_cores": foreign,
           "clean": foreign < common.FOREIGN_MAX_CORES}
    return out


# --------------------------------------------------------------------------- driver


def model_dirs(workloads: list[str]) -> dict[str, Path]:
    """Build (once, cached) the models the chosen workloads need, in a child process (the driver never loads torch)."""
    needed = sorted({WORKLOADS[w].model for w in workloads})
    code = ("import sys, json; sys.path.insert(0, %r); import _common; "
            "builders = {'tiny': _common.tiny_model_dir, '6m': _common.model_6m_dir, '31m': _common.model_31m_dir}; "
            "print(json.dumps({name: str(builders[name]()) for name in sys.argv[1:]}))") % str(common.BENCH_DIR)
    out = subprocess.run([sys.executable, "-c", code, *needed], capture_output=True, text=True, check=True, cwd=common.REPO)
    dirs = json.loads(out.stdout.strip().splitlines()[-1])
    return {k: Path(v) for k, v in dirs.items() if v}


def expand(names: list[str]) -> list[str]:
    out = []
    for name in names:
        for item in PRESETS.get(name, [name]):
            if item not in VARIANTS:
                raise SystemExit(f"unknown variant {item!r}; choose from {', '.join(VARIANTS)} or {', '.join(PRESETS)}")
            if item not in out:
                out.append(item)
    return out


def before_checkout(rev: str) -> Path:
    """A worktree of revision `rev` under bench/.cache/ (made once): the cohort the `cohort_before` variant runs."""
    sha = subprocess.run(["git", "-C", str(common.REPO), "rev-parse", "--short", rev], check=True, capture_output=True,
                         text=True).stdout.strip()
    path = common.BENCH_DIR / ".cache" / f"before-{sha}"
    if not path.is_dir():
        subprocess.run(["git", "-C", str(common.REPO), "worktree", "add", "--detach", str(path), sha], check=True,
                       capture_output=True)
    return path


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--variants", nargs="+", default=["@decide"], help="names or presets: " + ", ".join(PRESETS))
    ap.add_argument("--load", nargs="+", default=["idle", "busy"], choices=["idle", "busy"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="2 steps per run: checks that each run works, measures nothing")
    ap.add_argument("--gate", action="store_true", help="before each run wait (../shared/tools/when-idle) for load < 1.0")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--list", action="store_true", help="print the variants and presets, run nothing")
    ap.add_argument("--before", default=None, metavar="REV",
                    help="also run `cohort_before`: cohort_default from a worktree of git revision REV (before/after in one run)")
    args = ap.parse_args(argv)
    if args.list:
        for name, v in VARIANTS.items():
            print(f"{name:26s} {v.side:6s} candidate={v.candidate!s:5s} {v.note}  args={list(v.args)} env={v.env}")
        for name, items in PRESETS.items():
            print(f"{name}: {' '.join(items)}")
        return {}
    steps = 2 if args.quick else args.steps
    variants = expand(args.variants)
    if args.before:
        VARIANTS["cohort_before"] = Variant("cohort", f"`cohort train` as is at {args.before}", checkout=before_checkout(args.before))
        variants.insert(0, "cohort_before")
    dirs = model_dirs(args.workloads)
    common.addition_file(64)
    runs = []
    for workload in args.workloads:
        for load in args.load:
            for name in variants:
                result = run_one(name, workload, load, steps, dirs[WORKLOADS[workload].model], args.gate)
                print(f"{workload}/{load}/{name}: {result.get('median_step_s', result.get('error', result.get('skipped')))}",
                      file=sys.stderr, flush=True)
                runs.append(result)
    doc = {"generated": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick, "steps": steps,
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_at_start": common.load_average()},
           "spinner": SPIN_CODE, "runs": runs}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown_tables(doc), file=sys.stderr)
    common.emit(doc)
    return doc


if __name__ == "__main__":
    main()
