"""The rollout engine a config asks for, built for the trainer or for `cohort eval`.

`build_engine` picks by `engine.mode` and `engine.name`, in this process:
- `server`: the client of the running rollout servers (`RemoteEngine`);
- `local_server`: vLLM in a private `cohort serve` child (`LocalServerEngine`);
- `colocate` + `hf`: transformers generation with the given model (the trainer's
  own policy, so no weight push is needed) or, without one, a copy loaded from
  model.path; its sampling path (continuous batching or plain generate, and why) is
  printed to stderr (during `cohort train`: RUN_DIR/logs/engine.log) (`engine.name=auto` resolves to hf where vLLM
  is not installed);
- `colocate` + `vllm`: vLLM in this process (`VLLMEngine`).

`rank0_engine` is the multi-process case: rank 0 holds the engine and every rank
gets its results (`cohort.distributed.rank0`); vLLM then always runs as a local
server child, and transformers on rank 0's own unsharded copy of the policy.

`set_torch_threads` gives the trainer (or `cohort eval`) the cores a local
server's engine leaves free. Every engine is sized by `engine_length`: the longest prompt kept +
rollout.max_completion_length + 1, capped at the model's positions (with agent.function: the model's positions, since
an agent renders its own prompts).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from cohort.distributed.fsdp import LocalContext
from cohort.distributed.rank0 import DetachedHFEngine, MainOnlyEngine
from cohort.models.devices import resolve_device
from cohort.models.pretrained import load_policy, stop_token_ids
from cohort.models.precision import Precision
from cohort.plan.batch import batch_plan
from cohort.plan.memory import engine_batch_limits
from cohort.prompts import max_positions_of
from cohort.rollout.engines.hf import HFEngine
from cohort.rollout.server.client import LocalServerEngine, RemoteEngine, engine_cores
from cohort.rollout.engines.vllm import VLLMEngine


SMALL_MODEL_PARAMETERS = 3_000_000  # below this a CPU step is fastest on one thread (docs/performance.md, "Threads")


def set_torch_threads(cfg, *, num_parameters: int | None = None, device: torch.device | None = None) -> None:
    """train.num_threads; unset: with engine.mode=local_server the cores the engine's process leaves free, and for a
    model of fewer than SMALL_MODEL_PARAMETERS (``num_parameters``, when known) trained on CPU one thread, unless the
    environment sets OMP_NUM_THREADS (measured: the 1M-parameter model's step 1.4-1.8x faster on one thread than on two
    under OMP_WAIT_POLICY=PASSIVE, a 5.9M one 14% slower)."""
    threads = cfg.train.num_threads
    if threads is None and cfg.engine.mode == "local_server":
        threads = engine_cores(cfg)[1]  # with pipeline.max_staleness >= 1: the cores the engine's process leaves free
    elif threads is None and small_cpu_model(num_parameters, device):
        threads = 1
    if threads:
        torch.set_num_threads(threads)


def small_cpu_model(num_parameters: int | None, device: torch.device | None = None) -> bool:
    """Whether the one-thread default applies: a known count under SMALL_MODEL_PARAMETERS, trained on the CPU (`device`;
    None: the device `train.device=auto` picks here), no OMP_NUM_THREADS."""
    device = device if device is not None else resolve_device("auto")
    return (num_parameters is not None and num_parameters < SMALL_MODEL_PARAMETERS and device.type == "cpu"
            and "OMP_NUM_THREADS" not in os.environ)


def engine_length(cfg, model_dir: Path, prompt_ids: list[list[int]]) -> int:
    """The sequence length every engine of the run must fit: the longest prompt kept + rollout.max_completion_length + 1,
    never more than the model's positions (encode_prompts checked that prompt + completion fits them); with an agent
    or a tools.environment the model's positions (an agent's prompts are its own; an environment's `reset` appends
    its first observation, of a length known only then, to the prompt)."""
    longest = max(len(ids) for ids in prompt_ids)
    length, positions = longest + cfg.rollout.max_completion_length + 1, max_positions_of(model_dir)
    if (cfg.agent.enabled or cfg.tools.environment is not None) and positions:  # prompts grow after encoding
        return positions
    return min(length, positions) if positions else length


def local_server_engine(cfg, model_dir: Path, max_model_len: int) -> LocalServerEngine:
    """vLLM in a private `cohort serve` child (engine.mode=local_server, and rank 0's vLLM in multi-process runs)."""
    return LocalServerEngine(model_dir, cfg, max_model_len=max_model_len, dtype=cfg.generation_dtype)


def build_engine(cfg, model_dir: Path, tokenizer, *, max_model_len: int, precision: Precision,
                 policy: torch.nn.Module | None = None, device: torch.device | None = None):
    """The engine of engine.mode / engine.name in this process (see the module docstring); a transformers copy of
    model.path (no `policy` given) is loaded onto `device`."""
    if cfg.engine.mode == "local_server":
        return local_server_engine(cfg, model_dir, max_model_len)
    if cfg.engine.mode == "server":
        return RemoteEngine(cfg.engine.server_urls, timeout_s=cfg.engine.server_timeout_s,
                            agreement_tolerance=cfg.server_agreement_tolerance, min_model_len=max_model_len,
                            stop_token_ids=stop_token_ids(model_dir, tokenizer))
    if cfg.engine.name == "hf":
        if policy is None:  # `cohort eval`: no trainer, so a copy of model.path to generate with
            policy = load_policy(model_dir, precision.weights_dtype, device).eval()
        stops = stop_token_ids(model_dir, tokenizer)  # the set vLLM and the rollout server use too
        engine = HFEngine(policy, pad_token_id=tokenizer.pad_token_id, stop_token_ids=stops, compute_context=precision.autocast)
        print(f"rollout engine: transformers, {engine.choice}", file=sys.stderr, flush=True)  # (train: the engine log)
        return engine
    return VLLMEngine(model_dir, dtype=cfg.generation_dtype, max_model_len=max_model_len, seed=cfg.rollout.seed,
                      enforce_eager=cfg.engine.enforce_eager, enable_prefix_caching=cfg.engine.enable_prefix_caching,
                      kv_cache_gib=cfg.engine.kv_cache_gib, gpu_memory_utilization=cfg.engine.gpu_memory_utilization,
                      sleep_mode=cfg.engine.sleep_mode, batch_limits=engine_batch_limits(batch_plan(cfg), max_model_len),
                      per_request_seeds=cfg.engine.per_request_seeds, stop_ids=stop_token_ids(model_dir, tokenizer))


def rank0_engine(cfg, dist: LocalContext, model_dir: Path, tokenizer, *, max_model_len: int,
                 precision: Precision, device: torch.device | None = None) -> MainOnlyEngine:
    """Several training processes: rank 0's engine (none on the other ranks), wrapped so every rank gets its results."""
    engine = None
    if dist.is_main:
        if cfg.engine.mode == "colocate" and cfg.engine.name == "hf":
            engine = DetachedHFEngine(load_policy(model_dir, cfg.model.dtype, device), pad_token_id=tokenizer.pad_token_id,
                                      stop_token_ids=stop_token_ids(model_dir, tokenizer))
            print(f"rollout engine: transformers on rank 0's copy, {engine.inner.choice}", file=sys.stderr, flush=True)
        elif cfg.engine.mode in ("colocate", "local_server"):  # vLLM cannot nest in a multi-rank process group
            engine = local_server_engine(cfg, model_dir, max_model_len)
        else:
            engine = build_engine(cfg, model_dir, tokenizer, max_model_len=max_model_len, precision=precision)
    return MainOnlyEngine(engine, dist)
