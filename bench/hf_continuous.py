"""The transformers engine: continuous batching (the default request level) vs plain `generate` (its fallback).

Workloads on the tiny benchmark model, as in bench/rollout.py: `tiny` (4 prompts × G=8, 16 tokens) and `long`
(8 prompts × G=8, 256 tokens, long-tailed lengths), temperature 1, float32, two threads (`--threads`). Per variant and
workload: one fresh engine, two warm-up batches, then `--repeats` timed batches with fresh seeds. Reported:
tokens/s (generated tokens over the batch time, median), the median batch time, and the median time until the
first completion comes back (`first_s`: a streaming engine returns short completions early, plain generate
returns all of them at the end). Both variants run in this one process, one after the other.

    .venv/bin/python bench/hf_continuous.py [--workloads tiny long] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import _common as common

WORKLOADS = {"tiny": (4, 8, 16), "long": (8, 8, 256)}  # prompts, G, max tokens


def run(continuous: bool, workload: str, repeats: int) -> dict:
    from cohort.models.char_tokenizer import EOS_TOKEN_ID
    from cohort.models.pretrained import load_policy
    from cohort.rollout.base import SamplingConfig, batch_requests
    from cohort.rollout.engines.hf import HFEngine

    n_prompts, g, max_tokens = WORKLOADS[workload]
    rows = common.addition_rows(64)
    prompts = [list(r["prompt"].encode()) for r in rows[:n_prompts] for _ in range(g)]
    engine = HFEngine(load_policy(common.tiny_model_dir(), "float32"), pad_token_id=EOS_TOKEN_ID,
                      stop_token_ids=[EOS_TOKEN_ID], continuous_batching=continuous)
    sampling = SamplingConfig(max_tokens, 1.0)
    for w in range(2):
        engine.generate(prompts, sampling, [900_000 + 1000 * w + i for i in range(len(prompts))])
    times, firsts, tokens = [], [], []
    with common.LoadWatch() as load:
        for r in range(repeats):
            t0 = time.perf_counter()
            engine.submit(batch_requests(prompts, sampling, [1000 * r + i for i in range(len(prompts))]))
            outs = engine.poll()
            firsts.append(time.perf_counter() - t0)
            while engine.in_flight:
                outs += engine.poll()
            times.append(time.perf_counter() - t0)
            tokens.append(sum(len(o.token_ids) for o in outs))
    engine.close()
    return {"median_batch_s": common.median(times), "first_s": common.median(firsts),
            "tokens_per_s": common.median([t / s for t, s in zip(tokens, times)]),
            "mean_tokens_per_batch": sum(tokens) / len(tokens), **load.record()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="PyTorch threads (the trainer's default for this model is 1)")
    args = ap.parse_args(argv)
    common.set_threads(args.threads)
    runs = {w: {name: run(cb, w, args.repeats) for name, cb in (("continuous", True), ("generate", False))}
            for w in args.workloads}
    result = {"benchmark": "hf_continuous", "tokens_per_s": {w: {v: r["tokens_per_s"] for v, r in rs.items()}
                                                             for w, rs in runs.items()},
              "runs": runs, "idle": all(r.get("idle", False) for rs in runs.values() for r in rs.values())}
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
