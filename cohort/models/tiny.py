"""The offline tiny models ``tiny:arith``, ``tiny:arith_chat``, ``tiny:tool_calc`` and ``tiny:long_tail``: shipped with
cohort as weights (``tiny_weights/<name>/``), copied into the cache on first use; their recipes
(``cohort.models.tiny_recipes``) built them.

Why shipped, not built on each machine (issue 46): the recipe is deterministic on one machine (one thread, one seed), but
the float sums of matrix products differ between CPUs, and across machines the same recipe gave tiny:arith held-out
greedy accuracies of 25.0%, 37.7% and 43.0%, tiny:arith_chat 34.3% and 47.3%, tiny:long_tail 78.5%, 79.5% and 92.0%; a
demo tuned on one start learned half as much on another. The shipped files are the builds of 2026-12-05 on an Intel Xeon
with AVX512-BF16 (cohort_tiny.json's ``built_on``); tests/models/test_tiny_shipped.py pins their digests. A recipe
change makes the shipped weights stale: they are then not used (the model is built as before) until ``make
tiny-weights`` re-ships them. ``build_tiny_model(name, train=True)`` builds by the recipe regardless.

``cohort train`` with no config does GRPO on the built-in ``arith`` task with this
model, so it must load like any user checkpoint (a transformers directory for
``Qwen2ForCausalLM`` with the character tokenizer; vLLM serves it unchanged) and
must leave headroom that RL can use: greedy held-out accuracy mid-way, with the
right answer often sampled when it is not greedy's choice.

Building (``build_tiny_model``, ``train=True`` or no shipped weights for the recipe): the recipe's warm start on one
CPU thread.

Choices:
- One thread while building (restored after), so a machine's thread count does not
  change the weights; a ~1M-parameter model gains nothing from more threads. Two
  builds on this machine gave bit-identical ``model.safetensors``. The build runs
  under ``torch.random.fork_rng``, so it leaves the caller's RNG state alone.
- The one-time build announces itself at WARNING level, so it shows without any
  logging set-up; per-check progress is INFO.
- Cached under ``$COHORT_CACHE`` (default ``~/.cache/cohort``) in
  ``tiny-<name>-<hash of the recipe>``, so any recipe change rebuilds. Written to a
  temporary directory and moved into place with ``os.replace`` under a file lock:
  two concurrent builders build once, and a reader never sees half a checkpoint.

Left out: GPU builds (a tiny model trains in a minute or two on one CPU core),
and a hub upload.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch
from filelock import FileLock

from cohort.data.tasks import get_task
from cohort.models.devices import cpu_model
from cohort.models.tiny_decode import greedy_completions, sampled_completions
from cohort.models.tiny_recipes import RECIPE_VERSION, TINY_RECIPES, TinyRecipe, new_tiny_model, warm_start

logger = logging.getLogger(__name__)

TINY_PREFIX = "tiny:"
METADATA_FILE = "cohort_tiny.json"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else ``$COHORT_CACHE``, else ``~/.cache/cohort``."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("COHORT_CACHE") or Path.home() / ".cache" / "cohort")


def resolve_model_path(path: str | Path) -> Path:
    """``tiny:<name>`` builds (or finds) that tiny model; anything else must be a
    local checkpoint directory."""
    text = str(path)
    if text.startswith(TINY_PREFIX):
        return build_tiny_model(text[len(TINY_PREFIX) :])
    local = Path(text).expanduser()
    if not local.is_dir():
        raise FileNotFoundError(
            f"model path {text!r} is not a local directory; pass a checkpoint directory "
            f"(config.json, weights, tokenizer files) or one of: "
            f"{', '.join(TINY_PREFIX + name for name in sorted(TINY_RECIPES))}"
        )
    return local


def cached_tiny_dir(name: str, cache_dir: str | Path | None = None) -> Path | None:
    """The checkpoint directory of tiny model ``name`` if it is built and cached, else None (nothing is built)."""
    if name not in TINY_RECIPES:
        return None
    target = cache_root(cache_dir) / f"tiny-{name}-{TINY_RECIPES[name].digest()}"
    return target if (target / METADATA_FILE).is_file() else None


SHIPPED_DIR = Path(__file__).with_name("tiny_weights")  # <name>/: a checkpoint as _build_into wrote it, shipped in the package


def shipped_tiny_dir(name: str) -> Path | None:
    """The checkpoint of tiny model ``name`` that ships with cohort, if there is one for the current recipe, else None.

    A shipped checkpoint whose recipe digest is not the recipe's (the recipe changed and nobody re-shipped) is not used:
    the model is then built from the recipe, as before there were shipped weights (tests/models/test_tiny_shipped.py
    fails until ``make tiny-weights`` re-ships it)."""
    directory = SHIPPED_DIR / name
    if name not in TINY_RECIPES or not (directory / METADATA_FILE).is_file():
        return None
    shipped = json.loads((directory / METADATA_FILE).read_text())
    return directory if shipped.get("recipe_digest") == TINY_RECIPES[name].digest() else None


def available_tiny_dir(name: str) -> Path | None:
    """A directory holding tiny model ``name``'s checkpoint without building or copying anything: the cached one, else
    the shipped one (the same files), else None. For checks that read the config, tokenizer or weight headers."""
    return cached_tiny_dir(name) or shipped_tiny_dir(name)


def build_tiny_model(name: str = "arith", *, cache_dir: str | Path | None = None, force: bool = False,
                     train: bool = False) -> Path:
    """The checkpoint directory of tiny model ``name``, installed into the cache on first use.

    Installed from the weights shipped with cohort (a copy: the same bytes on every machine, in a second), or, when none
    ship for this recipe or ``train``, built by the recipe's warm start (a minute to a quarter of an hour; its weights
    then depend on the machine's float arithmetic). Returns at once when the cached one exists (unless ``force``).
    Concurrent callers wait on a file lock and the second one finds the first one's.
    """
    if name not in TINY_RECIPES:
        raise ValueError(f"unknown tiny model {name!r}; available: {', '.join(sorted(TINY_RECIPES))}")
    recipe = TINY_RECIPES[name]
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"tiny-{name}-{recipe.digest()}"
    shipped = None if train else shipped_tiny_dir(name)
    if shipped is not None:
        return build_once(target, lambda staging: _copy_files(shipped, staging), force=force,
                          announce=lambda: logger.warning("installing %s%s's shipped weights into %s", TINY_PREFIX, name,
                                                          target))
    return build_once(target, lambda staging: _build_into(staging, name, recipe), force=force,
                      announce=lambda: logger.warning("building %s%s (one-time, ~%d s) into %s", TINY_PREFIX, name,
                                                      recipe.expected_build_s, target))


def _copy_files(source: Path, destination: Path) -> None:
    for path in sorted(source.iterdir()):
        if path.is_file():
            shutil.copyfile(path, destination / path.name)


def ship_tiny_model(name: str) -> Path:
    """Build tiny model ``name`` by its recipe on this machine (in a scratch cache) and make it the shipped checkpoint
    (``SHIPPED_DIR/<name>``): ``make tiny-weights``, after a recipe change. The metadata records the machine."""
    import platform

    with tempfile.TemporaryDirectory(prefix="cohort-ship-") as scratch:
        built = build_tiny_model(name, cache_dir=scratch, train=True)
        metadata = json.loads((built / METADATA_FILE).read_text())
        metadata["built_on"] = {"cpu": cpu_model(), "machine": platform.machine(), "threads": 1}
        (built / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
        destination = SHIPPED_DIR / name
        shutil.rmtree(destination, ignore_errors=True)
        destination.mkdir(parents=True)
        _copy_files(built, destination)
    return destination


def build_once(target: Path, build: Callable[[Path], None], *, announce: Callable[[], None], marker: str = METADATA_FILE,
               force: bool = False) -> Path:
    """``target``, a cache directory that ``build(staging)`` fills, built once: at once when its ``marker`` file is there
    (unless ``force``); else under a file lock (a concurrent caller waits, then finds the first one's build), into a
    private staging directory beside it that is made readable and moved into place atomically, so a crashed build
    leaves nothing half-written. ``announce`` says on the console that the one-time work starts."""
    if (target / marker).is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / marker).is_file() and not force:
            return target  # another process built it while we waited
        announce()
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            build(staging)
            _make_readable(staging)
            _replace_dir(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _make_readable(directory: Path) -> None:
    """``mkdtemp`` makes a private (0700) directory; a shared cache needs 0755/0644."""
    directory.chmod(0o755)
    for path in directory.iterdir():
        path.chmod(0o644)


def _replace_dir(staging: Path, target: Path) -> None:
    """Move ``staging`` to ``target`` atomically; an old ``target`` is set aside first
    (``os.replace`` cannot overwrite a non-empty directory)."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _build_into(out_dir: Path, name: str, recipe: TinyRecipe) -> None:
    start = time.perf_counter()
    task = get_task(recipe.task, seed=recipe.task_seed)
    sft_rows = task.train_rows[: -recipe.validation_size]
    validation_rows = task.train_rows[-recipe.validation_size :]
    codec = recipe.write_tokenizer(out_dir)
    with _single_thread(), torch.random.fork_rng(devices=[]):  # the caller's RNG is untouched
        torch.manual_seed(recipe.seed)
        model = new_tiny_model(recipe, codec)
        train_stats = warm_start(model, recipe, sft_rows, validation_rows, codec)
        eval_prompts = [row["prompt"] for row in task.eval_rows]
        answers = [row["answer"] for row in task.eval_rows]
        greedy = greedy_completions(model, eval_prompts, recipe.max_new_tokens, codec=codec, kv_cache=recipe.kv_cache)
        samples = sampled_completions(model, eval_prompts, 8, recipe.max_new_tokens, seed=recipe.seed, codec=codec,
                                      kv_cache=recipe.kv_cache)
        extra = recipe.extra_statistics(model, eval_prompts, answers, codec)
    model.save_pretrained(out_dir)
    recipe.finish_checkpoint(out_dir, codec)
    correct = [[text == answer for text in texts] for texts, answer in zip(samples, answers)]
    metadata = {
        "name": f"{TINY_PREFIX}{name}",
        "recipe": dataclasses.asdict(recipe),
        "recipe_digest": recipe.digest(),
        "recipe_version": RECIPE_VERSION,
        "task": task.name,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        **train_stats,
        "eval_size": len(answers),
        "eval_greedy_accuracy": sum(g == a for g, a in zip(greedy, answers)) / len(answers),
        "eval_sampled_accuracy_t1": sum(sum(c) / len(c) for c in correct) / len(correct),
        "eval_pass_at_8_t1": sum(any(c) for c in correct) / len(correct),
        **extra,
        "build_seconds": round(time.perf_counter() - start, 1),
        "torch_version": torch.__version__,
    }
    (out_dir / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    logger.warning(
        "built %s%s in %.0f s: held-out greedy accuracy %.1f%% after %d steps",
        TINY_PREFIX, name, metadata["build_seconds"], 100 * metadata["eval_greedy_accuracy"], train_stats["steps"],
    )


@contextmanager
def _single_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


if __name__ == "__main__":  # python -m cohort.models.tiny NAME...: re-ship those tiny models (make tiny-weights)
    import sys

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for tiny_name in sys.argv[1:] or sorted(TINY_RECIPES):
        print(f"shipped {TINY_PREFIX}{tiny_name}: {ship_tiny_model(tiny_name)}")
