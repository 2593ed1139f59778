"""The prepared GPU check: the embedded demo and a 0.5B-shaped Qwen2 trained on one device; prints JSON.

    python bench/gpu_check.py                  # on a GPU machine (train.device=auto -> cuda:0, model.dtype=auto -> bf16)
    python bench/gpu_check.py --device cpu     # the same script here, as a smoke check (small shapes, few steps)

Made for a machine that has only PyTorch, transformers and peft (no vLLM, pydantic or network): everything runs
with the transformers engine (`engine.name=hf`), and the missing small packages travel as wheels
(`make gpu-check-wheels` fetches them into .whl/; docs/gpu.md says how to run it there, and what else it carries).

A lent GPU is 15 minutes in all, so the check cannot waste it: each part's JSON is written to `--out-dir` as soon as
the part ends (`<part>.json`, then `summary.json` with all of them), a part that raises is recorded (its error and
traceback in its JSON) and the next one runs, and the big part stops taking steps after `--big-budget-s`.

Two parts, the big one first (what only a GPU can show), each timed separately:
- **demo**: `cohort.train` on the embedded demo (tiny:arith, its preset) with the transformers engine on the device,
  in the precision `model.dtype=auto` picks there; held-out greedy accuracy before and after.
- **big**: a randomly initialised Qwen2 of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads,
  intermediate 4864, vocabulary 151936, tied embeddings: ~494M parameters) with the character tokenizer, trained
  `--big-steps` GRPO steps on the arith prompts (8 prompts x 8 completions, `--big-tokens` tokens each, micro-batch
  8) in bf16 mixed precision, with a reward that spreads within every group (a hash of the completion's characters:
  a random model never answers right, so an accuracy reward would give no gradient) and a learning rate of 2e-4, at
  which Adam moves the weights by more than bf16's resolution each step: the push then carries new weights and the
  canary compares something. The engine is a transformers copy of its own (as rank 0 holds one under FSDP), so
  every step pushes the weights and checks the canaries. Reported: s/step, trained tokens/s (prompt + completion
  tokens through the update), the update's model FLOPs utilisation (6 x parameters x trained tokens/s over the bf16
  matrix rate measured at start), the allocator's peak (`max_memory_allocated`) and what it reserved
  (`max_memory_reserved`) beside the planner's estimate, how far the weights moved, and the canary gap. Since issue
  47 also: the engine's choice (continuous batching or plain generate), each step's `timing/*`, the peak per phase
  beside the planner's bytes per phase, and one more step (untimed; `--no-profile` skips it) whose update runs under
  `UpdateProbe`: torch.profiler's time by category and host reads, and on CUDA what was live at the update's peak.

`--device cpu` shrinks the big model (`--shape small`) and the step counts, so the whole check takes a few minutes
here; its numbers say only that the script works.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's cohort, without an install

from cohort.api import train as cohort_train  # noqa: E402
from cohort.config.resolve import load_config  # noqa: E402
from cohort.distributed.rank0 import DetachedHFEngine  # noqa: E402
from cohort.models.devices import resolve_device  # noqa: E402
from cohort.models.pretrained import load_policy, load_tokenizer, stop_token_ids  # noqa: E402
from cohort.plan.memory import kv_bytes_per_token, memory_estimate, model_facts  # noqa: E402
from cohort.trainer.phases import Phases  # noqa: E402
from cohort.trainer.trainer import Trainer  # noqa: E402

SHAPES = {  # Qwen2 config fields; "0.5b" is Qwen2.5-0.5B's shape
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "small": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=4096, tie_word_embeddings=True),
}


def matmul_rate(device: torch.device, n: int, seconds: float = 2.0) -> float:
    """Measured bf16 matrix-multiply rate on `device`, FLOP/s (2n^3 per n x n product)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _sync(device)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            a @ b
        count += 10
        _sync(device)
    return 2 * n**3 * count / (time.perf_counter() - start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhasePeaks(Phases):
    """The trainer's phase timers that also keep, per phase, the device allocator's peak while it was the innermost
    phase open ("outside" between phases). The 0.5B run's whole peak was 1.17x the planner's rows on the H200
    (2026-12-04) without saying in which phase; the planner's rows are the update's. `read_peak` / `reset_peak`:
    torch.cuda.max_memory_allocated / reset_peak_memory_stats on a GPU."""

    def __init__(self, read_peak: Callable[[], int], reset_peak: Callable[[], None]):
        super().__init__()
        self.read_peak, self.reset_peak = read_peak, reset_peak
        self.peaks: dict[str, int] = {}
        self.open: list[str] = []

    def mark(self) -> None:
        """The peak since the last mark, to the innermost open phase; then a new window."""
        name = self.open[-1] if self.open else "outside"
        self.peaks[name] = max(self.peaks.get(name, 0), self.read_peak())
        self.reset_peak()

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.mark()
        self.open.append(name)
        try:
            with super().__call__(name):
                yield
        finally:
            self.mark()
            self.open.pop()


CATEGORIES = (  # an op's or kernel's name -> where the update's time goes (first match; by name, so approximate)
    ("optimizer", ("adam", "foreach", "multi_tensor", "optimizer", "clip_grad", "norm")),
    ("attention", ("attention", "sdpa", "flash", "fmha", "efficient")),
    ("log-prob", ("logprob", "log_softmax", "logsumexp", "softmax", "amax", "gather", "cross_entropy")),
    ("matmul", ("gemm", "matmul", "aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "cutlass", "xmma", "cublas")),
    ("copy and cast", ("copy", "_to_copy", "aten::to", "cat", "contiguous", "memcpy", "memset")),
)
HOST_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "aten::_local_scalar_dense")  # (on a CPU tensor, no wait)


def profile_summary(events, on_device: bool, top: int = 15) -> dict:
    """Self time of `events` (a torch.profiler `key_averages()`, or anything with `key`, `count`,
    `self_cpu_time_total` and `self_device_time_total` in microseconds) by CATEGORIES and the `top` ops, in ms;
    `host_syncs`: calls of HOST_SYNCS (each one waits for the GPU). `on_device`: the device's kernel time (CUDA), else
    the CPU's op time."""
    field = "self_device_time_total" if on_device else "self_cpu_time_total"
    timed = [(e.key, e.count, getattr(e, field, 0.0) / 1e3) for e in events]
    by_category: dict[str, float] = {}
    for key, _, ms in timed:
        name = key.lower()
        category = next((c for c, words in CATEGORIES if any(w.lower() in name for w in words)), "other")
        by_category[category] = by_category.get(category, 0.0) + ms
    ops = sorted(timed, key=lambda t: -t[2])[:top]
    return {"time": "device kernels" if on_device else "CPU ops", "total_ms": sum(ms for _, _, ms in timed),
            "by_category_ms": dict(sorted(by_category.items(), key=lambda kv: -kv[1])),
            "top_ops": [{"name": k[:120], "calls": n, "self_ms": ms} for k, n, ms in ops],
            "host_syncs": {k: n for k, n, _ in timed if any(k.startswith(h) for h in HOST_SYNCS)}}


def live_at_peak(trace: list[dict], top: int = 15) -> dict:
    """Replays a CUDA allocator trace (`torch.cuda.memory._snapshot()["device_traces"][i]`: events with `action`
    alloc / free_requested, `addr`, `size`, `frames`) and returns the highest live total and what was live then,
    grouped by where it was allocated: the innermost Python frame of cohort/ and the innermost frame overall (an
    allocation of the backward has no Python frame: the autograd engine's thread). Bytes allocated before the trace
    began are not in it (`peak_bytes` is above them)."""
    total, peak, peak_index = 0, 0, -1
    sizes: dict[int, int] = {}
    for i, event in enumerate(trace):
        if event["action"] == "alloc":
            sizes[event["addr"]] = event["size"]
            total += event["size"]
            if total > peak:
                peak, peak_index = total, i
        elif event["action"] == "free_requested":
            total -= sizes.pop(event["addr"], 0)
    live: dict[int, dict] = {}
    for event in trace[: peak_index + 1]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
        elif event["action"] == "free_requested":
            live.pop(event["addr"], None)
    groups: dict[str, int] = {}
    for event in live.values():
        frames = [f"{f['filename'].split('site-packages/')[-1]}:{f['line']}" for f in event.get("frames", ())
                  if f.get("filename", "").endswith(".py")]
        ours = next((f for f in frames if "cohort/" in f), None)
        where = " <- ".join(dict.fromkeys(f for f in (frames[0] if frames else None, ours) if f)) or "no Python frame (backward)"
        groups[where] = groups.get(where, 0) + event["size"]
    return {"peak_bytes": peak, "live_allocations": len(live),
            "by_site_bytes": dict(sorted(groups.items(), key=lambda kv: -kv[1])[:top])}


class UpdateProbe:
    """Wraps the trainer's phase timers: the next "update" phase (once armed) runs under torch.profiler and, on CUDA,
    the allocator's history; `result` then holds `profile_summary` and `live_at_peak` of it. Everything else passes
    through to the wrapped timers."""

    def __init__(self, phases, device: torch.device):
        self.phases, self.device = phases, device
        self.armed, self.result = False, None

    def __getattr__(self, name):
        return getattr(self.phases, name)

    @contextlib.contextmanager
    def __call__(self, name: str):
        if name != "update" or not self.armed:
            with self.phases(name):
                yield
            return
        self.armed = False
        cuda = self.device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        if cuda:
            torch.cuda.memory._record_memory_history(max_entries=500_000, stacks="python")
        try:
            with self.phases(name), torch.profiler.profile(activities=activities) as prof:
                yield
            _sync(self.device)
            self.result = {"profile": profile_summary(prof.key_averages(), on_device=cuda)}
            if cuda:
                trace = torch.cuda.memory._snapshot()["device_traces"][self.device.index or 0]
                self.result["live_at_peak"] = live_at_peak(trace)
        finally:
            if cuda:
                torch.cuda.memory._record_memory_history(enabled=None)


def phase_estimates(rows: list[tuple[str, int, str]], engine_copy: int, kv_bytes: int, logits_bytes: int) -> dict:
    """The planner's bytes per phase: its rows are the update's peak (+ the engine's copy); the other phases hold
    what persists between steps (weights, gradients, AdamW moments, the engine's copy), generation adds its KV cache
    and three (B, V) float32 buffers of logits (the scores, their log-softmax, the sampler's probabilities)."""
    sizes = {name: size for name, size, _ in rows}
    resident = sum(sizes.get(name, 0) for name in ("weights", "gradients", "AdamW moments", "reference model")) + engine_copy
    return {"update": sum(sizes.values()) + engine_copy, "generate": resident + kv_bytes + logits_bytes,
            "resident": resident}


def run_demo(device: torch.device, steps: int, out_dir: Path) -> dict:
    """The embedded demo through cohort.train (its preset), the transformers engine on `device`."""
    start = time.perf_counter()
    summary = cohort_train(None, overrides=[
        "engine.name=hf", f"train.device={device}", f"train.max_steps={steps}", f"run.output_dir={out_dir / 'demo'}",
        "run.progress=false", "run.loggers=[jsonl]"])
    config = json.loads(json.dumps(load_config(out_dir / "demo" / "config.yaml").to_dict()))
    return {"steps": steps, "model_dtype": config["model"]["dtype"], "wall_s": time.perf_counter() - start,
            "median_step_s": summary.get("median_step_s"), "accuracy_before": summary.get("eval/accuracy_before"),
            "accuracy_after": summary.get("eval/accuracy_after")}


def build_random_qwen2(out_dir: Path, shape: str, max_positions: int) -> Path:
    """A random Qwen2 of `shape` saved with the character tokenizer (its ids are the first 259 of the vocabulary; the
    model may sample any id, which the tokenizer decodes as nothing)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from cohort.models.char_tokenizer import EOS_TOKEN_ID, save_char_tokenizer

    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=max_positions, eos_token_id=EOS_TOKEN_ID,
                         pad_token_id=EOS_TOKEN_ID, bos_token_id=None)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(str(out_dir), safe_serialization=True)
    save_char_tokenizer(out_dir, model_max_length=max_positions)
    return out_dir


SPREAD_REWARD = "def spread(prompts, completions, **kw):\n    return [(sum(map(ord, c)) % 7) / 6 for c in completions]\n"


def run_big(device: torch.device, shape: str, steps: int, tokens: int, out_dir: Path, rate: float,
            budget_s: float, profile: bool = True) -> dict:
    """GRPO steps of the random Qwen2 on the arith prompts, measured step by step (see the module docstring); no
    step starts after `budget_s` seconds. `profile`: then one more step, not timed, whose update runs under
    `UpdateProbe`."""
    model_dir = build_random_qwen2(out_dir / f"qwen2-{shape}", shape, max_positions=tokens + 64)
    (out_dir / "gpu_check_rewards.py").write_text(SPREAD_REWARD)
    sys.path.insert(0, str(out_dir))
    overrides = [f"model.path={model_dir}", "model.dtype=bfloat16", "data.task=arith", "engine.name=hf",
                 "rollout.num_generations=8", f"rollout.max_completion_length={tokens}", "train.prompts_per_step=8",
                 "train.micro_batch_size=8", f"train.max_steps={steps}", "train.learning_rate=2e-4",
                 f"train.device={device}", "rewards=[{name: gpu_check_rewards.spread}]", f"run.output_dir={out_dir / 'big'}",
                 "run.progress=false", "run.loggers=[jsonl]"]
    cfg = load_config(None, overrides)
    tokenizer = load_tokenizer(model_dir)
    engine = DetachedHFEngine(load_policy(model_dir, torch.bfloat16, device), pad_token_id=tokenizer.pad_token_id,
                              stop_token_ids=stop_token_ids(model_dir, tokenizer))
    print(f"big: rollout engine: transformers, {engine.inner.choice}", file=sys.stderr, flush=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer = Trainer(cfg, engine=engine, log=lambda *a, **k: None)
    if device.type == "cuda":  # the peak per phase (the rollout gets the trainer's timers with each batch request)
        trainer.swap_phases(PhasePeaks(lambda: torch.cuda.max_memory_allocated(device),
                                       lambda: torch.cuda.reset_peak_memory_stats(device)))
    start = time.perf_counter()
    try:
        parameters = sum(p.numel() for p in trainer.parts.policy.parameters())
        first = {n: p.detach().float().clone() for n, p in trainer.parts.policy.named_parameters() if p.dim() == 2}
        records, probe = [], None
        while len(records) < steps and time.perf_counter() - start < budget_s:
            metrics = trainer.step()
            batch, rows = trainer.state.batch, trainer.state.step_indices
            trained = sum(len(batch.prompt_ids[i]) + len(batch.completion_ids[i]) for i in rows)
            records.append({"step_s": metrics["timing/step_s"], "update_s": metrics.get("timing/update_s", float("nan")),
                            "generate_s": metrics.get("timing/generate_s", 0.0), "trained_tokens": trained,
                            "frac_reward_zero_std": metrics.get("frac_reward_zero_std"),
                            "grad_norm": metrics.get("grad_norm"),
                            "canary_gap_max": metrics.get("sync/canary_gap_max"),
                            "timing": {k: v for k, v in metrics.items() if k.startswith("timing/")}})
        if profile and time.perf_counter() - start < budget_s:  # one more step, its update profiled (not timed)
            probe = UpdateProbe(trainer.phases, device)
            trainer.swap_phases(probe)
            probe.armed = True
            trainer.step()
            trainer.swap_phases(probe.phases)
        trainer.sync.push()  # the last step's push, checked
        moved = max(((p.detach().float() - first[n]).abs().max() / first[n].abs().max()).item()
                    for n, p in trainer.parts.policy.named_parameters() if n in first)
        if isinstance(trainer.phases, PhasePeaks):
            trainer.phases.mark()
            phase_peaks = dict(trainer.phases.peaks)
        else:
            phase_peaks = {}
        peak = max(phase_peaks.values()) if phase_peaks else None
        reserved = torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None
    finally:
        trainer.close()
    report = _big_report(cfg, trainer, model_dir, records, parameters, rate, peak, reserved, moved, shape, tokens)
    planned = report.pop("planner_by_phase")
    return report | {"peak_allocated_bytes_by_phase": phase_peaks, "planner_bytes_by_phase": planned,
                     "peak_over_plan_by_phase": {name: phase_peaks[name] / planned.get(name, planned["resident"])
                                                 for name in phase_peaks if name != "outside"},
                     "engine_choice": engine.inner.choice, "update_probe": probe.result if probe else None}


def _big_report(cfg, trainer, model_dir: Path, records: list[dict], parameters: int, rate: float, peak, reserved,
                moved: float, shape: str, tokens: int) -> dict:
    timed = records[1:] or records  # the first step pays for kernels' first use
    update_s = sum(r["update_s"] for r in timed)
    tokens_per_s = sum(r["trained_tokens"] for r in timed) / update_s
    rows = memory_estimate(cfg, trainer.plan, model_facts(str(model_dir)))  # the planner's trainer peak (cohort plan)
    engine_copy = 2 * parameters  # the engine's own bf16 copy (DetachedHFEngine), which the trainer's peak leaves out
    estimate = sum(size for _, size, _ in rows) + engine_copy
    facts = model_facts(str(model_dir))
    completions = cfg.train.prompts_per_step * cfg.rollout.num_generations
    longest = max(len(p) for p in trainer.state.batch.prompt_ids) + tokens
    by_phase = phase_estimates(rows, engine_copy, kv_bytes_per_token(cfg, facts) * completions * longest,
                               3 * completions * facts.vocab_size * 4)
    return {"shape": shape, "parameters": parameters, "steps": len(records), "completion_tokens": tokens,
            "s_per_step": sum(r["step_s"] for r in timed) / len(timed),
            "generate_s_per_step": sum(r["generate_s"] for r in timed) / len(timed),
            "update_s_per_step": update_s / len(timed), "update_tokens_per_s": tokens_per_s,
            "update_mfu": 6 * parameters * tokens_per_s / rate,
            "peak_allocated_bytes": peak, "peak_reserved_bytes": reserved, "planner_estimate_bytes": estimate,
            "planner_rows": {name: size for name, size, _ in rows}, "engine_copy_bytes": engine_copy,
            "planner_by_phase": by_phase,
            "peak_over_estimate": peak / estimate if peak else None,
            "reserved_over_estimate": reserved / estimate if reserved else None,
            "weights_moved_max_relative": moved, "frac_reward_zero_std": [r["frac_reward_zero_std"] for r in records],
            "grad_norm": [r["grad_norm"] for r in records],
            "canary_gap_max": max((r["canary_gap_max"] or 0.0) for r in records),
            "last_canary_gap": trainer.sync.last_canary_gap}


def run_parts(parts: dict[str, Callable[[], dict]], out_dir: Path, doc: dict) -> dict:
    """Each part in turn; its JSON written to `out_dir`/<name>.json as soon as it ends (an error and its traceback
    when it raised: the next part runs all the same), and summary.json after each part."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, part in parts.items():
        start = time.perf_counter()
        try:
            result = part()
        except Exception as exc:  # a failed part must not cost the others (module docstring)
            result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        result["part_wall_s"] = time.perf_counter() - start
        doc[name] = result
        (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        (out_dir / "summary.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(f"{name}: {json.dumps(result, default=str)[:2000]}", file=sys.stderr, flush=True)
    return doc


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="train.device: auto (cuda:0 on a GPU machine), cuda, cpu")
    ap.add_argument("--demo-steps", type=int, default=None, help="default: 300 on a GPU (the preset), 4 on CPU")
    ap.add_argument("--big-steps", type=int, default=None, help="default: 20 on a GPU, 3 on CPU")
    ap.add_argument("--big-budget-s", type=float, default=240.0, help="no big step starts after this many seconds")
    ap.add_argument("--big-tokens", type=int, default=None, help="completion tokens; default: 256 on a GPU, 16 on CPU")
    ap.add_argument("--shape", choices=list(SHAPES), default=None, help="default: 0.5b on a GPU, small on CPU")
    ap.add_argument("--skip", nargs="*", default=[], choices=["demo", "big"])
    ap.add_argument("--no-profile", action="store_true", help="no extra big step with its update under torch.profiler "
                    "(and, on CUDA, the allocator's history: what was live at the update's peak)")
    ap.add_argument("--out-dir", default=None, help="each part's JSON written here as it ends (default: a temporary "
                    "folder); $OUT/gpu-check on a lent machine, so what finished comes back")
    ap.add_argument("--out", default=None, help="also write the whole JSON here at the end")
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    work = Path(tempfile.mkdtemp(prefix="cohort-gpu-check-"))
    out_dir = Path(args.out_dir) if args.out_dir else work / "out"
    doc = {"generated": time.strftime("%Y-%m-%d %H:%M:%S"), "device": str(device), "python": platform.python_version(),
           "torch": torch.__version__, "transformers": transformers.__version__,
           "device_name": torch.cuda.get_device_name(device) if gpu else platform.processor()}
    rate = matmul_rate(device, 8192 if gpu else 1024)
    doc["bf16_matmul_tflops"] = rate / 1e12
    print(f"bf16 matmul: {rate / 1e12:.1f} TFLOP/s", file=sys.stderr, flush=True)
    parts = {}
    if "big" not in args.skip:
        parts["big"] = lambda: run_big(device, args.shape or ("0.5b" if gpu else "small"), args.big_steps or (20 if gpu else 3),
                                       args.big_tokens or (256 if gpu else 16), work, rate, args.big_budget_s,
                                       not args.no_profile)
    if "demo" not in args.skip:
        parts["demo"] = lambda: run_demo(device, args.demo_steps or (300 if gpu else 4), work)
    run_parts(parts, out_dir, doc)
    text = json.dumps(doc, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return doc


if __name__ == "__main__":
    main()
