"""Run N cohort GRPO steps on a benchmark workload and summarise them (used by grpo_step.py and long_completion.py).

The trainer is driven step by step (no eval, no checkpoint), so the numbers are
the steady-state cost of an optimizer step. The first step is excluded from the
medians (one-time warm-up: allocator growth, vLLM's first batch shapes).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import _common as common

PHASES = ("generate", "reward", "logprob", "update", "sync")


def cohort_overrides(model_dir: Path, data_file: Path, *, prompts_per_step: int, num_generations: int, max_completion_length: int,
                     steps: int, engine: str, threads: int, run_dir: Path, extra: list[str]) -> list[str]:
    per_step = prompts_per_step * num_generations
    return [
        f"model.path={model_dir}", f"data.train_files=[{data_file}]", "data.max_prompt_length=16",
        f"engine.name={engine}", f"rollout.num_generations={num_generations}", f"rollout.max_completion_length={max_completion_length}",
        "rollout.temperature=1.0", "algorithm.beta=0.0", "algorithm.loss_type=dapo",
        # the whole step in one micro-batch as TRL does (per_device_train_batch_size = completions per step), split by
        # the token budget where sequences are long: the fast path
        f"train.prompts_per_step={prompts_per_step}", f"train.micro_batch_size={per_step}", "train.max_tokens_per_microbatch=2048",
        "train.learning_rate=1e-4",
        f"train.max_steps={steps}", f"train.num_threads={threads}",
        "rewards=[{name: 'bench._common:addition_reward'}]",
        f"run.output_dir={run_dir}", "run.progress=false", "run.loggers=[jsonl]", "run.log_completions_every=0",
        *extra,
    ]


def run_steps(overrides: list[str], steps: int, *, limits: bool = False) -> dict:
    """Build a Trainer from `overrides`, run `steps` optimizer steps, return the summary (first step excluded).

    `limits`: afterwards, also time the phases' limits on the last batch (see `phase_limits`).
    """
    sys.path.insert(0, str(common.REPO))
    from cohort.config.resolve import load_config
    from cohort.trainer.trainer import Trainer

    start = time.perf_counter()
    trainer = Trainer(load_config(None, overrides), log=lambda *a, **k: None)
    setup_s = time.perf_counter() - start
    records = []
    with common.LoadWatch() as load:
        for _ in range(steps):
            metrics = trainer.step()
            batch = trainer.state.batch
            train_tokens = sum(len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids))
            records.append({"metrics": metrics, "train_tokens": train_tokens,
                            "completion_tokens": sum(len(c) for c in batch.completion_ids),
                            "lengths": [len(c) for c in batch.completion_ids]})
        extra = phase_limits(trainer, trainer.state.batch) if limits else {}
        if extra:
            last = records[-1]["metrics"]
            extra["limits"]["last_update_s"] = last.get("timing/update_s", 0.0)
            extra["limits"]["update_over_bare"] = last.get("timing/update_s", 0.0) / extra["limits"]["bare_fwd_bwd_s"]
            tokens = records[-1]["completion_tokens"]
            in_loop = tokens / last["timing/generate_s"] if last.get("timing/generate_s") else None
            extra["limits"]["last_generate_tokens_per_s"] = in_loop
            extra["limits"]["generate_over_raw"] = (in_loop / extra["limits"]["engine_raw_tokens_per_s"]) if in_loop else None
    trainer.close()
    return summarise(records, setup_s=setup_s) | extra | load.record() | {"peak_rss_mib": common.peak_rss_mib(),
                                                                           "peak_child_rss_mib": common.peak_child_rss_mib()}


def phase_limits(trainer, batch, repeats: int = 3) -> dict:
    """How fast each phase could be, on the same batch.

    - generation: the engine alone generating the batch's prompts again (same
      sampling, fresh seeds), best of `repeats`: its raw tokens/s;
    - update: a bare forward + backward (plain logits, cross-entropy on the
      completion tokens) over the same micro-batches the trainer formed, best
      of `repeats`, and the same over every sequence alone (no padding at all).
    """
    import torch

    from cohort.rollout.base import SamplingConfig
    from cohort.models.batching import pack_right_padded

    cfg = trainer.cfg
    sampling = SamplingConfig(cfg.rollout.max_completion_length, cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k)
    trainer.sync.push()
    gen = []
    for r in range(repeats):
        start = time.perf_counter()
        outs = trainer.parts.engine.generate(batch.prompt_ids, sampling, [10_000 * (r + 1) + i for i in range(len(batch))])
        gen.append((sum(len(o.token_ids) for o in outs), time.perf_counter() - start))
    raw_tokens_per_s = max(t / s for t, s in gen)

    def bare(groups: list[list[int]]) -> float:
        start = time.perf_counter()
        for idx in groups:
            pb = pack_right_padded([batch.prompt_ids[i] for i in idx], [batch.completion_ids[i] for i in idx], trainer.parts.pad_id)
            logits = trainer.parts.policy(input_ids=pb.input_ids, attention_mask=pb.attention_mask).logits  # (B, L, V)
            targets = pb.input_ids[:, 1:].masked_fill(pb.attention_mask[:, 1:] == 0, -100)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten())
            loss.backward()
        trainer.parts.policy.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    micro = trainer.micro_batches(batch, list(range(len(batch))))  # the micro-batches the trainer's update forms
    bare_s = min(bare(micro) for _ in range(repeats))
    unpadded_s = min(bare([[i] for i in range(len(batch))]) for _ in range(repeats))
    return {"limits": {"engine_raw_tokens_per_s": raw_tokens_per_s, "bare_fwd_bwd_s": bare_s, "bare_fwd_bwd_unpadded_s": unpadded_s,
                       "micro_batches": len(micro)}}


def summarise(records: list[dict], *, setup_s: float) -> dict:
    """Medians over steps 2..N, throughputs over the same steps, and the per-phase breakdown."""
    steady = records[1:] or records
    m = [r["metrics"] for r in steady]
    phase = {p: common.median([x.get(f"timing/{p}_s", 0.0) for x in m]) for p in PHASES}
    gen_s = sum(x.get("timing/generate_s", 0.0) for x in m)
    upd_s = sum(x.get("timing/update_s", 0.0) for x in m)
    lengths = sorted(l for r in steady for l in r["lengths"])
    step_s = common.median([x["timing/step_s"] for x in m])
    out = {
        "median_step_s": step_s,
        "mean_step_s": sum(x["timing/step_s"] for x in m) / len(m),
        "step_s_all": [round(r["metrics"]["timing/step_s"], 4) for r in records],
        "phases_median_s": phase,
        "phases_share": {p: (v / step_s if step_s else 0.0) for p, v in phase.items()},
        "other_median_s": step_s - sum(phase.values()),
        "rollout_tokens_per_s": sum(r["completion_tokens"] for r in steady) / gen_s if gen_s else None,
        "train_tokens_per_s": sum(r["train_tokens"] for r in steady) / upd_s if upd_s else None,
        "train_completion_tokens_per_s": sum(r["completion_tokens"] for r in steady) / upd_s if upd_s else None,
        "padding_fraction": common.median([x.get("padding_fraction", 0.0) for x in m]),
        "completion_length": {"mean": sum(lengths) / len(lengths), "p50": lengths[len(lengths) // 2],
                              "p90": lengths[int(len(lengths) * 0.9)], "max": lengths[-1]} if lengths else {},
        "reward_mean": common.median([x.get("reward", float("nan")) for x in m]),
        "setup_s": setup_s,
        "steps": len(records),
    }
    return out


def default_run_dir(name: str) -> Path:
    return common.CACHE / "runs" / f"{name}-{os.getpid()}"
