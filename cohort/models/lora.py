"""LoRA with peft: the adapter is trained, the base weights are never modified.

`attach_lora` wraps the loaded policy with a peft LoRA adapter (the lora
section). The trainer keeps training the same transformers module object (peft
injects its layers into it); `LoraPolicy` holds the peft wrapper and does the
four things full fine-tuning does differently:

- rollout weights (`merged_weights`): for every LoRA layer W + scaling · B @ A,
  computed out of place in float32 and named as in the base checkpoint
  (`model.layers.0.self_attn.q_proj.base_layer.weight` -> `...q_proj.weight`),
  so vLLM loads them like full weights. Merging in place and unmerging after
  (TRL) drifts bfloat16 base weights a little at every cycle; here the base is
  only read, so it stays bit-identical however many syncs run.
- the reference policy (`adapter_disabled`): the policy with its adapter off is
  the initial model, so no reference copy is held when algorithm.beta != 0.
- checkpoints (`save_adapter` / `load_adapter`): only the adapter's tensors,
  float32 as trained, so a resumed run continues bit-exactly.
- the final model (`save_final`): `final/adapter/` (peft's format) always, and
  with lora.save_merged a merged transformers checkpoint in `final/`
  itself that `from_pretrained` and vLLM load.

Precision (`base_dtype`, `attach_lora(precision=...)`): the frozen base is held
in model.dtype even under train.precision=mixed; only the adapter is float32.
Its vectors stay float32 and the embeddings' outputs are upcast, so the forward
is the float32-master one (docs/lora.md, "Precision").

LoRA dropout (lora.dropout) applies only to forward passes that build a
graph (the update): scoring runs under no_grad (old and reference log-probs, the
sync check's canaries) and must be deterministic, so peft's dropout modules are
swapped for `TrainOnlyDropout`.

`lora_problems` is the pre-flight check of the fields: ranges, target modules
that the architecture has (read by building the model on the meta device from
config.json: no weights are read), and the combinations not served yet.

Left out: loading the adapter into vLLM as a LoRA adapter (bench/lora_sync.py:
it agrees with merged pushes, but vLLM's CPU backend generated 4.8x slower),
DoRA/rsLoRA, LoRA on embeddings or the LM head (only linear layers), several
adapters at once, sharded (multi-process) training and PPO's critic (both
refused by `lora_problems`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from cohort.config import CohortConfig
from cohort.models.pretrained import write_config_dtype
from cohort.models.precision import Precision

ADAPTER_DIR = "adapter"  # final/adapter/: the trained adapter in peft's format


class TrainOnlyDropout(torch.nn.Dropout):
    """Dropout only while autograd records (the update's forward); identity under no_grad (scoring, generation)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if torch.is_grad_enabled() and self.training else x


def lora_alpha(lora_cfg) -> float:
    """lora.alpha, or 2 × rank when unset."""
    return float(lora_cfg.alpha) if lora_cfg.alpha is not None else 2.0 * lora_cfg.rank


def base_dtype(precision: Precision) -> torch.dtype:
    """The dtype the frozen base is loaded in: model.dtype (the compute dtype) whatever train.precision says.

    Float32 masters exist so that small updates survive rounding; the base is never updated, so under
    train.precision=mixed it would only cost 4 instead of 2 B/parameter plus autocast's bfloat16 copy of every weight
    that each linear saves for the backward. Only the adapter is trained: peft keeps it in float32."""
    return precision.compute_dtype


def attach_lora(model: torch.nn.Module, lora_cfg, *, precision: Precision | None = None,
                gradient_checkpointing: bool = False) -> "LoraPolicy":
    """Inject a LoRA adapter into `model` in place (peft); only the adapter's parameters require grad afterwards.

    `precision` (mixed, with the base loaded in `base_dtype`): the base's vectors (norm weights, biases: a few
    thousand values per layer) go back to float32 and the embeddings' outputs are upcast to float32, so the residual
    stream and the norms run in float32 as under autocast over float32 masters; for a bfloat16 checkpoint the forward
    is that of the float32-master model bit for bit (autocast rounds every matrix to the same bfloat16 values)."""
    from peft import LoraConfig, get_peft_model  # heavy optional dependency, only for LoRA runs

    targets = lora_cfg.target_modules
    config = LoraConfig(r=lora_cfg.rank, lora_alpha=lora_alpha(lora_cfg), lora_dropout=lora_cfg.dropout,
                        target_modules=targets if isinstance(targets, str) else list(targets), bias="none",
                        task_type="CAUSAL_LM")
    if gradient_checkpointing:
        model.enable_input_require_grads()  # the frozen embeddings' output must require grad for checkpointed blocks
    if precision is not None and precision.mixed and model.dtype != torch.float32:
        for param in model.parameters():
            if param.dim() < 2:  # CPU layer_norm refuses a bf16 weight on a float32 input
                param.data = param.data.float()
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                module.register_forward_hook(_float32_output)
    peft_model = get_peft_model(model, config)  # (autocast_adapter_dtype: the adapter in float32 over a bf16/fp16 base)
    for layer in _lora_layers(model).values():
        for name, dropout in list(layer.lora_dropout.items()):
            if isinstance(dropout, torch.nn.Dropout):
                layer.lora_dropout[name] = TrainOnlyDropout(dropout.p)
    return LoraPolicy(peft_model)


def _float32_output(_module: torch.nn.Module, _args, output: torch.Tensor) -> torch.Tensor:
    return output.float()


def _lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from peft.tuners.lora import LoraLayer  # heavy optional dependency

    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def base_name(peft_name: str) -> str:
    """A parameter's name in the base checkpoint: peft's wrapper prefix and `.base_layer` dropped."""
    name = peft_name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".")


class LoraPolicy:
    """The peft wrapper around the trainer's policy (which stays the transformers module the trainer computes with)."""

    def __init__(self, peft_model: torch.nn.Module):
        self.peft_model = peft_model
        self.model = peft_model.get_base_model()  # the same object the trainer holds as its policy
        self.layers = _lora_layers(self.model)
        self.adapter = peft_model.active_adapter

    def trainable_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def merged_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(base checkpoint name, tensor) for every weight the engine needs; LoRA layers merged in float32, out of place.

        The base weights are only read: W.float() is a new tensor whenever W is not float32, and `+` never writes
        into its operands. Tied weights come once (named_parameters drops duplicates), as in the base checkpoint."""
        for name, param in self.model.named_parameters():
            if ".lora_" in name:
                continue
            owner = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
            if owner is not None and name.endswith(".base_layer.weight") and owner in self.layers:
                yield base_name(name), self.merged_weight(owner)
            else:
                yield base_name(name), param.detach()

    def merged_weight(self, layer_name: str) -> torch.Tensor:
        """W + scaling · B @ A of one LoRA layer in float32 (transposed for fan_in_fan_out layers such as GPT-2's Conv1D)."""
        layer = self.layers[layer_name]
        if self.adapter not in layer.lora_A:
            raise TypeError(f"{layer_name}: LoRA is supported on linear layers only (lora.target_modules)")
        a = layer.lora_A[self.adapter].weight.detach().float()  # (r, in)
        b = layer.lora_B[self.adapter].weight.detach().float()  # (out, r)
        delta = (b @ a) * layer.scaling[self.adapter]  # (out, in)
        if getattr(layer, "fan_in_fan_out", False):
            delta = delta.T
        return layer.get_base_layer().weight.detach().float() + delta

    @contextlib.contextmanager
    def adapter_disabled(self):
        """The base model: the reference policy when algorithm.beta != 0."""
        with self.peft_model.disable_adapter():
            yield

    def adapter_state(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict  # heavy optional dependency

        return get_peft_model_state_dict(self.peft_model)

    def save_adapter(self, directory: Path) -> None:
        """peft's adapter format (adapter_config.json + adapter_model.safetensors), float32 as trained."""
        self.peft_model.save_pretrained(str(directory), safe_serialization=True)

    def load_adapter(self, directory: Path) -> None:
        """Load an adapter saved by `save_adapter` in place; every adapter tensor must be there."""
        from peft import set_peft_model_state_dict  # heavy optional dependency
        from safetensors.torch import load_file

        path = Path(directory) / "adapter_model.safetensors"
        if not path.is_file():
            raise FileNotFoundError(f"{directory}: no adapter_model.safetensors (a LoRA checkpoint holds the adapter only)")
        saved = load_file(str(path))
        expected = set(self.adapter_state())
        if set(saved) != expected:
            missing, unexpected = sorted(expected - set(saved)), sorted(set(saved) - expected)
            raise ValueError(f"{directory}: the adapter does not match the lora section (missing {missing[:3]}, unexpected "
                             f"{unexpected[:3]}); resume with the LoRA settings of the original run")
        set_peft_model_state_dict(self.peft_model, saved)

    def merged_state_dict(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {name: tensor.to(dtype) for name, tensor in self.merged_weights()}

    def save_final(self, directory: Path, tokenizer, dtype: torch.dtype, *, merged: bool) -> None:
        """`directory/adapter/` always; with `merged`, a merged transformers checkpoint in `directory` in `dtype`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.save_adapter(directory / ADAPTER_DIR)
        tokenizer.save_pretrained(str(directory / ADAPTER_DIR))
        if not merged:
            return
        self.model.save_pretrained(str(directory), safe_serialization=True, state_dict=self.merged_state_dict(dtype))
        write_config_dtype(directory, dtype)
        tokenizer.save_pretrained(str(directory))


def adapter_parameters_bound(hidden: int, intermediate: int, layers: int, rank: int) -> int:
    """An upper bound on all-linear adapter parameters of a decoder (for `cohort plan`): rank × (in + out) per layer for
    q, k, v, o (hidden → hidden; grouped-query k/v are smaller) and gate, up, down (hidden ↔ intermediate)."""
    return layers * rank * (4 * 2 * hidden + 3 * (hidden + intermediate))


# --------------------------------------------------------------------------- validation (no weights read)


def linear_module_names(model_dir: Path) -> tuple[set[str], set[str]]:
    """(names of the linear layers peft can target, names of every other leaf module), as last name parts.

    The model is built on the meta device from config.json: no weights are read or allocated."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    linear, other = set(), set()
    linear_kinds = (torch.nn.Linear,) + _conv1d_kind()
    head = model.get_output_embeddings()
    for name, module in model.named_modules():
        if not name or any(True for _ in module.children()):
            continue
        short = name.rsplit(".", 1)[-1]
        (linear if isinstance(module, linear_kinds) and module is not head else other).add(short)
    return linear, other - linear


def _conv1d_kind() -> tuple[type, ...]:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # an older/newer transformers without GPT-2's Conv1D
        return ()
    return (Conv1D,)


def lora_problems(cfg: CohortConfig, model_dir: Path | None = None, *, needs_critic: bool = False, world_size: int = 1) -> list[str]:
    """Every problem with the lora section's fields, with its fix; `model_dir` (when given) to check target modules.

    `needs_critic` (the algorithm trains a critic) and `world_size` (training processes) come from the caller, which
    sits above this module."""
    if cfg.lora.rank == 0:  # LoRA off: a LoRA field changed from its default would be silently ignored
        changed = [f for f in ("alpha", "dropout", "target_modules", "save_merged")
                   if getattr(cfg.lora, f) != type(cfg.lora).model_fields[f].default]
        return [f"lora.{f} is set but lora.rank = 0 (LoRA off): set lora.rank (e.g. 16) or drop lora.{f}" for f in changed]
    problems = []
    if cfg.lora.rank < 0:
        problems.append(f"lora.rank = {cfg.lora.rank}: must be >= 1 for LoRA (e.g. 16), or 0 to train every weight")
    if cfg.lora.alpha is not None and not cfg.lora.alpha > 0:
        problems.append(f"lora.alpha = {cfg.lora.alpha}: must be > 0 (the adapter is scaled by alpha / rank; unset: 2 × rank)")
    if not 0.0 <= cfg.lora.dropout < 1.0:
        problems.append(f"lora.dropout = {cfg.lora.dropout}: must be in [0, 1) (0.05 is common; 0 turns it off)")
    targets = cfg.lora.target_modules
    if isinstance(targets, str) and targets != "all-linear":
        problems.append(f"lora.target_modules = {targets!r}: give `all-linear` or a list of module names such as "
                        "[q_proj, v_proj]")
    elif isinstance(targets, list) and not targets:
        problems.append("lora.target_modules = []: name at least one module, or `all-linear`")
    problems += _combination_problems(cfg, needs_critic, world_size)
    if model_dir is not None and isinstance(targets, list) and targets:
        problems += _target_problems(model_dir, targets)
    return problems


def _combination_problems(cfg: CohortConfig, needs_critic: bool, world_size: int) -> list[str]:
    problems = []
    if needs_critic:
        problems.append(f"lora.rank = {cfg.lora.rank} with algorithm.name = {cfg.algorithm.name}: the critic is not "
                        "trained with LoRA yet; use grpo (or another critic-free algorithm), or lora.rank=0")
    if world_size > 1:
        problems.append(f"lora.rank = {cfg.lora.rank} with {world_size} training processes: sharded "
                        "LoRA training is not supported yet; use train.num_processes=1 or lora.rank=0")
    return problems  # every engine.mode serves LoRA: the engine receives merged weights under the base names


def _target_problems(model_dir: Path, targets: list[str]) -> list[str]:
    try:
        linear, other = linear_module_names(model_dir)
    except Exception as exc:  # an unreadable config is reported by the model checks; nothing more to say here
        return [f"lora.target_modules: cannot read the architecture from {model_dir}/config.json ({exc})"]
    problems = []
    for name in targets:
        if name in linear:
            continue
        why = "is not a linear layer (LoRA here adapts linear layers only)" if name in other else "is not a module of this model"
        problems.append(f"lora.target_modules: {name!r} {why}; this model's linear layers are "
                        f"{', '.join(sorted(linear))} (or use all-linear)")
    return problems
