"""Evaluation of the current policy on held-out prompts: greedy accuracy, what a constant answer gets, pass@k.

`evaluate` scores with any engine (the trainer's, before and after training);
`evaluate_model` is `cohort eval`: model.path scored with an engine and the
rewards only, no optimizer and no trainer.

Accuracy is the mean score of the *first* reward function, counting a score
>= 0.5 as correct: the first reward is taken to be the task's correctness check
(numeric_match, accuracy, code_tests ...). A function with partial credit says
where correct starts in its `correct_at` attribute (a task scorer with partial
credit says 1.0, since it may give "10" 0.5 for the answer "1"). Rows it
cannot score (None) are left out. `eval/reward` is the mean weighted total of
all functions.

Beside the greedy accuracy, when the first function reads answers (cohort/rewards/answer_reading.py), the answer
breakdown (cohort/runs/answer_stats.py): the best constant answer and its accuracy on the same items
(`constant_answer`, `constant_accuracy`), the accuracy on the items whose reference is not among the two most common
(`common_answers`, `beyond_common_accuracy`, `beyond_common_prompts`), what the model's answers score if they ignored
the question, on all of them and beyond the common answers (`chance_accuracy`, `beyond_common_chance`), the accuracy
on each common reference beside how often the model gives it (`by_reference`), and the distribution of the model's
greedy answers (`answers`); else `breakdown_missing` says why. A tools run adds `tools`: its greedy trajectories'
tool metrics as training logs them (cohort/tools/episode.py: calls per trajectory, calls by form and the share in the
template's tags, calls the parser ignored, the share whose answer used a tool's result, the statuses). With `num_samples` n > 0, n more completions per prompt at
`temperature` give `pass@1` and `pass@k` (Chen et al.'s unbiased estimator; k = `pass_k`, at most n).
"""

from __future__ import annotations

import numpy as np
import torch

from cohort.models.pretrained import checkpoint_parameters, load_run_tokenizer, resolve_model_dir
from cohort.models.devices import resolve_device
from cohort.models.precision import resolve_precision
from cohort.connectors import routed
from cohort.plan.run_environment import RunEnvironment, run_data
from cohort.plan.run_rewards import reward_specs
from cohort.prompts import encode_prompts
from cohort.rewards import RewardSet
from cohort.rewards.answer_reading import Unreadable, answer_reader, read_pairs
from cohort.rollout.base import SamplingConfig, completion_seeds, decode_completion
from cohort.agents import agent_setup as agents
from cohort.rollout.collect import as_completion, episode_arguments, episode_metrics, failed_episodes, shown_prompts
from cohort.tools.tool_setup import prompt_with_observation, rows_by_index, run_rows, wrap_engine
from cohort.runs import answer_stats
from cohort.trainer.build_engine import build_engine, engine_length, set_torch_threads


CORRECT_AT = 0.5


def correct_at(rewards) -> float:
    """The first reward's score from which a completion counts as correct: its own `correct_at`, else 0.5."""
    functions = getattr(rewards, "functions", None) or [None]
    return float(getattr(functions[0], "correct_at", CORRECT_AT))


def _generate_and_score(engine, tokenizer, dataset, prompt_ids, rewards, *, max_tokens: int, k: int, temperature: float,
                        seed: int, first_row: int) -> dict:
    """`k` completions per prompt (greedy at temperature 0): their texts, chat-or-text completions, columns (one
    entry per completion), correctness (P, k) with NaN where unscored, and the scores' weighted totals."""
    prompts = [ids for ids in prompt_ids for _ in range(k)]
    rows = [row for row in dataset.rows for _ in range(k)]
    seeds = completion_seeds(seed, 10**6, len(prompts)) if temperature > 0 else None
    outs = engine.generate(prompts, SamplingConfig(max_tokens, temperature), seeds,
                           [first_row + i for i in range(len(dataset.rows)) for _ in range(k)])
    texts = [decode_completion(tokenizer, o) for o in outs]
    shown = shown_prompts(outs, [r[dataset.prompt_key] for r in rows])  # (with an environment's first observation)
    completions = [as_completion(p, t, o.episode) for p, t, o in zip(shown, texts, outs)]
    columns = {c: [r.get(c) for r in rows] for c in dataset.columns}
    scored = rewards.score(prompts=shown, completions=completions, completion_ids=[o.token_ids for o in outs],
                           columns=columns, group_size=k, optional=episode_arguments(outs, shown),
                           unscored=failed_episodes(outs))
    first = scored.per_function[:, 0].reshape(-1, k)  # (P, k)
    correct = np.where(np.isnan(first), np.nan, (first >= correct_at(rewards)).astype(float))
    return {"texts": texts, "completions": completions, "columns": columns, "correct": correct, "total": scored.total,
            "episodes": episode_metrics(outs)}


def evaluate(engine, tokenizer, dataset, prompt_ids, rewards, *, max_tokens: int, num_samples: int = 0, pass_k: int = 1,
             temperature: float = 1.0, seed: int = 0, first_row: int = 0) -> dict:
    """Greedy accuracy (and the answer breakdown) on every prompt; with `num_samples` > 0, pass@1 and pass@`pass_k`
    from that many samples per prompt at `temperature` (module docstring). The greedy completions are in
    "completions", for inspection; everything else is a number, a short list or a line of text."""
    greedy = _generate_and_score(engine, tokenizer, dataset, prompt_ids, rewards, max_tokens=max_tokens, k=1,
                                 temperature=0.0, seed=seed, first_row=first_row)
    correct = greedy["correct"][:, 0]  # (P,)
    total = greedy["total"][np.isfinite(greedy["total"])]
    result = {"accuracy": float(np.nanmean(correct)) if np.isfinite(correct).any() else float("nan"),
              "reward": float(total.mean()) if total.size else float("nan"), "num_prompts": len(dataset.rows)}
    result.update(answer_breakdown(rewards, greedy["completions"], greedy["columns"], correct))
    tools = {key.removeprefix("tools/"): value for key, value in greedy["episodes"].items() if key.startswith("tools/")}
    if tools:  # a tools run: its greedy trajectories' calls, as the training console counts them
        result["tools"] = tools
    if num_samples > 0:
        sampled = _generate_and_score(engine, tokenizer, dataset, prompt_ids, rewards, max_tokens=max_tokens,
                                      k=num_samples, temperature=temperature, seed=seed, first_row=first_row)
        k = min(pass_k, num_samples)
        result.update({"pass@1": answer_stats.mean_pass_at_k(sampled["correct"], 1),
                       f"pass@{k}": answer_stats.mean_pass_at_k(sampled["correct"], k),
                       "pass_samples": num_samples, "pass_temperature": temperature})
    result["completions"] = greedy["texts"]
    return result


def answer_breakdown(rewards, completions: list, columns: dict[str, list], correct: np.ndarray) -> dict:
    """The eval record's answer fields (module docstring) for one completion per row; `breakdown_missing` (a line)
    when the first reward function does not read answers."""
    reader = answer_reader(rewards)
    if isinstance(reader, Unreadable):
        return {"breakdown_missing": reader.reason}
    answers, references = read_pairs(reader, completions, columns)
    if all(r is None for r in references):
        return {"breakdown_missing": "no held-out row has a reference answer", "answers": answer_stats.answer_distribution(answers)}
    constant, constant_accuracy = answer_stats.constant_baseline(references)
    beyond_accuracy, beyond_prompts = answer_stats.beyond_common(references, correct.tolist())
    return {"constant_answer": constant, "constant_accuracy": constant_accuracy,
            "chance_accuracy": answer_stats.chance_accuracy(answers, references),
            "common_answers": answer_stats.common_answers(references),
            "beyond_common_accuracy": beyond_accuracy, "beyond_common_prompts": beyond_prompts,
            "beyond_common_chance": answer_stats.chance_accuracy(answers, references, answer_stats.beyond_items(references)),
            "by_reference": answer_stats.by_reference(answers, references, correct.tolist()),
            "answers": answer_stats.answer_distribution(answers)}


def evaluate_model(cfg, *, num_samples: int, pass_k: int, temperature: float,
                   environment: RunEnvironment | None = None) -> dict | None:
    """`cohort eval`: model.path on the eval data with the run's rewards (as the trainer composes them) and engine;
    None when there is no eval data. `environment`: the plan's (`RunPlan.environment`: what validation resolved).

    The prompts are encoded and the engine sized exactly as the trainer does (train and eval prompts both), so a
    model scores the same here as in a run's "before" eval."""
    environment = environment if environment is not None else RunEnvironment(cfg)
    cfg = routed(cfg)[0]  # (`environment` read into its hub's field, which the wrappers below read)
    train, evals, task_specs = run_data(cfg, environment)
    if evals is None:
        return None
    torch.manual_seed(cfg.train.seed)
    rewards, engine = RewardSet.from_specs(reward_specs(cfg, environment, task_specs)), None
    try:
        model_dir = resolve_model_dir(cfg.model.path, cfg.model.revision)
        device = resolve_device(cfg.train.device)  # the trainer's device: a transformers engine generates there
        set_torch_threads(cfg, num_parameters=checkpoint_parameters(model_dir), device=device)  # before the engine
        tokenizer = load_run_tokenizer(model_dir, cfg.model)
        prompts = encode_prompts(cfg, tokenizer, model_dir, train, evals, environment.tools)  # raises if one cannot fit
        max_model_len = engine_length(cfg, model_dir, prompts.train_ids + prompts.eval_ids)
        engine = build_engine(cfg, model_dir, tokenizer, precision=resolve_precision(cfg.model.dtype, cfg.train.precision, device),
                              device=device, max_model_len=max_model_len)
        rows = rows_by_index(run_rows(prompts.train, prompts.eval))  # (the trainer's table: eval rows after train's)
        if cfg.tools.enabled:  # multi-turn, as in training
            engine = wrap_engine(cfg.tools, engine, tokenizer, rows, max_model_len=max_model_len, resolution=environment.tools,
                                 prompt_with=prompt_with_observation(prompts.renderer.encode, prompts.eval.prompt_key))
        if cfg.agent.enabled:  # agent runs, as in training
            engine = agents.wrap_engine(cfg, engine, tokenizer, rows, max_model_len=max_model_len,
                                        agent=environment.agent(cfg.model.path))
        return evaluate(engine, tokenizer, prompts.eval, prompts.eval_ids, rewards, max_tokens=cfg.rollout.max_completion_length,
                        num_samples=num_samples, pass_k=pass_k, temperature=temperature, seed=cfg.rollout.seed,
                        first_row=len(prompts.train.rows))
    finally:
        if engine is not None:
            engine.close()
        rewards.close()
