"""Run every benchmark, cohort and TRL side by side, and write bench/results.json (`make bench`).

Each benchmark runs as its own process, under ../shared/tools/when-idle when
that exists (it waits for the 1-minute load to fall below 1.0). A result that
is not `idle` (other processes used CPU during it, `_common.LoadWatch`) is
re-run, up to `--retries` times; the last attempt is kept with its `idle` flag and the
number of attempts, so a busy-machine number is never mistaken for a clean one.

TRL runs from bench/.trl-venv (never a dependency of cohort); when that venv
is missing the TRL entries say how to create it. The summary at the top of the
JSON puts each target beside the numbers it compares.

    .venv/bin/python bench/run_all.py [--only grpo_step long_completion ...] [--retries 2] [--out bench/results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import _common as common

WHEN_IDLE = common.REPO.parent / "shared" / "tools" / "when-idle"
TRL_PYTHON = common.BENCH_DIR / ".trl-venv" / "bin" / "python"
TRL_HOWTO = "make bench-env (and make bench-env-vllm for TRL's vLLM path)"
LONG_LENGTHS = (128, 256)
# generation in a private child process on its own core, overlapped with the update (the trainer's threads: the other cores)
LOCAL_OVERLAP = ["engine.mode=local_server", "pipeline.max_staleness=1", "train.num_threads=null"]


IDLE_WAIT_S = 600
# when-idle's gate before each run: the previous benchmark's own threads keep the 1-minute load near 2 for a while, so
# waiting for 0.5 would cost ~80 s a run; whether a run was really alone is judged afterwards by its foreign_cores
START_MAX_LOAD = 1.0


def run_json(cmd: list[str], retries: int, timeout_s: float = 1800) -> dict:
    """Run a benchmark command (under when-idle when available) until it reports an idle run or retries run out."""
    wrapped = [str(WHEN_IDLE), "--max-load", str(START_MAX_LOAD), "--wait-s", str(IDLE_WAIT_S), "--"] + cmd if WHEN_IDLE.is_file() else cmd
    result: dict = {}
    for attempt in range(1, retries + 2):
        try:
            proc = subprocess.run(wrapped, capture_output=True, text=True, cwd=common.REPO, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s} s", "attempts": attempt}
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{\"")]
        if not lines and proc.returncode == 75:  # when-idle gave up waiting
            if attempt <= retries:
                print("  machine never idle; waiting again", file=sys.stderr)
                continue
            return _run_plain(cmd, timeout_s)  # run once anyway; its own load record says it was not idle
        result = json.loads(lines[-1]) if lines else {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-3000:]}
        result["attempts"] = attempt
        if result.get("idle", True) or "error" in result:
            return result
        print(f"  busy machine (load {result.get('load_before')} → {result.get('load_after')}); repeating", file=sys.stderr)
    return result


def _run_plain(cmd: list[str], timeout_s: float) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=common.REPO, timeout=timeout_s)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{\"")]
    result = json.loads(lines[-1]) if lines else {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-3000:]}
    result["never_idle"] = True
    return result


def cohort_grpo(retries: int, engine: str, extra: list[str] = ()) -> dict:
    cmd = [sys.executable, str(common.BENCH_DIR / "grpo_step.py"), "--engine", engine]
    for item in extra:
        cmd += ["--set", item]
    return run_json(cmd, retries)


def cohort_long(retries: int, length: int, extra: list[str] = ()) -> dict:
    cmd = [sys.executable, str(common.BENCH_DIR / "grpo_step.py"), "--name", "long_completion", "--prompts-per-step", "8",
           "--max-completion-length", str(length), "--steps", "6", "--limits"]
    for item in extra:
        cmd += ["--set", item]
    return run_json(cmd, retries)


def trl(retries: int, *args: str) -> dict:
    python = common.BENCH_DIR / ".trl-vllm-venv" / "bin" / "python" if "--vllm" in args else TRL_PYTHON  # vLLM: its own venv
    if not python.is_file():
        return {"skipped": f"no TRL venv; create it with: {TRL_HOWTO}"}
    return run_json([str(python), str(common.BENCH_DIR / "trl_grpo_step.py"), *args], retries)


def trl_long(retries: int, length: int, vllm: bool) -> dict:
    args = ["--prompts-per-step", "8", "--max-completion-length", str(length), "--steps", "6"] + (["--vllm"] if vllm else [])
    return trl(retries, *args)


def summary(results: dict) -> dict:
    """Each target beside the numbers it compares (None where a number is missing)."""
    def step(r):
        return r.get("median_step_s") if isinstance(r, dict) else None

    def sides(section: dict, suffix: str = "") -> tuple[dict, dict]:
        ours = {k[len("cohort_"):].removesuffix(suffix): step(v) for k, v in section.items()
                if k.startswith("cohort_") and k.endswith(suffix) and step(v)}
        theirs = {k[len("trl_"):].removesuffix(suffix): step(v) for k, v in section.items()
                  if k.startswith("trl_") and k.endswith(suffix) and step(v)}
        return ours, theirs

    def compare(ours: dict, theirs: dict, factor: float, target: str) -> dict:
        best_ours = min(ours.items(), key=lambda kv: kv[1]) if ours else (None, None)
        best_trl = min(theirs.items(), key=lambda kv: kv[1]) if theirs else (None, None)
        speedup = best_trl[1] / best_ours[1] if best_ours[1] and best_trl[1] else None
        return {"cohort_s_per_step": ours, "trl_s_per_step": theirs, "best_cohort": best_ours[0], "faster_trl": best_trl[0],
                "speedup": speedup, "target": target, "met": (speedup >= factor) if speedup else None}

    out: dict = {"tiny": compare(*sides(results.get("grpo_step", {})), 1.0, "cohort no slower than TRL's median s/step")}
    long = results.get("long_completion", {})
    for n in LONG_LENGTHS:
        out[f"long_{n}"] = compare(*sides(long, f"_{n}"), 1.5, ">= 1.5x faster median s/step than the faster TRL path")
    lv = results.get("large_vocab_logprob", {})
    ratio = lv.get("peak_rss_ratio_chunked_over_naive")
    out["large_vocab"] = {"peak_rss_ratio": ratio, "same_results": lv.get("same_results"), "target": "peak RSS <= 0.5 x naive",
                          "met": (ratio <= 0.5 and bool(lv.get("same_results"))) if ratio else None}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=["grpo_step", "long_completion", "large_vocab_logprob", "rollout", "overlap_learning"])
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--idle-wait-s", type=int, default=IDLE_WAIT_S, help="how long to wait for an idle machine per attempt")
    ap.add_argument("--no-trl-vllm", action="store_true", help="skip TRL's vLLM path")
    ap.add_argument("--out", default=str(common.BENCH_DIR / "results.json"))
    args = ap.parse_args(argv)
    globals()["IDLE_WAIT_S"] = args.idle_wait_s
    wanted = set(args.only or ["grpo_step", "long_completion", "large_vocab_logprob", "rollout", "overlap_learning"])
    common.tiny_model_dir()
    common.addition_file(64)
    out_path = Path(args.out)
    results: dict = json.loads(out_path.read_text()).get("results", {}) if (args.only and out_path.is_file()) else {}

    def record(section: str, key: str, value: dict) -> None:
        print(f"{section}/{key}: {value.get('median_step_s', value.get('tokens_per_s', value.get('error', value.get('skipped', ''))))}",
              file=sys.stderr)
        results.setdefault(section, {})[key] = value

    if "grpo_step" in wanted:
        record("grpo_step", "cohort_vllm", cohort_grpo(args.retries, "vllm"))
        record("grpo_step", "cohort_vllm_overlap", cohort_grpo(args.retries, "vllm", ["pipeline.max_staleness=1"]))
        record("grpo_step", "cohort_local_overlap", cohort_grpo(args.retries, "vllm", LOCAL_OVERLAP))
        record("grpo_step", "cohort_hf", cohort_grpo(args.retries, "hf"))
        record("grpo_step", "trl_transformers", trl(args.retries))
        if not args.no_trl_vllm:
            record("grpo_step", "trl_vllm", trl(args.retries, "--vllm"))
    if "long_completion" in wanted:
        for n in LONG_LENGTHS:
            record("long_completion", f"cohort_default_{n}", cohort_long(args.retries, n))
            record("long_completion", f"cohort_overlap_{n}", cohort_long(args.retries, n, ["pipeline.max_staleness=1"]))
            record("long_completion", f"cohort_local_overlap_{n}", cohort_long(args.retries, n, LOCAL_OVERLAP))
            record("long_completion", f"trl_transformers_{n}", trl_long(args.retries, n, vllm=False))
            if not args.no_trl_vllm:
                record("long_completion", f"trl_vllm_{n}", trl_long(args.retries, n, vllm=True))
    if "large_vocab_logprob" in wanted:
        results["large_vocab_logprob"] = run_json([sys.executable, str(common.BENCH_DIR / "large_vocab_logprob.py")], args.retries)
    if "overlap_learning" in wanted:
        results["overlap_learning"] = run_json([sys.executable, str(common.BENCH_DIR / "overlap_learning.py")], args.retries)
    if "rollout" in wanted:
        results["rollout"] = run_json([sys.executable, str(common.BENCH_DIR / "rollout.py")], args.retries, timeout_s=3600)
    doc = {"generated": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "summary": summary(results), "results": results}
    out_path.write_text(json.dumps(doc, indent=2) + "\n")
    common.emit(doc["summary"])
    return doc


if __name__ == "__main__":
    main()
