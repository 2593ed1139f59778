"""One generation batch from the rollout scheduler: rewards per group as groups finish, the staleness bound, dynamic
sampling's refills, the cut of partial rollouts, and (where exact) the update's forward/backward passes on finished
groups while the rest still generate.

`Scheduler.collect(request)` (cohort/rollout/scheduler.py) is the trainer's one call per batch: `collect_batch`
here asks the scheduler to admit what its rules allow, then takes groups as they finish until the batch's B groups
are kept, and returns them as a `Collected`. What it needs from the trainer comes in the `BatchRequest`: the reward
set, the tokenizer, the prompt rows, the phase timers, the policy version that trains on the batch, and (streamed
update) the callback that trains kept groups. The groups that one poll of the engine completes are
scored in one reward call, started at once (`RewardSet.submit`, on the reward event loop, while the engine keeps
generating); a call's rewards are read once they are done, or when nothing else is left to wait for. A streaming
engine (vLLM in-process, a rollout server, transformers' continuous batching) returns groups as they finish, so
several calls overlap generation; an engine that samples whole batches (`BatchRequests`) returns everything in one
poll: one call per batch. The groups are then put back in submission order and the calls' outputs merged over
exactly the kept rows (`RewardSet.merge`), so the batch's completions, rewards and reward metrics do not depend on
the order the engine finished in. Under a staleness bound k >= 1 each group is screened when taken
(`Scheduler.screen`: too-stale tokens masked, or the group replaced).

Dynamic sampling (`pipeline.dynamic_sampling`, DAPO): a group whose rewards are all equal (the rule of
`frac_reward_zero_std`, NaN rows included: `advantage_stats`) is dropped, and one new prompt group is submitted in
its place at once (`Scheduler.refill`; seeds continue the batch's slot numbering, so they are distinct and
reproducible) unless the groups still live already fill the batch. Every dropped group is replaced by exactly one,
so under k = 0 the kept groups are the first B non-constant groups of one fixed sequence: the same set whatever the
completion order. Rounds are counted by position in that sequence (round 0: the groups in flight when the batch
starts; round r+1: as many groups as round r dropped), so the bound `pipeline.max_refill_rounds` is hit, or not,
independently of the order too.

The batch's end (`_cut`): B kept groups are the batch (pinned partial rollouts first); the scheduler takes back the
rest (`Scheduler.end_batch`: the queue keeps it under k >= 1; partial rollouts under k = 0 cut it off into the
continuation buffer).

Streamed update (`pipeline.stream_update`; when it applies: `cohort.plan.batch.stream_update_blockers`): each kept group is
handed to `request.train_groups` as soon as it is certain to be in the batch (the trainer's forward/backward with its
advantages from its own rewards, loss summed unnormalised into the trainer's own sums); when the batch is complete
the trainer divides the gradients by the loss normaliser and steps (`Trainer.finish_streamed_update`). The gradient
equals the batch update's up to float rounding. This module only decides when a group is trained, never how.

Also here, read through `EpisodeRecord` alone (this layer knows no connector): `shown_prompts`, `failed_episodes`,
`episode_arguments` (the optional reward arguments of multi-turn trajectories; the held-out eval passes them too)
and `episode_metrics`.

Left out: several training processes with dynamic sampling or a staleness bound (validation refuses them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from cohort.algorithms import advantage_stats
from cohort.rewards.reward_set import PendingScores, RewardOutput
from cohort.rollout.base import EpisodeRecord, Trajectory, decode_completion, with_observation
from cohort.rollout.stream import FinishedGroup


@dataclass
class BatchRequest:
    """What the trainer hands the rollout side for one batch (`Scheduler.collect`)."""

    rewards: Any  # RewardSet (or rank 0's MainOnlyRewards)
    tokenizer: Any
    data: Any  # the PromptDataset whose rows the scheduler's prompt ids are
    phases: Any  # the trainer's phase timers: phases("generate") / phases("reward")
    version: int  # the policy version that trains on this batch
    # the streamed update: (rows, trajectories, rewards) of whole kept groups -> their reference log-probs (or None);
    # None: no group is trained before the batch is complete
    train_groups: Callable[[list[int], list[Trajectory], np.ndarray], list[torch.Tensor] | None] | None = None


@dataclass
class Collected:
    """A generation batch's kept groups in submission order: what `Trainer.generate_batch` builds its batch from."""

    rows: list[int]
    prompts: list[list[int]]
    outs: list[Trajectory]
    texts: list[str]
    scored: RewardOutput
    metrics: dict[str, float] = field(default_factory=dict)  # dynamic_sampling/*, partial/*, async/*
    ref_logp: list[torch.Tensor] | None = None  # the streamed update's reference log-probs, when beta != 0
    sampled_version: int = 0  # the oldest policy version any of its groups was submitted under


@dataclass
class _Context:
    """One collection's inputs: the scheduler collecting and what the trainer's request brought."""

    scheduler: Any  # the Scheduler (cohort/rollout/scheduler.py) whose `collect` this is (it imports this module)
    rewards: Any
    tokenizer: Any
    data: Any
    prompt_ids: list[list[int]]  # the scheduler's prompts as token ids, one per row of `data`
    group_size: int  # G
    phases: Any
    version: int
    train_groups: Callable[[list[int], list[Trajectory], np.ndarray], list[torch.Tensor] | None] | None


@dataclass
class _Call:
    """One RewardSet call over the groups one poll returned (in index order)."""

    pending: PendingScores
    output: RewardOutput | None = None


@dataclass
class _Group:
    finished: FinishedGroup
    rows: list[int]  # dataset rows, G of them
    texts: list[str]
    call: _Call
    offset: int  # its first row in the call's output
    trained: bool = False  # its forward/backward ran (streamed update)
    version: int = 0  # the policy version it was (last) submitted under
    ref_logp: list[torch.Tensor] | None = None  # the reference's log-probs (streamed update with beta != 0)

    @property
    def total(self) -> np.ndarray:
        return self.call.output.total[self.offset: self.offset + len(self.rows)]


class RefillLedger:
    """Dynamic sampling's bookkeeping over the sequence of submitted groups (stream index `first`, first + 1, ...):
    which were kept or dropped, and the rounds (round 0: the first `batch_groups`; round r+1: as many as round r
    dropped)."""

    def __init__(self, batch_groups: int, max_rounds: int, first: int = 0):
        self.batch_groups, self.max_rounds, self.first = batch_groups, max_rounds, first
        self.dropped: dict[int, bool] = {}  # position in the sequence -> dropped?

    def record(self, index: int, dropped: bool) -> None:
        self.dropped[index - self.first] = dropped

    def rounds(self) -> list[int]:
        """Sizes of the rounds whose size is known (the last may still be running)."""
        sizes, start = [self.batch_groups], 0
        while sizes[-1] and all(i in self.dropped for i in range(start, start + sizes[-1])):
            drops = sum(self.dropped[i] for i in range(start, start + sizes[-1]))
            start += sizes[-1]
            sizes.append(drops)
        return sizes if sizes[-1] else sizes[:-1]

    def check_bound(self) -> None:
        """Raise once a group of round max_rounds + 1 is known to be needed."""
        sizes = self.rounds()
        drops = sum(self.dropped.values())
        if len(sizes) <= self.max_rounds + 1 and drops > self.batch_groups * (self.max_rounds + 1):
            sizes = sizes + [0] * (self.max_rounds + 1 - len(sizes)) + [drops - self.batch_groups * self.max_rounds]
        if len(sizes) > self.max_rounds + 1:  # (the second test: groups of later batches in flight, k >= 1)
            generated = sum(sizes[: self.max_rounds + 1])
            raise RuntimeError(
                f"pipeline.dynamic_sampling: after pipeline.max_refill_rounds = {self.max_rounds} refill round(s) the batch "
                f"still lacks {sizes[self.max_rounds + 1]} of its {self.batch_groups} groups ({generated} groups generated, "
                f"{sum(self.dropped.values())} dropped because every completion of the group got the same reward). Check "
                "that the reward function can tell completions apart, use prompts that are neither always solved nor never "
                "solved, raise pipeline.max_refill_rounds, or set pipeline.dynamic_sampling=false")

    def metrics(self) -> dict[str, float]:
        dropped = sum(self.dropped.values())
        return {"dynamic_sampling/groups_generated": float(len(self.dropped)),
                "dynamic_sampling/groups_kept": float(len(self.dropped) - dropped),
                "dynamic_sampling/groups_dropped": float(dropped),
                "dynamic_sampling/refill_rounds": float(len(self.rounds()) - 1)}


def all_equal(rewards: np.ndarray) -> bool:
    """One group's rewards are all equal: `advantage_stats`' frac_reward_zero_std rule (NaN rows ignored; a group
    with no finite reward counts)."""
    # a host-side decision on host rewards (one group's): the rule of frac_reward_zero_std, without a device round trip
    return bool(advantage_stats(torch.tensor(rewards, dtype=torch.float32, device="cpu"), len(rewards))["frac_reward_zero_std"] == 1.0)


def collect_batch(scheduler, request: BatchRequest) -> Collected:
    """One generation batch from `scheduler` (see the module docstring): admit what the rules allow, take groups as
    they finish until the batch's B are kept; with `request.train_groups`, train each kept group as it arrives."""
    r = request
    ctx = _Context(scheduler, r.rewards, r.tokenizer, r.data, scheduler.prompt_ids, scheduler.g, r.phases, r.version,
                   r.train_groups)
    with ctx.phases("generate"):  # (a rollout server that is gone fails here: the error names the phase)
        scheduler.admit(ctx.version)
    ledger = None
    if scheduler.rules.refill:  # dynamic sampling: which groups were dropped, by round
        admitted = scheduler.untaken_groups()
        ledger = RefillLedger(len(admitted), scheduler.rules.max_refill_rounds, min(admitted, default=0))
    calls: list[_Call] = []
    try:
        kept = _drive(ctx, ledger, calls, scheduler.batch_groups)
    except BaseException:
        scheduler.abort()  # nothing of this batch stays in the engine (a reward error, the refill bound, an interrupt)
        raise
    kept = sorted(kept, key=lambda grp: grp.finished.index)
    collected = _assemble(ctx, kept, calls, ledger)
    collected.metrics.update(scheduler.metrics(collected.outs, ctx.version))
    collected.sampled_version = min([ctx.version] + [grp.version for grp in kept])
    return collected


def _drive(ctx: _Context, ledger: RefillLedger | None, calls: list[_Call], target: int) -> list[_Group]:
    """Take groups as they finish until `target` are kept: rewards (one call per poll's groups), the staleness
    bound, dynamic sampling's decision and refills, the streamed update. Every reward call made is appended to
    `calls`."""
    scheduler = ctx.scheduler
    arrived: list[FinishedGroup] = []  # complete groups of the current poll
    waiting: list[_Group] = []  # their reward functions running
    kept: list[_Group] = []
    while True:
        room = target - len(kept) - len(waiting) - len(arrived)  # groups the batch may still take
        finished = None
        if room > 0 or scheduler.pinned_open():  # (a pinned partial rollout: the batch waits for it)
            with ctx.phases("generate"):
                finished = scheduler.next_group()  # None: no group left in flight
            if finished is not None and not scheduler.screen(finished, ctx.version):
                continue  # too stale under pipeline.stale_tokens=drop: a fresh prompt took its place
        if finished is not None:
            arrived.append(finished)
            if scheduler.ready and room > 1:
                continue  # more groups from the same poll: score them in one call
        if arrived:
            waiting += _start_rewards(ctx, arrived, calls)
            arrived = []
        enough = len(kept) + len(waiting) >= target  # (dynamic sampling: once their rewards say)
        with ctx.phases("reward"):
            scored, waiting = _read_rewards(waiting, wait=not scheduler.pending or (enough and ledger is not None))
        dropped = 0
        for group in scored:
            if ledger is not None and _drop(ledger, group):
                dropped += 1
            else:
                kept.append(group)
        if ledger is not None:
            ledger.check_bound()  # (before refilling: a round known to be the last asks for nothing more)
        live = len(kept) + len(waiting) + scheduler.pending  # groups that may still end up in the batch
        refills = max(0, min(dropped, target - live))
        for k, group in enumerate(grp for grp in scored if grp not in kept):
            with ctx.phases("generate"):
                scheduler.drop(group.finished.index, ctx.version, refill=k < refills)
        candidates = kept + (waiting if ledger is None else [])  # without dynamic sampling every complete group is kept
        if len(candidates) >= target and not scheduler.pinned_open():
            return _cut(ctx, candidates, [grp for grp in waiting if grp not in candidates], target)
        if ctx.train_groups is not None:
            _train(ctx, [grp for grp in _batch_choice(scheduler.pinned(), kept, target, sure=True)[0] if not grp.trained])
        if finished is None and not waiting and not scheduler.pending:  # nothing left in flight and the batch lacks
            with ctx.phases("generate"):  # groups (dropped ones not refilled under k >= 1, whose later batches were
                scheduler.top_up(target - len(candidates), ctx.version)  # counted live, or the run's last batch)


def _batch_choice(pinned: set[int], kept: list[_Group], target: int, sure: bool = False) -> tuple[list[_Group], list[_Group]]:
    """The batch among the kept groups — pinned groups first (partial rollouts: they ran to the end for it), then
    the others in the order they were kept — and the surplus. `sure`: only the groups certain to be in the batch
    while pinned groups may still arrive (what the streamed update may train already)."""
    first = [grp for grp in kept if grp.finished.index in pinned][:target]
    others = [grp for grp in kept if grp not in first]
    room = target - (min(len(pinned), target) if sure else len(first))
    batch = first + others[:max(0, room)]
    return batch, [grp for grp in kept if grp not in batch]


def _cut(ctx: _Context, kept: list[_Group], waiting: list[_Group], target: int) -> list[_Group]:
    """The batch is `target` of the kept groups (`_batch_choice`); the scheduler takes back the rest (the surplus
    and, with partial rollouts under k = 0, everything still generating: cut off into the continuation buffer)."""
    batch, surplus = _batch_choice(ctx.scheduler.pinned(), kept, target)
    with ctx.phases("generate"):
        ctx.scheduler.end_batch([grp.finished for grp in batch], [grp.finished for grp in surplus + waiting])
    with ctx.phases("reward"):  # after the cut: a slow reward function never holds the engine's tail
        _read_rewards(kept + waiting, wait=True)  # (every reward call's output exists for the merge)
    if ctx.train_groups is not None:
        _train(ctx, [grp for grp in batch if not grp.trained])
    return batch


def _drop(ledger: RefillLedger, group: _Group) -> bool:
    """Dynamic sampling's decision for a scored group, recorded in the ledger."""
    dropped = all_equal(group.total)
    ledger.record(group.finished.index, dropped)
    return dropped


def _start_rewards(ctx: _Context, finished: list[FinishedGroup], calls: list[_Call]) -> list[_Group]:
    """One RewardSet call over these groups' completions, started on the reward event loop."""
    data = ctx.data
    rows = [i for group in finished for i in group.key]
    trajectories = [t for group in finished for t in group.trajectories]
    texts = [decode_completion(ctx.tokenizer, t) for t in trajectories]
    prompts = shown_prompts(trajectories, [data.rows[i][data.prompt_key] for i in rows])
    call = _Call(ctx.rewards.submit(
        prompts=prompts, completions=[as_completion(p, x, t.episode) for p, x, t in zip(prompts, texts, trajectories)],
        completion_ids=[t.token_ids for t in trajectories],
        columns={c: [data.rows[i].get(c) for i in rows] for c in data.columns}, group_size=ctx.group_size,
        optional=episode_arguments(trajectories, prompts),  # multi-turn: what each record gives the rewards
        unscored=failed_episodes(trajectories)))
    calls.append(call)
    g = ctx.group_size
    return [_Group(group, group.key, texts[k * g:(k + 1) * g], call, k * g, version=ctx.scheduler.submitted_version(group.index))
            for k, group in enumerate(finished)]


def shown_prompts(trajectories: Sequence[Trajectory], prompts: Sequence[Any]) -> list[Any]:
    """Each trajectory's prompt as the model saw it: the row's prompt with its record's first observation appended
    (`with_observation`), which TRL passes reward functions as `prompts`; the row's prompt otherwise."""
    return [with_observation(p, t.episode.observation) if t.episode is not None and t.episode.observation else p
            for t, p in zip(trajectories, prompts)]


def failed_episodes(trajectories: Sequence[Trajectory]) -> list[bool]:
    """The failure rule of multi-turn records: a failed episode (`EpisodeRecord.failed`) is scored by nothing
    (`RewardSet.submit(unscored=)`: every reward None, advantage 0)."""
    return [t.episode is not None and t.episode.failed for t in trajectories]


def episode_arguments(trajectories: Sequence[Trajectory], prompts: Sequence[Any]) -> dict[str, list[Any]]:
    """The optional reward arguments of multi-turn trajectories, each name one list over the trajectories: what each
    record gives (`EpisodeRecord.reward_arguments` of its shown prompt, `shown_prompts`), None where a trajectory's
    record gives no such name or it has none; {} when no trajectory has a record that gives one."""
    given = [t.episode.reward_arguments(p) if t.episode is not None else {} for t, p in zip(trajectories, prompts)]
    names = dict.fromkeys(name for arguments in given for name in arguments)
    return {name: [arguments.get(name) for arguments in given] for name in names}


def episode_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The metrics of a batch's multi-turn records: each kind's `EpisodeRecord.batch_metrics` over its records (in
    the order the kinds first appear); {} without a record."""
    by_kind: dict[type, list[EpisodeRecord]] = {}
    for t in trajectories:
        if t.episode is not None:
            by_kind.setdefault(type(t.episode), []).append(t.episode)
    return {key: value for kind, records in by_kind.items() for key, value in kind.batch_metrics(records).items()}


def as_completion(prompt: Any, text: str, record: EpisodeRecord | None = None) -> Any:
    """A completion as the reward contract passes it: the text for a text prompt; for a chat prompt the messages, as
    TRL passes them: a multi-turn record's (`EpisodeRecord.completion_messages`: each assistant turn, its calls in
    `tool_calls`, and each tool message, so a reward reading the last assistant message reads the final answer, never
    a tool's output), else the text as one assistant message."""
    if not isinstance(prompt, list):
        return text
    messages = record.completion_messages() if record is not None else None
    return messages if messages is not None else [{"role": "assistant", "content": text}]


def _read_rewards(waiting: list[_Group], wait: bool) -> tuple[list[_Group], list[_Group]]:
    """The groups whose reward call is done (every one when `wait`), in index order; and those still running."""
    scored, still = [], []
    for group in waiting:
        if group.call.output is None and (wait or group.call.pending.done()):
            group.call.output = group.call.pending.result()
        (scored if group.call.output is not None else still).append(group)
    return sorted(scored, key=lambda grp: grp.finished.index), still


def _assemble(ctx: _Context, kept: list[_Group], calls: list[_Call], ledger: RefillLedger | None) -> Collected:
    """The kept groups (in submission order) as one batch; the reward outputs merged over exactly their rows."""
    outs = [t for grp in kept for t in grp.finished.trajectories]
    rows = [i for grp in kept for i in grp.rows]
    ref = [x for grp in kept for x in grp.ref_logp] if kept and kept[0].ref_logp is not None else None
    position = {id(call): k for k, call in enumerate(calls)}
    picks = [(position[id(grp.call)], grp.offset + j) for grp in kept for j in range(len(grp.rows))]
    scored = ctx.rewards.merge([call.output for call in calls], picks)
    prompts = [t.prompt_ids or ctx.prompt_ids[i] for t, i in zip(outs, rows)]  # (one that carries its own keeps them)
    return Collected(rows, prompts, outs, [x for grp in kept for x in grp.texts], scored,
                     ledger.metrics() if ledger else {}, ref)


# ------------------------------------------------------------------ the streamed update

def _train(ctx: _Context, groups: list[_Group]) -> None:
    """Forward/backward over these kept groups (the trainer's `train_groups`); their reference log-probs kept for the
    batch."""
    if not groups:
        return
    g = ctx.group_size
    ref_logp = ctx.train_groups([i for grp in groups for i in grp.rows],
                                [t for grp in groups for t in grp.finished.trajectories],
                                np.concatenate([grp.total for grp in groups]))
    for k, grp in enumerate(groups):
        grp.trained = True
        grp.ref_logp = ref_logp[k * g:(k + 1) * g] if ref_logp is not None else None
