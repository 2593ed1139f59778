"""Building a trainer's parts (`TrainerParts`, cohort/trainer/parts.py) from the config, in the order that fails fastest.

Data and rewards first (cheap, and the most common mistakes), then the
tokenizer and the prompts (a prompt the model cannot hold fails here, before any
weights load) — all three as validation read them (`RunPlan.read`, cohort/plan/run_plan.py), and every environment
as validation resolved it (`RunPlan.environment`), read here only when it did not (a `tiny:*` model built on first use, a plan from another process) —, the policy, the optional reference model (only when
algorithm.beta != 0), the distillation teacher (only for algorithm.name = distill;
held like the reference: frozen, sharded and offloaded with it), the optimizer and the schedule, the algorithm's resolved
choices (`cohort.trainer.algorithms`), the critic (only for an algorithm that
needs one), and last the rollout engine (the slowest to start,
cohort/trainer/build_engine.py), wrapped in the tool loop when tools.functions or tools.environment is set, or in agent
runs when agent.function is (cohort/agents).

Nothing here touches a Trainer: `setup` returns the parts and the Trainer holds them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from pathlib import Path
from typing import Callable

import torch

from cohort.config import ConfigError
from cohort.data.datasets import RepeatSampler
from cohort.distributed.fsdp import LocalContext, context_from_env, offload_optimizer_state, rank_run_dir
from cohort.distributed.rank0 import MainOnlyEngine, main_only_rewards
from cohort.models.devices import autocast_device_type, resolve_device, use_device
from cohort.models.pretrained import load_policy, load_run_tokenizer, load_tokenizer, resolve_model_dir
from cohort.models.lora import attach_lora, base_dtype
from cohort.models.precision import DTYPES, Precision, resolve_precision
from cohort.prompts import encode_prompts
from cohort.rewards import RewardSet
from cohort.plan.run_environment import RunEnvironment, run_data
from cohort.plan.run_plan import RunInputs, RunPlan
from cohort.plan.run_rewards import reward_specs
from cohort.plan.teacher_checks import mismatch_problem, tokenizer_mismatch
from cohort.agents import agent_setup as agents
from cohort.tools.tool_setup import prompt_with_observation, rows_by_index, run_rows, wrap_engine
from cohort.trainer import algorithms
from cohort.trainer.checkpoint import check_disk_space
from cohort.trainer.critic import Critic
from cohort.trainer.build_engine import build_engine, engine_length, rank0_engine, set_torch_threads
from cohort.trainer.optim import build_optimizer
from cohort.trainer.parts import TrainerParts


def setup(run: RunPlan, run_dir: Path, *, pack: Callable, external_engine=None) -> TrainerParts:
    """Every part of a trainer for a validated `run` (its config and batch plan, and what validation read).
    `pack(batch, indices)` is the trainer's batch packing (the critic sees the same tokens as the policy);
    `external_engine`, when given, is used and not closed."""
    cfg, plan = run.config, run.batch
    torch.manual_seed(cfg.train.seed)
    # cuda:LOCAL_RANK with a GPU (train.device=auto), else the CPU: every model and every step's tensor goes there
    dist = context_from_env(resolve_device(cfg.train.device))  # one process, or one of W under torchrun
    device = dist.device
    use_device(device)
    run_dir = rank_run_dir(dist, cfg, run_dir)
    _check_writable(run_dir)
    environment = run.environment if run.environment is not None else RunEnvironment(cfg)  # (resolved once a process)
    read = _read_inputs(cfg, dist, run.read, environment)  # (what validation read, completed here)
    rewards = main_only_rewards(RewardSet.from_specs(reward_specs(cfg, environment, read.task_specs)), dist)
    model_dir, tokenizer, prompts = read.model_dir, read.tokenizer, read.prompts
    sessions = _sessions(plan, prompts)
    if dist.is_main:  # before any weights load (a served environment's capacity for the sessions a step keeps open)
        environment.before_load(sessions[0], sessions[1], cfg.tools.timeout_s)
    sampler = RepeatSampler(len(prompts.train), plan.prompts_per_generation, plan.num_generations,
                            shuffle=cfg.data.shuffle, seed=cfg.train.seed)
    precision = resolve_precision(cfg.model.dtype, cfg.train.precision, device)  # float32 master weights when mixed
    policy = load_policy(model_dir, base_dtype(precision) if cfg.lora.rank else precision.weights_dtype,  # LoRA: frozen
                         device=device)
    set_torch_threads(cfg, num_parameters=sum(p.numel() for p in policy.parameters()), device=device)  # before any engine
    if cfg.train.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    lora = attach_lora(policy, cfg.lora, precision=precision,
                       gradient_checkpointing=cfg.train.gradient_checkpointing) if cfg.lora.rank else None
    policy.train()
    check_disk_space(run_dir, policy, cfg.run.keep_checkpoints, cfg.run.save_every)
    # the reference (beta != 0) is a frozen copy; under LoRA it is the policy with its adapter disabled (no copy)
    ref_model = _reference(policy) if cfg.algorithm.beta != 0 and lora is None else None
    if ref_model is not None:  # W > 1: sharded (and offloaded) like the policy, never a full copy per rank
        ref_model = dist.shard(ref_model, precision, param_offload=cfg.train.param_offload)
    teacher = _teacher(cfg, dist, tokenizer) if cfg.algorithm.name == "distill" else None
    policy = dist.shard(policy, precision, param_offload=cfg.train.param_offload)  # FSDP2 when W > 1: optimizer on shards
    optimizer, lr_schedule = build_optimizer(policy, cfg.train)
    if cfg.train.optimizer_offload:
        offload_optimizer_state(optimizer)
    algorithm = algorithms.resolve(cfg, off_policy=plan.off_policy)
    critic = _critic(cfg, model_dir, pack, precision, device) if algorithm.spec.needs_critic else None
    max_model_len = engine_length(cfg, model_dir, prompts.train_ids + (prompts.eval_ids or []))
    engine, owns_engine = _engine(cfg, dist, model_dir, tokenizer, external_engine, max_model_len=max_model_len,
                                  precision=precision, policy=policy)
    if cfg.tools.enabled:  # multi-turn: every request goes through the tool loop (cohort/tools/loop.py)
        engine = _with_tools(cfg, engine, tokenizer, prompts, max_model_len, environment)
    if cfg.agent.enabled:  # every request is one run of the agent function (cohort/agents/engine.py), beside rank 0's engine
        engine = _on_rank0(engine, functools.partial(agents.wrap_engine, cfg, tokenizer=tokenizer, rows=_rows(prompts),
                                                     max_model_len=max_model_len, agent=environment.agent(cfg.model.path)))
    return TrainerParts(
        dist=dist, device=device, run_dir=run_dir, rewards=rewards, model_dir=model_dir, tokenizer=tokenizer,
        pad_id=tokenizer.pad_token_id, renderer=prompts.renderer, prompts_filtered=prompts.filtered,
        train_data=prompts.train, train_ids=prompts.train_ids, eval_data=prompts.eval, eval_ids=prompts.eval_ids,
        sampler=sampler, precision=precision, policy=policy, lora=lora, ref_model=ref_model, teacher=teacher,
        optimizer=optimizer, lr_schedule=lr_schedule,
        algorithm=algorithm, kl_controller=algorithms.kl_controller(cfg),
        aggregation=algorithm.aggregation, loss_name=algorithm.loss_name, critic=critic,
        engine=engine, owns_engine=owns_engine, engine_shares_policy=getattr(engine, "model", None) is policy,
    )


def _read_inputs(cfg, dist: LocalContext, read: RunInputs | None, environment: RunEnvironment) -> RunInputs:
    """What validation read (`read`), with the checkpoint directory the run loads: as validation found it, else
    resolved here (a `tiny:*` model built on first use, a Hub id's snapshot with its weights fetched). When validation
    read nothing (`read` None: a `tiny:*` model, another process's plan), the data, the tokenizer and every prompt
    encoded too (raises if one cannot fit). A dataset or model by name is fetched once per node."""
    if read is not None and read.model_dir is not None:
        return read
    model_dir = dist.local_main_first(lambda: resolve_model_dir(cfg.model.path, cfg.model.revision))
    if read is not None:  # a Hub id: validation read its snapshot's tokenizer, the weights come now
        return dataclasses.replace(read, model_dir=model_dir)
    train_data, eval_data, task_specs = dist.local_main_first(lambda: run_data(cfg, environment))
    tokenizer = load_run_tokenizer(model_dir, cfg.model)
    prompts = encode_prompts(cfg, tokenizer, model_dir, train_data, eval_data, environment.tools)
    return RunInputs(model_dir, tokenizer, prompts, task_specs)


def _reference(policy: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(policy)
    ref.eval()
    ref.requires_grad_(False)
    return ref


def _teacher(cfg, dist: LocalContext, tokenizer) -> torch.nn.Module:
    """distill: teacher.path frozen in its own dtype (`cfg.teacher_dtype`, no float32 master copy) on the training device;
    under several processes sharded, and offloaded with train.param_offload, exactly as the reference model is. Its
    tokenizer is compared with the student's first (validation could not read every kind of path), so a teacher of
    another tokenizer is refused before its weights load."""
    teacher_dir = resolve_model_dir(cfg.teacher.path)
    mismatch = tokenizer_mismatch(tokenizer, load_tokenizer(teacher_dir))
    if mismatch is not None:
        raise ConfigError([mismatch_problem(cfg, mismatch)])
    dtype = DTYPES[cfg.teacher_dtype]
    teacher = load_policy(teacher_dir, dtype, device=dist.device)
    teacher.eval()
    teacher.requires_grad_(False)
    held = Precision(weights_dtype=dtype, compute_dtype=dtype, device_type=autocast_device_type(dist.device))  # never mixed
    return dist.shard(teacher, held, param_offload=cfg.train.param_offload)


def _critic(cfg, model_dir: Path, pack: Callable, precision: Precision, device: torch.device) -> Critic:
    """PPO's value model: its own copy of critic.path (default: the policy's checkpoint) with a new value head, on the
    policy's device and in its precision."""
    return Critic(resolve_model_dir(cfg.critic.path) if cfg.critic.path else model_dir, cfg, pack=pack,  # (one process)
                  precision=precision, device=device)


def _engine(cfg, dist: LocalContext, model_dir: Path, tokenizer, external, *, max_model_len: int, precision: Precision,
            policy: torch.nn.Module):
    """(engine, owned): the one handed in, rank 0's under several processes, else the configured one in this process."""
    if external is not None:
        return external, False
    if dist.world_size > 1:  # rank 0 builds the engine; every rank gets its results
        return rank0_engine(cfg, dist, model_dir, tokenizer, max_model_len=max_model_len, precision=precision,
                            device=dist.device), True
    return build_engine(cfg, model_dir, tokenizer, max_model_len=max_model_len, precision=precision, policy=policy), True


def _with_tools(cfg, engine, tokenizer, prompts, max_model_len: int, environment: RunEnvironment):
    """The engine inside the tool loop (the run's resolved tools); under several processes the loop wraps rank 0's
    engine, so tools run once, beside it, and every rank receives the finished multi-turn trajectories."""
    wrap = functools.partial(wrap_engine, cfg.tools, rows=_rows(prompts), tokenizer=tokenizer,
                             prompt_with=prompt_with_observation(prompts.renderer.encode, prompts.train.prompt_key),
                             max_model_len=max_model_len, resolution=environment.tools)
    return _on_rank0(engine, wrap)


def _on_rank0(engine, wrap: Callable):
    """`wrap(engine=engine)`; under several processes, rank 0's engine wrapped inside its `MainOnlyEngine` (the tool
    loop or the agent endpoint runs once, beside it, and every rank receives the finished trajectories)."""
    if isinstance(engine, MainOnlyEngine):
        if engine.engine is not None:
            engine.engine = wrap(engine=engine.engine)
        return engine
    return wrap(engine=engine)


def _sessions(plan, prompts) -> tuple[int, str]:
    """(trajectories the run keeps in flight at once, why): each holds an environment instance (a served environment:
    a session) from its reset to its end."""
    train = math.ceil(plan.generation_batch_size * plan.admission.over_provision)
    evals = len(prompts.eval.rows) if prompts.eval is not None else 0
    why = f"a generation batch of {plan.generation_batch_size} completions"
    if plan.admission.over_provision != 1:
        why += f" × pipeline.over_provision {plan.admission.over_provision:g}"
    if evals > train:
        return evals, f"the {evals} eval prompts, all at once"
    return train, why


def _rows(prompts):
    """A request -> its dataset row (train and eval, by `Request.row`), for environments and agents."""
    return rows_by_index(run_rows(prompts.train, prompts.eval))


def _check_writable(run_dir) -> None:
    probe = run_dir / ".write-test"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError([f"run.output_dir = {str(run_dir)!r} is not writable ({exc}); choose another run.output_dir"]) from exc
