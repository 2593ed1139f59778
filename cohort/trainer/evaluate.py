"""Greedy (or sampled, pass@k) evaluation of the current policy on held-out prompts.

`evaluate` scores with any engine (the trainer's, before and after training);
`evaluate_model` is `cohort eval`: model.path scored with an engine and the
rewards only, no optimizer and no trainer.

Accuracy is the mean score of the *first* reward function, counting a score
>= 0.5 as correct: the first reward is taken to be the task's correctness check
(numeric_match, accuracy, code_tests ...). A function with partial credit says
where correct starts in its `correct_at` attribute (reasoning_gym: 1.0, since
reasoning-gym's default scorer gives "10" 0.5 for the answer "1"). Rows it
cannot score (None) are left out. `eval/reward` is the mean weighted total of
all functions.
"""

from __future__ import annotations

import numpy as np
import torch

from cohort.data.run_data import load_data
from cohort.models.pretrained import checkpoint_parameters, load_run_tokenizer, resolve_model_dir
from cohort.models.devices import resolve_device
from cohort.models.precision import resolve_precision
from cohort.prompts import encode_prompts
from cohort.rewards import RewardSet
from cohort.rollout.base import SamplingConfig, completion_seeds, decode_completion
from cohort.agents import agent_setup as agents
from cohort.rollout.collect import tool_arguments
from cohort.tools.tool_setup import rows_by_prompt, wrap_engine
from cohort.trainer.build_engine import build_engine, engine_length, set_torch_threads


CORRECT_AT = 0.5


def correct_at(rewards) -> float:
    """The first reward's score from which a completion counts as correct: its own `correct_at`, else 0.5."""
    functions = getattr(rewards, "functions", None) or [None]
    return float(getattr(functions[0], "correct_at", CORRECT_AT))


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
    texts = [decode_completion(tokenizer, o) for o in outs]
    key = dataset.prompt_key
    completions = [[{"role": "assistant", "content": t}] if isinstance(r[key], list) else t for r, t in zip(rows, texts)]
    columns = {c: [r.get(c) for r in rows] for c in dataset.columns}
    scored = rewards.score(prompts=[r[key] for r in rows], completions=completions, completion_ids=[o.token_ids for o in outs],
                           columns=columns, group_size=k, optional=tool_arguments(outs, [r[key] for r in rows]))
    first = scored.per_function[:, 0].reshape(-1, k)  # (P, k)
    correct = np.where(np.isnan(first), np.nan, (first >= correct_at(rewards)).astype(float))
    scorable = ~np.all(np.isnan(first), axis=1)
    accuracy = float(np.nanmean(correct)) if scorable.any() else float("nan")
    pass_k = float(np.mean(np.nanmax(np.nan_to_num(correct[scorable], nan=0.0), axis=1))) if scorable.any() else float("nan")
    total = scored.total[np.isfinite(scored.total)]
    return {"accuracy": accuracy, f"pass@{k}": pass_k, "reward": float(total.mean()) if total.size else float("nan"),
            "num_prompts": len(dataset.rows), "completions": texts}


def evaluate_model(cfg, *, num_samples: int = 1, temperature: float = 0.0) -> dict | None:
    """`cohort eval`: model.path on the eval data with the configured rewards and engine; None when there is no eval data.

    The prompts are encoded and the engine sized exactly as the trainer does (train and eval prompts both), so a
    model scores the same here as in a run's "before" eval."""
    train, evals, specs = load_data(cfg)
    if evals is None:
        return None
    torch.manual_seed(cfg.train.seed)
    rewards, engine = RewardSet.from_specs(specs), None
    try:
        model_dir = resolve_model_dir(cfg.model.path, cfg.model.revision)
        device = resolve_device(cfg.train.device)  # the trainer's device: a transformers engine generates there
        set_torch_threads(cfg, num_parameters=checkpoint_parameters(model_dir), device=device)  # before the engine
        tokenizer = load_run_tokenizer(model_dir, cfg.model)
        prompts = encode_prompts(cfg, tokenizer, model_dir, train, evals)  # raises if one cannot fit
        engine = build_engine(cfg, model_dir, tokenizer, precision=resolve_precision(cfg.model.dtype, cfg.train.precision, device),
                              device=device, max_model_len=engine_length(cfg, model_dir, prompts.train_ids + prompts.eval_ids))
        if cfg.tools.enabled:  # multi-turn, as in training
            engine = wrap_engine(cfg.tools, engine, tokenizer, rows_by_prompt(prompts.eval_ids, prompts.eval.rows))
        if cfg.agent.enabled:  # agent runs, as in training
            engine = agents.wrap_engine(cfg, engine, tokenizer, rows_by_prompt(prompts.eval_ids, prompts.eval.rows),
                                        max_model_len=engine_length(cfg, model_dir, prompts.train_ids + prompts.eval_ids))
        return evaluate(engine, tokenizer, prompts.eval, prompts.eval_ids, rewards, max_tokens=cfg.rollout.max_completion_length,
                        num_samples=num_samples, temperature=temperature, seed=cfg.rollout.seed)
    finally:
        if engine is not None:
            engine.close()
        rewards.close()
