"""Loading policies and tokenizers from local transformers checkpoints.

`tiny:<task>` names resolve to the embedded tiny models (built offline, cached);
anything else must be a local directory with a transformers config. Nothing is
fetched from a model hub: the loaders pass `local_files_only=True`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cohort.models.precision import DTYPES


class ModelLoadError(ValueError):
    pass


def resolve_model_dir(path: str) -> Path:
    """`tiny:arith` -> the cached embedded checkpoint (built on first use); else a checked local dir."""
    if path.startswith("tiny:"):
        from cohort.models.tiny import build_tiny_model

        return build_tiny_model(path.split(":", 1)[1])
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ModelLoadError(f"model.path = {path!r}: not a directory; give a local transformers checkpoint directory or tiny:arith")
    if not (p / "config.json").is_file():
        raise ModelLoadError(f"model.path = {path!r}: no config.json there, so it is not a transformers checkpoint")
    return p


def check_model_dir(path: str) -> list[str]:
    """Cheap pre-flight check (no weights read) for config validation."""
    if path.startswith("tiny:"):
        from cohort.data.tasks import list_tasks

        name = path.split(":", 1)[1]
        known = list_tasks()
        return [] if name in known else [f"model.path = {path!r}: unknown tiny model; choose one of {', '.join('tiny:' + n for n in known)}"]
    try:
        resolve_model_dir(path)
    except ModelLoadError as exc:
        return [str(exc)]
    return []


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot load the tokenizer from {model_dir}: {exc}") from exc
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_policy(model_dir: Path, dtype: str | torch.dtype) -> torch.nn.Module:
    """The causal LM with its weights in `dtype` (a name or a torch dtype; float32 for mixed-precision master weights)."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=DTYPES.get(dtype, dtype), local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot load a causal LM from {model_dir}: {exc}") from exc
    model.config.use_cache = False
    return model
