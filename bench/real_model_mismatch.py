"""The trainer/engine log-prob gap on a real model under bf16: the LM head in bf16 (autocast's) against float32, one JSON.

vLLM in bfloat16 (cohort's engine, as `model.dtype=bfloat16` runs it) samples 4 completions of 48 tokens at temperature
0.7 for each of 8 held-out "What is a + b?" chat prompts (bench/_common.py); the trainer's float32 master weights then
score the same tokens at the same temperature three ways:
- `head_bf16`: everything under bf16 autocast, the head included (the full logits' log_softmax: what the log-prob kernel
  computed in its forward before it kept the head in float32, cohort/models/logprobs.py);
- `head_float32`: the kernel as it is (`completion_logprobs` under autocast: the body in bf16, the head in float32);
- `float32`: no autocast at all (the trainer's float32 numbers; its own distance from the bf16 engine).
Per variant: mean and max |engine − trainer| per token over the sampled tokens (what `mismatch/*` reports in a run),
and the same over the tokens the engine gave p > 0.8 (the confident ones).

    .venv/bin/python bench/real_model_mismatch.py --model-dir DIR [--out bench/real_model_mismatch.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import _common as common


def gaps(engine, trainer, confident) -> dict:
    gap = (engine - trainer).abs()
    return {"mean": float(gap.mean()), "max": float(gap.max()),
            "confident_mean": float(gap[confident].mean()) if confident.any() else None, "tokens": int(gap.numel())}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    from cohort.models.batching import pack_right_padded
    from cohort.models.pretrained import load_policy, load_tokenizer
    from cohort.models.logprobs import completion_logprobs, naive_completion_logprobs
    from cohort.rollout.base import SamplingConfig
    from cohort.rollout.engines.vllm import VLLMEngine

    load_before, started = common.load_average(), time.strftime("%H:%M:%S")
    tokenizer = load_tokenizer(Path(args.model_dir))
    _, held_out = common.sum_question_rows()
    prompts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True) for r in held_out[:8]]
    prompts = [list(p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p) for p in prompts]
    engine = VLLMEngine(Path(args.model_dir), dtype="bfloat16", max_model_len=256)
    group = [p for p in prompts for _ in range(4)]
    outs = engine.generate(group, SamplingConfig(max_tokens=48, temperature=0.7), list(range(len(group))))
    engine.close()
    completions = [list(o.token_ids) for o in outs]
    engine_logp = torch.tensor([x for o in outs for x in o.logprobs], dtype=torch.float64)
    policy = load_policy(Path(args.model_dir), "float32")
    pb = pack_right_padded(group, completions, tokenizer.pad_token_id)
    packed = (policy, pb.input_ids, pb.attention_mask, pb.prompt_lengths, pb.completion_ids, pb.completion_mask)
    mask = pb.completion_mask.bool()
    confident = engine_logp.exp() > 0.8
    result = {"benchmark": "real_model_mismatch", "model_dir": args.model_dir, "completions": len(group)}
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            head_bf16 = naive_completion_logprobs(*packed, temperature=0.7)[0]
            head_float32 = completion_logprobs(*packed, temperature=0.7)[0]
        float32 = completion_logprobs(*packed, temperature=0.7)[0]
    for name, logp in (("head_bf16", head_bf16), ("head_float32", head_float32), ("float32", float32)):
        result[name] = gaps(engine_logp, logp[mask].double(), confident)
    result |= {"confident_tokens": int(confident.sum()), "load_before": load_before, "started": started,
               "load_after": common.load_average()}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
