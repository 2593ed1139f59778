"""Every check of a config, with fix-it messages, before anything loads: one entry point, `validate_config`.

`validate_config(cfg, check_files=True)` reports *all* problems at once as one
`ConfigError`, each naming its fields and a fix, and returns the run's
`RunPlan` (its `batch`: the `BatchPlan`). It runs, in this order:

- the config alone: batch arithmetic, value ranges (the loss fields' in `cohort.plan.loss_checks`, the distillation
  teacher's in `cohort.plan.teacher_checks`), the scheduler's rules, the rollout mode and the distributed settings,
  training processes, the run/logger/optimizer fields, and that every reward spec resolves;
- with check_files, the outside world, cheaply: the data files and their columns (each reward's columns too), the
  model directory (`tiny:*` names are only looked up, never built) and its tokenizer (files present; loaded once,
  and text encodes to tokens: cohort.models.tokenizer_check), the output directory, the weights' headers, the
  prompts measured as the trainer will keep them (the data and the model's tokenizer, no weights; skipped for
  `tiny:*` models, whose tokenizer is built with the model) against the model's positions, the vLLM CPU KV cache,
  and a distillation teacher's tokenizer against that same student tokenizer;
- on a GPU, with vLLM colocated or in a local server child: the GPU memory plan
  (`cohort.plan.memory.gpu_memory_plan`, against the GPU's total memory read from
  CUDA), refusing a split that cannot fit with both numbers and the fixes;
- elsewhere the estimate against the machine's memory (`machine_memory_problems`: the host's on the CPU, a GPU
  of the trainer's own), refusing a run that cannot fit with the fixes that would make it
  (cohort/plan/machine_fit.py; train.check_memory=false runs it anyway). Not with `for_gpu` (that plans another
  machine), nor for `cohort eval` (`trains=False`: it holds no gradients or optimizer state).

It builds nothing: no model, no tokenizer of a `tiny:*` model, no engine, and
writes no file (but RUN_DIR/logs/error.log when reading the data raised an error of its own: one line names it; with check_files, a GGUF model.path is converted once into cohort's cache first, so the checks can
read it). It never writes into `cfg`: it returns a `RunPlan` (cohort/plan/run_plan.py) whose `config` is a new,
resolved config, with the values every later reader must agree on settled (and `environment` read into its hub's
field, cohort/connectors/registry.py's `routed`):
- `model.dtype = auto` becomes the dtype chosen for this device (`choose_model_dtype`), so the saved config.yaml,
  the plan and every part read one concrete dtype;
- `engine.gpu_memory_utilization` unset (None), when the GPU plan applies, becomes the derived fraction, so every
  engine built from it (colocated, a local server child, torchrun's children reading config.yaml) gets the same
  value and the saved config.yaml records what vLLM was given (a resumed run takes it as set; unset it to derive
  it again on another GPU).
The model's directory is resolved once (`pretrained.inspect_model`) and handed to every check that reads it; what validation
reads to check the prompts (the tokenizer, the data, every prompt encoded) is the plan's `read`, which the trainer's
setup uses as it is. Once per process: `cohort train` and `cohort.train` validate, then hand the plan to the Trainer
(`Trainer(plan)`), which validates only when it is given a config; a Ray actor receives the plan
(`RunPlan.for_another_process`) and does not validate.

Left out: whatever needs the weights (a checkpoint whose tensors do not fit its
config fails at load, naming the directory).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

from cohort.agents.agent_checks import agent_problems
from cohort.algorithm_facts import FACTS
from cohort.config import CohortConfig, ConfigError, default_output_dir
from cohort.data.datasets import DataError, check_data_config, own_data
from cohort.data.named import named_data_problems
from cohort.models import pretrained
from cohort.models.devices import DeviceError, auto_dtype, has_bf16_units, resolve_device
from cohort.models.gguf import gguf_parameters
from cohort.models.hub import hub_parameter_count
from cohort.models import host_memory
from cohort.models.host_memory import MachineMemory
from cohort.models.lora import lora_problems
from cohort.models.placement import engine_gpus, training_processes, visible_gpus
from cohort.models.tiny import available_tiny_dir
from cohort.models.tokenizer_check import checked_tokenizer, tokenizer_file_problems
from cohort.plan.batch import BatchPlan, MeasuredPrompts, batch_plan, stream_update_active, with_measured_prompts
from cohort.plan.loss_checks import loss_problems
from cohort.plan.machine_fit import host_rows, machine_fit_problems, trainer_gpu_rows
from cohort.plan.memory import (GpuMemoryPlan, ModelFacts, UnreadableWeights, gpu_fit_problems, gpu_memory_plan,
                                kv_bytes_per_token, model_facts)
from cohort.plan.pipeline_checks import pipeline_problems
from cohort.connectors import routed
from cohort.plan.run_environment import RunEnvironment, run_data
from cohort.plan.run_plan import RunInputs, RunPlan
from cohort.plan.run_rewards import reward_problems
from cohort.plan.teacher_checks import teacher_fit_problems, teacher_problems
from cohort.prompts import encode_prompts, fit_problems, max_positions_of
from cohort.rewards.columns import reward_column_problems
from cohort.tools.tool_checks import tool_problems
from cohort.runs.error_log import describe, write_error_log


def validate_config(cfg: CohortConfig, *, check_files: bool = True, for_gpu: bool = False,
                    trains: bool = True) -> RunPlan:
    """All checks that need no model; raises ConfigError listing every problem, else returns the run's plan: the
    resolved config (a new object: `cfg` is never written), the batch plan (with check_files, its token bound taken
    from the longest prompt kept) and what was read to check it (the tokenizer, the prompts encoded). `for_gpu`:
    choose `model.dtype = auto` as on a GPU (`cohort plan --gpu-memory-gib`, planning a GPU run from another machine).
    `trains`: False for `cohort eval`, which trains nothing, so the training estimate is not compared with the
    machine's memory (`machine_memory_problems`)."""
    cfg, routing = routed(cfg)  # `environment` read into its hub's field (a new object); every check reads that
    # model.path looked at once (with check_files, a GGUF file converted first): where its config and tokenizer are,
    # for every check that reads them (the dtype's choice reads its weights' headers)
    model = (pretrained.inspect_model(cfg.model.path, cfg.model.revision, convert=check_files)
             if check_files or cfg.model.dtype == "auto" else pretrained.ModelFiles(None, []))
    model_dir = model.directory
    dtype, _, device_problems = choose_model_dtype(cfg, model_dir, for_gpu=for_gpu)
    if device_problems:  # (a train.device this process cannot have: nothing below can be judged)
        raise ConfigError(device_problems)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": dtype})})  # the plan's own config
    device = resolve_device(cfg.train.device)
    problems = routing + check_batch_arithmetic(cfg) + check_ranges(cfg) + check_correction(cfg) + pipeline_problems(cfg, training_world_size(cfg)) + check_rollout_mode(cfg) + check_processes(cfg)
    problems += check_gpu_settings(cfg, device.type, visible_gpus()) + check_colocated_gpu(cfg, device)
    if check_files:
        problems += check_data_config(cfg.data, cfg.tools.environment) + (named_data_problems(cfg.data) if cfg.data.dataset_name else [])
        problems += model.problems or tokenizer_file_problems(cfg.model.path, folder=model_dir)
        if cfg.critic.path:
            problems += [p.replace("model.path", "critic.path", 1) for p in pretrained.check_model_dir(cfg.critic.path)]
    environment = RunEnvironment(cfg)  # each environment resolved once, where it is checked, and carried in the plan
    problems += (hub_problems := environment.problems())  # (each hub's spelling and own checks, its connector's)
    problems += reward_problems(cfg, environment)
    problems += tool_problems(cfg.tools, environment.tools)
    agent = agent_problems(cfg)
    problems += agent
    problems += lora_problems(cfg, model_dir if check_files and cfg.lora.rank > 0 else None,
                              needs_critic=FACTS[cfg.algorithm.name].needs_critic, world_size=training_world_size(cfg))
    if check_files:
        problems += reward_column_problems(cfg, environment.rows_if_any() if not (hub_problems or agent) else None)
    problems += _check_run_section(cfg)
    measured, read = None, None
    if check_files:
        # (an agent section with problems: its environment's tasks are not read, whose loading would fail on the same cause)
        outside, measured, read = _check_outside(cfg, model, environment, read_data=not (agent or hub_problems))
        problems += outside
    # algorithm.name = distill: the teacher (cohort/plan/teacher_checks.py), against the student read above
    problems += teacher_problems(cfg, check_files, student_readable=not model.problems,
                                 student_tokenizer=read.tokenizer if read is not None else None)
    plan = batch_plan(cfg, training_world_size(cfg))
    plan = with_measured_prompts(cfg, plan, measured) if check_files else plan
    problems += teacher_fit_problems(cfg, plan) if check_files else []
    gpu = None
    if check_files and not problems:
        gpu = plan_gpu_memory(cfg, plan, model_dir=model_dir)
        problems += gpu_fit_problems(cfg, gpu) if gpu is not None else []
        if trains and not for_gpu and (gpu is None or not gpu.shared):  # (vLLM beside the trainer on its GPU: the split above)
            problems += machine_memory_problems(cfg, plan, device, model_dir=model_dir)
    if problems:  # (once each: a named dataset's missing split is found by the data check and again when measuring)
        raise ConfigError(list(dict.fromkeys(problems)))
    if gpu is not None and gpu.derived:  # the other value validation settles (module docstring)
        cfg = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"gpu_memory_utilization": gpu.utilization})})
    return RunPlan(cfg, plan, read, environment)


# --------------------------------------------------------------------------- the device and model.dtype = auto


def choose_model_dtype(cfg: CohortConfig, model_dir: Path | None, *, for_gpu: bool = False) -> tuple[str, str | None, list[str]]:
    """Resolve train.device and `model.dtype = auto` (cohort/models/devices.py); writes nothing. Returns the dtype
    (model.dtype itself when it is not auto), what was chosen and why for the `config:` line (None when nothing was
    auto) and the problems found (a train.device this process cannot have). `model_dir`: `model_dir_of(cfg)`, whose
    safetensors headers give the checkpoint's size (never the weights). `for_gpu`: choose as on a GPU with bf16 units,
    whatever this machine has (`cohort plan --gpu-memory-gib`, planning a GPU run)."""
    try:
        device = torch.device("cuda", 0) if for_gpu else resolve_device(cfg.train.device)
    except DeviceError as exc:
        return cfg.model.dtype, None, [str(exc)]
    placed = f"train.device auto = {device}" if cfg.train.device == "auto" and device.type != "cpu" and not for_gpu else None
    if cfg.model.dtype != "auto":
        return cfg.model.dtype, placed, []
    if cfg.model.path.startswith("tiny:"):  # an embedded model: its cached or shipped checkpoint (never built here)
        model_dir = available_tiny_dir(cfg.model.path.split(":", 1)[1])
    try:
        parameters = pretrained.checkpoint_parameters(model_dir) if model_dir is not None and model_dir.is_dir() else None
    except Exception:  # an unreadable header (SafetensorError, OSError): the weights check below names the file
        parameters = None
    if parameters is None and pretrained.model_source(cfg.model.path) == "gguf":
        parameters = gguf_parameters(cfg.model.path)  # (not converted yet: the file's own header, as the conversion will)
    elif parameters is None and model_dir is not None and not cfg.model.path.startswith("tiny:"):
        parameters = hub_parameter_count(cfg.model.path, cfg.model.revision)  # (a Hub id not downloaded: the Hub's headers)
    dtype, why = auto_dtype(device.type, for_gpu or has_bf16_units(device), parameters)
    why = "as on a GPU with bfloat16 units: --gpu-memory-gib plans a GPU run" if for_gpu else why
    chosen = f"model.dtype auto = {dtype} ({why})"
    return dtype, "; ".join(note for note in (placed, chosen) if note), []


def model_dir_of(cfg: CohortConfig) -> Path | None:
    """Where model.path's config.json and tokenizer are on disk (a Hub id: its snapshot, config and tokenizer fetched,
    never the weights); None for a `tiny:*` model or a path that is no checkpoint (check_model_dir says why)."""
    return pretrained.config_dir(cfg.model.path, cfg.model.revision)


# --------------------------------------------------------------------------- the config alone


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_batch_arithmetic(cfg: CohortConfig) -> list[str]:
    """Every impossible batch combination, each with the fields involved and a fix."""
    problems = []
    g, t, r = cfg.rollout.num_generations, cfg.train, cfg.rollout
    min_g = FACTS[cfg.algorithm.name].min_group_size
    if g < min_g:
        problems.append(
            f"rollout.num_generations = {g}: algorithm.name = {cfg.algorithm.name} needs at least {min_g} completions per prompt "
            f"(its baseline is computed within each group); use 2 or more (8 is typical)"
            if min_g > 1 else f"rollout.num_generations = {g}: must be at least 1"
        )
    for key, value in (("train.prompts_per_step", t.prompts_per_step), ("train.steps_per_generation", t.steps_per_generation),
                       ("train.micro_batch_size", t.micro_batch_size), ("train.max_steps", t.max_steps),
                       ("algorithm.num_iterations", cfg.algorithm.num_iterations),
                       ("rollout.max_completion_length", r.max_completion_length), ("data.max_prompt_length", cfg.data.max_prompt_length)):
        if value is not None and value < 1:
            problems.append(f"{key} = {value}: must be at least 1")
    if problems:
        return problems
    per_step = t.prompts_per_step * g
    if r.generation_batch_size is not None:
        gen = r.generation_batch_size
        if gen % g:
            ok = [k * g for k in range(max(1, gen // g), gen // g + 2)]
            problems.append(
                f"rollout.generation_batch_size = {gen} is not divisible by rollout.num_generations = {g}; use a multiple of {g} such as {ok[0]} or {ok[-1]}"
            )
        elif gen % per_step:
            problems.append(
                f"rollout.generation_batch_size = {gen} is not a multiple of the completions per optimizer step "
                f"(train.prompts_per_step × rollout.num_generations = {t.prompts_per_step} × {g} = {per_step}); "
                f"use {per_step * max(1, gen // per_step)}, or unset it and set train.steps_per_generation"
            )
    if t.micro_batch_size < per_step and per_step % t.micro_batch_size:
        divisors = _divisors(per_step)
        below = [d for d in divisors if d < t.micro_batch_size][-1:]
        above = [d for d in divisors if d > t.micro_batch_size][:1]
        fits = below + above
        problems.append(
            f"train.prompts_per_step × rollout.num_generations = {t.prompts_per_step} × {g} = {per_step} is not divisible by "
            f"train.micro_batch_size = {t.micro_batch_size}; use {' or '.join(map(str, fits))}"
        )
    return problems


def check_ranges(cfg: CohortConfig) -> list[str]:
    problems = []
    a, r, t = cfg.algorithm, cfg.rollout, cfg.train
    if r.temperature <= 0:
        problems.append(f"rollout.temperature = {r.temperature}: must be > 0 (the trainer divides logits by it); use 1.0 for plain sampling")
    if not 0 < r.top_p <= 1:
        problems.append(f"rollout.top_p = {r.top_p}: must be in (0, 1]; use 1.0 to turn nucleus sampling off")
    if r.top_k < 0:
        problems.append(f"rollout.top_k = {r.top_k}: must be >= 0 (0 turns it off)")
    if a.beta < 0:
        problems.append(f"algorithm.beta = {a.beta}: must be >= 0 (0 disables the KL term and the reference model)")
    for key, value in (("algorithm.epsilon_low", a.epsilon_low), ("algorithm.epsilon_high", a.epsilon_high)):
        if value < 0:
            problems.append(f"{key} = {value}: must be >= 0 (0.2 is the PPO default)")
    if a.epsilon_low >= 1 and a.loss_type != "gmpo":  # (gmpo's eps bound the log-ratio: e^-eps stays positive)
        problems.append(f"algorithm.epsilon_low = {a.epsilon_low}: must be < 1 or the lower clip bound 1 − ε is not positive; use 0.2")
    if a.delta is not None and a.delta <= 1 + a.epsilon_high:
        problems.append(f"algorithm.delta = {a.delta}: must exceed 1 + algorithm.epsilon_high = {1 + a.epsilon_high}; TRL suggests 1.5–2, or unset it")
    if t.learning_rate <= 0:
        problems.append(f"train.learning_rate = {t.learning_rate}: must be > 0")
    if cfg.model.dtype == "float16" and t.precision == "mixed":
        problems.append("model.dtype = float16 with train.precision = mixed: float16 mixed precision needs loss scaling, which "
                        "cohort does not do; use model.dtype=bfloat16 (same memory, no loss scaling needed), or "
                        "train.precision=pure to train the float16 weights directly (lossy)")
    if t.warmup_steps < 0 or t.warmup_steps > t.max_steps:
        problems.append(f"train.warmup_steps = {t.warmup_steps}: must be between 0 and train.max_steps = {t.max_steps}")
    if t.logprob_chunk_size < 1:
        problems.append(f"train.logprob_chunk_size = {t.logprob_chunk_size}: must be >= 1")
    if t.max_tokens_per_microbatch is not None and t.max_tokens_per_microbatch < 1:
        problems.append(f"train.max_tokens_per_microbatch = {t.max_tokens_per_microbatch}: must be >= 1, or unset it (null) for no token cap")
    problems += _check_algorithm_ranges(cfg) + loss_problems(cfg)
    return problems


def _check_algorithm_ranges(cfg: CohortConfig) -> list[str]:
    """KL controller, discounting and critic fields."""
    a, c, problems = cfg.algorithm, cfg.critic, []
    if a.kl_controller == "adaptive" and a.beta == 0:
        problems.append("algorithm.kl_controller = adaptive with algorithm.beta = 0: the controller multiplies beta, so it would stay 0; "
                        "set algorithm.beta to its starting value (e.g. 0.01) or use kl_controller=fixed")
    if a.kl_target <= 0:
        problems.append(f"algorithm.kl_target = {a.kl_target}: must be > 0 (nats per token; 0.1 is verl's default)")
    if a.kl_horizon < 1:
        problems.append(f"algorithm.kl_horizon = {a.kl_horizon}: must be >= 1 (completions; 10000 is verl's default)")
    for key, value in (("algorithm.gamma", a.gamma), ("algorithm.lam", a.lam)):
        if not 0 <= value <= 1:
            problems.append(f"{key} = {value}: must be in [0, 1] (1.0 and 0.95 are the usual values)")
    if c.learning_rate <= 0:
        problems.append(f"critic.learning_rate = {c.learning_rate}: must be > 0")
    if c.warmup_steps < 0 or c.warmup_steps > cfg.train.max_steps:
        problems.append(f"critic.warmup_steps = {c.warmup_steps}: must be between 0 and train.max_steps = {cfg.train.max_steps}")
    if c.cliprange_value <= 0:
        problems.append(f"critic.cliprange_value = {c.cliprange_value}: must be > 0 (0.2 is the usual value)")
    return problems


def check_correction(cfg: CohortConfig) -> list[str]:
    """algorithm.rollout_correction_cap: a cap > 0."""
    if cfg.algorithm.rollout_correction_cap <= 0:
        return [f"algorithm.rollout_correction_cap = {cfg.algorithm.rollout_correction_cap}: must be > 0 (2.0 is TRL's default)"]
    return []


def check_rollout_mode(cfg: CohortConfig) -> list[str]:
    """engine.mode=server needs server URLs, a timeout and the token the servers were started with; local_server needs vLLM."""
    problems = []
    spawned = cfg.distributed.backend == "ray"  # Ray starts the servers (when no URLs are given) and makes a token
    if cfg.engine.mode == "server":
        if not cfg.engine.server_urls and not spawned:
            problems.append("engine.mode = server but engine.server_urls is empty; start `cohort serve MODEL_DIR --port 8400` "
                            "and set engine.server_urls=[http://127.0.0.1:8400]")
        bad = [u for u in cfg.engine.server_urls if not u.startswith(("http://", "https://"))]
        if bad:
            problems.append(f"engine.server_urls = {bad}: each must start with http:// or https:// (e.g. http://127.0.0.1:8400)")
        if not os.environ.get("COHORT_SERVER_TOKEN") and not spawned:
            problems.append("engine.mode = server needs the servers' token in the environment: export COHORT_SERVER_TOKEN=<the token "
                            "`cohort serve` was started with>")
    if cfg.engine.mode == "local_server" and cfg.engine.name != "vllm":
        problems.append(f"engine.mode = local_server runs vLLM in a child process; got engine.name = {cfg.engine.name}: set "
                        "engine.name=vllm, or engine.mode=colocate to generate with transformers in the trainer")
    if cfg.engine.num_threads is not None:
        cores = len(os.sched_getaffinity(0))
        if cfg.engine.num_threads < 1 or cfg.engine.num_threads > cores:
            problems.append(f"engine.num_threads = {cfg.engine.num_threads}: must be between 1 and the {cores} core(s) this process "
                            "may use, or unset it (half of them with pipeline.max_staleness >= 1)")
        elif cfg.engine.mode != "local_server":
            problems.append(f"engine.num_threads = {cfg.engine.num_threads} only applies with engine.mode = local_server (got "
                            f"{cfg.engine.mode}); set engine.mode=local_server or unset engine.num_threads")
    if cfg.engine.server_timeout_s <= 0:
        problems.append(f"engine.server_timeout_s = {cfg.engine.server_timeout_s}: must be > 0 (seconds; 300 is the default)")
    d = cfg.distributed
    if d.num_rollout_servers < 1:
        problems.append(f"distributed.num_rollout_servers = {d.num_rollout_servers}: must be at least 1")
    for key in ("cpus_per_trainer", "gpus_per_trainer", "cpus_per_rollout", "gpus_per_rollout"):
        if getattr(d, key) < 0:
            problems.append(f"distributed.{key} = {getattr(d, key)}: must be >= 0")
    if d.gpus_per_trainer not in (0, 1) and d.gpus_per_trainer > 0:  # a trainer uses one device: the GPU Ray assigns it
        problems.append(f"distributed.gpus_per_trainer = {d.gpus_per_trainer:g}: a trainer actor trains on one whole GPU "
                        "(a share would put two NCCL ranks on one GPU; more than one would sit idle); set it to 1, or 0 "
                        "to train on the CPU")
    if spawned and importlib.util.find_spec("ray") is None:
        problems.append("distributed.backend = ray but Ray is not installed: pip install ray (or use backend none)")
    return problems

def training_world_size(cfg: CohortConfig) -> int:
    """Processes training together: torchrun's WORLD_SIZE when launched by it, else train.num_processes."""
    return training_processes(cfg)


# --------------------------------------------------------------------------- GPUs


def check_gpu_settings(cfg: CohortConfig, device_type: str, visible: int) -> list[str]:
    """engine.sleep_mode, engine.tensor_parallel_size and engine.gpu_memory_utilization against the rollout mode,
    the training device (`device_type`) and the GPUs this process sees (`visible`)."""
    problems = []
    child = cfg.engine.mode == "local_server" or (cfg.engine.mode == "colocate" and cfg.engine.name == "vllm" and training_world_size(cfg) > 1)
    if cfg.engine.gpu_memory_utilization is not None and not 0 < cfg.engine.gpu_memory_utilization <= 1:
        problems.append(f"engine.gpu_memory_utilization = {cfg.engine.gpu_memory_utilization}: must be in (0, 1] (a fraction of "
                        "the GPU's memory), or unset (null) for the planner's value")
    if cfg.engine.sleep_mode:
        why = ("engine.name = hf has no sleep mode; set engine.name=vllm" if cfg.engine.name != "vllm" else
               f"engine.mode = {cfg.engine.mode}: the engine is not in the trainer's process, so it has nothing to release "
               "for the update" if cfg.engine.mode != "colocate" or child else
               "vLLM's sleep mode needs CUDA, and the training device is the CPU" if device_type != "cuda" else
               "the engine generates while the trainer updates (pipeline.max_staleness >= 1 / the streamed "
               "update); turn those off (pipeline.stream_update=off)" if cfg.pipeline.max_staleness
               or stream_update_active(cfg, training_world_size(cfg)) else None)
        if why:
            problems.append(f"engine.sleep_mode = {cfg.engine.sleep_mode}: {why}; or set engine.sleep_mode=0")
    if cfg.engine.tensor_parallel_size < 1:
        problems.append(f"engine.tensor_parallel_size = {cfg.engine.tensor_parallel_size}: must be at least 1")
    elif cfg.engine.tensor_parallel_size > 1:
        if cfg.engine.name != "vllm" or (cfg.engine.mode == "colocate" and not child):
            problems.append(f"engine.tensor_parallel_size = {cfg.engine.tensor_parallel_size} needs vLLM in its own process(es): "
                            "set engine.mode=local_server (its GPUs follow the trainer's) or server")
        elif child and visible and cfg.engine.tensor_parallel_size > visible:
            problems.append(f"engine.tensor_parallel_size = {cfg.engine.tensor_parallel_size}: this process sees {visible} GPU(s); "
                            f"use at most {visible}")
    return problems


def check_colocated_gpu(cfg: CohortConfig, device: torch.device) -> list[str]:
    """vLLM inside the trainer's process runs on that process's first GPU (cuda:0, its worker's local rank); a trainer
    placed on another GPU of the same process would not share a GPU with it as colocate means (and as the planner
    assumes). `device`: the training side's (train.device resolved)."""
    if device.type != "cuda" or not device.index or cfg.engine.name != "vllm" or cfg.engine.mode != "colocate" or training_world_size(cfg) > 1:
        return []
    return [f"train.device = {cfg.train.device} with engine.mode = colocate: vLLM in this process runs on cuda:0, not "
            f"on GPU {device.index}; give the process only that GPU (CUDA_VISIBLE_DEVICES={device.index} and "
            "train.device=auto), or put vLLM in its own process (engine.mode=local_server)"]


def plan_gpu_memory(cfg: CohortConfig, plan: BatchPlan, total_bytes: int | None = None, *,
                    model_dir: Path | None = None) -> GpuMemoryPlan | None:
    """The GPU split for a run whose vLLM sits on a GPU (colocated, or a local server child), None otherwise (CPU,
    transformers engine, remote servers, or a model directory not readable yet). `total_bytes`: the GPU's memory
    (default: the training device's, read from CUDA; `cohort plan --gpu-memory-gib` passes one); `model_dir`: where
    model.path is on disk when the caller has resolved it (`pretrained.inspect_model`)."""
    if cfg.engine.name != "vllm" or cfg.engine.mode == "server":
        return None
    try:
        facts = model_facts(cfg.model.path, cfg.model.revision, directory=model_dir)
    except UnreadableWeights:
        return None
    if facts is None:
        return None
    shared, world = True, training_world_size(cfg)
    if cfg.engine.mode == "local_server" or world > 1:  # vLLM in a child, on the GPUs after the trainer's when there are enough
        visible = visible_gpus() if total_bytes is None else world + cfg.engine.tensor_parallel_size  # (a GPU asked about: enough)
        gpus = engine_gpus(world, cfg.engine.tensor_parallel_size, visible)
        shared = gpus is None or gpus.shared
    if total_bytes is None:
        device = resolve_device(cfg.train.device)
        if device.type != "cuda":
            return None
        total_bytes = torch.cuda.get_device_properties(device).total_memory  # (thin: the one CUDA read)
    return gpu_memory_plan(cfg, plan, facts, total_bytes, shared=shared)


def machine_memory_problems(cfg: CohortConfig, plan: BatchPlan, device: torch.device, *,
                            machine: MachineMemory | None = None, model_dir: Path | None = None) -> list[str]:
    """The estimate against the memory of the machine it runs on, where no GPU split holds the trainer: on the CPU the
    host's (its peak and vLLM's CPU share; `machine`: default `host_memory.machine_memory()`, the one place a test
    fakes it), on a
    GPU of its own the GPU's total (one training process: several hold a shard each, not counted here). Refused with the
    fixes (cohort/plan/machine_fit.py); [] when it fits, the model's size is unknown, or the machine's cannot be read."""
    try:
        facts = model_facts(cfg.model.path, cfg.model.revision, directory=model_dir)
    except UnreadableWeights:  # (reported by the weights check)
        return []
    if facts is None:
        return []
    fit = dict(world_size=training_world_size(cfg), needs_critic=FACTS[cfg.algorithm.name].needs_critic)
    if device.type == "cpu":
        machine = machine or host_memory.machine_memory()
        return [] if machine is None else machine_fit_problems(cfg, plan, facts, machine, host_rows,
                                                               where="this machine's", **fit)
    if device.type != "cuda" or fit["world_size"] > 1:
        return []
    machine = machine or MachineMemory(torch.cuda.get_device_properties(device).total_memory, f"{device}'s total_memory")
    return machine_fit_problems(cfg, plan, facts, machine, trainer_gpu_rows, where="the GPU's", **fit)


def check_processes(cfg: CohortConfig) -> list[str]:
    """What multi-process training (FSDP2) needs today: whole groups per rank; no critic; no mid-run checkpoints; and
    what only it serves (train.param_offload)."""
    world, t = training_world_size(cfg), cfg.train
    if t.num_processes < 1:
        return [f"train.num_processes = {t.num_processes}: must be at least 1"]
    if world == 1:
        return ["train.param_offload = true offloads FSDP shards, and one training process does not shard: set "
                "train.num_processes > 1, or use train.optimizer_offload (which works in one process) or "
                "train.gradient_checkpointing to save GPU memory"] if t.param_offload else []
    problems = []
    if t.prompts_per_step % world:
        lower = t.prompts_per_step // world * world
        fits = [k for k in (lower, lower + world) if k > 0]
        problems.append(f"train.prompts_per_step = {t.prompts_per_step} must divide by the {world} training processes (each takes "
                        f"whole groups); use {' or '.join(map(str, fits))}")
    if FACTS[cfg.algorithm.name].needs_critic:
        problems.append(f"algorithm.name = {cfg.algorithm.name}: the critic is not sharded across processes yet; use "
                        f"train.num_processes=1 with {cfg.algorithm.name}")
    if cfg.run.save_every:
        problems.append(f"run.save_every = {cfg.run.save_every}: checkpoints of a sharded optimizer are not written yet with "
                        f"{world} processes; set run.save_every=0 (the final model is still saved) or train.num_processes=1")
    return problems


def _check_run_section(cfg: CohortConfig) -> list[str]:
    run, t, problems = cfg.run, cfg.train, []
    for key, value in (("run.save_every", run.save_every), ("run.eval_every", run.eval_every),
                       ("run.log_completions_every", run.log_completions_every)):
        if value < 0:
            problems.append(f"{key} = {value}: must be >= 0 (0 turns it off)")
    if run.save_every > t.max_steps:
        problems.append(f"run.save_every = {run.save_every} > train.max_steps = {t.max_steps}: no checkpoint would be written "
                        f"before the run ends; use a value <= {t.max_steps} (e.g. {max(1, t.max_steps // 10)}) or 0")
    if run.keep_checkpoints < 1:
        problems.append(f"run.keep_checkpoints = {run.keep_checkpoints}: must be >= 1, or resuming has nothing to start from; use 2")
    if run.eval_every and own_data(cfg.data) and not cfg.data.eval_files and not cfg.data.dataset_test_split:
        problems.append(f"run.eval_every = {run.eval_every} but there is no eval data (data.train_files or data.dataset_name is set "
                        "and neither data.eval_files nor data.dataset_test_split is); set one of them or run.eval_every=0")
    if run.wandb_project and "wandb" not in run.loggers:
        problems.append(f"run.wandb_project = {run.wandb_project!r} but run.loggers has no wandb: add it (run.loggers=[console,jsonl,"
                        "wandb]) or unset run.wandb_project")
    for name, package in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        if name in run.loggers and importlib.util.find_spec(package) is None:
            problems.append(f"run.loggers includes {name!r} but the {package} package is not installed; `pip install {package}` "
                            f"or remove {name} from run.loggers")
    for key, value in (("train.adam_beta1", t.adam_beta1), ("train.adam_beta2", t.adam_beta2)):
        if not 0 <= value < 1:
            problems.append(f"{key} = {value}: must be in [0, 1) (AdamW divides by 1 − β^step); 0.9 and 0.999 are the defaults")
    if t.weight_decay < 0:
        problems.append(f"train.weight_decay = {t.weight_decay}: must be >= 0 (0.0 turns it off)")
    if t.max_grad_norm < 0:
        problems.append(f"train.max_grad_norm = {t.max_grad_norm}: must be >= 0 (0 turns clipping off; 1.0 is usual)")
    if t.num_threads is not None and t.num_threads < 1:
        problems.append(f"train.num_threads = {t.num_threads}: must be >= 1, or unset it to keep PyTorch's default")
    if cfg.engine.sync_check_tolerance is not None and cfg.engine.sync_check_tolerance <= 0:
        problems.append(f"engine.sync_check_tolerance = {cfg.engine.sync_check_tolerance}: must be > 0 (engines never agree to the last "
                        "bit); unset it (null) for the calibrated check, or use about 1e-3 for float32")
    if cfg.engine.name == "vllm" and cfg.engine.kv_cache_gib <= 0:
        problems.append(f"engine.kv_cache_gib = {cfg.engine.kv_cache_gib}: must be > 0 (GiB of KV cache for vLLM on CPU); 1.0 is the default")
    if cfg.data.eval_max_samples is not None and cfg.data.eval_max_samples < 1:
        problems.append(f"data.eval_max_samples = {cfg.data.eval_max_samples}: must be >= 1, or None for all eval rows")
    return problems


# --------------------------------------------------------------------------- the outside world


def _check_outside(cfg: CohortConfig, model: pretrained.ModelFiles, environment: RunEnvironment, *,
                   read_data: bool = True) -> tuple[list[str], MeasuredPrompts | None, RunInputs | None]:
    """The output directory, the weights' headers, the tokenizer, the prompts against the model's positions, the vLLM
    CPU KV cache; returns the problems, the prompts' measure and what was read (for the run: `RunPlan.read`).

    The prompts are read and tokenized with the model's tokenizer (no weights), so the fit check uses the longest prompt
    actually kept; a `tiny:*` model is only checked against its recipe's positions (its tokenizer is built with the model).
    """
    problems, model_dir = _check_output_dir(cfg.run.output_dir), model.directory
    try:
        facts = model_facts(cfg.model.path, cfg.model.revision, directory=model_dir)
    except UnreadableWeights as exc:
        return problems + [f"model.path = {cfg.model.path!r}: {exc}; re-save or re-download the checkpoint"], None, None
    tokenizer, found = (checked_tokenizer(cfg.model.path, folder=model_dir, chat_template=cfg.model.chat_template,
                                          chat_template_kwargs=cfg.model.chat_template_kwargs)
                        if model_dir is not None else (None, []))
    if not tokenizer_file_problems(cfg.model.path, folder=model_dir):  # (missing files: reported with the model's checks)
        problems += found  # it loads, and text encodes to tokens
    measured, read = (_read_prompts(cfg, model, tokenizer, environment) if tokenizer is not None and read_data
                      else (None, None))
    problems += measured.problems if measured else fit_problems(cfg, max_positions_of(model_dir or cfg.model.path))
    if facts is not None and not (measured and measured.problems):
        problems += _check_kv_cache(cfg, facts, measured)
    return problems, measured, read


def _check_output_dir(output_dir: str | None) -> list[str]:
    if output_dir is None:
        return []
    path = Path(output_dir).expanduser()
    if path.exists() and not path.is_dir():
        return [f"run.output_dir = {output_dir!r} is a file, not a directory; choose another run.output_dir"]
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return [f"run.output_dir = {output_dir!r}: {str(ancestor)!r} is a file, so the directory cannot be created; "
                "choose another run.output_dir"]
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return [f"run.output_dir = {output_dir!r}: {str(ancestor)!r} is not writable; choose another run.output_dir"]
    return []


def _read_prompts(cfg: CohortConfig, model: pretrained.ModelFiles, tokenizer,
                  environment: RunEnvironment) -> tuple[MeasuredPrompts | None, RunInputs | None]:
    """Read the data (an agent.environment's tasks loaded once, kept in `environment`) and encode every prompt with
    the model's tokenizer as the trainer will; returns their measure and what was read (None for both when the
    tokenizer encodes nothing: a directory without tokenizer files)."""
    try:
        train, evals, task_specs = run_data(cfg, environment)
        encoded = encode_prompts(cfg, tokenizer, model.directory, train, evals, environment.tools)
    except DataError as exc:
        return MeasuredPrompts(None, "", 0, [str(exc)]), None
    except ConfigError as exc:
        return MeasuredPrompts(None, "", 0, exc.problems), None
    except Exception as exc:  # noqa: BLE001 - a user's module or a loader raising: one line, the traceback in the log
        return MeasuredPrompts(None, "", 0, [_reading_failed(cfg, exc)]), None
    longest, where = encoded.longest()
    if longest == 0:  # a directory without tokenizer files: transformers builds an empty tokenizer; measure nothing
        return None, None
    # a Hub id's snapshot holds its config and tokenizer, not (yet) its weights: the run fetches them (RunInputs)
    return (MeasuredPrompts(longest, where, encoded.filtered, []),
            RunInputs(model.directory if model.holds_weights else None, tokenizer, encoded, task_specs))


def _reading_failed(cfg: CohortConfig, error: Exception) -> str:
    """The one line for an error raised while the data was read (an environment's module that fails on import, a task's
    own loader): which field's data, the error as raised, and where its traceback went (RUN_DIR/logs/error.log, the
    only file validation writes)."""
    source = (f"agent.environment = {cfg.agent.environment!r}: loading its tasks" if cfg.agent.environment is not None
              else f"data.dataset_name = {cfg.data.dataset_name!r}: loading it" if cfg.data.dataset_name
              else "data.train_files: reading them" if cfg.data.train_files
              else f"data.task = {cfg.data.task!r}: building its rows")
    log = write_error_log(Path(cfg.run.output_dir or default_output_dir()), error)
    return f"{source} raised {' '.join(describe(error).splitlines())} (the traceback: {log})"


def _check_kv_cache(cfg: CohortConfig, facts: ModelFacts, measured: MeasuredPrompts | None) -> list[str]:
    """vLLM on CPU: the KV cache must hold one whole sequence (the longest prompt kept + the completion)."""
    if cfg.engine.name != "vllm" or cfg.engine.mode not in ("colocate", "local_server") or torch.cuda.is_available():
        return []
    prompt = measured.longest if measured and measured.longest is not None else cfg.data.max_prompt_length
    if prompt is None:
        return []
    longest = prompt + cfg.rollout.max_completion_length
    per_token = kv_bytes_per_token(cfg, facts)
    gib = max(1, int(round(cfg.engine.kv_cache_gib)))  # what VLLMEngine hands vLLM (whole GiB)
    if per_token * longest <= gib * 2**30:
        return []
    return [f"engine.kv_cache_gib = {cfg.engine.kv_cache_gib} ({gib} GiB) cannot hold one sequence of {longest} tokens "
            f"({per_token * longest / 2**30:.2f} GiB at {per_token:,} bytes per token); raise engine.kv_cache_gib to at least "
            f"{-(-per_token * longest // 2**30)} or shorten data.max_prompt_length / rollout.max_completion_length"]
