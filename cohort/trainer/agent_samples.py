"""Agent runs as samples, before the batch is scored: a run that played several seats becomes one run per seat
(`with_seats`), and a run that rewrote its history one row per model call (`with_call_samples`). Both are called on
the collected batch before its log-probs, a critic's values and its advantages are made, so every later phase sees
the final rows, exactly as for any task.

Seats (`with_seats`, called on the collected batch before the batch, its log-probs and its advantages are made): a
multi-seat episode (an environment of several players, e.g. a two-seat zero-sum game: one trace per seat, each with
its own reward) reaches the trainer as one trajectory per request whose record's `seats` holds one trajectory per seat
(its calls, cohort/agents/engine.py) with that seat's reward. Each group of G runs (one prompt's episodes) becomes, for
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
of the group's statistics), so the groups keep their size. A seat row's per-function scores are the episode's
with the seat's reward in place of the episode's in the agent's column (the first: cohort/plan/run_rewards.py), and
its total is their weighted sum again (the reward set's weights and aggregation): `rewards` beside the environment,
scored once per episode (on the run's completion, with `agent_runs=` its record), are added to every seat's reward,
as they are to a one-seat episode's (docs/environments.md). The run's own rewards/* metrics stay the episodes' (the
agent's column: the seats' mean), and `agent/seat/<name>/reward` is each seat's mean reward from the environment.

Calls (`with_call_samples`, called on the batch of one row per run, after `with_seats`): a run (or a seat) whose
calls do not form one chain (cohort/agents/runs.py) reaches the trainer as its last call's trajectory, its earlier
calls riding along as its record's `samples`. Each earlier call becomes a row just before the run's own row, with the
run's dataset row, reward and per-function scores, and `RolloutBatch.runs` names every row's run (runs numbered in
order, G per prompt group, so run r is sibling r mod G of group r // G). Then, as for any batch: the old, reference
and teacher log-probs score every row, a critic values every row's tokens, and the advantages read `runs`
(`AdvantageInputs.runs`, cohort/algorithms/specs.py): group-relative ones (grpo, rloo, distill's rewards part,
reinforce_pp_baseline's group mean) take their statistics over the G runs of a group, each run counted once, and
give every row of a run the run's advantage on its trained tokens; per-token ones (reinforce_pp's reward-to-go, ppo's
GAE against each row's own values) score each row in its own right with the run's reward on its last trained token.
A step's slice of the batch (train.steps_per_generation, algorithm.num_iterations) and a process's share of a step
are whole runs (`RolloutBatch.rows_of_runs`), so a run's samples train together.

Choices: a group's statistics count each run once whatever its number of calls (a run is not weighted by how chatty
its agent was in the baseline); so do the metrics read from the runs (reward, reward_std, frac_reward_zero_std,
answers/*: the run's last call's text), while the length metrics (completions/*, tokens/generated) count every row
the loss sees. With the KL in an outcome reward (rloo), a run's KL is the sum over all its rows. In the loss,
token-level aggregations (dapo, bnpo) count every sample's tokens, sequence-level ones each sample as one sequence,
and PPO's whitening runs over every row's tokens: a run of three calls weighs three samples there, as the agent-loop
systems do for "one sample per step".

Left out: a seat played by several traces of one name (best-of-n's solvers) is one seat per trace (`name#k`, in
completion order), not one pooled group. The streamed update (pipeline.stream_update) trains groups as they finish,
before this widening, so it stays off with an agent (cohort/plan/batch.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from cohort.rewards.reward_set import aggregate
from cohort.rollout.base import EpisodeRecord, Trajectory, decode_completion
from cohort.rollout.collect import Collected
from cohort.trainer.rollout_batch import RolloutBatch


def seat_names(trajectories: Sequence[Trajectory]) -> list[str]:
    """The seats the batch's runs played, in order of first appearance ([] when no run played seats)."""
    names: list[str] = []
    for t in trajectories:
        for seat in _seats(t.episode):
            if seat.episode.seat not in names:
                names.append(seat.episode.seat)
    return names


def with_seats(collected: Collected, group_size: int, tokenizer, weights: Sequence[float] | None = None,
               aggregation: str = "sum_then_normalize") -> Collected:
    """`collected` with every multi-seat run widened into one row per seat, each group of `group_size` runs into one
    group per seat (module docstring: "Seats"); `collected` itself when no run played seats. `weights` and
    `aggregation`: the reward set's (`RewardSet.weights`, `.aggregation`; None: weight 1 each), by which a seat row's
    scores (the seat's reward in the agent's column 0, the episode's other scores beside it) make its total."""
    names = seat_names(collected.outs)
    if not names:
        return collected
    scored = collected.scored
    rows, prompts, outs, texts, scores = [], [], [], [], []
    for start in range(0, len(collected.outs), group_size):
        for name in names:
            for i in range(start, start + group_size):
                run = collected.outs[i]
                seat = next((s for s in _seats(run.episode) if s.episode.seat == name), None)
                row_scores = np.full(scored.per_function.shape[1], np.nan)  # (F,)
                if seat is None:  # the episode failed (or never seated this one): its trajectory, scored by nothing
                    episode = run.episode.unplayed_seat(name) if run.episode is not None else None
                    sample, text = replace(run, episode=episode), collected.texts[i]
                else:  # the seat's reward where the run's was, the episode's other scores beside it
                    sample, text, reward = seat, decode_completion(tokenizer, seat), seat.episode.outcome.get("reward")
                    row_scores[1:] = scored.per_function[i, 1:]
                    row_scores[0] = np.nan if reward is None else float(reward)
                rows.append(collected.rows[i])
                prompts.append(list(sample.prompt_ids) or collected.prompts[i])
                outs.append(sample)
                texts.append(text)
                scores.append(row_scores)
    per_function = np.stack(scores)  # (S x N, F)
    total = aggregate(per_function, list(weights) if weights is not None else [1.0] * per_function.shape[1], aggregation,
                      group_size)
    metrics = dict(scored.metrics)
    for name in names:
        mine = np.array([per_function[k, 0] for k, t in enumerate(outs) if t.episode is not None and t.episode.seat == name])
        mine = mine[np.isfinite(mine)]
        metrics[f"agent/seat/{name}/reward"] = float(mine.mean()) if mine.size else float("nan")
    widened = replace(scored, total=total, per_function=per_function, metrics=metrics)
    return replace(collected, rows=rows, prompts=prompts, outs=outs, texts=texts, scored=widened)


def seat_advantage_metrics(batch: RolloutBatch) -> dict[str, float]:
    """`agent/seat/<name>/advantage_abs`: the mean |advantage| of each seat's rows (0 when its groups taught nothing)."""
    seats = [e.seat if e is not None else None for e in batch.episodes or ()]  # (a tool loop's Episode: no seat)
    if not any(seats):
        return {}
    out: dict[str, list[float]] = {}
    for i, seat in enumerate(seats):
        if seat:
            out.setdefault(seat, []).append(abs(batch.sequence_advantage(i)))
    return {f"agent/seat/{name}/advantage_abs": float(np.mean(values)) for name, values in out.items()}


def run_samples(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """Each trajectory's earlier samples ([] unless its producer rewrote its history: an agent run's)."""
    return [list(t.episode.samples) if t.episode is not None else [] for t in trajectories]


def _seats(record: EpisodeRecord | None) -> list[Trajectory]:
    """The seats a trajectory's record played ([] for one seat, or no record)."""
    return list(record.seats) if record is not None else []


def with_call_samples(batch: RolloutBatch, trajectories: Sequence[Trajectory], tokenizer) -> RolloutBatch:
    """`batch` (one row per run, `trajectories` its runs; nothing scored yet) with every run's earlier calls inserted
    as rows just before its own, each carrying the run's dataset row, reward and per-function scores, and `runs`
    naming each row's run (module docstring: "Calls"). The batch itself when no run has samples."""
    extra = run_samples(trajectories)
    if not any(extra):
        return batch
    order: list[tuple[int, Trajectory | None]] = []  # (the run's row, a sample or None: the row itself)
    for i, samples in enumerate(extra):
        order += [(i, s) for s in samples] + [(i, None)]
    runs = [i for i, _ in order]
    return replace(
        batch, row_indices=[batch.row_indices[i] for i in runs],
        prompt_ids=[list(s.prompt_ids) if s else batch.prompt_ids[i] for i, s in order],
        completion_ids=[s.token_ids if s else batch.completion_ids[i] for i, s in order],
        engine_logp=[s.logprobs if s else batch.engine_logp[i] for i, s in order],
        truncated=[s.status == "length" if s else batch.truncated[i] for i, s in order],
        completions_text=[decode_completion(tokenizer, s) if s else batch.completions_text[i] for i, s in order],
        rewards=batch.rewards[runs], per_function=batch.per_function[runs],
        versions=[list(s.versions) if s else batch.versions[i] for i, s in order],
        loss_masks=[list(s.loss_mask) if s else batch.loss_mask_of(i) for i, s in order],
        episodes=[None if s else (batch.episodes[i] if batch.episodes else None) for i, s in order], runs=runs)
