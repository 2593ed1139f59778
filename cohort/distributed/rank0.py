"""Rank 0's side of multi-process training: the rollout engine and the rewards run there only.

Every rank executes the same driver loop; the wrappers here make the engine and
reward calls collective: rank 0 runs the real call and broadcasts the result,
the other ranks receive it. Weight pushes are collective too (every rank takes
part in gathering the shards; rank 0 hands the full tensors over), and streamed:
rank 0's engine reads the weights as a stream of gathered tensors, each all-gathered
when it asks for the next, so rank 0 holds one full tensor at a time (plus what its
engine keeps: the remote engine packs parts of up to 64 MiB) and no rank ever holds
the whole model. Every walk the engine starts over the stream is announced to the
other ranks, which join its all-gathers in the same order and drop what they
receive; the remote engine, which plans its parts from the sizes first, reads them
from the shards' metadata (`GatheredWalks.layout`), so a push gathers each tensor once.

Which engine rank 0 holds (chosen by `cohort.trainer.build_engine.rank0_engine`):
- engine.mode=server: the client of the rollout servers (`RemoteEngine`);
- engine.name=hf: `DetachedHFEngine`, transformers on an unsharded copy of
  the policy (generating with the sharded module would need every rank in
  every decoding step);
- engine.name=vllm (engine.mode colocate or local_server): `LocalServerEngine`,
  a private `cohort serve` child on loopback — vLLM builds torch.distributed groups of its own, which cannot
  nest inside a multi-rank process (it waits for ranks that never come).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from cohort.distributed.fsdp import LocalContext, gather_named_tensors
from cohort.rewards.reward_set import PendingScores, RewardOutput
from cohort.rollout.base import BatchRequests, ForwardingEngine, generate_requests
from cohort.rollout.engines.hf import HFEngine


class MainOnlyEngine(BatchRequests):
    """Runs a rollout engine on rank 0 and broadcasts what it returns; the other ranks hold no engine.

    `update_weights` is collective: every rank gathers the full tensors (FSDP
    all-gathers in parameter order) one at a time, as rank 0's engine reads them
    (`GatheredWalks`; the other ranks `follow_walks`). The request
    level is collective too, and batch-wise (`BatchRequests`): every rank queues
    the same requests, and a `poll` (every rank calls it at the same point of the
    driver loop) has rank 0 run them all to the end on its engine and broadcast
    the trajectories, so every rank sees the same groups at the same poll.
    """

    in_flight_updates = False  # requests run to the end inside one collective poll: none is in flight at a sync

    def __init__(self, engine, ctx: LocalContext):
        self.engine, self.ctx = engine, ctx
        self.policy_version = 0  # the version last pushed, known on every rank without a collective

    def poll(self, timeout: float | None = None):
        requests, self._queue[:] = list(self._queue), []
        if not requests:
            return []
        return self.ctx.broadcast_object(generate_requests(self.engine, requests) if self.ctx.is_main else None)

    def update_weights(self, named_tensors, version: int, *, in_flight: bool = False):
        """Collective: rank 0's engine reads `named_tensors` gathered (`GatheredWalks`); the others follow its walks.
        What the engine returns reaches every rank; an engine that fails fails every rank (none is left waiting)."""
        if in_flight:
            raise RuntimeError("MainOnlyEngine (multi-process training) cannot update weights with requests in flight: "
                               "its requests are sampled batch-wise inside one collective poll")
        if self.ctx.is_main:
            walks = GatheredWalks(named_tensors, self.ctx)
            try:
                sent = self.engine.update_weights(walks, version)
            except BaseException as exc:
                walks.finish()
                self.ctx.broadcast_object(_PushEnd(failed=f"{type(exc).__name__}: {exc}"))
                raise
            walks.finish()
            self.ctx.broadcast_object(_PushEnd(sent=sent))
        else:
            sent = follow_walks(named_tensors, self.ctx)
        self.policy_version = version
        return sent

    def score(self, prompts, completions, temperature: float = 1.0):
        return self.ctx.broadcast_object(self.engine.score(prompts, completions, temperature) if self.ctx.is_main else None)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


@dataclass(frozen=True)
class _PushEnd:
    """Rank 0's last word on a push: what its engine returned, or why it failed."""

    sent: object = None
    failed: str | None = None


_WALK = "walk"  # rank 0 announces a walk over the weights: every rank joins its all-gathers


class GatheredWalks:
    """Rank 0's view of a push: each walk (`iter`) is announced to the other ranks, then yields (name, full tensor)
    gathered one at a time; a walk left half-way is finished (`finish`) before the next, so the ranks stay in step."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], ctx: LocalContext):
        self.named, self.ctx = named_tensors, ctx
        self._open: Iterator[tuple[str, torch.Tensor]] | None = None

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        self.finish()
        self.ctx.broadcast_object(_WALK)
        self._open = iter(gather_named_tensors(self.named, self.ctx.device))
        return self._open

    def layout(self) -> list[tuple[str, int]]:
        """(name, bytes of the full tensor) in walk order, from each shard's metadata (a DTensor knows its global shape
        and dtype): no all-gather and no walk announced, so an engine that plans before it sends (the remote engine's
        parts) gathers the weights once per push, not twice (issue 38, item 7)."""
        return [(name, tensor.numel() * tensor.element_size()) for name, tensor in self.named]

    def finish(self) -> None:
        """Join the rest of the open walk's all-gathers (the other ranks are in them), dropping the tensors."""
        if self._open is not None:
            for _ in self._open:
                pass
            self._open = None


def follow_walks(named_tensors: Iterable[tuple[str, torch.Tensor]], ctx: LocalContext):
    """Ranks > 0 during a push: join each walk rank 0 announces (collectives in its order), until its last word."""
    while (message := ctx.broadcast_object(None)) == _WALK:
        for _ in gather_named_tensors(named_tensors, ctx.device):
            pass
    if message.failed is not None:
        raise RuntimeError(f"rank 0's rollout engine failed to take the weights: {message.failed}")
    return message.sent


class RewardsFailed(RuntimeError):
    """Rank 0's rewards raised; every other rank raises this with its message (the traceback is rank 0's)."""

    def __init__(self, message: str):
        super().__init__(f"the rewards failed on rank 0: {message}")
        self.message = message

    def __reduce__(self):  # (sent by broadcast_object: rebuilt from the message alone)
        return (RewardsFailed, (self.message,))


class MainOnlyRewards:
    """Scores on rank 0 only (a reward model or sandbox runs once), broadcasts the result to every rank."""

    def __init__(self, rewards, ctx: LocalContext):
        self.rewards, self.ctx = rewards, ctx

    def submit(self, **kwargs) -> PendingScores:
        """Scored now, on rank 0 alone, and handed to every rank: the collection calls this at the same point on every
        rank (it follows rank 0's engine), while a pending call's `done()` would differ between ranks. (A forwarded
        `submit` ran the rewards on every rank: a reward model or sandbox once per process, and a reward that is not
        deterministic could give the ranks different advantages.)"""
        failed, out = None, None
        if self.ctx.is_main:
            try:
                out = self.rewards.submit(**kwargs).result()
            except Exception as exc:  # every rank fails with it: the others wait in the broadcast below
                failed = exc
        out = self.ctx.broadcast_object(RewardsFailed(f"{type(failed).__name__}: {failed}") if failed is not None else out)
        if failed is not None:
            raise failed
        if isinstance(out, RewardsFailed):
            raise out
        return PendingScores.finished(out)

    def score(self, **kwargs) -> RewardOutput:
        return self.submit(**kwargs).result()

    def __getattr__(self, name):
        return getattr(self.rewards, name)


class DetachedHFEngine(ForwardingEngine):
    """transformers generation on rank 0's own unsharded copy of the policy, updated by weight pushes.

    Under FSDP the trainer's module is sharded, and generating with it would need
    every rank in every decoding step; rank 0 samples from a full copy instead.
    Requests, scoring and the policy version pass through to the `HFEngine` over that copy.
    """

    in_flight_updates = False  # transformers generation cannot take new weights mid-request

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, stop_token_ids: list[int]):
        model.requires_grad_(False)
        self.inner = HFEngine(model, pad_token_id=pad_token_id, stop_token_ids=stop_token_ids)
        self.params = dict(model.named_parameters())
        self.buffers = dict(model.named_buffers())

    @torch.no_grad()
    def update_weights(self, named_tensors, version: int, *, in_flight: bool = False) -> None:
        if in_flight:
            raise RuntimeError("DetachedHFEngine cannot update weights with requests in flight (in_flight_updates is "
                               "False); use engine.name=vllm for asynchronous training")
        for name, tensor in named_tensors:
            target = self.params.get(name, self.buffers.get(name))
            if target is None:
                raise KeyError(f"weight {name!r} is not in the rollout copy of the model")
            target.copy_(tensor)
        self.inner.policy_version = version
        return None

    def close(self) -> None:
        pass  # the inner HFEngine is not closed (its continuous-batching managers, if any, stay up until exit)


def main_only_rewards(rewards, ctx: LocalContext):
    """`rewards` itself in one process; under several, a wrapper that scores on rank 0 and broadcasts."""
    return rewards if ctx.world_size == 1 else MainOnlyRewards(rewards, ctx)
