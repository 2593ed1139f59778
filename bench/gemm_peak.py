"""What this CPU's matrix multiply reaches at the update's shapes: the ceiling an update's FLOP/s is read against.

The update of a transformer is dominated by three GEMM shapes per layer and micro-batch: (tokens x hidden) @ (hidden x
hidden) for the attention projections, (tokens x hidden) @ (hidden x intermediate) for the MLP's up and gate, and
(tokens x intermediate) @ (intermediate x hidden) for its down projection. This times each with torch.matmul in
float32 and, where the CPU has bfloat16 units (cohort/models/devices.py's `has_bf16_units`), in bfloat16, at the
threads torch uses by default, after a warm-up, best of `--repeats`; and prints one JSON object: each shape's GFLOP/s
(2·m·k·n / seconds), the FLOP-weighted peak over the three (one layer's mix), the machine (CPU model, cores, bf16
units, OpenMP policy) and the load average before and after (timings mean something only on an idle machine).

    .venv/bin/python bench/gemm_peak.py [--model-dir DIR | --hidden 896 --intermediate 4864] [--tokens 2048]

The default shape is Qwen2.5-Coder-0.5B-Instruct's (hidden 896, intermediate 4864) at 2,048 tokens, about one
micro-batch of examples/qwen_tool_calc.yaml (8 completions of ~250 tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from cohort.models.devices import cpu_model, has_bf16_units


def gflops(m: int, k: int, n: int, dtype: torch.dtype, repeats: int) -> float:
    """Best GFLOP/s of an (m x k) @ (k x n) matmul in `dtype` over `repeats` timed runs after two warm-ups."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    for _ in range(2):
        torch.matmul(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * m * k * n / best / 1e9


def shapes(hidden: int, intermediate: int, tokens: int) -> dict[str, tuple[int, int, int]]:
    return {"attention_projection": (tokens, hidden, hidden), "mlp_up": (tokens, hidden, intermediate),
            "mlp_down": (tokens, intermediate, hidden)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", help="read hidden_size and intermediate_size from this checkpoint's config.json")
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--intermediate", type=int, default=4864)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.model_dir:
        config = json.loads((Path(args.model_dir) / "config.json").read_text())
        args.hidden, args.intermediate = config["hidden_size"], config["intermediate_size"]
    load_before = os.getloadavg()
    bf16 = has_bf16_units(torch.device("cpu"))
    dtypes = {"float32": torch.float32, **({"bfloat16": torch.bfloat16} if bf16 else {})}
    result: dict = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                                "bf16_units": bf16, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)")},
                    "hidden": args.hidden, "intermediate": args.intermediate, "tokens": args.tokens, "gflops": {}}
    for name, dtype in dtypes.items():
        per_shape = {label: gflops(*shape, dtype, args.repeats) for label, shape in
                     shapes(args.hidden, args.intermediate, args.tokens).items()}
        # one layer's mix: 4 attention-sized projections (q, k, v, o: k and v are smaller under GQA, counted full
        # here), 2 up-sized (up, gate), 1 down; the FLOP-weighted harmonic mean is the layer's GEMM throughput
        flops = {"attention_projection": 4 * args.hidden * args.hidden, "mlp_up": 2 * args.hidden * args.intermediate,
                 "mlp_down": args.hidden * args.intermediate}
        seconds = sum(flops[k] / per_shape[k] for k in flops)
        result["gflops"][name] = {**{k: round(v, 1) for k, v in per_shape.items()},
                                  "layer_mix": round(sum(flops.values()) / seconds, 1)}
    result["load_before"], result["load_after"] = [round(x, 2) for x in load_before], [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
