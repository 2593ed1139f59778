"""Everything a Trainer is built from, declared in one place: `TrainerParts`.

`cohort.trainer.build_parts.setup` builds the parts from the config and returns them;
the `Trainer` (cohort/trainer/trainer.py) holds them as `trainer.parts`, and every
reader names the part through it (`trainer.parts.policy`, `trainer.parts.engine`;
`Trainer.swap_engine` replaces the engine). The counters and the current batch
are its `TrainerState` (cohort/trainer/state.py); its other state (the weight
sync, phase timers, the rollout scheduler) is declared in its `__init__`.

The checkpoint module (cohort/trainer/checkpoint.py) saves the state dicts of the
parts listed in `stateful_parts` (cohort/trainer/state.py: optimizer, lr_schedule, sampler, critic, KL
controller, ...) under the part's name here, so renaming a field renames its
entry in state.pt (the checkpoint module's `RENAMED_PARTS` reads old names).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from cohort.algorithms import AdaptiveKLController, FixedKLController
from cohort.data.datasets import PromptDataset, RepeatSampler
from cohort.distributed.fsdp import LocalContext
from cohort.distributed.rank0 import MainOnlyRewards
from cohort.models.lora import LoraPolicy
from cohort.models.precision import Precision
from cohort.prompts import PromptRenderer
from cohort.rewards import RewardSet
from cohort.rollout.base import RolloutEngine
from cohort.trainer.algorithms import AlgorithmChoice
from cohort.trainer.critic import Critic


@dataclass
class TrainerParts:
    """What `setup` builds, in build order (the cheapest and likeliest to fail first)."""

    dist: LocalContext  # this process among the training processes (every method the identity in one process)
    device: torch.device  # where the training side lives (train.device): every model and every tensor a step makes
    run_dir: Path  # where this process writes (ranks > 0: run_dir/ranks/rank-N)
    rewards: RewardSet | MainOnlyRewards  # scores completions (on rank 0 only, broadcast, when several processes)
    model_dir: Path  # model.path resolved to a local checkpoint directory
    tokenizer: object  # the model's transformers tokenizer
    pad_id: int  # the tokenizer's pad token, used to right-pad packed batches
    renderer: PromptRenderer  # prompts (text or chat messages) to token ids under the run's prompt limit
    prompts_filtered: int  # train prompts dropped as longer than the limit (data.overlong_prompts=filter)
    train_data: PromptDataset  # the kept train rows (prompt, gold columns)
    train_ids: list[list[int]]  # their prompts as token ids
    eval_data: PromptDataset | None  # the kept held-out rows, or None without eval data
    eval_ids: list[list[int]] | None  # their prompts as token ids
    sampler: RepeatSampler  # which rows form each generation batch (each prompt G times in a row)
    precision: Precision  # weights dtype and autocast of every trained model (train.precision)
    policy: torch.nn.Module  # the trained model (FSDP-sharded under several processes; peft-wrapped under LoRA)
    lora: LoraPolicy | None  # lora.rank > 0: the adapter's handle (merged weights, adapter off), else None
    ref_model: torch.nn.Module | None  # frozen copy of the initial policy, only when algorithm.beta != 0
    teacher: torch.nn.Module | None  # algorithm.name = distill: teacher.path, frozen, held like the reference
    optimizer: torch.optim.Optimizer  # the policy's AdamW
    lr_schedule: torch.optim.lr_scheduler.LRScheduler  # its learning-rate schedule (train.lr_scheduler)
    algorithm: AlgorithmChoice  # the configured algorithm with every `auto` resolved
    kl_controller: FixedKLController | AdaptiveKLController  # beta, fixed or adapted towards algorithm.kl_target
    aggregation: str  # how token losses become one loss (from algorithm.loss_type)
    loss_name: str  # the policy-loss entry (ppo_clip, gspo, ...)
    critic: Critic | None  # PPO's value model with its own optimizer, else None
    engine: RolloutEngine  # generates completions and scores canaries (vLLM, transformers, or a server)
    owns_engine: bool  # close the engine with the trainer (False for an engine handed in)
    engine_shares_policy: bool  # the engine generates with the policy module itself: no weight push needed

