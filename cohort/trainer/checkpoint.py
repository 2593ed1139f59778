"""Checkpoints: everything a run needs to continue exactly where it stopped, written atomically.

Layout, one directory per saved step (`RUN_DIR/checkpoints/step-000012/`):

    model/       the policy as a transformers checkpoint with its tokenizer, so
                 `cohort eval model.path=RUN_DIR/checkpoints/step-000012/model` works
    state.pt     the rest of the trainer state (below), read back with weights_only=True
    meta.json    step, policy version, generation index, time: for people and tools
    manifest.json  every other file with its size and sha256, written last
                 (cohort/runs/manifest.py)

`state.pt` holds
- the trainer's `TrainerState` (cohort/trainer/state.py), through its own
  `state_dict`: optimizer steps taken, policy version, and the current generation
  batch when the checkpoint falls inside one (train.steps_per_generation ×
  algorithm.num_iterations > 1), so the resumed run trains on the same
  completions, old and reference log-probs;
- the RNG states of python, numpy and torch (CPU, and CUDA when present);
- the state dicts of the trainer's parts named in `stateful_parts` (cohort/trainer/state.py; an explicit
  list: a part with state that is not listed there is not saved): the optimizer, the
  LR schedule, the prompt sampler, the KL controller, a PPO critic (its model,
  optimizer and schedule), the weight-sync check (the canaries, noise floor and
  last verified log-probs) and the rollout scheduler (the generation index, the
  groups admitted and not trained, the continuation buffer). Every completion's
  sampling seed derives from rollout.seed and the generation index
  (`cohort.rollout.base.completion_seeds`), so restoring it restores the samples.

Older checkpoints are read too: parts saved under an earlier name
(`RENAMED_PARTS`), and the generation index saved beside the counters rather
than in the scheduler's state.

Under train.precision=mixed the weights saved here are the float32 master
weights (final/ holds the model.dtype copy, cohort/trainer/run.py).

Atomicity: everything is written into `checkpoints/.tmp-step-N-PID/`, the
manifest last, every file and the directory are fsynced, then the directory is
renamed to `step-N` and the parent fsynced. A crash at any moment leaves every
earlier checkpoint intact; half-written `.tmp-*` directories are ignored and swept
at the next save. Only the newest `run.keep_checkpoints` survive a save.

Resuming (`resume`) checks a checkpoint against its manifest before loading it.
Given a run directory, a damaged checkpoint (manifest missing, a file missing, a
size or hash that differs) is named with what is wrong, moved aside to
`checkpoints/damaged-step-N/` (so pruning never counts it as one of the kept), and
the newest intact one is loaded instead; none intact is an error that says what to
do. Given one checkpoint directory, a damaged one is refused: the user named it.
A checkpoint written before manifests existed (its meta.json does not mention
one) is "unverified": it is loaded as before, and when loading fails it counts
as damaged. A failed load of such a checkpoint may have changed part of the
trainer; the next candidate's load overwrites every part of it.

With LoRA (lora.rank > 0) `model/` holds the adapter alone (peft's
adapter_config.json + adapter_model.safetensors, float32) and the optimizer
state holds the adapter's moments only: the base weights are model.path's,
never changed, and are read from there on resume.

What is saved and restored comes in one typed value, `Checkpointed` (cohort/trainer/state.py: the parts, the
`TrainerState`, the stateful parts by name, the plan's batch size), which the Trainer builds
(`Trainer.checkpointed()`); nothing here reads a Trainer. Rewinding a failed step in memory is not a checkpoint:
cohort/trainer/failure.py's `StepStart`.

Not saved: the reference model (it is the initial model.path, rebuilt from it),
the rollout engine (a fresh engine receives the weights at the first sync) and
gradients (zero between optimizer steps).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file

from cohort.distributed.fsdp import LocalContext
from cohort.runs.manifest import MANIFEST, Verdict, verify, write_manifest
from cohort.trainer.state import Checkpointed, rng_state, set_rng_state

CHECKPOINTS = "checkpoints"
PREFIX = "step-"
DAMAGED_PREFIX = "damaged-"
LOGS_WITH_STEPS = ("metrics.jsonl", "completions.jsonl", "eval.jsonl", "warnings.jsonl")


# older checkpoints' part names: the rollout scheduler's state; the learning-rate schedule (saved as "scheduler" before
# it was renamed, so that "scheduler" would mean one thing, the rollout scheduler)
RENAMED_PARTS = {"async_rollout": "rollout", "continuations": "rollout", "scheduler": "lr_schedule"}


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says which and what to do."""


# --------------------------------------------------------------------------- writing


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"{PREFIX}{step:06d}"


def unsupported(dist: LocalContext) -> str | None:
    """Why a trainer among these processes cannot checkpoint its state, or None when it can."""
    if dist.world_size > 1:
        return "checkpoints of a multi-process (sharded) run are not written yet"
    return None


def save_checkpoint(saved: Checkpointed, keep: int | None = None) -> Path:
    """Write the trainer's state for its current step atomically; keep the newest `keep` (default run.keep_checkpoints)."""
    if (reason := unsupported(saved.parts.dist)) is not None:
        raise CheckpointError(reason)
    run_dir, step = saved.parts.run_dir, saved.state.step
    root = Path(run_dir) / CHECKPOINTS
    final = checkpoint_dir(run_dir, step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _sweep_partials(root)
        tmp.mkdir()
        _write_contents(saved, tmp)
        write_manifest(tmp)  # last: it lists every file above, complete
        _fsync_tree(tmp)
        if final.exists():  # the same step saved twice (resumed and stopped at once): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        previous = latest_checkpoint(run_dir)
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        raise CheckpointError(
            f"could not write the checkpoint of step {step} under {root}: {exc}; {kept}. "
            "Free disk space or set run.output_dir to a writable disk, then resume with `cohort train --resume RUN_DIR`"
        ) from exc
    prune(root, keep if keep is not None else saved.keep)
    return final


def _write_contents(saved: Checkpointed, directory: Path) -> None:
    model_dir, parts = directory / "model", saved.parts
    if parts.lora is not None:  # LoRA: the adapter only, float32 as trained (cohort/models/lora.py)
        parts.lora.save_adapter(model_dir)
    else:
        parts.policy.save_pretrained(str(model_dir), safe_serialization=True)
    parts.tokenizer.save_pretrained(str(model_dir))
    state = {
        **saved.state.state_dict(),  # step, policy_version, batch (cohort/trainer/state.py)
        "rng": rng_state(),
        "parts": {name: part.state_dict() for name, part in saved.stateful.items()},
        "modules": {},  # (checkpoints before the list of stateful parts listed trainable modules here; none was ever saved)
    }
    torch.save(state, directory / "state.pt")
    meta = {"step": state["step"], "policy_version": state["policy_version"],
            "generation_index": state["parts"]["rollout"]["generation_index"], "mid_generation": state["batch"] is not None,
            "generation_batch_size": saved.generation_batch_size,
            "saved_at": time.strftime("%Y-%m-%d %H:%M:%S"), "manifest": MANIFEST}  # (so a missing manifest reads as damage)
    (directory / "meta.json").write_text(json.dumps(meta, indent=2))


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
    for path in sorted((p for p in directory.rglob("*") if p.is_dir()), reverse=True):
        _fsync_dir(path)
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sweep_partials(root: Path) -> None:
    for leftover in root.glob(".tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"{PREFIX}*") if p.is_dir() and (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def prune(root: Path, keep: int) -> None:
    for old in list_checkpoints(root.parent)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- choosing what to resume from


@dataclasses.dataclass
class Resumed:
    """The checkpoint a resume loaded, its meta.json, its verdict, and notes for the log (checkpoints skipped as damaged)."""

    path: Path
    meta: dict[str, Any]
    verdict: Verdict
    notes: list[str]


def is_checkpoint_dir(path: Path) -> bool:
    """Whether `path` is one checkpoint (`step-N` with its meta.json or manifest) rather than a run directory."""
    path = Path(path)
    return path.name.startswith(PREFIX) and ((path / "meta.json").is_file() or (path / MANIFEST).is_file())


def check(directory: Path) -> Verdict:
    """`directory` against its manifest; without one, meta.json says whether it was written before manifests existed."""
    directory = Path(directory)
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except FileNotFoundError:
        meta = None
    except (OSError, ValueError):
        meta = {"manifest": MANIFEST}  # unreadable: only the manifest can tell whether that is damage
    if meta is None and not (directory / MANIFEST).is_file():
        return Verdict("damaged", ("meta.json and manifest.json are missing",))
    return verify(directory, expects_manifest=meta is None or bool(meta.get("manifest")))


def resume(target: Path, load: Callable[[Path], dict[str, Any]]) -> Resumed:
    """Verify and `load` (a function of the checkpoint directory returning its meta) the checkpoint to resume from.

    `target` is one checkpoint (refused when damaged) or a run directory (its newest intact checkpoint; damaged newer
    ones are moved aside and named in `notes`). See the module docstring for checkpoints without a manifest."""
    target = Path(target)
    if is_checkpoint_dir(target):
        verdict = check(target)
        if verdict.status == "damaged":
            run_dir = target.parent.parent
            raise CheckpointError(
                f"the checkpoint {target} is damaged: {verdict.summary}. Resume from the run directory instead "
                f"(`cohort train --resume {run_dir}` starts from its newest intact checkpoint), or restore the file from a copy"
            )
        return Resumed(target, load(target), verdict, [])
    skipped: list[tuple[Path, str]] = []
    for path in reversed(_step_dirs(target)):
        verdict = check(path)
        if verdict.status == "damaged":
            skipped.append((path, verdict.summary))
            continue
        try:
            meta = load(path)
        except CheckpointError as exc:
            if verdict.status != "unverified":  # it matches its manifest: the problem is not damage (the config, say)
                raise
            skipped.append((path, f"it has no manifest (written before checkpoints were verified) and did not load: {exc}"))
            continue
        return Resumed(path, meta, verdict, [_set_aside(skipped, path)] if skipped else [])
    if skipped:
        named = "; ".join(f"{p.name}: {why}" for p, why in skipped)
        raise CheckpointError(
            f"{target} has no intact checkpoint to resume from ({named}). Restore the damaged files from a copy, "
            "or start the run again with a new run.output_dir"
        )
    raise CheckpointError(
        f"{target} has no complete checkpoint under {CHECKPOINTS}/ to resume from "
        "(checkpoints are written every run.save_every steps and when a run is stopped by a signal)"
    )


def _step_dirs(run_dir: Path) -> list[Path]:
    """Every `step-N` directory (complete or not), oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    found = [p for p in root.glob(f"{PREFIX}*") if p.is_dir() and p.name[len(PREFIX):].isdigit()] if root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def _set_aside(skipped: list[tuple[Path, str]], loaded: Path) -> str:
    """Rename the damaged checkpoints to `damaged-step-N` (pruning and later resumes ignore them); the line that says so."""
    moved = []
    for path, why in skipped:
        aside, n = path.with_name(DAMAGED_PREFIX + path.name), 1
        while aside.exists():  # set aside before (the same step damaged twice): both kept
            aside, n = path.with_name(f"{DAMAGED_PREFIX}{path.name}-{n}"), n + 1
        os.rename(path, aside)
        moved.append(f"{path.name} ({why}; kept as {aside})")
    return f"skipped damaged checkpoint {', '.join(moved)}; resuming from the newest intact one, {loaded.name}"


# --------------------------------------------------------------------------- reading


def load_checkpoint(saved: Checkpointed, directory: Path) -> dict[str, Any]:
    """Restore a trainer (built from the same config) to the state saved in `directory`; returns meta.json."""
    directory = Path(directory)
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {directory / 'meta.json'}: {exc}") from exc
    try:
        state = torch.load(directory / "state.pt", weights_only=True, map_location="cpu")  # (RNG states must be CPU tensors)
    except (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"cannot read {directory / 'state.pt'}: {exc}") from exc
    if state["batch"] is not None and meta.get("generation_batch_size") != saved.generation_batch_size:
        raise CheckpointError(
            f"{directory} was saved inside a generation batch of {meta.get('generation_batch_size')} completions but the "
            f"config now plans {saved.generation_batch_size}; resume with the batch settings of the original run"
        )
    parts = saved.parts
    if parts.lora is not None:  # LoRA: the base is model.path's; the adapter is read back
        try:
            parts.lora.load_adapter(directory / "model")
        except (OSError, ValueError) as exc:
            raise CheckpointError(str(exc)) from exc
    else:
        load_weights(parts.policy, directory / "model")
    for name, part_state in _part_states(state):
        if name not in saved.stateful:
            raise CheckpointError(f"{directory} holds state for trainer part {name!r}, which this trainer does not have")
        saved.stateful[name].load_state_dict(part_state)
    saved.state.load_state_dict(state, parts.device)  # (the engine is taken to hold none of these weights)
    if "sync_check" not in state["parts"] and state.get("canary"):  # a checkpoint from before the calibrated check
        saved.stateful["sync_check"].canaries = [tuple(state["canary"])]
    set_rng_state(state["rng"])
    return meta


def _part_states(state: dict[str, Any]) -> list[tuple[str, Any]]:
    """state.pt's part states under this trainer's part names: older names renamed (`RENAMED_PARTS`), and the generation
    index of a checkpoint that saved it beside the counters put into the rollout scheduler's state."""
    parts = [(RENAMED_PARTS.get(name, name), part_state) for name, part_state in state["parts"].items()]
    if "generation_index" not in state:
        return parts
    old = {"generation_index": state["generation_index"]}  # (before the scheduler saved its own generation index)
    if not any(name == "rollout" for name, _ in parts):
        parts.append(("rollout", {}))
    return [(name, {**part_state, **old} if name == "rollout" else part_state) for name, part_state in parts]


def load_weights(model: torch.nn.Module, directory: Path) -> None:
    """Load every *.safetensors file of a transformers checkpoint into `model` in place; tied weights may be absent."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no .safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except Exception as exc:  # safetensors raises its own SafetensorError (an Exception) for a damaged file
            raise CheckpointError(f"cannot read {f}: {type(exc).__name__}: {exc}") from exc
    missing, unexpected = model.load_state_dict(weights, strict=False)
    current = model.state_dict()
    loaded_storage = {current[name].data_ptr() for name in weights if name in current}
    untied_missing = [name for name in missing if current[name].data_ptr() not in loaded_storage]
    if untied_missing or unexpected:
        raise CheckpointError(f"{directory}: weights do not match the model (missing {untied_missing[:5]}, unexpected {unexpected[:5]})")


def truncate_logs(run_dir: Path, step: int) -> dict[str, int]:
    """Drop records after `step` from the run's JSONL logs (a killed run may have logged past its last checkpoint).

    Returns how many lines were dropped per file. A torn last line (killed mid-write) is dropped too.
    """
    dropped = {}
    for name in LOGS_WITH_STEPS:
        path = Path(run_dir) / name
        if not path.is_file():
            continue
        kept, lost = [], 0
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                lost += 1
                continue
            if isinstance(record, dict) and int(record.get("step", 0)) <= step:
                kept.append(line)
            else:
                lost += 1
        if lost:
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            os.replace(tmp, path)
        dropped[name] = lost
    return dropped


# --------------------------------------------------------------------------- disk space


def checkpoint_bytes(model: torch.nn.Module) -> int:
    """Approximate size of one checkpoint: the weights once, plus AdamW's two moments (same dtype as the weights)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size() * (3 if p.requires_grad else 1)
    return total


def check_disk_space(run_dir: Path, model: torch.nn.Module, keep: int, save_every: int) -> None:
    """Fail before training when the run directory's disk cannot hold the checkpoints and the final model."""
    one = checkpoint_bytes(model)
    weights = sum(p.numel() * p.element_size() for p in {p.data_ptr(): p for p in model.parameters()}.values())
    count = (keep + 1) if save_every else 1  # one more than kept exists while the newest is written
    need = count * one + weights
    free = shutil.disk_usage(run_dir).free
    if free < need:
        raise CheckpointError(
            f"run.output_dir = {str(run_dir)!r} has {free / 2**30:.2f} GiB free but this run needs about {need / 2**30:.2f} GiB "
            f"({count} checkpoint(s) of {one / 2**30:.2f} GiB: weights + AdamW moments, plus the final model); "
            "free space, lower run.keep_checkpoints, or choose another run.output_dir"
        )
