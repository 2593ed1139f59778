"""LoRA rollout sync, two ways, on vLLM's CPU backend (prints JSON): merged weights pushed vs vLLM's LoRA adapter.

- `merged` (what cohort does): W + s·B@A in float32 per adapted layer, pushed with `reload_weights` (VLLMEngine).
- `adapter`: vLLM built with enable_lora; the adapter is saved in peft's format each step and generation runs with
  a LoRARequest(load_inplace=True), so vLLM re-reads it.

Each mode runs in its own process (one vLLM per process), on a ~31.7M-parameter random Qwen2 with a rank-16 adapter
on every linear layer (random B, so the adapter changes the output). Per step: a sync (a new adapter: B scaled)
then one generation batch (64 prompts × 32 tokens, greedy); reported are medians over the steps after the first, and
the mean log-prob of the same greedy tokens under each mode (the two must agree to ~1e-5 when both apply the adapter).

    PYTHONPATH=. python bench/lora_sync.py [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # as VLLMEngine sets it (kv_cache_gib 1)
RANK = 16


def _lora_policy(model_dir: Path, step: int):
    import torch

    from cohort.config.resolve import load_config
    from cohort.models.pretrained import load_policy
    from cohort.models.lora import attach_lora

    cfg = load_config({"model": {"path": str(model_dir)}, "lora": {"rank": RANK}})
    model = load_policy(model_dir, "float32")
    lora = attach_lora(model, cfg.lora)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in lora.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.02 if "lora_A" in name else 0.02 * (1 + step)))
    return lora


def child(mode: str, model_dir: Path, steps: int, work: Path) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=[5 + i % 40, 6, 7, 8]) for i in range(64)]
    greedy = SamplingParams(max_tokens=32, temperature=0.0, logprobs=0, detokenize=False)
    kwargs = dict(model=str(model_dir), tokenizer=str(model_dir), dtype="float32", max_model_len=64, enforce_eager=True,
                  logprobs_mode="processed_logprobs", seed=0)
    if mode == "adapter":
        kwargs.update(enable_lora=True, max_lora_rank=RANK, max_loras=1)
    start = time.perf_counter()
    if mode == "merged":
        from cohort.rollout.engines.vllm import VLLMEngine

        engine = VLLMEngine(model_dir, dtype="float32", max_model_len=64, seed=0)
        llm = engine.llm
    else:
        llm = LLM(**kwargs)
    startup = time.perf_counter() - start
    sync_s, gen_s, mean_logp = [], [], []
    for step in range(steps):
        lora = _lora_policy(model_dir, step)
        t0 = time.perf_counter()
        request = None
        if mode == "merged":
            engine.update_weights(lora.merged_weights(), step + 1)
        else:
            from vllm.lora.request import LoRARequest

            lora.save_adapter(work / "adapter")
            request = LoRARequest("policy", 1, str(work / "adapter"), load_inplace=True)
        t1 = time.perf_counter()
        outs = llm.generate(prompts, greedy, use_tqdm=False, lora_request=request)
        t2 = time.perf_counter()
        sync_s.append(t1 - t0)
        gen_s.append(t2 - t1)
        logps = [float(step_lp[tok].logprob) for o in outs for step_lp, tok in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]
        mean_logp.append(sum(logps) / len(logps))
    return {"mode": mode, "startup_s": startup, "sync_s_median": statistics.median(sync_s[1:]),
            "generate_s_median": statistics.median(gen_s[1:]), "mean_logp_per_step": mean_logp}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--child", nargs=3, metavar=("MODE", "MODEL_DIR", "WORK"))
    args = parser.parse_args()
    if args.child:
        mode, model_dir, work = args.child
        print("RESULT " + json.dumps(child(mode, Path(model_dir), args.steps, Path(work))))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from lora_memory import build_model

    results = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        model_dir = build_model(tmp / "model")
        for mode in ("merged", "adapter"):
            proc = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--child", mode, str(model_dir), str(tmp)],
                                  capture_output=True, text=True)
            found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            results[mode] = json.loads(found[-1][7:]) if found else {"mode": mode, "error": proc.stderr[-1500:]}
    merged, adapter = results["merged"], results["adapter"]
    if "error" not in merged and "error" not in adapter:
        results["max_mean_logp_gap"] = max(abs(a - b) for a, b in zip(merged["mean_logp_per_step"], adapter["mean_logp_per_step"]))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
