"""The Trainer and its step: generate → reward → log-probs → advantages → update (→ critic) → sync, each phase timed.

One `Trainer.step()` is one optimizer step; the loop over steps (with evals, logs and checkpoints around it) is
`run_training(trainer)`, in cohort/trainer/run.py, which drives the Trainer from above. A generation batch serves
`train.steps_per_generation × algorithm.num_iterations` steps (TRL's order:
slices 0..S−1, then again for the next iteration). The maths is in
`cohort.algorithms`; this module only moves tensors between the phases, each of which returns its part of the batch
(the batch is built from those parts, never filled in place; its micro-batches are packed whole by
`RolloutBatch.micro_batch`, cohort/trainer/rollout_batch.py):

- old log-probs are computed (one no-grad pass at generation time) only when a
  batch is reused off-policy; on-policy the ratio's denominator is the current
  log-prob detached, which costs nothing;
- reference log-probs are computed once per generation batch, and only when
  `algorithm.beta != 0` (the reference model is not even loaded otherwise); the
  distillation teacher's (algorithm.name = distill) in the same pass as the old
  log-probs (cohort/trainer/scoring.py), and its per-token advantage joins the
  rewards' in each micro-batch's loss, against the proximal log-probs there;
- what differs between algorithms (grpo, rloo, reinforce_pp*, ppo) is read from
  `self.parts.algorithm`, resolved from its spec (`cohort.algorithms.specs`) by `cohort.trainer.algorithms`: the
  advantage function, the policy-loss entry, where the KL goes, and whether a
  critic exists (then its values are computed at generation time and it is
  updated after the policy, both timed as `timing/critic_s`); old log-probs are
  also computed when the KL to the reference is measured at generation time;
- new weights are pushed into the rollout engine lazily, just before the next
  generation (cast to the engine's dtype), and checked against the canaries'
  noise floor, by `self.sync` (cohort/trainer/weight_sync.py; the statistics: cohort/trainer/sync_check.py);
- every forward pass of a trained model runs under `self.parts.precision.autocast()`:
  bf16 maths over float32 master weights under train.precision=mixed, nothing
  otherwise (cohort/models/precision.py); backward passes run outside it;
- generation goes through the rollout scheduler (cohort/rollout/scheduler.py),
  one mechanism whose admission rules compose: the staleness bound k
  (`pipeline.max_staleness`; k = 0 is synchronous training, k >= 1 generates
  through the update and pushes weights in flight, each token stamped with its
  version), partial rollouts (`pipeline.over_provision`) and dynamic sampling's
  refills. The trainer asks for each batch with one call, `Scheduler.collect`
  (cohort/rollout/collect.py): rewards per group as groups finish and, with
  `pipeline.stream_update`, the forward/backward passes of finished groups while
  the rest generate, through the `train_groups` callback it hands over
  (`finish_streamed_update` then divides by the normaliser and steps). Off-policy tokens are weighted by
  `algorithm.rollout_correction`.

Several training processes differ only through `self.parts.dist` (cohort/distributed/fsdp.py:
this rank's groups, the global loss normaliser, reduced metrics and gradients — all
the identity in one process); a rollout server is just another engine
(rollout/server/client.py). Out of scope here: the loop over steps, checkpoints, exact resume and stopping
(trainer/run.py, trainer/checkpoint.py, trainer/stopping.py); the counters and current batch are a `TrainerState`
(trainer/state.py).
"""

from __future__ import annotations

import functools
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cohort.algorithms import (aggregate_loss, aggregation_count, kl_penalty, masked_mean, policy_loss, rollout_correction,
                               top_entropy_mask)
from cohort.algorithms import advantage_stats
from cohort.algorithms.specs import AdvantageInputs, AdvantageOutputs
from cohort.config import CohortConfig, default_output_dir
from cohort.models.batching import pad_rows, split_to_count
from cohort.models.host_memory import release_host_memory
from cohort.models.logprobs import completion_logprobs
from cohort.rewards.answer_reading import answer_reader, batch_answer_metrics
from cohort.rollout.base import SamplingConfig, release_engine_memory
from cohort.rollout.collect import BatchRequest, Collected, episode_metrics
from cohort.rollout.scheduler import Scheduler
from cohort.trainer.agent_samples import seat_advantage_metrics, with_call_samples, with_seats
from cohort.trainer.episode_failures import EpisodeFailures
from cohort.trainer.metric_sums import host_values, running_max, step_metrics
from cohort.trainer.optim import zero_missing_grads
from cohort.trainer.parts import TrainerParts
from cohort.trainer.phases import Phases
from cohort.trainer.rollout_batch import BatchLogprobs, MicroBatch, RolloutBatch, StreamedGradients
from cohort.trainer.state import Checkpointed, TrainerState, stateful_parts
from cohort.trainer.build_parts import setup
from cohort.trainer.stopping import check_finite
from cohort.trainer.scoring import distill_micro_batch, score_completions, teacher_scorer
from cohort.trainer.weight_sync import WeightSync
from cohort.plan.batch import BatchPlan
from cohort.plan.run_plan import RunPlan
from cohort.plan.validate import validate_config


class Trainer:
    """One optimizer step at a time (`step`; the loop over steps is cohort/trainer/run.py's `run_training`) over its
    parts. Its whole state is what `__init__` declares, each a typed attribute read by name (nothing is forwarded):
    `state` (`TrainerState`, cohort/trainer/state.py: every counter and the current batch), `parts` (`TrainerParts`,
    cohort/trainer/parts.py: policy, engine, rewards, optimizer, ...: `trainer.parts.policy`), `scheduler` (the
    rollout scheduler, checkpointed as `rollout`), `sync` (`WeightSync`, cohort/trainer/weight_sync.py: push, canaries,
    calibration) and the phase timers."""

    def __init__(self, run: CohortConfig | RunPlan, *, run_dir: str | Path | None = None, engine=None, log=print):
        """`run`: a config (validated here, before any model loads) or the plan validating it returned (cohort/plan/
        run_plan.py: a caller that validated hands it over, with what validation read)."""
        run = run if isinstance(run, RunPlan) else validate_config(run)
        self.cfg: CohortConfig = run.config  # resolved (model.dtype settled)
        self.plan: BatchPlan = run.batch
        self.log = log
        self.phases = Phases()
        self.state = TrainerState(self.plan.optimizer_steps_per_generation)  # counters, the batch (checkpointed)
        run_dir = Path(run_dir or self.cfg.run.output_dir or default_output_dir())
        self.parts: TrainerParts = setup(run, run_dir, pack=self.pack, external_engine=engine)
        cfg, r, plan, parts = self.cfg, self.cfg.rollout, self.plan, self.parts
        self.scheduler = Scheduler(  # what is in flight and what is admitted next (cohort/rollout/scheduler.py; checkpointed)
            parts.engine, parts.sampler, parts.train_ids, SamplingConfig(r.max_completion_length, r.temperature, r.top_p, r.top_k),
            plan.num_generations, plan.generation_batch_size // plan.num_generations, plan.admission,
            seed=r.seed, generations=-(-plan.max_steps // plan.optimizer_steps_per_generation))
        self.sync = WeightSync(parts, self.state, self.scheduler.lock, self.phases,  # push + canary check (trainer/weight_sync.py)
                               generation_dtype=cfg.generation_dtype, group_size=plan.num_generations,
                               fixed_tolerance=cfg.engine.sync_check_tolerance)
        self.stream_update = plan.stream_update  # train groups as they finish (rollout/collect.py; the plan decided where exact)
        self.answers = answer_reader(parts.rewards)  # reads each completion's answer for answers/* (or why it cannot)
        self.failures: EpisodeFailures | None = None  # the last generated batch's failed episodes, until `take_failures`

    def swap_engine(self, engine) -> None:
        """Replace the engine (a test's wrapper): in the parts and in the scheduler, which sends every request to it."""
        self.parts.engine = engine
        self.scheduler.engine = engine

    def swap_phases(self, phases: Phases) -> None:
        """Replace the phase timers (a benchmark's, which also measure memory): the trainer's and its weight sync's."""
        self.phases = self.sync.phases = phases

    def checkpointed(self) -> Checkpointed:
        """What a checkpoint of this trainer saves and restores (cohort/trainer/checkpoint.py) and a failed step rewinds
        (cohort/trainer/failure.py): the parts, the state, the parts with state by the names state.pt uses (the sync
        check, the rollout scheduler among them; cohort/trainer/state.py)."""
        return Checkpointed(self.parts, self.state, stateful_parts(self.parts, self.sync.check, self.scheduler),
                            generation_batch_size=self.plan.generation_batch_size, keep=self.cfg.run.keep_checkpoints)

    # ------------------------------------------------------------------ phases

    def generate_batch(self) -> RolloutBatch:
        """The next generation batch from the scheduler (`Scheduler.collect`, rollout/collect.py), in submission order:
        rewards per group as groups finish; with the streamed update, the forward/backward passes too."""
        self.sync.push()  # the engine samples from the current policy (a no-op unless a resume left it behind)
        self.parts.optimizer.zero_grad(set_to_none=True)  # (a streamed update accumulates into them during the collection)
        streamed = StreamedGradients() if self.stream_update else None
        collected = self.scheduler.collect(BatchRequest(
            self.parts.rewards, self.parts.tokenizer, self.parts.train_data, self.phases, self.state.policy_version,
            train_groups=functools.partial(self.train_groups, streamed=streamed) if streamed is not None else None))
        self.sync.calibrate(collected.sampled_version, collected.prompts, collected.outs)
        return self._finish_batch(collected, collected.sampled_version, streamed)

    def _finish_batch(self, collected: Collected, sampled_version: int, streamed: StreamedGradients | None) -> RolloutBatch:
        """The batch from its collected groups, built by the phases that produce its parts, in this order: the sampled
        batch (agent runs widened into one run per seat, then one row per call: trainer/agent_samples.py) and its
        metrics (read from the runs), the old, teacher and reference log-probs, the critic's values, the advantages;
        each phase reads the batch so far and returns its part, joined to it by `dataclasses.replace` (never set in place)."""
        self.failures = EpisodeFailures.of(collected.outs)  # (counted over the runs, before seats widen them)
        rewards = self.parts.rewards
        collected = with_seats(collected, self.plan.num_generations, self.parts.tokenizer,  # one run per seat, by seat
                               rewards.weights, rewards.aggregation)
        outs, scored = collected.outs, collected.scored
        runs = RolloutBatch.from_trajectories(collected.rows, collected.prompts, outs, rewards=scored.total,
                                              per_function=scored.per_function, texts=collected.texts,
                                              policy_version=sampled_version,
                                              taken_version=self.state.policy_version, streamed=streamed)
        sampled = with_call_samples(runs, outs, self.parts.tokenizer)  # one row per call of a run that rewrote its history
        metrics = {**self._batch_metrics(sampled, runs, scored.metrics), **collected.metrics, **episode_metrics(outs)}
        with self.phases("logprob"):
            batch = sampled.with_logprobs(self._generation_logprobs(sampled, collected.ref_logp, streamed))
        if self.parts.critic is not None:
            with self.phases("critic"):
                values = self.parts.critic.values(batch, self.micro_batches(batch, list(range(len(batch)))))
            batch = replace(batch, values=values)
        advantages, advantage_metrics = self._advantages(batch)
        batch = replace(batch, advantages=advantages.advantages, returns=advantages.returns,
                        metrics={**metrics, **advantage_metrics})
        return replace(batch, metrics={**batch.metrics, **seat_advantage_metrics(batch)})

    def take_failures(self) -> EpisodeFailures | None:
        """The failed episodes of the batch generated since the last call (None: none was generated; the training loop
        reports them after each step, cohort/trainer/episode_failures.py)."""
        failures, self.failures = self.failures, None
        return failures

    def _generation_logprobs(self, batch: RolloutBatch, streamed_ref: list[torch.Tensor] | None,
                             streamed: StreamedGradients | None) -> BatchLogprobs:
        """The batch's no-grad log-prob part: the old-policy and teacher passes in one (the streamed update trained with
        its own teacher pass), then the reference's (the streamed update's, scored per group, when it made them)."""
        policy = (self.parts.policy, self.parts.precision.autocast)
        scorers = {"old": policy} if self.parts.algorithm.score_old_logp else {}
        if self.parts.teacher is not None and streamed is None:
            scorers["teacher"] = teacher_scorer(self.parts.teacher)
        scored = self._score(batch, scorers)
        ref = streamed_ref if streamed_ref is not None else self.reference_logprobs(batch)
        return BatchLogprobs(old_logp=scored.get("old"), ref_logp=ref, teacher_logp=scored.get("teacher"))

    def teacher_logprobs(self, batch: RolloutBatch) -> list[torch.Tensor] | None:
        """The distillation teacher's log-probs of every completion; None without a teacher (algorithm.name != distill)."""
        return self._score(batch, {"t": teacher_scorer(self.parts.teacher)})["t"] if self.parts.teacher is not None else None

    def reference_logprobs(self, batch: RolloutBatch) -> list[torch.Tensor] | None:
        """The reference policy's log-probs of every completion; None when beta = 0 (no reference)."""
        if self.parts.ref_model is not None:
            return self._score_all(self.parts.ref_model, batch)
        if self.parts.lora is not None and self.cfg.algorithm.beta != 0:  # LoRA: the reference is the adapter disabled
            with self.parts.lora.adapter_disabled():
                return self._score_all(self.parts.policy, batch)
        return None

    def _batch_metrics(self, batch: RolloutBatch, runs: RolloutBatch, reward_metrics: dict[str, float]) -> dict[str, float]:
        """The batch's metrics: lengths over every row the loss sees (`batch`), rewards and answers over the runs
        (`runs`: one row per run, trainer/agent_samples.py)."""
        lengths = np.array(batch.trained_lengths(), dtype=np.float64)  # sampled tokens only: tool output left out
        stats = advantage_stats(torch.as_tensor(runs.rewards, dtype=torch.float32, device=self.parts.device), self.plan.num_generations)
        finite = runs.rewards[np.isfinite(runs.rewards)]
        metrics = {
            "reward": float(finite.mean()) if finite.size else float("nan"),
            "reward_std": float(stats["reward_std"]),
            "frac_reward_zero_std": float(stats["frac_reward_zero_std"]),
            "completions/mean_length": float(lengths.mean()),
            "completions/min_length": float(lengths.min()),
            "completions/max_length": float(lengths.max()),
            "completions/clipped_ratio": float(np.mean(batch.truncated)),
            "tokens/generated": float(lengths.sum()),
            **reward_metrics,
            **batch_answer_metrics(self.answers, self.parts.train_data, runs.row_indices, runs.completions_text,
                                   self.plan.num_generations),
        }
        return metrics

    def _score_all(self, model: torch.nn.Module, batch: RolloutBatch) -> list[torch.Tensor]:
        """`model`'s log-probs of every completion, under the run's autocast (the policy, the reference)."""
        return self._score(batch, {"m": (model, self.parts.precision.autocast)})["m"]

    def _score(self, batch: RolloutBatch, scorers: dict) -> dict[str, list[torch.Tensor]]:
        """Every scorer's log-probs of every completion, in one pass over the micro-batches (trainer/scoring.py)."""
        if not scorers:
            return {}
        return score_completions(batch, self.micro_batches(batch, list(range(len(batch)))), scorers, pad_id=self.parts.pad_id,
                                 device=self.parts.device, temperature=self.cfg.rollout.temperature,
                                 chunk_size=self.cfg.train.logprob_chunk_size)

    def update(self, batch: RolloutBatch, indices: list[int]) -> dict[str, float]:
        """One optimizer step over `indices` of the batch, with gradient accumulation (or the streamed update's end)."""
        if batch.streamed is not None:  # its groups were trained as they arrived: only the step is left
            return self.finish_streamed_update(batch.streamed)
        micro = self.micro_batches(batch, self.local_rows(batch, indices))  # this rank's groups
        # as many micro-batches on every rank (FSDP's collectives must match); a token budget can differ per rank
        micro = split_to_count(micro, self.parts.dist.max_count(len(micro)))
        packed = [self.pack(batch, mb) for mb in micro]
        num_items = self.parts.dist.global_count(sum(aggregation_count(p.mask, self.parts.aggregation) for p in packed))
        sums: dict[str, Any] = defaultdict(float)  # tensors on the device until the step ends (one host read)
        self.parts.optimizer.zero_grad(set_to_none=True)
        inert = self.inert_micro_batches(batch, micro, packed)
        self.backward_micro_batches(batch, micro, packed, num_items, sums, inert=inert)
        if any(inert):
            zero_missing_grads(self.parts.policy)  # (the optimizer steps every parameter, as with a zero backward)
        sums["inert_micro_batches"] += float(sum(inert))
        sums = defaultdict(float, self.parts.dist.reduce_metrics(host_values(sums)))  # over ranks (identity in one process)
        grad_norm = self._clip_and_step(sums["loss"])
        return self._update_metrics(sums, grad_norm)

    def finish_streamed_update(self, streamed: StreamedGradients) -> dict[str, float]:
        """The streamed update's optimizer step: every group's gradients are in, each micro-batch's loss summed
        unnormalised; divide by the loss normaliser (the same count the batch update divides by), then clip and step."""
        count = streamed.count if streamed.count > 0 else 1.0  # (aggregate_loss: a zero count divides by 1)
        for p in self.parts.policy.parameters():
            if p.grad is not None:
                p.grad.div_(count)
        sums = defaultdict(float, host_values(streamed.sums))
        sums["loss"] /= count
        grad_norm = self._clip_and_step(sums["loss"])
        return self._update_metrics(sums, grad_norm)

    def train_groups(self, rows: list[int], trajectories, rewards: np.ndarray, *,
                     streamed: StreamedGradients) -> list[torch.Tensor] | None:
        """The streamed update (the callback `generate_batch` hands the collection, rollout/collect.py): forward/backward
        over whole kept groups, the loss summed unnormalised into `streamed`, their advantages from their own rewards.
        Returns their reference log-probs (None: beta = 0)."""
        prompts = [t.prompt_ids or self.parts.train_ids[i] for t, i in zip(trajectories, rows)]  # (an environment's observation)
        part = RolloutBatch.from_trajectories(rows, prompts, trajectories, rewards=rewards,
                                              per_function=np.empty((len(rows), 0)), texts=[], policy_version=self.state.policy_version)
        a = self.cfg.algorithm
        with self.phases("update"):
            ref = self.reference_logprobs(part)  # None without a reference (beta = 0)
            teacher = self.teacher_logprobs(part)  # None without a teacher (distill only)
            advantages = self.parts.algorithm.spec.advantages(AdvantageInputs(
                rewards=torch.tensor(part.rewards, dtype=torch.float32, device=self.parts.device), mask=self.advantage_mask(part),
                group_size=self.plan.num_generations, scale=a.scale_rewards, gamma=a.gamma, lam=a.lam)).advantages
            part = replace(part.with_logprobs(BatchLogprobs(ref_logp=ref, teacher_logp=teacher)), advantages=advantages)
            micro = self.micro_batches(part, list(range(len(part))))
            packed = [self.pack(part, mb) for mb in micro]
            streamed.count += float(sum(aggregation_count(p.mask, self.parts.aggregation) for p in packed))
            self.backward_micro_batches(part, micro, packed, 1.0, streamed.sums)
        return part.ref_logp

    def inert_micro_batches(self, batch: RolloutBatch, micro: list[list[int]], packed: list[MicroBatch]) -> list[bool]:
        """Which micro-batches' gradient is exactly zero, so their backward can be skipped: every advantage of their
        rows is 0 (a group whose rewards are all equal, GRPO's constant group) and nothing else carries a gradient (no
        entropy bonus, no KL term in the loss, no distillation teacher, no critic). Every policy loss is the advantage
        times a function of the ratio (cohort/algorithms/losses.py), so its gradient there is 0 exactly, not nearly.
        One process only: ranks of an FSDP group must run the same backward passes (its collectives). One host read
        of the advantages per update."""
        a = self.cfg.algorithm
        if (self.parts.dist.world_size != 1 or a.entropy_coeff != 0 or self.parts.algorithm.kl_placement == "loss"
                or self.parts.critic is not None or any(p.teacher_logp is not None for p in packed)):
            return [False] * len(micro)
        moving = (batch.advantages != 0).any(dim=1).tolist()  # (N,): a row with some non-zero advantage
        return [not any(moving[i] for i in mb) for mb in micro]

    def backward_micro_batches(self, batch: RolloutBatch, micro: list[list[int]], packed: list[MicroBatch], num_items,
                               sums, inert: list[bool] | None = None) -> None:
        """Forward and backward over each micro-batch (gradients accumulate), the loss divided by `num_items`. The
        metrics accumulate in `sums` as tensors on the device (no host sync per micro-batch; `host_values` reads them),
        and every host-made tensor was moved when `packed` was made: the loop copies nothing to the device. An `inert`
        micro-batch (`inert_micro_batches`: its gradient is exactly zero) is scored without autograd and not
        backpropagated: its metrics (log-probs, entropy, the engine mismatch) are the same, its backward is saved."""
        cfg, a = self.cfg, self.cfg.algorithm
        for k, (mb, mbi) in enumerate(zip(micro, packed)):
            pb, mask = mbi.packed, mbi.mask
            skip = inert is not None and inert[k]
            with self.parts.precision.autocast(), torch.set_grad_enabled(not skip):  # (backward outside autocast)
                logp, entropy = completion_logprobs(self.parts.policy, pb.input_ids, pb.attention_mask, pb.prompt_lengths,
                                                    pb.completion_ids, mask, temperature=cfg.rollout.temperature,
                                                    chunk_size=cfg.train.logprob_chunk_size, entropy_grad=a.entropy_coeff != 0)
            width = logp.shape[1]
            old = mbi.old_logp if mbi.old_logp is not None else logp.detach()
            adv = batch.advantages[mb][:, :width].to(logp.dtype)  # (B, width) of the batch's (N, T)
            adv, distill_metrics = distill_micro_batch(mbi.teacher_logp, adv, old, mask, cfg.teacher)  # + the teacher's
            old, weights = self._off_policy(batch, mb, mbi, logp, old, sums)
            if a.top_entropy_quantile < 1:  # TRL's rho: only the micro-batch's top-rho tokens by entropy carry the loss
                keep = top_entropy_mask(entropy.detach(), mask, 1.0 - a.top_entropy_quantile)
                weights = keep.to(logp.dtype) if weights is None else weights * keep
                sums["entropy/kept_frac"] += keep.sum()
            loss, metrics = policy_loss(self.parts.loss_name, logp, old, adv, mask, token_weights=weights, aggregation=self.parts.aggregation,
                                        max_length=cfg.rollout.max_completion_length, num_items=num_items,
                                        **self.parts.algorithm.loss_params)
            metrics = {**metrics, **distill_metrics}
            if a.entropy_coeff != 0:  # verl's entropy bonus, aggregated as the policy loss
                loss = loss - a.entropy_coeff * aggregate_loss(entropy, mask, self.parts.aggregation, num_items=num_items,
                                                               max_length=cfg.rollout.max_completion_length)
            if self.parts.algorithm.kl_placement == "loss":
                kl = kl_penalty(logp, mbi.ref_logp, self.parts.algorithm.kl_estimator)
                loss = loss + self.parts.kl_controller.value * aggregate_loss(kl, mask, self.parts.aggregation, num_items=num_items,
                                                                        max_length=cfg.rollout.max_completion_length)
                sums["kl"] += (kl.detach() * mask).sum()
            if not skip:
                loss.backward()
            tokens = mask.sum()
            sums["loss"] += loss.detach()
            sums["entropy"] += (entropy.detach() * mask).sum()
            sums["tokens"] += tokens
            sums["padding"] += pb.attention_mask.numel() - pb.attention_mask.sum()  # padded cells
            sums["cells"] += pb.attention_mask.numel()
            self._accumulate_mismatch(sums, batch, mb, mbi, logp)
            for key, value in metrics.items():
                sums[key] += value.detach() * tokens if torch.is_tensor(value) else float(value) * tokens
            self.release_host_memory()  # (CPU) this micro-batch's activations: the next one's are of another size

    def local_rows(self, batch: RolloutBatch, indices: list[int]) -> list[int]:
        """This process's rows of a step's `indices`: the rows of its contiguous block of whole groups of runs (a run's
        samples stay together; every row when there is one process)."""
        return batch.rows_of_runs(self.parts.dist.local_indices(batch.runs_of(indices), self.plan.num_generations))

    def release_host_memory(self) -> bool:
        """train.release_host_memory, on the CPU: the heap's free pages back to the system (cohort/models/host_memory.py)."""
        return self.cfg.train.release_host_memory and release_host_memory(self.parts.device)

    def micro_batches(self, batch: RolloutBatch, indices: list[int]) -> list[list[int]]:
        """`indices` split into length-sorted micro-batches of at most train.micro_batch_size completions
        and train.max_tokens_per_microbatch padded tokens (`RolloutBatch.micro_batches`)."""
        return batch.micro_batches(indices, self.plan.micro_batch_size, self.cfg.train.max_tokens_per_microbatch)

    def pack(self, batch: RolloutBatch, mb: list[int]) -> MicroBatch:
        """Micro-batch `mb` on the device under this run's loss-mask rules (`RolloutBatch.micro_batch`): truncated
        completions, stale tokens, the scheduler's staleness bound. The critic packs with it too."""
        a = self.cfg.algorithm
        return batch.micro_batch(mb, pad_id=self.parts.pad_id, device=self.parts.device,
                                 version=self.state.policy_version, mask_truncated=a.mask_truncated_completions,
                                 mask_stale=a.off_policy_objective == "mask_stale",
                                 staleness_bound=self.scheduler.token_staleness_bound)

    def advantage_mask(self, batch: RolloutBatch) -> torch.Tensor:
        """(N, T) 1.0 on each completion's tokens that enter the loss (`RolloutBatch.trained_mask`)."""
        return batch.trained_mask(self.cfg.algorithm.mask_truncated_completions, self.parts.device)

    def _advantages(self, batch: RolloutBatch) -> tuple[AdvantageOutputs, dict[str, float]]:
        """Advantages (N, T) and critic targets for the whole generation batch, by the algorithm's spec, with their
        metrics (the KL's among them: the adaptive KL controller is updated here). Group statistics count the batch's
        runs (`RolloutBatch.runs`), each run once."""
        a, choice = self.cfg.algorithm, self.parts.algorithm
        mask = self.advantage_mask(batch)
        width = mask.shape[1]
        kl = None
        if batch.old_logp is not None and batch.ref_logp is not None:  # KL(sampling policy ‖ reference) per token
            kl = kl_penalty(pad_rows(batch.old_logp, width), pad_rows(batch.ref_logp, width), choice.kl_estimator)
        beta = self.parts.kl_controller.value
        rewards = torch.tensor(batch.rewards, dtype=torch.float32, device=self.parts.device)  # (N,) each row its run's
        out = choice.spec.advantages(AdvantageInputs(
            rewards=rewards, mask=mask, group_size=self.plan.num_generations, kl=kl, runs=batch.runs_tensor(self.parts.device),
            kl_coef=beta if choice.kl_placement == "reward" else 0.0,
            values=pad_rows(batch.values, width) if batch.values is not None else None,
            scale=a.scale_rewards, gamma=a.gamma, lam=a.lam))
        metrics = {key: float(value) for key, value in out.metrics.items()}
        if kl is not None:
            kl_mean = masked_mean(kl, mask)
            metrics.update({"kl": float(kl_mean), "kl_coef": beta})
            self.parts.kl_controller.update(kl_mean, len(batch))  # a no-op for the fixed controller
        return out, metrics

    def _off_policy(self, batch: RolloutBatch, mb: list[int], mbi: MicroBatch, logp: torch.Tensor, prox: torch.Tensor,
                    sums) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The ratio's denominator and the per-token weights for `algorithm.off_policy_objective` (docs/algorithms.md):
        `decoupled` keeps the proximal policy `prox` (old log-probs, or the current ones detached) and weights each token
        by pi_prox / pi_engine, truncated or masked (`algorithm.rollout_correction`; auto: only when some token of the
        micro-batch is off-policy); `coupled` takes the engine's log-probs as the denominator, no weights; `mask_stale`
        (its tokens already left out by `pack`) keeps prox, no weights. Also accumulates the staleness metrics."""
        a, mask = self.cfg.algorithm, mbi.mask
        self._accumulate_staleness(sums, mbi)  # (tokens carry the version that sampled them, whatever the engine)
        if a.off_policy_objective == "mask_stale":
            return prox, None
        has_engine = all(len(batch.engine_logp[i]) == len(batch.completion_ids[i]) for i in mb)
        if a.off_policy_objective == "coupled":
            if not has_engine:
                raise RuntimeError("algorithm.off_policy_objective = coupled needs the engine's log-probs of every sampled "
                                   "token; this engine returned none. Use decoupled or mask_stale")
            return mbi.engine.to(prox.dtype), None
        stale = mbi.trains_off_policy or (  # (known on the host: the loop never waits for the device to decide)
            batch.policy_version != self.state.policy_version and not self.parts.engine_shares_policy and batch.old_logp is None)
        if a.rollout_correction == "none" or (a.rollout_correction == "auto" and not stale):
            return prox, None
        if not has_engine:
            raise RuntimeError("algorithm.rollout_correction needs the engine's log-probs of every sampled token; this engine "
                               "returned none. Set algorithm.rollout_correction=none (and pipeline.max_staleness=0)")
        engine = mbi.engine
        mode = "truncate" if a.rollout_correction == "auto" else a.rollout_correction
        weights, metrics = rollout_correction(prox.detach().float(), engine, mask, level="token", mode=mode,
                                              cap=a.rollout_correction_cap)
        tokens = mask.sum()
        for key in ("mismatch/kl", "mismatch/ratio_mean", "mismatch/frac_capped", "mismatch/frac_masked"):
            sums["correction/" + key.split("/", 1)[1]] += metrics[key] * tokens
        w = weights.float() * mask
        sums["ess_w"] += w.sum()
        sums["ess_w2"] += (w * w).sum()
        return prox, weights.to(logp.dtype)

    def _accumulate_staleness(self, sums, mbi: MicroBatch) -> None:
        """staleness/* (versions between each trained token's sampler and the policy training on it) and the
        off-policy token count, over the loss's tokens."""
        if mbi.behind is None:
            return
        stale = mbi.behind * mbi.mask
        sums["staleness_sum"] += stale.sum()
        running_max(sums, "staleness_max", stale)
        sums["staleness_tokens"] += mbi.mask.sum()
        sums["off_policy_tokens"] += (mbi.off * mbi.mask).sum()

    def _accumulate_mismatch(self, sums, batch: RolloutBatch, mb: list[int], mbi: MicroBatch, logp: torch.Tensor) -> None:
        """|trainer − engine| log-prob gap, measured where the trainer still holds the sampling policy (per token: the
        tokens stamped with the trainer's version; asynchronous training checks its in-flight weight pushes by it)."""
        reference, mask = None, mbi.mask
        if mbi.old_logp is not None:
            reference = mbi.old_logp
        elif mbi.behind is not None:
            mask = mask * (mbi.behind == 0).float()
            reference = logp.detach()
        else:  # the batch sampled by the trainer's version, which the engine held (or shares the policy module itself)
            state = self.state
            engine_held = state.policy_version == state.synced_version or self.parts.engine_shares_policy
            if state.policy_version == batch.policy_version and engine_held:
                reference = logp.detach()
        if reference is None or not batch.engine_logp[mb[0]]:
            return
        gap = (reference.float() - mbi.engine).abs() * mask
        sums["mismatch_sum"] += gap.sum()
        running_max(sums, "mismatch_max", gap)
        sums["mismatch_tokens"] += mask.sum()

    def _clip_and_step(self, loss: float) -> float:
        params = [p for p in self.parts.policy.parameters() if p.grad is not None]
        max_norm = self.cfg.train.max_grad_norm if self.cfg.train.max_grad_norm > 0 else float("inf")
        grad_norm = self.parts.dist.sync_and_clip_grads(params, max_norm)  # multi-process: the global norm over every shard
        check_finite(self.state.step + 1, loss=loss, grad_norm=grad_norm)  # raises before the weights change
        self.parts.optimizer.step()
        self.parts.lr_schedule.step()
        self.state.policy_version += 1
        return grad_norm

    def _update_metrics(self, sums: dict[str, float], grad_norm: float) -> dict[str, float]:
        return step_metrics(sums, grad_norm, self.parts.lr_schedule.get_last_lr()[0], staleness_shown=self.scheduler.rules.off_policy)

    # ------------------------------------------------------------------ loop

    def step(self) -> dict[str, float]:
        """One optimizer step: (generate + reward + log-probs + advantages when due), update, critic update, sync."""
        plan = self.plan
        step_start = time.perf_counter()
        slot = self.state.step % plan.optimizer_steps_per_generation
        if slot == 0 or self.state.batch is None:
            self.state.batch = self.generate_batch()  # (pushes the policy into the engine first, when it changed)
        indices = self.state.batch.step_rows(slot % plan.steps_per_generation, plan.steps_per_generation)  # whole runs
        self.state.step_indices = indices
        release_engine_memory(self.parts.engine)  # vLLM's sleep mode: its KV cache (and weights) off the GPU for the update
        self.release_host_memory()  # (CPU) what generation and the push freed, out of the heap before the update
        with self.phases("update"):
            metrics = self.update(self.state.batch, indices)
        if self.parts.critic is not None:
            with self.phases("critic"):
                metrics.update(self.parts.critic.update(self.state.batch, self.micro_batches(self.state.batch, indices)))
        self.release_host_memory()  # (CPU) the update's, before the push and the next generation
        self.state.step += 1
        if self.state.step % plan.optimizer_steps_per_generation == 0 and self.state.step < plan.max_steps:
            self.sync.push()
        out = {**(self.state.batch.metrics if slot == 0 else {}), **metrics, **self.phases.pop()}
        out["timing/step_s"] = time.perf_counter() - step_start
        out.update(self.sync.pop_metrics())  # the pushes' bytes and the last canary check's statistics
        return out

    def close(self) -> None:
        """Release the engine, rewards and process group; call it from a `finally` (it sees whether a failure is unwinding)."""
        clean = sys.exc_info()[0] is None  # in a `finally` reached by an exception, that exception is still current
        if "scheduler" in self.__dict__:
            self.scheduler.close()  # stops a driver thread, aborts what is in flight
        self.parts.rewards.close()
        if self.parts.owns_engine:
            self.parts.engine.close()
        self.parts.dist.close(clean=clean)

