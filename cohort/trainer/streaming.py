"""One generation batch through the group stream: rewards per group as groups finish, dynamic sampling's refills,
and (where exact) the update's forward/backward passes on finished groups while the rest still generate.

`collect_batch(trainer, pending)` submits the batch's groups to a `GroupStream` (cohort/rollout/stream.py). The
groups that one poll of the engine completes are scored in one reward call, started at once (`RewardSet.submit`,
on the reward event loop, while the engine keeps generating); a call's rewards are read once they are done, or
when the stream has nothing else to wait for. A streaming engine (vLLM in-process, a rollout server, transformers'
continuous batching) returns groups as they finish, so several calls overlap generation; an engine that samples
whole batches (`BatchRequests`) returns everything in one poll: one call per batch. The groups are then put back in submission order and the calls'
outputs merged over exactly the kept rows (`RewardSet.merge`), so the batch's completions, rewards and reward
metrics are the batch path's, whatever order the engine finished in.

Dynamic sampling (`rollout.dynamic_sampling`, DAPO): a group whose rewards are all equal (the rule of
`frac_reward_zero_std`, NaN rows included: `advantage_stats`) is dropped, and one new prompt group is submitted in
its place at once (`RepeatSampler.next_group`; seeds continue the batch's slot numbering, so they are distinct and
reproducible). Every dropped group is replaced by exactly one, so the kept groups are the first B non-constant
groups of one fixed sequence: the same set whatever the completion order. Rounds are counted by position in that
sequence (round 0: the batch's B groups; round r+1: as many groups as round r dropped), so the bound
`rollout.max_refill_rounds` is hit, or not, independently of the order too.

Streamed update (`rollout.stream_update`; when it applies: `cohort.plan.stream_update_blockers`): each kept group's
advantages are computed from its own rewards (group-local by the condition), its micro-batches run forward and
backward with the loss summed unnormalised (`num_items=1`), and when the batch is complete the gradients are
divided by the loss normaliser (the sum of `aggregation_count` over every micro-batch, exactly what the batch
update divides each micro-batch loss by) before clipping and the optimizer step (`Trainer.finish_streamed_update`).
The gradient equals the batch update's up to float rounding (micro-batches are cut per arrival, not over the
whole batch).

Left out: refills behind an update (rollout.overlap), several training processes, partial rollouts (aborting the
tail and resuming it next step).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cohort.algorithms import advantage_stats, aggregation_count
from cohort.algorithms.specs import AdvantageInputs
from cohort.rewards.reward_set import PendingScores, RewardOutput
from cohort.rollout.base import Trajectory, completion_text
from cohort.rollout.stream import FinishedGroup, GroupStream
from cohort.tools.metrics import tool_arguments
from cohort.trainer.partial import BufferedGroup
from cohort.trainer.rollout_batch import RolloutBatch


@dataclass
class Collected:
    """A generation batch's kept groups in submission order: what `Trainer.generate_batch` builds its batch from."""

    rows: list[int]
    prompts: list[list[int]]
    outs: list[Trajectory]
    texts: list[str]
    scored: RewardOutput
    metrics: dict[str, float] = field(default_factory=dict)  # dynamic_sampling/*
    ref_logp: list[torch.Tensor] | None = None  # the streamed update's reference log-probs, when beta != 0


@dataclass
class StreamedGradients:
    """The streamed update's state between generation and the optimizer step: accumulated metric sums (loss
    unnormalised) and the loss normaliser's count so far; the gradients themselves sit in the parameters' .grad."""

    sums: dict[str, Any] = field(default_factory=lambda: defaultdict(float))  # tensors on the device until the step
    count: float = 0.0


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
    ref_logp: list[torch.Tensor] | None = None  # the reference's log-probs (streamed update with beta != 0)

    @property
    def total(self) -> np.ndarray:
        return self.call.output.total[self.offset: self.offset + len(self.rows)]


class RefillLedger:
    """Dynamic sampling's bookkeeping over the sequence of submitted groups (index 0, 1, ...): which were kept or
    dropped, and the rounds (round 0: the first `batch_groups`; round r+1: as many as round r dropped)."""

    def __init__(self, batch_groups: int, max_rounds: int):
        self.batch_groups, self.max_rounds = batch_groups, max_rounds
        self.dropped: dict[int, bool] = {}  # index -> dropped?

    def record(self, index: int, dropped: bool) -> None:
        self.dropped[index] = dropped

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
        if len(sizes) > self.max_rounds + 1:
            generated = sum(sizes[: self.max_rounds + 1])
            raise RuntimeError(
                f"rollout.dynamic_sampling: after rollout.max_refill_rounds = {self.max_rounds} refill round(s) the batch "
                f"still lacks {sizes[self.max_rounds + 1]} of its {self.batch_groups} groups ({generated} groups generated, "
                f"{sum(self.dropped.values())} dropped because every completion of the group got the same reward). Check "
                "that the reward function can tell completions apart, use prompts that are neither always solved nor never "
                "solved, raise rollout.max_refill_rounds, or set rollout.dynamic_sampling=false")

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


def collect_batch(trainer, pending) -> Collected:
    """Run one generation batch through the stream (see the module docstring); with `trainer.streamed` set, train
    each kept group as it arrives; with partial rollouts (`trainer.continuations`), stop at the batch's B groups."""
    cfg, g = trainer.cfg, trainer.plan.num_generations
    stream = GroupStream(trainer.engine, f"gen{pending.generation_index}")
    buffer = trainer.continuations
    target = len(pending.rows) // g if buffer is not None else None
    with trainer.phases("generate"):  # (a rollout server that is gone fails here: the error names the phase)
        submitted = submit_batch(stream, pending, g, buffer, trainer)
    ledger = RefillLedger(submitted, cfg.rollout.max_refill_rounds) if cfg.rollout.dynamic_sampling else None
    calls: list[_Call] = []
    try:
        kept = _drive(trainer, stream, pending, ledger, calls, target)
    except BaseException:
        stream.abort()  # nothing of this batch stays in the engine (a reward error, the refill bound, an interrupt)
        trainer.streamed = None  # and no half-accumulated gradient stands in for the next update
        raise
    collected = _assemble(trainer, sorted(kept, key=lambda grp: grp.finished.index), calls, ledger)
    if buffer is not None:
        collected.metrics.update(buffer.counts.metrics(len(buffer), collected.outs, pending.policy_version))
    return collected


def _drive(trainer, stream: GroupStream, pending, ledger: RefillLedger | None, calls: list[_Call],
           target: int | None = None) -> list[_Group]:
    """Take groups as they finish until none is left (or, with partial rollouts, until `target` are kept): rewards
    (one call per poll's groups), dynamic sampling's decision, the streamed update. Every reward call made is
    appended to `calls`."""
    arrived: list[FinishedGroup] = []  # complete groups of the current poll
    waiting: list[_Group] = []  # their reward functions running
    kept: list[_Group] = []
    while True:
        with trainer.phases("generate"):
            finished = stream.next_group()  # None: no group left in flight
        if finished is not None:
            arrived.append(finished)
            if stream.ready:
                continue  # more groups from the same poll: score them in one call
        if arrived:
            waiting += _start_rewards(trainer, arrived, calls)
            arrived = []
        enough = target is not None and len(kept) + len(waiting) >= target  # (dynamic sampling: once their rewards say)
        with trainer.phases("reward"):
            scored, waiting = _read_rewards(waiting, wait=not stream.pending or (enough and ledger is not None))
        dropped = 0
        for group in scored:
            if ledger is not None and _drop(ledger, group):
                dropped += 1
            else:
                kept.append(group)
        if ledger is not None:
            ledger.check_bound()  # (before refilling: a round known to be the last asks for nothing more)
        live = len(kept) + len(waiting) + stream.pending  # groups that may still end up in the batch
        for _ in range(dropped if target is None else max(0, min(dropped, target - live))):
            _refill(trainer, stream, pending)
        candidates = kept + (waiting if ledger is None else [])  # without dynamic sampling every complete group is kept
        if target is not None and len(candidates) >= target and not trainer.continuations.pinned_open(stream):
            return _cut(trainer, stream, candidates, [grp for grp in waiting if grp not in candidates], target)
        if trainer.streamed is not None:
            sure = kept if target is None else _batch_choice(trainer.continuations, kept, target, sure=True)[0]
            _train(trainer, [grp for grp in sure if not grp.trained])
        if finished is None and not waiting and not stream.pending:
            return kept


def _batch_choice(buffer, kept: list[_Group], target: int, sure: bool = False) -> tuple[list[_Group], list[_Group]]:
    """Partial rollouts: the batch among the kept groups — pinned groups first (they ran to the end for it), then
    the others in the order they were kept — and the surplus. `sure`: only the groups certain to be in the batch
    while pinned groups may still arrive (what the streamed update may train already)."""
    pinned = buffer.counts.pinned_indices
    first = [grp for grp in kept if grp.finished.index in pinned][:target]
    others = [grp for grp in kept if grp not in first]
    room = target - (min(len(pinned), target) if sure else len(first))
    batch = first + others[:max(0, room)]
    return batch, [grp for grp in kept if grp not in batch]


def _cut(trainer, stream: GroupStream, kept: list[_Group], waiting: list[_Group], target: int) -> list[_Group]:
    """Partial rollouts: `target` kept groups are the batch (`_batch_choice`); every other group goes into the
    continuation buffer, the interrupted ones with what they sampled, the complete ones whole."""
    buffer = trainer.continuations
    with trainer.phases("generate"):
        interrupted = stream.interrupt()  # (complete groups not handed out yet come back too, all members finished)
    batch, surplus = _batch_choice(buffer, kept, target)
    complete = [(grp.finished.index, grp.finished.trajectories) for grp in surplus + waiting]
    complete += [(index, members) for index, _, members in interrupted if all(m is not None and m.finished for m in members)]
    buffer.put_interrupted([item for item in interrupted if not all(m is not None and m.finished for m in item[2])])
    for index, members in sorted(complete, key=lambda item: item[0]):
        buffer.put_complete(index, members)
    with trainer.phases("reward"):  # after the interrupt: a slow reward function never holds the engine's tail
        _read_rewards(kept + waiting, wait=True)  # (every reward call's output exists for the merge)
    if trainer.streamed is not None:
        _train(trainer, [grp for grp in batch if not grp.trained])
    return batch


def _drop(ledger: RefillLedger, group: _Group) -> bool:
    """Dynamic sampling's decision for a scored group, recorded in the ledger."""
    dropped = all_equal(group.total)
    ledger.record(group.finished.index, dropped)
    return dropped


def _start_rewards(trainer, finished: list[FinishedGroup], calls: list[_Call]) -> list[_Group]:
    """One RewardSet call over these groups' completions, started on the reward event loop."""
    data = trainer.train_data
    rows = [i for group in finished for i in group.key]
    trajectories = [t for group in finished for t in group.trajectories]
    texts = [completion_text(trainer.tokenizer, t) for t in trajectories]
    prompts = [data.rows[i][data.prompt_key] for i in rows]
    call = _Call(trainer.rewards.submit(
        prompts=prompts, completions=[trainer._as_completion(p, t) for p, t in zip(prompts, texts)],
        completion_ids=[t.token_ids for t in trajectories],
        columns={c: [data.rows[i].get(c) for i in rows] for c in data.columns}, group_size=trainer.plan.num_generations,
        optional=tool_arguments(trajectories, prompts)))  # multi-turn: conversations, environments (cohort/tools/metrics.py)
    calls.append(call)
    g = trainer.plan.num_generations
    return [_Group(group, group.key, texts[k * g:(k + 1) * g], call, k * g) for k, group in enumerate(finished)]


def _read_rewards(waiting: list[_Group], wait: bool) -> tuple[list[_Group], list[_Group]]:
    """The groups whose reward call is done (every one when `wait`), in index order; and those still running."""
    scored, still = [], []
    for group in waiting:
        if group.call.output is None and (wait or group.call.pending.done()):
            group.call.output = group.call.pending.result()
        (scored if group.call.output is not None else still).append(group)
    return sorted(scored, key=lambda grp: grp.finished.index), still


def _refill(trainer, stream: GroupStream, pending) -> None:
    """Submit one replacement group: the sampler's next prompt, seeds continuing the batch's slot numbering."""
    with trainer.phases("generate"):
        _submit_new(trainer, stream, pending, 1)


def _submit_new(trainer, stream: GroupStream, pending, n: int) -> None:
    """Submit `n` groups of new prompts from the sampler, seeds continuing the batch's slot numbering (slots B*G,
    (B+1)*G, ... after the batch's own), in one engine submit."""
    g = trainer.plan.num_generations
    entries = []
    for k in range(n):
        rows = trainer.sampler.next_group()
        first = pending.seeds[0] + (stream.submitted + k) * g
        entries.append(([trainer.train_ids[i] for i in rows], list(range(first, first + g)), rows))
    _record(trainer.continuations, stream.submit_groups(entries, pending.sampling), entries)


def _record(buffer, indices: list[int], entries: list[tuple]) -> None:
    """Partial rollouts: remember what each submitted group is (rows, seeds, abort counts), to buffer it if cut off."""
    if buffer is None:
        return
    for index, entry in zip(indices, entries):
        prompts, seeds, rows, *rest = entry
        record = rest[1] if len(rest) > 1 else BufferedGroup(list(rows), list(seeds), [None] * len(seeds), [0] * len(seeds))
        buffer.record(index, record)


def _assemble(trainer, kept: list[_Group], calls: list[_Call], ledger: RefillLedger | None) -> Collected:
    """The kept groups (in submission order) as one batch; the reward outputs merged over exactly their rows."""
    outs = [t for grp in kept for t in grp.finished.trajectories]
    rows = [i for grp in kept for i in grp.rows]
    ref = [x for grp in kept for x in grp.ref_logp] if kept and kept[0].ref_logp is not None else None
    position = {id(call): k for k, call in enumerate(calls)}
    picks = [(position[id(grp.call)], grp.offset + j) for grp in kept for j in range(len(grp.rows))]
    scored = trainer.rewards.merge([call.output for call in calls], picks)
    return Collected(rows, [trainer.train_ids[i] for i in rows], outs, [x for grp in kept for x in grp.texts], scored,
                     ledger.metrics() if ledger else {}, ref)


def submit_batch(stream: GroupStream, pending, g: int, buffer=None, trainer=None) -> int:
    """The generation batch's groups (G consecutive entries each), in one engine submit; with partial rollouts the
    continuation buffer's groups first and extra new groups last (over-provisioning). Returns the groups submitted."""
    parts = [slice(k * g, (k + 1) * g) for k in range(len(pending.rows) // g)]
    entries = [(pending.prompts[p], pending.seeds[p], pending.rows[p]) for p in parts]
    extra = 0
    if buffer is not None:
        groups, resumed, extra = buffer.submissions(len(parts), trainer.train_ids)
        entries = [(*entry, group) for entry, group in zip(resumed, groups)] + entries
    indices = stream.submit_groups([entry[:4] for entry in entries], pending.sampling)
    _record(buffer, indices, entries)
    if extra:
        _submit_new(trainer, stream, pending, extra)
    return stream.submitted


def collect_async(trainer) -> tuple[Collected, int]:
    """Asynchronous training (trainer/async_rollout.py): admit what the staleness bound allows, take the batch's B
    groups in the order they finished, score them in one call. Returns the batch and its oldest token's version."""
    rollout = trainer.async_rollout
    trainer.sync_weights()  # (a no-op but after a resume: a fresh engine must hold the policy before anything is admitted)
    with trainer.phases("generate"):
        rollout.admit()
        finished = rollout.take(trainer.plan.generation_batch_size // trainer.plan.num_generations)
    calls: list[_Call] = []
    groups = _start_rewards(trainer, finished, calls)
    with trainer.phases("reward"):
        groups, _ = _read_rewards(groups, wait=True)
    collected = _assemble(trainer, groups, calls, None)
    collected.metrics.update(rollout.metrics())
    oldest = min((min(t.versions) for t in collected.outs if t.versions), default=trainer.policy_version)
    return collected, oldest


def drain_batch(engine, pending, g: int) -> list[Trajectory]:
    """The whole batch's trajectories in submission order (rollout.overlap's background call: no rewards there)."""
    stream = GroupStream(engine, f"gen{pending.generation_index}")
    submit_batch(stream, pending, g)
    by_index = {group.index: group.trajectories for group in stream}
    return [t for k in sorted(by_index) for t in by_index[k]]


def score_drained(trainer, pending, outs: list[Trajectory]) -> Collected:
    """Rewards per group for a batch drained in the background (rollout.overlap): all groups at once, merged."""
    g, calls = trainer.plan.num_generations, []
    finished = [FinishedGroup(k, pending.rows[k * g:(k + 1) * g], outs[k * g:(k + 1) * g]) for k in range(len(outs) // g)]
    groups = _start_rewards(trainer, finished, calls)  # one call over the batch
    with trainer.phases("reward"):
        groups, _ = _read_rewards(groups, wait=True)
    return _assemble(trainer, groups, calls, None)


# ------------------------------------------------------------------ the streamed update

def _train(trainer, groups: list[_Group]) -> None:
    """Forward/backward over these kept groups, loss unnormalised; their advantages from their own rewards."""
    if not groups:
        return
    g = trainer.plan.num_generations
    outs = [t for grp in groups for t in grp.finished.trajectories]
    rows = [i for grp in groups for i in grp.rows]
    total = np.concatenate([grp.total for grp in groups])
    part = RolloutBatch.from_trajectories(rows, [trainer.train_ids[i] for i in rows], outs, rewards=total,
                                          per_function=np.empty((len(rows), 0)), texts=[],
                                          policy_version=trainer.policy_version)
    with trainer.phases("update"):
        part.ref_logp = trainer.reference_logprobs(part)  # None without a reference (beta = 0)
        for k, grp in enumerate(groups if part.ref_logp is not None else []):
            grp.ref_logp = part.ref_logp[k * g:(k + 1) * g]
        part.advantages = group_advantages(trainer, part)
        indices = list(range(len(part)))
        micro = trainer._micro_batches(part, indices)
        packed = [trainer._pack(part, mb) for mb in micro]
        trainer.streamed.count += float(sum(aggregation_count(p[1], trainer.aggregation) for p in packed))
        trainer.backward_micro_batches(part, micro, packed, 1.0, trainer.streamed.sums)
    for grp in groups:
        grp.trained = True


def group_advantages(trainer, part: RolloutBatch) -> torch.Tensor:
    """(n, T) advantages of whole groups from their own rewards: the spec's function, as `Trainer._advantages` calls it."""
    a = trainer.cfg.algorithm
    out = trainer.algorithm.spec.advantages(AdvantageInputs(
        rewards=torch.tensor(part.rewards, dtype=torch.float32, device=trainer.device), mask=trainer.advantage_mask(part), group_size=trainer.plan.num_generations,
        scale=a.scale_rewards, gamma=a.gamma, lam=a.lam))
    return out.advantages
