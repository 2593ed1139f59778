"""Agent runs as samples: a run that played several seats becomes one sample per seat before the advantages
(`with_seats`), and a run that rewrote its history joins the batch as one sample per call after them
(`with_run_samples`).

Seats (`with_seats`, called on the collected batch before the batch, its log-probs and its advantages are made): a
multi-seat episode (a verifiers multi-agent env, e.g. a two-seat zero-sum game: one trace per seat, each with its own
reward) reaches the trainer as one trajectory per request whose `AgentRun.seats` holds one trajectory per seat (its
calls, cohort/agents/engine.py) with that seat's reward. Each group of G runs (one prompt's episodes) becomes, for
each seat in turn, G rows: that seat's trajectory in each of the G episodes, rewarded with that seat's reward. So the
batch has S x N rows in groups of G, and every later phase (old and reference log-probs, a critic's values, the
advantages, the update's slices, the processes' shards) sees the final rows, exactly as for any task.

Why group by seat: a seat's siblings are the same seat of the other episodes of the same task: the same role, rules
and opponent (the same policy), so the group mean is that seat's baseline on this task, which is what GRPO's
"compare with the other samples of the same prompt" means here. Grouping both seats of one episode together instead
would compare a zero-sum game's winner with its own loser (the mean is always 0, and a seat that is favoured by the
rules would look good for being seated there); pooling every seat of every episode into one group of S x G would
need groups of another size than rollout.num_generations and would still mix the seats' baselines. A run whose
episode failed (no seats) fills each seat's slot with its own trajectory and no reward (NaN: advantage 0, left out
of the group's statistics), so the groups keep their size. The reward set's per-function scores of a seat row are
the seat's reward (an environment's reward set is its one reward, validation refuses others beside it); the run's own
rewards/* metrics stay the episodes' (the seats' mean), and `agent/seat/<name>/reward` is each seat's mean.

Calls (`with_run_samples`): a run (or a seat) whose calls do not form one chain (cohort/agents/runs.py) reaches the
trainer as its last call's trajectory, its earlier calls riding along as `AgentRun.samples`. Everything per group is
computed on the runs, as for any trajectory: G runs per group, their rewards (the agent's), the group statistics and
metrics, the advantages. Then `with_run_samples` inserts each run's earlier calls as rows just before the run's own
row, each with the run's reward and its advantage: the run's one outcome-level advantage
(`RolloutBatch.sequence_advantage`, the value every trained token of the run's row carries) on every trained token of
the sample. So a run that made three calls puts three samples into the loss, all pushed the same way, as the
agent-loop systems do for "one sample per step".

Choices: the call samples are added after the advantages, so a group's statistics count each run once whatever its
number of calls (a run is not weighted by how chatty its agent was in the baseline); in the loss, token-level
aggregations (dapo, bnpo) count every sample's tokens, sequence-level ones each sample as one sequence. Old and
reference log-probs, when the algorithm uses them, are scored again over the widened batch by the caller.

Left out: for the call samples, algorithms with a critic and more than one optimizer step per generation batch
(validation refuses them with an agent: per-token values and the step's slice of the batch would not follow the
inserted rows). A seat played by several traces of one name (best-of-n's solvers) is one seat per trace (`name#k`,
in completion order), not one pooled group.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np
import torch

from cohort.agents.runs import AgentRun
from cohort.rollout.base import Trajectory, decode_completion
from cohort.rollout.collect import Collected
from cohort.trainer.rollout_batch import RolloutBatch


def seat_names(trajectories: Sequence[Trajectory]) -> list[str]:
    """The seats the batch's runs played, in order of first appearance ([] when no run played seats)."""
    names: list[str] = []
    for t in trajectories:
        for seat in t.episode.seats if isinstance(t.episode, AgentRun) else []:
            if seat.episode.seat not in names:
                names.append(seat.episode.seat)
    return names


def with_seats(collected: Collected, group_size: int, tokenizer) -> Collected:
    """`collected` with every multi-seat run widened into one row per seat, each group of `group_size` runs into one
    group per seat (module docstring: "Seats"); `collected` itself when no run played seats."""
    names = seat_names(collected.outs)
    if not names:
        return collected
    scored, width = collected.scored, collected.scored.per_function.shape[1]
    rows, prompts, outs, texts, total = [], [], [], [], []
    for start in range(0, len(collected.outs), group_size):
        for name in names:
            for i in range(start, start + group_size):
                run = collected.outs[i]
                seat = next((s for s in (run.episode.seats if isinstance(run.episode, AgentRun) else [])
                             if s.episode.seat == name), None)
                if seat is None:  # the episode failed (or never seated this one): its trajectory, no reward
                    episode = replace(run.episode, samples=[], seats=[], seat=name) if isinstance(run.episode, AgentRun) else None
                    sample, reward, text = replace(run, episode=episode), None, collected.texts[i]
                else:
                    sample, reward, text = seat, seat.episode.outcome.get("reward"), decode_completion(tokenizer, seat)
                rows.append(collected.rows[i])
                prompts.append(list(sample.prompt_ids) or collected.prompts[i])
                outs.append(sample)
                texts.append(text)
                total.append(float("nan") if reward is None else float(reward))
    total_np = np.array(total, dtype=np.float64)
    metrics = dict(scored.metrics)
    for name in names:
        mine = np.array([r for r, t in zip(total, outs) if isinstance(t.episode, AgentRun) and t.episode.seat == name])
        mine = mine[np.isfinite(mine)]
        metrics[f"agent/seat/{name}/reward"] = float(mine.mean()) if mine.size else float("nan")
    widened = replace(scored, total=total_np, per_function=np.repeat(total_np[:, None], width, axis=1), metrics=metrics)
    return replace(collected, rows=rows, prompts=prompts, outs=outs, texts=texts, scored=widened)


def seat_advantage_metrics(batch: RolloutBatch) -> dict[str, float]:
    """`agent/seat/<name>/advantage_abs`: the mean |advantage| of each seat's rows (0 when its groups taught nothing)."""
    seats = [e.seat if isinstance(e, AgentRun) else None for e in batch.episodes or ()]  # (a tool loop's Episode: no seat)
    if not any(seats):
        return {}
    out: dict[str, list[float]] = {}
    for i, seat in enumerate(seats):
        if seat:
            out.setdefault(seat, []).append(abs(batch.sequence_advantage(i)))
    return {f"agent/seat/{name}/advantage_abs": float(np.mean(values)) for name, values in out.items()}


def run_samples(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """Each trajectory's earlier samples ([] unless it is an agent run that rewrote its history)."""
    return [list(t.episode.samples) if isinstance(t.episode, AgentRun) else [] for t in trajectories]


def with_run_samples(batch: RolloutBatch, trajectories: Sequence[Trajectory], tokenizer) -> RolloutBatch:
    """`batch` (advantages computed, one row per trajectory) with every run's earlier samples inserted before its row,
    each carrying the run's row index, reward and per-function scores, and its advantage on the sample's trained
    tokens. The batch itself when no run has samples."""
    extra = run_samples(trajectories)
    if not any(extra):
        return batch
    order: list[tuple[int, Trajectory | None]] = []  # (the run's row, a sample or None: the row itself)
    for i, samples in enumerate(extra):
        order += [(i, s) for s in samples] + [(i, None)]
    advantages = [batch.sequence_advantage(i) for i in range(len(batch))]
    rows = RolloutBatch(
        row_indices=[batch.row_indices[i] for i, _ in order],
        prompt_ids=[list(s.prompt_ids) if s else batch.prompt_ids[i] for i, s in order],
        completion_ids=[s.token_ids if s else batch.completion_ids[i] for i, s in order],
        engine_logp=[s.logprobs if s else batch.engine_logp[i] for i, s in order],
        truncated=[s.status == "length" if s else batch.truncated[i] for i, s in order],
        completions_text=[decode_completion(tokenizer, s) if s else batch.completions_text[i] for i, s in order],
        rewards=np.array([batch.rewards[i] for i, _ in order]), per_function=batch.per_function[[i for i, _ in order]],
        advantages=torch.empty(0), metrics=batch.metrics, policy_version=batch.policy_version,
        versions=[list(s.versions) if s else batch.versions[i] for i, s in order],
        taken_version=batch.taken_version,
        loss_masks=[list(s.loss_mask) if s else batch.loss_mask_of(i) for i, s in order],
        episodes=[None if s else (batch.episodes[i] if batch.episodes else None) for i, s in order],
        streamed=batch.streamed)
    width = max(1, max(len(c) for c in rows.completion_ids))
    mask = rows.token_mask(list(range(len(rows))), width, batch.advantages.device)  # (N', width)
    values = torch.tensor([advantages[i] for i, _ in order], dtype=batch.advantages.dtype, device=batch.advantages.device)
    return replace(rows, advantages=values[:, None] * mask)  # (N', width): the run's advantage on each trained token
