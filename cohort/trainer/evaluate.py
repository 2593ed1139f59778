"""Greedy (or sampled, pass@k) evaluation of the current policy on held-out prompts.

Accuracy is the mean score of the *first* reward function, counting a score
>= 0.5 as correct: the first reward is taken to be the task's correctness check
(numeric_match, accuracy, code_tests ...). Rows it cannot score (None) are left
out. `eval/reward` is the mean weighted total of all functions.
"""

from __future__ import annotations

import numpy as np

from cohort.rollout.base import SamplingConfig, completion_seeds, completion_text


def evaluate(engine, tokenizer, dataset, prompt_ids, rewards, *, max_tokens: int, num_samples: int = 1,
             temperature: float = 0.0, seed: int = 0) -> dict:
    """Scores `num_samples` completions per prompt; greedy when temperature is 0.

    Returns accuracy (mean over samples), pass@k (any sample correct, k = num_samples),
    mean reward, and the completions for inspection.
    """
    k = num_samples
    prompts = [ids for ids in prompt_ids for _ in range(k)]
    rows = [row for row in dataset.rows for _ in range(k)]
    sampling = SamplingConfig(max_tokens, temperature)
    seeds = completion_seeds(seed, 10**6, len(prompts)) if temperature > 0 else None
    outs = engine.generate(prompts, sampling, seeds)
    texts = [completion_text(tokenizer, o) for o in outs]
    key = dataset.prompt_key
    completions = [[{"role": "assistant", "content": t}] if isinstance(r[key], list) else t for r, t in zip(rows, texts)]
    columns = {c: [r.get(c) for r in rows] for c in dataset.columns}
    scored = rewards.score(prompts=[r[key] for r in rows], completions=completions, completion_ids=[o.token_ids for o in outs],
                           columns=columns, group_size=k)
    first = scored.per_function[:, 0].reshape(-1, k)  # (P, k)
    correct = np.where(np.isnan(first), np.nan, (first >= 0.5).astype(float))
    scorable = ~np.all(np.isnan(first), axis=1)
    accuracy = float(np.nanmean(correct)) if scorable.any() else float("nan")
    pass_k = float(np.mean(np.nanmax(np.nan_to_num(correct[scorable], nan=0.0), axis=1))) if scorable.any() else float("nan")
    total = scored.total[np.isfinite(scored.total)]
    return {"accuracy": accuracy, f"pass@{k}": pass_k, "reward": float(total.mean()) if total.size else float("nan"),
            "num_prompts": len(dataset.rows), "completions": texts}
