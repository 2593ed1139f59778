"""Where one weight sync goes, phase by phase, for a model in the in-process vLLM engine (`cohort train`'s default).

Builds the engine and the trainer's policy as `cohort train` does for a checkpoint (float32 here, or --dtype), samples
one batch to take canaries from (as the first step does), then times, over --repeats pushes of a perturbed copy of the
policy: the push (`VLLMEngine.update_weights` with the weights as a stream, split into the stream's own cost and
vLLM's reload), the engine's canary scoring (`VLLMEngine.score`) and the trainer's (`completion_logprobs` under
no_grad). Prints one JSON object with the median of each and the load before and after.

    .venv/bin/python bench/sync_phases.py --model gguf:smollm2-135m-instruct [--repeats 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import _common as common

common.cohort_cli_environment()  # as `cohort train` runs, before torch loads

import torch  # noqa: E402

from cohort.models.batching import pack_right_padded  # noqa: E402
from cohort.models.logprobs import completion_logprobs  # noqa: E402
from cohort.models.pretrained import load_policy, load_tokenizer, resolve_model_dir  # noqa: E402
from cohort.rollout.base import SamplingConfig, WeightStream  # noqa: E402
from cohort.rollout.engines.vllm import VLLMEngine  # noqa: E402
from cohort.trainer.sync_check import CANARY_TOKENS_FLOAT32  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gguf:smollm2-135m-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--canary-tokens", type=int, default=CANARY_TOKENS_FLOAT32)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    model_dir = resolve_model_dir(args.model)
    tok = load_tokenizer(model_dir)
    dtype = getattr(torch, args.dtype)
    policy = load_policy(model_dir, dtype)
    engine = VLLMEngine(model_dir, dtype=args.dtype, max_model_len=512)
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], add_generation_prompt=True,
                                           tokenize=False), add_special_tokens=False)["input_ids"]
               for a, b in [(3, 4), (12, 9), (25, 17), (8, 30)]]
    outs = engine.generate(prompts * 8, SamplingConfig(max_tokens=48, temperature=0.7), seeds=list(range(32)))
    canaries, used = [], 0
    for p, o in zip(prompts * 8, outs):
        if used >= args.canary_tokens:
            break
        canaries.append((p, list(o.token_ids)))
        used += len(o.token_ids)
    names = [n for n, _ in policy.named_parameters()]
    times = {"stream_only": [], "push": [], "engine_score": [], "trainer_score": []}
    for r in range(args.repeats):
        with torch.no_grad():  # a new version: every weight moved a little, as after an update
            for p in policy.parameters():
                p.add_(torch.randn_like(p), alpha=1e-4)
        stream = WeightStream(lambda: ((n, p.detach().to(dtype)) for n, p in policy.named_parameters()))
        t = time.perf_counter()
        for _ in stream:
            pass
        times["stream_only"].append(time.perf_counter() - t)
        t = time.perf_counter()
        engine.update_weights(stream, r + 1)
        times["push"].append(time.perf_counter() - t)
        t = time.perf_counter()
        engine.score([p for p, _ in canaries], [c for _, c in canaries], 1.0)
        times["engine_score"].append(time.perf_counter() - t)
        t = time.perf_counter()
        packed = pack_right_padded([p for p, _ in canaries], [c for _, c in canaries], 0, "cpu")
        with torch.no_grad():
            completion_logprobs(policy, packed.input_ids, packed.attention_mask, packed.prompt_lengths,
                                packed.completion_ids, packed.completion_mask)
        times["trainer_score"].append(time.perf_counter() - t)
    result = {
        "model": args.model, "dtype": args.dtype, "parameters": sum(p.numel() for p in policy.parameters()),
        "tensors": len(names), "canaries": len(canaries), "canary_tokens": used, "repeats": args.repeats,
        "median_s": {k: round(statistics.median(v), 4) for k, v in times.items()},
        "all_s": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "torch_threads": torch.get_num_threads(), "load_before": load_before, "load_after": os.getloadavg(),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
