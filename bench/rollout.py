"""Rollout throughput: cohort's vLLM engine (under several settings) vs the transformers engine.

Workloads on the tiny benchmark model: `tiny` (4 prompts × G=8, 16 tokens) and
`long` (8 prompts × G=8, 256 tokens, long-tailed lengths). Each variant runs in
a fresh subprocess (vLLM reads its environment once, and RSS is per process):
engine start, two warm-up batches, then `--repeats` timed batches with fresh
seeds; tokens/s is generated tokens over the median batch time.

Variants (the vLLM settings the issue asks to choose by measurement):
- `vllm`: the defaults in cohort.config.EngineConfig (eager, prefix caching,
  1 GiB KV cache, OMP_WAIT_POLICY=PASSIVE, vLLM's automatic thread binding);
- `vllm_compiled`: enforce_eager=False (torch.compile + CPU graph capture);
- `vllm_active_wait`: OMP_WAIT_POLICY=ACTIVE (spinning OpenMP workers);
- `vllm_nobind`: VLLM_CPU_OMP_THREADS_BIND=nobind;
- `vllm_no_prefix_cache`: enable_prefix_caching=False;
- `vllm_kv4g`: a 4 GiB KV cache;
- `vllm_one_core`: one thread bound to the last core (what engine.mode=local_server
  with pipeline.max_staleness=1 gives the engine on a 2-core machine);
- `hf`: transformers `generate` on the policy (cohort's fallback engine).

    .venv/bin/python bench/rollout.py [--variants vllm hf ...] [--workloads tiny long] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import _common as common

common.cohort_cli_environment()  # cohort runs here as `cohort train` would: the CLI's environment, before torch loads

WORKLOADS = {"tiny": (4, 8, 16), "long": (8, 8, 256)}  # prompts, G, max tokens
VARIANTS = {
    "vllm": ({}, {}),
    "vllm_compiled": ({"enforce_eager": False}, {}),
    "vllm_active_wait": ({}, {"OMP_WAIT_POLICY": "ACTIVE"}),
    "vllm_nobind": ({}, {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}),
    "vllm_no_prefix_cache": ({"enable_prefix_caching": False}, {}),
    "vllm_kv4g": ({"kv_cache_gib": 4.0}, {}),
    "vllm_one_core": ({}, {"VLLM_CPU_OMP_THREADS_BIND": str(max(os.sched_getaffinity(0))), "OMP_NUM_THREADS": "1"}),
    "hf": (None, {}),
}


def child(variant: str, workload: str, repeats: int) -> dict:
    common.set_threads(2)
    from cohort.config import EngineConfig
    from cohort.models.char_tokenizer import EOS_TOKEN_ID
    from cohort.rollout.base import SamplingConfig

    n_prompts, g, max_tokens = WORKLOADS[workload]
    rows = common.addition_rows(64)
    prompts = [list(r["prompt"].encode()) for r in rows[:n_prompts] for _ in range(g)]
    model_dir = common.tiny_model_dir()
    settings, _ = VARIANTS[variant]
    start = time.perf_counter()
    if settings is None:
        from cohort.models.pretrained import load_policy
        from cohort.rollout.engines.hf import HFEngine

        engine = HFEngine(load_policy(model_dir, "float32"), pad_token_id=EOS_TOKEN_ID, stop_token_ids=[EOS_TOKEN_ID])
    else:
        from cohort.rollout.engines.vllm import VLLMEngine

        d = EngineConfig().model_dump() | settings
        engine = VLLMEngine(model_dir, dtype="float32", max_model_len=16 + max_tokens + 1, seed=0, enforce_eager=d["enforce_eager"],
                            enable_prefix_caching=d["enable_prefix_caching"], kv_cache_gib=d["kv_cache_gib"])
    start_s = time.perf_counter() - start
    sampling = SamplingConfig(max_tokens, 1.0)
    for w in range(2):
        engine.generate(prompts, sampling, [900_000 + 1000 * w + i for i in range(len(prompts))])
    times, tokens = [], []
    with common.LoadWatch() as load:
        for r in range(repeats):
            t0 = time.perf_counter()
            outs = engine.generate(prompts, sampling, [1000 * r + i for i in range(len(prompts))])
            times.append(time.perf_counter() - t0)
            tokens.append(sum(len(o.token_ids) for o in outs))
    engine.close()
    per_batch = common.median(times)
    return {"variant": variant, "workload": workload, "engine_start_s": start_s, "median_batch_s": per_batch,
            "tokens_per_s": common.median([t / s for t, s in zip(tokens, times)]), "mean_tokens_per_batch": sum(tokens) / len(tokens),
            "batch_s_all": [round(t, 4) for t in times], **load.record(), "peak_rss_mib": common.peak_rss_mib()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "WORKLOAD"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        result = child(args.child[0], args.child[1], args.repeats)
        common.emit(result)
        return result
    results: dict[str, dict] = {}
    for variant in args.variants:
        for workload in args.workloads:
            env = os.environ | VARIANTS[variant][1]
            cmd = [sys.executable, __file__, "--child", variant, workload, "--repeats", str(args.repeats)]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=common.REPO, env=env)
            lines = [l for l in proc.stdout.splitlines() if l.startswith("{\"")]
            results.setdefault(workload, {})[variant] = json.loads(lines[-1]) if lines else {"error": proc.stderr[-2000:]}
    summary = {w: {v: r.get("tokens_per_s") for v, r in runs.items()} for w, runs in results.items()}
    result = {"benchmark": "rollout", "tokens_per_s": summary, "runs": results,
              "idle": all(r.get("idle", False) for runs in results.values() for r in runs.values())}
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
