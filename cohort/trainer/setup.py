"""Building a trainer's parts from the config, in the order that fails fastest.

Data and rewards first (cheap, and the most common mistakes), then the
tokenizer, the policy, the optional reference model (only when algorithm.beta != 0),
the optimizer and the schedule, the algorithm's resolved choices
(`cohort.trainer.algorithms`), the critic (only for an algorithm that needs
one), and last the rollout engine (the slowest to start).
"""

from __future__ import annotations

import copy
import math

import torch

from cohort.data.datasets import RepeatSampler
from cohort.models.loading import load_policy, load_tokenizer, resolve_model_dir, stop_token_ids
from cohort.models.precision import resolve_precision
from cohort.prompts import encode_prompts, load_data, max_positions_of


def setup(trainer, external_engine=None) -> None:
    cfg = trainer.cfg
    threads = cfg.train.num_threads
    if threads is None and cfg.rollout.mode == "local_server":
        from cohort.rollout.remote_engine import engine_cores

        threads = engine_cores(cfg)[1]  # with rollout.overlap: the cores the engine's process leaves free
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(cfg.train.seed)
    from cohort.distributed.fsdp import attach_context

    attach_context(trainer)  # trainer.dist: one process, or one of W under torchrun (ranks > 0 log to run_dir/ranks/)
    _check_writable(trainer.run_dir)
    train_data, eval_data, reward_specs = load_data(cfg)
    from cohort.rewards import RewardSet

    trainer.rewards = trainer.dist.main_only_rewards(RewardSet.from_specs(reward_specs))
    trainer.model_dir = resolve_model_dir(cfg.model.path)
    trainer.tokenizer = load_tokenizer(trainer.model_dir)
    trainer.pad_id = trainer.tokenizer.pad_token_id
    prompts = encode_prompts(cfg, trainer.tokenizer, trainer.model_dir, train_data, eval_data)  # raises if one cannot fit
    trainer.renderer, trainer.prompts_filtered = prompts.renderer, prompts.filtered
    trainer.train_data, trainer.train_ids = prompts.train, prompts.train_ids
    trainer.eval_data, trainer.eval_ids = prompts.eval, prompts.eval_ids
    trainer.sampler = RepeatSampler(len(trainer.train_data), trainer.plan.prompts_per_generation, trainer.plan.num_generations,
                                    shuffle=cfg.data.shuffle, seed=cfg.train.seed)
    trainer.precision = resolve_precision(cfg.model.dtype, cfg.train.precision)  # float32 master weights when mixed
    trainer.policy = load_policy(trainer.model_dir, trainer.precision.weights_dtype)
    if cfg.train.gradient_checkpointing:
        trainer.policy.gradient_checkpointing_enable()
    trainer.lora = _lora(trainer.policy, cfg)  # LoRA: the adapter injected into the policy in place (cohort/models/lora.py)
    trainer.policy.train()
    from cohort.trainer.checkpoint import check_disk_space

    check_disk_space(trainer.run_dir, trainer.policy, cfg.run.keep_checkpoints, cfg.run.save_every)
    # the reference (beta != 0) is a frozen copy; under LoRA it is the policy with its adapter disabled (no copy)
    trainer.ref_model = _reference(trainer.policy) if cfg.algorithm.beta != 0 and trainer.lora is None else None
    trainer.policy = trainer.dist.shard(trainer.policy)  # FSDP2 when W > 1; the optimizer then holds this rank's shards
    trainer.optimizer, trainer.scheduler = build_optimizer(trainer.policy, cfg.train)
    from cohort.trainer import algorithms
    from cohort.trainer.loop import LOSS_AGGREGATION

    trainer.algorithm = algorithms.resolve(cfg, off_policy=trainer.plan.off_policy)
    trainer.kl_controller = algorithms.kl_controller(cfg)
    trainer.aggregation = LOSS_AGGREGATION[cfg.algorithm.loss_type]
    trainer.loss_name = trainer.algorithm.loss_name
    trainer.critic = _critic(trainer) if trainer.algorithm.spec.needs_critic else None
    trainer.engine, trainer.owns_engine = _engine(trainer, external_engine)
    trainer.engine_shares_policy = getattr(trainer.engine, "model", None) is trainer.policy


def _lora(policy: torch.nn.Module, cfg):
    """A `LoraPolicy` when model.lora_rank > 0 (only the adapter then requires grad), else None."""
    if not cfg.model.lora_rank:
        return None
    from cohort.models.lora import attach_lora

    return attach_lora(policy, cfg.model, gradient_checkpointing=cfg.train.gradient_checkpointing)


def _reference(policy: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(policy)
    ref.eval()
    ref.requires_grad_(False)
    return ref


def _critic(trainer):
    """PPO's value model: its own copy of critic.path (default: the policy's checkpoint) with a new value head."""
    from cohort.trainer.critic import Critic

    cfg = trainer.cfg
    model_dir = resolve_model_dir(cfg.critic.path) if cfg.critic.path else trainer.model_dir
    return Critic(model_dir, cfg, pack=trainer._pack)


def build_optimizer(policy: torch.nn.Module, train_cfg):
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=train_cfg.learning_rate, betas=(train_cfg.adam_beta1, train_cfg.adam_beta2),
                                  weight_decay=train_cfg.weight_decay)
    warmup, total, kind = train_cfg.warmup_steps, train_cfg.max_steps, train_cfg.lr_scheduler

    def factor(step: int) -> float:  # step = number of optimizer steps taken so far
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _engine_length(trainer) -> int:
    """The sequence length every engine of the run must fit: the longest prompt kept + rollout.max_completion_length + 1,
    never more than the model's positions (encode_prompts checked that prompt + completion fits them)."""
    longest = max(len(ids) for ids in trainer.train_ids + (getattr(trainer, "eval_ids", None) or []))
    length, positions = longest + trainer.cfg.rollout.max_completion_length + 1, max_positions_of(trainer.model_dir)
    return min(length, positions) if positions else length


def local_server_engine(trainer):
    """vLLM in a private `cohort serve` child (rollout.mode=local_server, and rank 0's vLLM in multi-process runs)."""
    from cohort.rollout.remote_engine import LocalServerEngine

    return LocalServerEngine(trainer.model_dir, trainer.cfg, max_model_len=_engine_length(trainer),
                             dtype=trainer.cfg.generation_dtype)


def _engine(trainer, external, *, split: bool = True):
    cfg = trainer.cfg
    if external is not None:
        return external, False
    if split and trainer.dist.world_size > 1:  # rank 0 builds the engine below; every rank gets its results
        from cohort.distributed.rank0 import rank0_engine

        return rank0_engine(trainer, lambda: _engine(trainer, None, split=False)[0]), True
    if cfg.rollout.mode == "local_server":
        return local_server_engine(trainer), True
    if cfg.rollout.mode == "server":
        from cohort.rollout.remote_engine import RemoteEngine

        return RemoteEngine(cfg.rollout.server_urls, timeout_s=cfg.rollout.server_timeout_s,
                            agreement_tolerance=cfg.server_agreement_tolerance, min_model_len=_engine_length(trainer),
                            stop_token_ids=stop_token_ids(trainer.model_dir, trainer.tokenizer)), True
    if cfg.rollout.engine == "hf":
        from cohort.rollout.hf_engine import HFEngine

        stops = stop_token_ids(trainer.model_dir, trainer.tokenizer)  # the set vLLM and the rollout server use too
        return HFEngine(trainer.policy, pad_token_id=trainer.pad_id, stop_token_ids=stops,
                        compute_context=trainer.precision.autocast), True
    from cohort.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(trainer.model_dir, dtype=cfg.generation_dtype, max_model_len=_engine_length(trainer), seed=cfg.rollout.seed,
                      enforce_eager=cfg.rollout.enforce_eager, enable_prefix_caching=cfg.rollout.enable_prefix_caching,
                      kv_cache_gib=cfg.rollout.kv_cache_gib, gpu_memory_utilization=cfg.rollout.gpu_memory_utilization), True


def _check_writable(run_dir) -> None:
    from cohort.config import ConfigError

    probe = run_dir / ".write-test"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError([f"run.output_dir = {str(run_dir)!r} is not writable ({exc}); choose another run.output_dir"]) from exc
