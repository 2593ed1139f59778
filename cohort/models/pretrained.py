"""Loading policies and tokenizers from transformers checkpoints, wherever they are named.

`resolve_model_dir` turns any model path into a local checkpoint directory, in this
order: `tiny:<task>` -> the embedded tiny model (built offline, cached); an existing
local directory with a transformers config; a `.gguf` file or a packaged GGUF name
(`gguf:smollm2-135m-instruct`) -> its checkpoint converted once into cohort's cache
(cohort/models/gguf.py); a Hugging Face Hub id (`org/name`, with `revision` or
`org/name@revision`) -> its snapshot in the HF cache, downloaded once
(cohort/models/hub.py). The loaders then read that directory (`local_files_only=True`:
a local directory needs no network, and nothing beside it is looked up). `inspect_model` (`check_model_dir`, then
`config_dir`) is the planner's cheap version: a Hub id's config and tokenizer files only, never its weights; a GGUF
file's magic bytes, and its converted checkpoint once converted.

`stop_token_ids` is the one place that decides which sampled tokens end a
completion; every engine (transformers, vLLM, the rollout server) stops at
exactly that set, so they all train on the same text.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from cohort.models import hub
from cohort.models.chat_template import ChatTemplateError, apply_chat_template_config
from cohort.models.gguf import GGUFError, cached_gguf_dir, gguf_checkpoint, gguf_file, is_gguf_path
from cohort.models.precision import DTYPES
from cohort.models.tiny import TINY_RECIPES, build_tiny_model


class ModelLoadError(ValueError):
    pass


ModelSource = Literal["tiny", "gguf", "hub", "local"]


def model_source(path: str) -> ModelSource:
    """What kind of name a model path is, decided in one place for every reader: `tiny:<task>`, a local directory, a
    `.gguf` file or `gguf:<name>` (before the Hub: `model.gguf` would pass for a Hub name), a Hub id; anything else is
    "local" (and reported as not a directory)."""
    if path.startswith("tiny:"):
        return "tiny"
    if Path(path).expanduser().is_dir():
        return "local"
    if is_gguf_path(path):
        return "gguf"
    return "hub" if hub.looks_like_hub_id(path) else "local"


def resolve_model_dir(path: str, revision: str | None = None) -> Path:
    """`tiny:arith` (or `tiny:arith_chat`) -> the cached embedded checkpoint (built on first use); a local directory ->
    itself, checked; a `.gguf` file or `gguf:<name>` -> its converted checkpoint (converted on first use); a Hub id ->
    its snapshot in the HF cache with weights (`revision`: a branch, tag or commit)."""
    source = model_source(path)
    if source == "tiny":
        return build_tiny_model(path.split(":", 1)[1])
    if source == "gguf":
        return _converted(path)
    if source == "hub":
        return _from_hub(path, revision, weights=True)
    return _local_dir(path)


def _local_dir(path: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ModelLoadError(f"model.path = {path!r}: not a directory; give a local transformers checkpoint directory, a "
                             "Hugging Face Hub id (org/name), a .gguf file or tiny:arith")
    if not (p / "config.json").is_file():
        raise ModelLoadError(f"model.path = {path!r}: no config.json there, so it is not a transformers checkpoint")
    return p


def _converted(path: str) -> Path:
    try:
        return gguf_checkpoint(path)  # converted on first use, then cached
    except GGUFError as exc:
        raise ModelLoadError(str(exc)) from None


def _from_hub(path: str, revision: str | None, *, weights: bool) -> Path:
    try:
        return hub.hub_snapshot(path, revision, weights=weights)
    except hub.HubModelError as exc:
        raise ModelLoadError(f"model.path = {path!r}: {exc}") from exc


@dataclass(frozen=True)
class ModelFiles:
    """The planner's one look at a model path (`inspect_model`): where its config and tokenizer are, and what is wrong."""

    directory: Path | None  # config.json and the tokenizer: a local directory, a GGUF file's converted checkpoint, a Hub
    # id's snapshot (config and tokenizer only); None for a `tiny:*` model (built with its tokenizer on first use), a
    # GGUF file not converted, and a path with problems
    problems: list[str]  # why the path is no checkpoint, each with its fix
    holds_weights: bool = False  # the directory is the checkpoint the run loads (a Hub snapshot's are fetched by the run)


def inspect_model(path: str, revision: str | None = None, *, convert: bool = True) -> ModelFiles:
    """The checks' look at a model path, no weights read and none downloaded: a `tiny:*` name is only looked up (built
    by the run), a local directory must hold config.json, a GGUF file its magic bytes (`convert`: then converted once,
    cached, so its config and tokenizer can be read; a failed conversion raises ModelLoadError), a Hub id its config
    and tokenizer files (fetched into the HF cache when missing)."""
    source = model_source(path)
    if source == "tiny":
        name, known = path.split(":", 1)[1], sorted(TINY_RECIPES)
        return ModelFiles(None, [] if name in known else [
            f"model.path = {path!r}: unknown tiny model; choose one of {', '.join('tiny:' + n for n in known)}"])
    try:
        if source == "hub":
            return ModelFiles(_from_hub(path, revision, weights=False), [])
        if source == "local":
            return ModelFiles(_local_dir(path), [], holds_weights=True)
        gguf_file(path)  # the file and its magic bytes
    except (ModelLoadError, GGUFError) as exc:
        return ModelFiles(None, [str(exc)])
    directory = _converted(path) if convert else cached_gguf_dir(path)
    return ModelFiles(directory, [], holds_weights=directory is not None)


def config_dir(path: str, revision: str | None = None) -> Path | None:
    """The directory holding `path`'s config.json and tokenizer, for checks before anything loads (`inspect_model`,
    converting nothing): None for a `tiny:*` model (built with the model), a GGUF file not converted yet, and a path
    that is no checkpoint (check_model_dir says why)."""
    return inspect_model(path, revision, convert=False).directory


def check_model_dir(path: str, revision: str | None = None) -> list[str]:
    """Cheap pre-flight check (no weights read, none downloaded, nothing converted): `inspect_model`'s problems."""
    return inspect_model(path, revision, convert=False).problems


def load_tokenizer(model_dir: Path, chat_template: str | None = None, chat_template_kwargs: dict | None = None):
    """The checkpoint's tokenizer, its chat template replaced by `chat_template` (model.chat_template: a Jinja file, or
    one inside the checkpoint) and `chat_template_kwargs` written in as defaults (cohort/models/chat_template.py)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot load the tokenizer from {model_dir}: {exc}") from exc
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    try:
        apply_chat_template_config(tok, model_dir, chat_template, chat_template_kwargs)
    except ChatTemplateError as exc:
        raise ModelLoadError(str(exc)) from None
    return tok


def load_run_tokenizer(model_dir: Path, model_cfg):
    """`load_tokenizer` with the model section's chat_template and chat_template_kwargs."""
    return load_tokenizer(model_dir, model_cfg.chat_template, model_cfg.chat_template_kwargs)


def load_policy(model_dir: Path, dtype: str | torch.dtype, device: torch.device | str | None = None) -> torch.nn.Module:
    """The causal LM with its weights in `dtype` (a name or a torch dtype; float32 for mixed-precision master weights),
    on `device` (None: the CPU)."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=DTYPES.get(dtype, dtype), local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot load a causal LM from {model_dir}: {exc}") from exc
    model.config.use_cache = False
    return model.to(device) if device is not None else model


STOP_PROBE = "cohort-stop-probe"  # an assistant message's content, to find what the chat template writes after it


def checkpoint_parameters(model_dir: Path) -> int | None:
    """Parameters stored in model_dir's safetensors files, read from their headers (nothing is loaded); None for a
    checkpoint without any (a `.bin` one). A tied output layer is stored once, so this is the loaded model's
    `sum(p.numel() for p in model.parameters())`."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with safe_open(str(file), framework="pt") as header:
            total += sum(math.prod(header.get_slice(name).get_shape()) for name in header.keys())
    return total


def stop_token_ids(model_dir: Path, tokenizer) -> list[int]:
    """The sorted token ids that end a completion for this checkpoint.

    The union of: `eos_token_id` (an int or a list) of `generation_config.json`
    (of `config.json` when there is none, as transformers and vLLM fall back),
    the tokenizer's EOS, and the chat template's end-of-turn token
    (`chat_end_of_turn_id`). The end-of-turn token is included for plain-text
    prompts too: a special token that closes a turn never belongs inside an
    answer, and a set that depends on the checkpoint alone lets a rollout server
    compute the same set as the trainer from the same directory.
    """
    ids = set(_config_eos_ids(Path(model_dir)))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    end_of_turn = chat_end_of_turn_id(tokenizer)
    if end_of_turn is not None:
        ids.add(end_of_turn)
    if not ids:
        raise ModelLoadError(f"{model_dir}: no stop token: generation_config.json and config.json have no eos_token_id and the "
                             "tokenizer has no eos_token; set eos_token_id in generation_config.json")
    return sorted(ids)


def _config_eos_ids(model_dir: Path) -> list[int]:
    """`eos_token_id` of generation_config.json, else of config.json, as a list (empty when unset)."""
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if not path.is_file():
            continue
        value = json.loads(path.read_text()).get("eos_token_id")
        values = value if isinstance(value, list) else [] if value is None else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise ModelLoadError(f"{path}: eos_token_id = {value!r}; give a token id or a list of token ids")
        return values
    return []


def chat_end_of_turn_id(tokenizer) -> int | None:
    """The special token the chat template writes right after an assistant message (`<|im_end|>`, `<|eot_id|>`,
    `<end_of_turn>`, `<|end|>`), found by rendering a probe conversation; None without a template or when the
    first token after the message is not a special token."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": STOP_PROBE}]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
    except Exception:  # a template that refuses this conversation shape names no end-of-turn token
        return None
    if STOP_PROBE not in text:
        return None
    after = text[text.rindex(STOP_PROBE) + len(STOP_PROBE):].lstrip(" ")
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return int(ids[0]) if ids and ids[0] in special else None


def write_config_dtype(directory: Path, dtype: torch.dtype) -> None:
    """Name `dtype` in a saved checkpoint's config.json: transformers writes the dtype of the module's own parameters
    there (float32 for float32 master weights), so a state dict saved in another dtype would load back as float32."""
    config_path = Path(directory) / "config.json"
    config = json.loads(config_path.read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
