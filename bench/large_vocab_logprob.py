"""Peak memory of the completion log-prob pass with a Qwen2.5-sized vocabulary: chunked vs naive.

Model: Qwen2 with vocabulary 151,936, hidden 256, 2 layers (untied LM head, as
in the larger Qwen2.5 models; random weights). Batch: 8 sequences of 64 prompt
+ 256 completion tokens. Each variant runs in a fresh subprocess so its peak RSS
(`ru_maxrss`) is its own:

- `chunked`: cohort.models.logprobs.completion_logprobs (completion positions
  only, `chunk_size` rows of logits at a time, recomputed in the backward);
- `naive`: the full (B, T, V) logits and a log-softmax over them
  (naive_completion_logprobs).

Both run forward + backward of the summed log-probs (the training pass); the
parent checks the two agree (log-probs, entropies and a gradient) and reports
RSS above the model's baseline (weights loaded, before the pass).

    .venv/bin/python bench/large_vocab_logprob.py [--chunk-size 1024] [--no-grad]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import _common as common

common.cohort_cli_environment()  # cohort runs here as `cohort train` would: the CLI's environment, before torch loads

VOCAB = 151_936
BATCH, PROMPT, COMPLETION = 8, 64, 256


def model_dir():
    return common.build_model(common.CACHE / "large-vocab-h256-l2", hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, intermediate_size=1024, vocab_size=VOCAB, tie_word_embeddings=False)


def inputs(seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    completion_lengths = torch.randint(COMPLETION // 4, COMPLETION + 1, (BATCH,), generator=g)
    completion_lengths[0] = COMPLETION
    input_ids = torch.randint(0, 256, (BATCH, PROMPT + COMPLETION), generator=g)
    attention_mask = torch.zeros_like(input_ids)
    completion_mask = torch.zeros((BATCH, COMPLETION))
    for b, n in enumerate(completion_lengths.tolist()):
        attention_mask[b, : PROMPT + n] = 1
        completion_mask[b, :n] = 1
    prompt_lengths = torch.full((BATCH,), PROMPT)
    return input_ids, attention_mask, prompt_lengths, input_ids[:, PROMPT:].clone(), completion_mask


def child(variant: str, chunk_size: int, grad: bool, out_path: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from cohort.models.logprobs import completion_logprobs, naive_completion_logprobs

    common.set_threads(2)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir()), dtype=torch.float32)
    args = inputs()
    baseline = common.peak_rss_mib()
    start = time.perf_counter()
    with torch.set_grad_enabled(grad):
        if variant == "chunked":
            logp, entropy = completion_logprobs(model, *args, chunk_size=chunk_size)
        else:
            logp, entropy = naive_completion_logprobs(model, *args)
        if grad:
            logp.sum().backward()
    seconds = time.perf_counter() - start
    grad_probe = model.lm_head.weight.grad[:512].clone() if grad else torch.zeros(1)
    torch.save({"logp": logp.detach(), "entropy": entropy.detach(), "grad": grad_probe}, out_path)
    common.emit({"variant": variant, "seconds": seconds, "baseline_rss_mib": baseline, "peak_rss_mib": common.peak_rss_mib()})


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument("--no-grad", action="store_true")
    ap.add_argument("--child", choices=["chunked", "naive"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.chunk_size, not args.no_grad, args.out)
        return {}
    import torch

    model_dir()
    runs = {}
    with common.LoadWatch() as load:
        for variant in ("chunked", "naive"):
            out = common.CACHE / f"large-vocab-{variant}.pt"
            cmd = [sys.executable, __file__, "--child", variant, "--chunk-size", str(args.chunk_size), "--out", str(out)]
            if args.no_grad:
                cmd.append("--no-grad")
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=common.REPO)
            line = [l for l in proc.stdout.splitlines() if l.startswith("{\"")]
            runs[variant] = json.loads(line[-1]) if line else {"error": proc.stderr[-2000:]}
            runs[variant]["tensors"] = torch.load(out) if out.is_file() else None
    a, b = runs["chunked"].pop("tensors"), runs["naive"].pop("tensors")
    agree = {}
    if a is not None and b is not None:
        agree = {key: float((a[key] - b[key]).abs().max()) for key in ("logp", "entropy", "grad")}
    extra = {v: r.get("peak_rss_mib", float("nan")) - r.get("baseline_rss_mib", float("nan")) for v, r in runs.items()}
    result = {
        "benchmark": "large_vocab_logprob", "vocab_size": VOCAB, "hidden": 256, "layers": 2, "batch": BATCH,
        "prompt_tokens": PROMPT, "max_completion_tokens": COMPLETION, "chunk_size": args.chunk_size, "grad": not args.no_grad,
        "runs": runs, "pass_rss_mib": extra,
        "peak_rss_ratio_chunked_over_naive": runs["chunked"].get("peak_rss_mib", 0) / runs["naive"].get("peak_rss_mib", 1),
        "pass_rss_ratio_chunked_over_naive": extra["chunked"] / extra["naive"] if extra.get("naive") else None,
        "max_abs_diff": agree, "same_results": bool(agree) and max(agree.values()) < 1e-4,
        **load.record(),
    }
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
