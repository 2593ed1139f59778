"""The memory a run needs, read from the config and the checkpoint's headers, never its weights.

- `model_facts(path)`: what the planner needs from a checkpoint directory (the architecture from `config.json`,
  the parameter count from the safetensors headers, a few KB read).
- `memory_estimate(cfg, plan, facts)`: a rough estimate of the training process at the peak of its update
  (weights + gradients + AdamW's two moments in the weights' dtype — float32 under train.precision=mixed —, an
  optional reference model or distillation teacher, activations of one micro-batch of the longest sequences, one
  log-prob chunk of logits; with LoRA the frozen base in model.dtype and the adapter's float32 weights, gradients
  and moments). Activations per token and layer are counted from what autograd keeps in a Qwen2-like decoder
  layer (`activation_bytes_per_token_layer`).
- `gpu_memory_plan(cfg, plan, facts, total_bytes)`: one GPU split between the trainer's peak (the estimate above)
  and vLLM's share (its weights, the KV cache of one generation batch's sequences, a fixed working memory), the
  `engine.gpu_memory_utilization` derived from it when unset (colocated: vLLM's share + 10% over the GPU's memory,
  rounded up to 0.01; vLLM alone on its GPU: 0.9), and whether it fits (`gpu_fit_problems`), with
  engine.sleep_mode releasing vLLM's memory during the update. Pure: `cohort.plan.validate` reads the GPU's size
  from CUDA and refuses what cannot fit.

Left out: on a GPU the CUDA context is a fixed allowance (CUDA_CONTEXT_BYTES), not a measurement; on the CPU the
free heap that glibc keeps resident between chunks that live on, which the trainer gives back by default
(train.release_host_memory, cohort/models/host_memory.py; docs/runs.md, "Memory on the CPU").
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from cohort.algorithm_facts import FACTS
from cohort.config import CohortConfig
from cohort.models.hub import hub_parameter_count
from cohort.plan.batch import BatchPlan

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MAX_CHUNK_LOGITS = 2**24  # cohort.models.logprobs.completion_logprobs: logits per LM-head chunk at most


# --------------------------------------------------------------------------- the model, without its weights


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


def model_facts(path: str | Path, revision: str | None = None, *, directory: Path | None = None) -> ModelFacts | None:
    """From `config.json` and the safetensors headers; None when `path` is not a checkpoint. A Hub id is read from its
    snapshot in the Hugging Face cache (config fetched when missing, never the weights); its parameters are counted
    from the cached weights' headers, or from the Hub's (remote headers only) while they are not downloaded yet.

    `directory`: where a path that is no directory is on disk, when the caller has resolved it (`inspect_model`).
    Raises `UnreadableWeights` when a weights file's header is broken (caught early: loading would fail later).
    """
    if Path(path).expanduser().is_dir():
        directory = Path(path).expanduser()
    elif directory is None:  # a Hub id or a GGUF file; imported here: cohort.models.pretrained brings torch, which the plan itself never needs
        from cohort.models.pretrained import config_dir

        directory = config_dir(str(path), revision)
    if directory is None:
        return None
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config)  # multimodal wrappers keep the LM's numbers inside
    hidden = int(config.get("hidden_size", 0))
    heads = int(config.get("num_attention_heads", 0)) or 1
    num_params = sum(_safetensors_numel(f) for f in sorted(directory.glob("*.safetensors")))
    if not num_params and not Path(path).expanduser().is_dir():
        num_params = hub_parameter_count(str(path), revision) or 0
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


def kv_bytes_per_token(cfg: CohortConfig, facts: ModelFacts) -> int:
    """Keys and values of every layer for one token, in the generation dtype."""
    return 2 * facts.num_layers * facts.num_kv_heads * facts.head_dim * BYTES[cfg.generation_dtype]


# --------------------------------------------------------------------------- the training process


def activation_bytes_per_token_layer(facts: ModelFacts, compute_bytes: int, mixed: bool) -> int:
    """Bytes autograd keeps for the backward per token and decoder layer of a Qwen2-like (Llama-like) model.

    Counted from what autograd saves in transformers' Qwen2DecoderLayer (Korthikanti et al. 2022, §4.1); equal to
    `saved_tensors_hooks` at Qwen2.5-0.5B's widths (tests/test_plan.py):
    - each of the two RMSNorms: its float32 input (4·h: the residual stream, or an upcast copy) and 1/rms (4);
      under autocast (`mixed`) the normalised value in float32 (4·h), and every linear after it keeps its own
      bf16 cast of it (3 for q, k, v and 2 for gate, up: 5·b·h); without autocast the normalised value and the
      norm's output in the compute dtype (2·b·h), shared by the linears;
    - attention: q (b·h), k and v repeated to every head (2·b·h: on CUDA transformers repeats grouped keys/values
      whenever a mask is passed, `use_gqa_in_sdpa`, and a padded batch has one), the output (b·h), the kernel's
      float32 log-sum-exp (4 per head); no T×T scores;
    - SwiGLU: gate, SiLU(gate), up and their product (4·b·intermediate).
    Mixed: 16·h + 8 + 9·b·h + 4·heads + 4·b·i (Qwen2.5-0.5B: 69,440 B; b·(8h + 4i) + 8h before said 60,416);
    otherwise 8·h + 8 + 8·b·h + 4·heads + 4·b·i. The (B, 1, T, T) mask is counted once by `_activation_row`.
    """
    h, i, b = facts.hidden_size, facts.intermediate_size, compute_bytes
    norms = 16 * h + 8 + 5 * b * h if mixed else 8 * h + 8 + 4 * b * h
    return norms + 4 * b * h + 4 * facts.num_heads + 4 * b * i


def _activation_row(cfg: CohortConfig, plan: BatchPlan, facts: ModelFacts, b: int) -> tuple[str, int, str]:
    """Activations of the largest micro-batch: every layer's (above), or with gradient checkpointing each layer's
    input (the residual stream: float32 under mixed precision) plus one layer recomputed in the backward."""
    sequence = plan.max_tokens_per_sequence or facts.max_positions or 0  # unmeasured prompts: the model's positions
    tokens = plan.micro_batch_size * sequence
    if cfg.train.max_tokens_per_microbatch is not None:
        tokens = min(tokens, max(cfg.train.max_tokens_per_microbatch, sequence))  # (one sequence always fits)
    mixed = cfg.train.precision == "mixed" and b < 4
    per_layer = activation_bytes_per_token_layer(facts, b, mixed)
    mask = tokens * sequence * b  # the (B, 1, T, T) mask in the compute dtype, kept once for every layer
    if cfg.train.gradient_checkpointing:
        residual = 4 if mixed else b  # autocast keeps the residual stream in float32
        return ("activations", tokens * (facts.num_layers * facts.hidden_size * residual + per_layer) + mask,
                f"{tokens:,} tokens × ({facts.num_layers} layer inputs × hidden × {residual} B + one layer recomputed, "
                f"{per_layer:,} B) + the attention mask (gradient checkpointing)")
    return ("activations", tokens * facts.num_layers * per_layer + mask,
            f"{tokens:,} tokens (micro-batch × longest sequence) × {facts.num_layers} layers × {per_layer:,} B "
            f"(activation_bytes_per_token_layer) + the attention mask, tokens × sequence × {b} B")


def memory_estimate(cfg: CohortConfig, plan: BatchPlan, facts: ModelFacts) -> list[tuple[str, int, str]]:
    """(item, bytes, how it was counted) for the training process at the peak of its update."""
    b = BYTES[cfg.model.dtype]  # the compute dtype: activations
    mixed = cfg.train.precision == "mixed" and b < 4
    w = 4 if mixed else b  # the trained weights, their gradients and AdamW moments: float32 master copies when mixed
    how_w = f"float32 master weights (train.precision = mixed, computing in {cfg.model.dtype})" if mixed else cfg.model.dtype
    p = facts.num_params
    chunk = min(cfg.train.logprob_chunk_size, max(1, MAX_CHUNK_LOGITS // max(1, facts.vocab_size)))  # rows per LM-head chunk
    trained, what = p, "the weights"
    weights = ("weights", p * w, f"{p:,} parameters × {w} B ({how_w})")
    if cfg.lora.rank:  # LoRA: gradients and moments of the adapter only, no reference copy (cohort/models/lora.py)
        from cohort.models.lora import adapter_parameters_bound

        trained = adapter_parameters_bound(facts.hidden_size, facts.intermediate_size, facts.num_layers, cfg.lora.rank)
        what = f"the LoRA adapter's ≤ {trained:,} parameters (rank {cfg.lora.rank}, every linear layer)"
        w = 4  # peft keeps the adapter in float32 over any base; the frozen base stays in model.dtype, even when mixed
        weights = ("weights", p * b + trained * w, f"{p:,} frozen base parameters × {b} B ({cfg.model.dtype}) + {what} × 4 B")
    rows = [
        weights,
        ("gradients", trained * w, "same size as " + what),
        ("AdamW moments", 2 * trained * w, f"two per parameter of {what}, in the weights' dtype"),
        _activation_row(cfg, plan, facts, b),
        ("log-prob chunk", chunk * facts.vocab_size * 4 * 2, f"two ({chunk} tokens × vocab {facts.vocab_size:,}) fp32 buffers (cohort.models.logprobs)"),
    ]
    if not cfg.lora.rank:  # LinearLogProb's backward: a chunk's whole head gradient before it joins .grad (LoRA: frozen)
        rows.append(("LM head gradient", facts.vocab_size * facts.hidden_size * w,
                     f"vocab {facts.vocab_size:,} × hidden {facts.hidden_size:,} × {w} B: one chunk's head gradient "
                     "before it is added into .grad"))
    if mixed and not cfg.lora.rank:  # (LoRA: the base is already in model.dtype; the adapter's copies are small)
        rows.append(("autocast weight copies", p * b, f"each weight cast to {cfg.model.dtype} once per forward pass"))
    if cfg.algorithm.beta and not cfg.lora.rank:  # (LoRA: the reference is the adapter disabled)
        rows.append(("reference model", p * w, f"a frozen copy (algorithm.beta = {cfg.algorithm.beta:g})"))
    if FACTS[cfg.algorithm.name].needs_critic:
        rows.append(("critic", 4 * p * w, f"{cfg.algorithm.name}: weights, gradients and moments of a policy-sized critic"))
    teacher = model_facts(cfg.teacher.path) if cfg.algorithm.name == "distill" and cfg.teacher.path else None
    if teacher is not None:  # frozen, its own dtype, scored before the update: only its weights sit beside the peak
        rows.append(("teacher model", teacher.num_params * BYTES[cfg.teacher_dtype], f"{teacher.num_params:,} parameters × "
                     f"{BYTES[cfg.teacher_dtype]} B ({cfg.teacher_dtype}, teacher.dtype), frozen"))
    return rows


# --------------------------------------------------------------------------- one GPU: the trainer and vLLM


GIB = 2**30
CUDA_CONTEXT_BYTES = 512 * 2**20  # per process: the CUDA context, cuBLAS workspaces, allocator slack (outside torch's count)
VLLM_WORKING_BYTES = 1 * GIB  # vLLM's memory besides weights, KV cache and the sampler's warm-up (its profile run's
# activations over max_num_batched_tokens, buffers), eager (engine.enforce_eager)
# vLLM's start-up sampler pass (`_dummy_sampler_run`) sorts max_num_seqs × vocab logits for top-k/top-p: float32 logits,
# the sort's float32 values and int64 indices = 16 B a logit (1,024 × 151,936: 2.32 GiB; issue 38 read 2.3-2.6 GiB)
VLLM_SAMPLER_BYTES_PER_LOGIT = 16
ENGINE_BATCHED_TOKENS = 8192  # max_num_batched_tokens on CUDA, at least max_model_len (vLLM's default below 70 GiB)
VLLM_CUDA_GRAPH_BYTES = 1 * GIB  # on top when CUDA graphs are captured (engine.enforce_eager unset, on a GPU, or false)
VLLM_BLOCK_TOKENS = 16  # vLLM's KV cache block on CUDA: a sequence takes whole blocks
VLLM_SHARE_MARGIN = 0.10  # the derived gpu_memory_utilization covers vLLM's share + 10%, rounded up to 0.01
OWN_GPU_UTILIZATION = 0.9  # vLLM's own default, for an engine alone on its GPU


@dataclass(frozen=True)
class GpuMemoryPlan:
    """One GPU's memory: the trainer's peak (its update) and vLLM's share, with the fraction vLLM is given.

    `utilization` × `total` is what vLLM takes once started (it sizes its KV cache to fill it). Without sleep mode
    that sits beside the trainer's peak; with engine.sleep_mode vLLM releases it during the update, so the two
    phases are the update (the trainer's peak alone) and generation (the trainer's resident state + vLLM)."""

    total: int  # the GPU's memory, bytes
    trainer: list[tuple[str, int, str]]  # the trainer's peak (`memory_estimate`); [] when vLLM is alone on the GPU
    trainer_resident: int  # what the trainer holds while vLLM is awake: weights, gradients, AdamW moments, reference, critic
    engine: list[tuple[str, int, str]]  # vLLM's share (`engine_share`)
    engine_minimum: int  # vLLM's weights + working memory + warm-up + one sequence's KV: less and vLLM refuses to start
    utilization: float  # engine.gpu_memory_utilization: the user's, or derived from `engine`
    derived: bool  # True when `utilization` was derived (the user left it unset)
    shared: bool  # the trainer and vLLM on this GPU (colocate); False: vLLM alone on its GPU(s)
    sleep_mode: int

    @property
    def trainer_peak(self) -> int:
        return sum(size for _, size, _ in self.trainer)

    @property
    def engine_need(self) -> int:
        return sum(size for _, size, _ in self.engine)

    @property
    def engine_bytes(self) -> int:
        """What vLLM takes once started: utilization × total (its KV cache fills whatever its weights leave)."""
        return math.ceil(self.utilization * self.total)

    @property
    def needed(self) -> int:
        """The busier phase's bytes, the CUDA context included."""
        if not self.shared:
            return CUDA_CONTEXT_BYTES + self.engine_bytes
        if self.sleep_mode:  # vLLM asleep during the update; awake (the trainer's resident state beside it) to generate
            return CUDA_CONTEXT_BYTES + max(self.trainer_peak, self.trainer_resident + self.engine_bytes)
        return CUDA_CONTEXT_BYTES + self.trainer_peak + self.engine_bytes

    @property
    def fits(self) -> bool:
        return self.needed <= self.total and self.engine_bytes >= self.engine_minimum


def engine_batch_limits(plan: BatchPlan, max_model_len: int) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) for vLLM on CUDA, as TRL passes them: one generation batch's sequences
    (over-provisioned ones included), one step's tokens. vLLM's own default on an H100/H200 is 1,024 sequences."""
    sequences = max(1, math.ceil(plan.generation_batch_size * plan.admission.over_provision))
    return sequences, max(max_model_len, ENGINE_BATCHED_TOKENS)


def engine_share(cfg: CohortConfig, plan: BatchPlan, facts: ModelFacts) -> list[tuple[str, int, str]]:
    """vLLM's memory on each of its GPUs: weights in the generation dtype, the KV cache of one generation batch's
    sequences (each in whole 16-token blocks; the prefix cache's sharing of a group's prompt is not counted on), and
    a fixed working memory; weights and KV split over engine.tensor_parallel_size GPUs."""
    tp, g = cfg.engine.tensor_parallel_size, BYTES[cfg.generation_dtype]
    blocks = _sequence_blocks(plan, facts)
    per_token = kv_bytes_per_token(cfg, facts)
    sequences = engine_batch_limits(plan, 0)[0]
    split = f" / tensor_parallel_size {tp}" if tp > 1 else ""
    return [
        ("vLLM weights", facts.num_params * g // tp, f"{facts.num_params:,} parameters × {g} B ({cfg.generation_dtype}){split}"),
        ("vLLM KV cache", plan.generation_batch_size * blocks * per_token // tp,
         f"{plan.generation_batch_size} sequences × {blocks:,} tokens × {per_token:,} B per token{split}"),
        ("vLLM working memory", VLLM_WORKING_BYTES + (0 if cfg.engine.enforce_eager else VLLM_CUDA_GRAPH_BYTES),
         "profile-run activations, buffers (a fixed allowance)"
         + ("" if cfg.engine.enforce_eager else " + CUDA graphs (engine.enforce_eager unset or false)")),
        ("vLLM sampler warm-up", sequences * facts.vocab_size * VLLM_SAMPLER_BYTES_PER_LOGIT,
         f"max_num_seqs {sequences} × vocab {facts.vocab_size:,} × {VLLM_SAMPLER_BYTES_PER_LOGIT} B (its start-up "
         "top-k/top-p pass)"),
    ]


CPU_RUNTIME_BYTES = 450 * 2**20  # a process that imported torch, transformers, vLLM and cohort's trainer: 443 MiB measured


def cpu_engine_share(cfg: CohortConfig, facts: ModelFacts) -> list[tuple[str, int, str]]:
    """What a vLLM engine colocated on the CPU adds to the training process, and the imports every such process pays:
    its weights in the generation dtype, engine.kv_cache_gib of KV cache (vLLM allocates all of it at start), the same
    working-memory allowance as on a GPU, and the runtime. Measured with SmolLM2-135M-Instruct (bench/smollm2_memory.py:
    without these rows the estimate was 0.69 × the peak RSS)."""
    g = BYTES[cfg.generation_dtype]
    kv = max(1, round(cfg.engine.kv_cache_gib)) * GIB  # (VLLM_CPU_KVCACHE_SPACE takes whole GiB: rollout/engines/vllm.py)
    return [
        ("vLLM weights", facts.num_params * g, f"{facts.num_params:,} parameters × {g} B ({cfg.generation_dtype}), its own copy"),
        ("vLLM KV cache", kv, "engine.kv_cache_gib, whole GiB, allocated at start"),
        ("vLLM working memory", VLLM_WORKING_BYTES, "profile-run activations, sampler logits, buffers (a fixed allowance)"),
        ("runtime", CPU_RUNTIME_BYTES, "the imports: torch, transformers, vLLM, cohort (measured)"),
    ]


def _sequence_blocks(plan: BatchPlan, facts: ModelFacts) -> int:
    """Tokens of KV cache one longest sequence takes: whole 16-token blocks (the model's positions when unmeasured)."""
    sequence = plan.max_tokens_per_sequence or facts.max_positions or 0
    return math.ceil(sequence / VLLM_BLOCK_TOKENS) * VLLM_BLOCK_TOKENS


def gpu_memory_plan(cfg: CohortConfig, plan: BatchPlan, facts: ModelFacts, total_bytes: int, *,
                    shared: bool = True) -> GpuMemoryPlan:
    """The split of a GPU of `total_bytes` (pure: validation passes the real GPU's size, tests any size).

    shared: the trainer and vLLM on this GPU (engine.mode=colocate); False: vLLM alone on it (a local server on
    the GPUs after the trainer's). engine.gpu_memory_utilization when set, else derived: shared, vLLM's share
    + VLLM_SHARE_MARGIN over the total, rounded up to 0.01; alone, OWN_GPU_UTILIZATION."""
    trainer = memory_estimate(cfg, plan, facts) if shared else []
    # held while vLLM wakes and takes the push: the gradients too (freed at the next batch's zero_grad, after it)
    resident = sum(size for name, size, _ in trainer
                   if name in ("weights", "gradients", "AdamW moments", "reference model", "critic", "teacher model"))
    engine = engine_share(cfg, plan, facts)
    tp = cfg.engine.tensor_parallel_size
    minimum = (sum(size for name, size, _ in engine if name != "vLLM KV cache")
               + _sequence_blocks(plan, facts) * kv_bytes_per_token(cfg, facts) // tp)
    utilization, derived = cfg.engine.gpu_memory_utilization, cfg.engine.gpu_memory_utilization is None
    if derived:
        need = sum(size for _, size, _ in engine) * (1 + VLLM_SHARE_MARGIN)
        utilization = min(1.0, math.ceil(need / total_bytes * 100) / 100) if shared else OWN_GPU_UTILIZATION
    return GpuMemoryPlan(total_bytes, trainer, resident, engine, minimum, utilization, derived, shared, cfg.engine.sleep_mode)


def gpu_fit_problems(cfg: CohortConfig, gpu: GpuMemoryPlan) -> list[str]:
    """Why this GPU cannot hold the run, both numbers and the fixes; [] when it can, or when train.check_memory is false
    and vLLM's share is at least what it needs to start."""
    if gpu.fits:
        return []
    where = f"the GPU's {human_bytes(gpu.total)}"
    util = (f"engine.gpu_memory_utilization = {gpu.utilization:g}" + (" (derived)" if gpu.derived else "")
            + f": {human_bytes(gpu.engine_bytes)}")
    if gpu.engine_bytes < gpu.engine_minimum:
        return [f"{util} is less than vLLM needs to start ({human_bytes(gpu.engine_minimum)}: its weights, working memory and "
                f"one sequence's KV cache); raise engine.gpu_memory_utilization to at least "
                f"{math.ceil(gpu.engine_minimum / gpu.total * 100) / 100:g} or unset it (null) to derive it"]
    if not cfg.train.check_memory:  # (the user's call: swap, or an estimate known to be high; vLLM's minimum above stays)
        return []
    if not gpu.shared:
        return [f"vLLM alone on its GPU: {util} + the CUDA context {human_bytes(CUDA_CONTEXT_BYTES)} exceed {where}; lower "
                "engine.gpu_memory_utilization or unset it (0.9)"]
    phase = ("the update (vLLM asleep)" if gpu.trainer_peak >= gpu.trainer_resident + gpu.engine_bytes
             else "generation (vLLM awake beside the trainer's weights, gradients and optimizer state)") if gpu.sleep_mode else "the update"
    fixes = ["train.micro_batch_size smaller (activations scale with it)",
             "train.gradient_checkpointing=true" if not cfg.train.gradient_checkpointing else None,
             "engine.sleep_mode=2 (vLLM's memory released during the update)" if not gpu.sleep_mode else None,
             "rollout.max_completion_length or data.max_prompt_length shorter",
             "engine.mode=local_server with a second GPU for vLLM",
             ("a smaller teacher" + (" or teacher.dtype=bfloat16" if cfg.teacher_dtype == "float32" else ""))
             if cfg.algorithm.name == "distill" else None,
             "lower engine.gpu_memory_utilization" if not gpu.derived else None]
    return [f"the trainer's peak {human_bytes(gpu.trainer_peak)} + vLLM's {util} + the CUDA context "
            f"{human_bytes(CUDA_CONTEXT_BYTES)} need {human_bytes(gpu.needed)} in {phase}, more than {where} "
            f"(`cohort plan` shows each part); fixes: {'; '.join(f for f in fixes if f)}"]


def human_bytes(n: float) -> str:
    """1536 -> '1.50 KiB' (binary units; bytes as a whole number)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)
