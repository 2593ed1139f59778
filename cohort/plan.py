"""`cohort plan`: the schedule, token bound and memory estimate of a config, before anything loads.

Two jobs:
- `plan_problems(cfg)`: the checks `validate_config` adds for runs (outputs,
  checkpoints, loggers, and what the model's own config.json forbids: the longest
  prompt kept + the completion longer than its positions, a vLLM KV cache too
  small for one sequence). Each names its fields and a fix. `cohort train` runs
  them too, before loading. The prompts are measured as the trainer will keep
  them (`measure_prompts`: the data and the model's tokenizer, no weights).
- `format_plan(cfg, plan)`: the printed schedule: prompts and completions per
  generation batch and per optimizer step, micro-batches and accumulation,
  optimizer steps per generation (the off-policy lag), an upper bound on tokens
  per step, and a rough memory estimate of the training process.

The model's weights are never loaded: the architecture comes from `config.json` and the
parameter count from the safetensors headers (a few KB read). The memory figure
is an estimate for planning (weights + gradients + AdamW's two moments in the
weights' dtype — float32 under train.precision=mixed —, an optional reference model, activations of one micro-batch of
the longest sequences, one log-prob chunk of logits); the allocator, CUDA
context and fragmentation come on top.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from cohort.config import BatchPlan, CohortConfig, ConfigError
from cohort.data.datasets import DataError
from cohort.data.loading import load_data
from cohort.models import loading
from cohort.prompts import encode_prompts, fit_problems, max_positions_of

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MAX_CHUNK_LOGITS = 2**24  # cohort.models.logprobs.completion_logprobs: logits per LM-head chunk at most
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class ModelFacts:
    """What the planner needs from a checkpoint directory, read without loading weights."""

    num_params: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int | None


def model_facts(path: str) -> ModelFacts | None:
    """From `config.json` and the safetensors headers; None when `path` is not a checkpoint directory.

    Raises `UnreadableWeights` when a weights file's header is broken (caught early: loading would fail later).
    """
    directory = Path(path).expanduser()
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config)  # multimodal wrappers keep the LM's numbers inside
    hidden = int(config.get("hidden_size", 0))
    heads = int(config.get("num_attention_heads", 0)) or 1
    num_params = sum(_safetensors_numel(f) for f in sorted(directory.glob("*.safetensors")))
    if not hidden or not num_params:
        return None
    return ModelFacts(
        num_params=num_params, hidden_size=hidden, intermediate_size=int(config.get("intermediate_size", 4 * hidden)),
        num_layers=int(config.get("num_hidden_layers", 0)), num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads", heads)), head_dim=int(config.get("head_dim") or hidden // heads),
        vocab_size=int(config.get("vocab_size", 0)), max_positions=config.get("max_position_embeddings"),
    )


class UnreadableWeights(ValueError):
    """A weights file whose safetensors header cannot be read: the checkpoint is truncated or corrupt."""


def _safetensors_numel(path: Path) -> int:
    """Element count of every tensor in a safetensors file, from its JSON header only."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        raw = fh.read(8)
        length = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if not 0 < length <= size - 8:
            raise UnreadableWeights(f"{path.name} has no valid safetensors header (truncated or not a safetensors file)")
        try:
            header = json.loads(fh.read(length))
        except (ValueError, UnicodeDecodeError) as exc:
            raise UnreadableWeights(f"{path.name} has a corrupt safetensors header ({exc})") from None
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in info["shape"]:
            count *= dim
        total += count
    return total


# --------------------------------------------------------------------------- checks


def plan_problems(cfg: CohortConfig, *, check_files: bool = True) -> list[str]:
    """Run, checkpoint and logger settings that cannot work, and what the model's config forbids.

    With check_files, the prompts are read and tokenized with the model's tokenizer (no weights), so the fit check
    uses the longest prompt actually kept; a `tiny:*` model is only checked against its positions (its tokenizer is
    built with the model).
    """
    problems = _check_run_section(cfg)
    if check_files:
        problems += _check_output_dir(cfg.run.output_dir)
        try:
            facts = model_facts(cfg.model.path)
        except UnreadableWeights as exc:
            return problems + [f"model.path = {cfg.model.path!r}: {exc}; re-save or re-download the checkpoint"]
        measured = measure_prompts(cfg)
        problems += measured.problems if measured else fit_problems(cfg, max_positions_of(cfg.model.path))
        if facts is not None and not (measured and measured.problems):
            problems += _check_kv_cache(cfg, facts, measured)
    return problems


@dataclass(frozen=True)
class MeasuredPrompts:
    """The prompts of a run as the trainer will keep them, measured without loading weights."""

    longest: int | None  # tokens of the longest prompt kept (None when a problem stopped the measurement)
    where: str  # its row
    filtered: int  # train prompts longer than the limit, dropped by data.overlong_prompts = filter
    problems: list[str]


_MEASURED: dict[tuple, MeasuredPrompts] = {}  # the last measurement: `cohort train` validates twice (CLI, then Trainer)


def measure_prompts(cfg: CohortConfig) -> MeasuredPrompts | None:
    """Read the data and the model's tokenizer and encode every prompt as the trainer will; None for a `tiny:*` model
    or a model directory whose tokenizer cannot be read (loading reports that later)."""
    if cfg.model.path.startswith("tiny:") or not (Path(cfg.model.path).expanduser() / "config.json").is_file():
        return None
    files = [Path(f) for f in cfg.data.train_files + cfg.data.eval_files]
    stamps = tuple((str(f), f.stat().st_mtime_ns if f.exists() else None) for f in files)
    key = (cfg.model.path, cfg.data.model_dump_json(), cfg.rollout.max_completion_length, cfg.train.seed, stamps)
    if key not in _MEASURED:
        _MEASURED.clear()
        _MEASURED[key] = _measure(cfg)
    return _MEASURED[key]


def _measure(cfg: CohortConfig) -> MeasuredPrompts | None:
    try:
        tokenizer = loading.load_tokenizer(Path(cfg.model.path).expanduser())
    except loading.ModelLoadError:
        return None
    try:
        train, evals, _ = load_data(cfg)
        encoded = encode_prompts(cfg, tokenizer, cfg.model.path, train, evals)
    except DataError as exc:
        return MeasuredPrompts(None, "", 0, [str(exc)])
    except ConfigError as exc:
        return MeasuredPrompts(None, "", 0, exc.problems)
    longest, where = encoded.longest()
    if longest == 0:  # a directory without tokenizer files: transformers builds an empty tokenizer; measure nothing
        return None
    return MeasuredPrompts(longest, where, encoded.filtered, [])


def with_measured_prompts(cfg: CohortConfig, plan: BatchPlan) -> BatchPlan:
    """The plan with its token bound taken from the longest prompt kept, when the prompts could be measured."""
    measured = measure_prompts(cfg)
    if measured is None or measured.longest is None:
        if cfg.data.max_prompt_length is None:
            return dataclasses.replace(plan, prompt_tokens_from="not measured (a tiny:* model's tokenizer is built with the model)")
        return plan
    return dataclasses.replace(plan, max_tokens_per_sequence=measured.longest + cfg.rollout.max_completion_length,
                               prompt_tokens_from=f"the longest prompt kept, {measured.where}")


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
    if run.eval_every and cfg.data.train_files and not cfg.data.eval_files:
        problems.append(f"run.eval_every = {run.eval_every} but there is no eval data (data.train_files is set and data.eval_files "
                        "is empty); set data.eval_files or run.eval_every=0")
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
    r = cfg.rollout
    if r.sync_check_tolerance is not None and r.sync_check_tolerance <= 0:
        problems.append(f"rollout.sync_check_tolerance = {r.sync_check_tolerance}: must be > 0 (engines never agree to the last "
                        "bit); unset it (null) for the calibrated check, or use about 1e-3 for float32")
    if r.engine == "vllm" and r.kv_cache_gib <= 0:
        problems.append(f"rollout.kv_cache_gib = {r.kv_cache_gib}: must be > 0 (GiB of KV cache for vLLM on CPU); 1.0 is the default")
    if r.engine == "vllm" and not 0 < r.gpu_memory_utilization <= 1:
        problems.append(f"rollout.gpu_memory_utilization = {r.gpu_memory_utilization}: must be in (0, 1] (a fraction of GPU memory)")
    if cfg.data.eval_max_samples is not None and cfg.data.eval_max_samples < 1:
        problems.append(f"data.eval_max_samples = {cfg.data.eval_max_samples}: must be >= 1, or None for all eval rows")
    return problems


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


def _check_kv_cache(cfg: CohortConfig, facts: ModelFacts, measured: MeasuredPrompts | None) -> list[str]:
    """vLLM on CPU: the KV cache must hold one whole sequence (the longest prompt kept + the completion)."""
    if cfg.rollout.engine != "vllm" or cfg.rollout.mode not in ("colocate", "local_server") or _cuda_available():
        return []
    prompt = measured.longest if measured and measured.longest is not None else cfg.data.max_prompt_length
    if prompt is None:
        return []
    longest = prompt + cfg.rollout.max_completion_length
    per_token = kv_bytes_per_token(cfg, facts)
    gib = max(1, int(round(cfg.rollout.kv_cache_gib)))  # what VLLMEngine hands vLLM (whole GiB)
    if per_token * longest <= gib * 2**30:
        return []
    return [f"rollout.kv_cache_gib = {cfg.rollout.kv_cache_gib} ({gib} GiB) cannot hold one sequence of {longest} tokens "
            f"({per_token * longest / 2**30:.2f} GiB at {per_token:,} bytes per token); raise rollout.kv_cache_gib to at least "
            f"{-(-per_token * longest // 2**30)} or shorten data.max_prompt_length / rollout.max_completion_length"]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def kv_bytes_per_token(cfg: CohortConfig, facts: ModelFacts) -> int:
    """Keys and values of every layer for one token, in the generation dtype."""
    return 2 * facts.num_layers * facts.num_kv_heads * facts.head_dim * BYTES[cfg.generation_dtype]


# --------------------------------------------------------------------------- the printout


def memory_estimate(cfg: CohortConfig, plan: BatchPlan, facts: ModelFacts) -> list[tuple[str, int, str]]:
    """(item, bytes, how it was counted) for the training process."""
    b = BYTES[cfg.model.dtype]  # the compute dtype: activations
    mixed = cfg.train.precision == "mixed" and b < 4
    w = 4 if mixed else b  # the trained weights, their gradients and AdamW moments: float32 master copies when mixed
    how_w = f"float32 master weights (train.precision = mixed, computing in {cfg.model.dtype})" if mixed else cfg.model.dtype
    p = facts.num_params
    # unmeasured prompts (data not read): bound the sequence by the model's positions
    tokens = plan.micro_batch_size * (plan.max_tokens_per_sequence or facts.max_positions or 0)
    per_layer = 8 * facts.hidden_size + 4 * facts.intermediate_size  # values kept per token per layer for the backward
    if cfg.train.gradient_checkpointing:
        activations = tokens * b * (facts.num_layers * facts.hidden_size + per_layer)
        act_how = f"{tokens:,} tokens × ({facts.num_layers} layer inputs + one layer recomputed) (gradient checkpointing)"
    else:
        activations = tokens * b * facts.num_layers * per_layer
        act_how = f"{tokens:,} tokens (micro-batch × longest sequence) × {facts.num_layers} layers × (8·hidden + 4·intermediate)"
    chunk = min(cfg.train.logprob_chunk_size, max(1, MAX_CHUNK_LOGITS // max(1, facts.vocab_size)))  # rows per LM-head chunk
    rows = [
        ("weights", p * w, f"{p:,} parameters × {w} B ({how_w})"),
        ("gradients", p * w, "same size as the weights"),
        ("AdamW moments", 2 * p * w, "two per parameter, in the weights' dtype"),
        ("activations", activations, act_how),
        ("log-prob chunk", chunk * facts.vocab_size * 4 * 2, f"two ({chunk} tokens × vocab {facts.vocab_size:,}) fp32 buffers (cohort.models.logprobs)"),
    ]
    if mixed:
        rows.append(("autocast weight copies", p * b, f"each weight cast to {cfg.model.dtype} once per forward pass"))
    if cfg.algorithm.beta:
        rows.append(("reference model", p * w, f"a frozen copy (algorithm.beta = {cfg.algorithm.beta:g})"))
    from cohort.algorithms.specs import ALGORITHMS

    if ALGORITHMS.get(cfg.algorithm.name).needs_critic:
        rows.append(("critic", 4 * p * w, f"{cfg.algorithm.name}: weights, gradients and moments of a policy-sized critic"))
    return rows


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def _tokens_per_step_line(cfg: CohortConfig, plan: BatchPlan) -> str:
    completion = cfg.rollout.max_completion_length
    if plan.max_tokens_per_sequence is None:
        return (f"  tokens per step       not bounded here: data.max_prompt_length is None and the prompts were "
                f"{plan.prompt_tokens_from}; each sequence is at most the model's positions")
    prompt = plan.max_tokens_per_sequence - completion
    bound = (f"max_prompt_length {prompt}" if plan.prompt_tokens_from == "data.max_prompt_length"
             else f"longest prompt {prompt}")
    line = (f"  tokens per step       ≤ {plan.completions_per_step * plan.max_tokens_per_sequence:,} "
            f"({plan.completions_per_step} × ({bound} + max_completion_length {completion}))")
    return line if plan.prompt_tokens_from == "data.max_prompt_length" else f"{line}; {plan.prompt_tokens_from}"


def format_plan(cfg: CohortConfig, plan: BatchPlan) -> str:
    accumulation = plan.micro_batches_per_step
    lag = plan.optimizer_steps_per_generation - 1
    lines = [
        "batch plan",
        f"  generation batch      {plan.prompts_per_generation} prompts × G={plan.num_generations} = {plan.generation_batch_size} completions",
        f"  optimizer step        {plan.prompts_per_step} prompts × G={plan.num_generations} = {plan.completions_per_step} completions",
        f"  micro-batches         {accumulation} of ≤{plan.micro_batch_size} completions (gradient accumulation over {accumulation})",
        f"  steps per generation  {plan.steps_per_generation} slices × {plan.num_iterations} iterations = {plan.optimizer_steps_per_generation}"
        + (" (off-policy: old log-probs computed once per generation batch)" if plan.off_policy else " (on-policy: no old-log-prob pass)"),
        f"  off-policy lag        {lag} optimizer step(s): the last update of a generation batch uses completions sampled "
        f"{lag} policy version(s) earlier" if lag else "  off-policy lag        0: every update uses completions of the current policy",
        f"  generation batches    {plan.num_generation_batches} for {plan.max_steps} steps",
        _tokens_per_step_line(cfg, plan),
        f"  tokens generated      ≤ {plan.generation_batch_size * cfg.rollout.max_completion_length:,} per generation batch",
        f"  reference model       {'yes (beta = %g)' % cfg.algorithm.beta if cfg.algorithm.beta else 'none (beta = 0)'}",
        f"  rollout engine        {cfg.rollout.engine}",
        f"  checkpoints           {'every %d steps, newest %d kept' % (cfg.run.save_every, cfg.run.keep_checkpoints) if cfg.run.save_every else 'only on a stop (run.save_every = 0)'}",
    ]
    try:
        facts = model_facts(cfg.model.path)
    except UnreadableWeights:
        facts = None
    if facts is None:
        lines.append("memory                not estimated (model.path is not a checkpoint directory with config.json and safetensors yet)")
        return "\n".join(lines)
    rows = memory_estimate(cfg, plan, facts)
    lines.append(f"memory of the training process (rough estimate; {facts.num_params:,} parameters)")
    lines += [f"  {name:<20}  {_human(size):>10}   {how}" for name, size, how in rows]
    lines.append(f"  {'total':<20}  {_human(sum(size for _, size, _ in rows)):>10}")
    if cfg.rollout.engine == "vllm":
        per_token = kv_bytes_per_token(cfg, facts)
        lines.append(f"  rollout engine (vLLM) on top: its weights and KV cache (rollout.kv_cache_gib on CPU, "
                     f"rollout.gpu_memory_utilization on GPU); KV {_human(per_token)} per token")
    lines.append("  the loss value is not progress: docs/algorithms.md#what-the-loss-value-means")
    return "\n".join(lines)
