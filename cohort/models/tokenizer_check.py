"""Is there a usable tokenizer beside a checkpoint? Checked before anything loads (`tokenizer_problems`).

A checkpoint folder copied with only config.json and the weights loads as a model, and
transformers then builds an empty tokenizer from config.json alone: every prompt encodes
to nothing, and vLLM stops at the first step ("The decoder prompt cannot be empty"). So
validation asks two things of a local model directory, in this order:
- the files: tokenizer.json, or a slow tokenizer's vocabulary (tokenizer.model,
  vocab.json + merges.txt, vocab.txt, spiece.model, ...); none present names the folder,
  what it holds and what it lacks;
- the tokenizer itself: it loads, and a short probe text encodes to at least one token.
The first reads a directory listing (validate_config asks it with the other cheap checks);
the second, `checked_tokenizer`, loads the tokenizer (no weights; ~0.1-0.5 s) and hands it back when it is usable,
so validation loads it once and encodes the prompts with it (after the weights' headers are found sound), and the
run reuses it (cohort/plan/run_plan.py).

Left out: `tiny:*` models (their tokenizer is built with the model) and directories that
are not checkpoints at all (cohort.models.pretrained.check_model_dir reports those).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cohort.models import pretrained

VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                    "sentencepiece.bpe.model", "tiktoken.model", "qwen.tiktoken")
PROBE_TEXT = "Hello world: 12 + 30 = 42."


def tokenizer_file_problems(path: str, key: str = "model.path", folder: Path | None = None) -> list[str]:
    """[] when `path` is a `tiny:*` model, not a checkpoint directory (reported elsewhere), or holds tokenizer files;
    else one problem naming the folder, what it holds and what it lacks. Reads the directory listing only. `folder`:
    where `path` is on disk when it is not a directory itself (a Hub id's snapshot, `pretrained.config_dir`)."""
    folder = Path(folder) if folder is not None else Path(path).expanduser()
    if path.startswith("tiny:") or not (folder / "config.json").is_file():
        return []
    present = sorted(p.name for p in folder.iterdir())
    if any(name in present for name in VOCABULARY_FILES):
        return []
    return [f"{key} = {path!r}: no tokenizer files in {folder} (it holds {', '.join(present[:10])}"
            f"{', ...' if len(present) > 10 else ''}); it lacks tokenizer.json (or a vocabulary: tokenizer.model, "
            "vocab.json + merges.txt) and tokenizer_config.json. Copy them from the checkpoint it came from, e.g. "
            f"AutoTokenizer.from_pretrained(ORIGINAL).save_pretrained({str(folder)!r})"]


def tokenizer_problems(path: str, key: str = "model.path", folder: Path | None = None) -> list[str]:
    """`tokenizer_file_problems`, then (when the files are there) whether the tokenizer loads and encodes a probe
    text to at least one token (`checked_tokenizer`, whose tokenizer this drops)."""
    return checked_tokenizer(path, key, folder)[1]


def checked_tokenizer(path: str, key: str = "model.path", folder: Path | None = None, *, chat_template: str | None = None,
                      chat_template_kwargs: dict | None = None) -> tuple[Any, list[str]]:
    """(the tokenizer, []) when `path`'s tokenizer files are there, it loads and it encodes a probe text to at least one
    token; (None, the problems) when not; (None, []) for a `tiny:*` model or a path that is no checkpoint directory
    (reported elsewhere). Loads the tokenizer (no weights) once per call, with model.chat_template and its kwargs
    applied (a template that cannot be read is one of the problems)."""
    problems = tokenizer_file_problems(path, key, folder)
    folder = Path(folder) if folder is not None else Path(path).expanduser()
    if problems or path.startswith("tiny:") or not (folder / "config.json").is_file():
        return None, problems
    try:
        tokenizer = pretrained.load_tokenizer(folder, chat_template, chat_template_kwargs)
    except pretrained.ModelLoadError as exc:
        return None, [str(exc) if str(exc).startswith("model.chat_template") else f"{key} = {path!r}: {exc}"]
    if not tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]:
        return None, [f"{key} = {path!r}: the tokenizer in {folder} encodes {PROBE_TEXT!r} to no tokens, so every prompt "
                      "would be empty; its tokenizer files are incomplete (tokenizer.json without a vocabulary?): copy them "
                      "again from the checkpoint it came from"]
    return tokenizer, []
