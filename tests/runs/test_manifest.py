"""Checkpoint manifests: each kind of damage is named, a run directory falls back to its newest intact checkpoint,
an explicitly named damaged checkpoint is refused, and checkpoints from before manifests still resume.

The checkpoints here are directories laid out as `save_checkpoint` writes them (model/model.safetensors, state.pt,
meta.json, then manifest.json), with small files, and `resume` gets a fake loader that records what it was asked to
load; tests/trainer/test_checkpoint.py resumes a real damaged run end to end.
"""

from __future__ import annotations

import hashlib
import json
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from cohort.distributed.fsdp import LocalContext
from cohort.trainer import checkpoint, failure
from cohort.runs.manifest import MANIFEST, verify, write_manifest

WEIGHTS = "model/model.safetensors"


def fake_checkpoint(run_dir: Path, step: int, *, manifest: bool = True) -> Path:
    """checkpoints/step-N as save_checkpoint lays it out; `manifest=False`: as written before manifests existed."""
    directory = checkpoint.checkpoint_dir(run_dir, step)
    (directory / "model").mkdir(parents=True)
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(directory / WEIGHTS))
    torch.save({"step": step}, directory / "state.pt")
    meta = {"step": step, "policy_version": step, **({"manifest": MANIFEST} if manifest else {})}
    (directory / "meta.json").write_text(json.dumps(meta))
    if manifest:
        write_manifest(directory)
    return directory


class Loader:
    """A fake `load`: records each directory; raises CheckpointError for those in `fails`, else returns its meta.json."""

    def __init__(self, fails: tuple[Path, ...] = ()):
        self.calls, self.fails = [], fails

    def __call__(self, path: Path) -> dict:
        self.calls.append(path)
        if path in self.fails:
            raise checkpoint.CheckpointError(f"cannot read {path / WEIGHTS}: incomplete metadata")
        return json.loads((path / "meta.json").read_text())


# --------------------------------------------------------------------------- the manifest


def test_the_manifest_lists_every_file_with_size_and_sha256(tmp_path):
    ckpt = fake_checkpoint(tmp_path, 1)
    entries = json.loads((ckpt / MANIFEST).read_text())["files"]
    assert sorted(entries) == ["meta.json", WEIGHTS, "state.pt"]  # every file but the manifest itself; no temp name left
    weights = (ckpt / WEIGHTS).read_bytes()
    assert entries[WEIGHTS] == {"bytes": len(weights), "sha256": hashlib.sha256(weights).hexdigest()}
    assert not list(ckpt.glob(".manifest*"))
    assert checkpoint.check(ckpt).status == "intact"


def test_truncated_weights_are_named_with_both_sizes(tmp_path):
    ckpt = fake_checkpoint(tmp_path, 1)
    size = (ckpt / WEIGHTS).stat().st_size
    with (ckpt / WEIGHTS).open("r+b") as fh:
        fh.truncate(100)
    verdict = checkpoint.check(ckpt)
    assert verdict.status == "damaged"
    assert verdict.problems == (f"{WEIGHTS} is 100 bytes, the manifest says {size} (truncated)",)


def test_a_missing_file_is_named(tmp_path):
    ckpt = fake_checkpoint(tmp_path, 1)
    (ckpt / "state.pt").unlink()
    assert checkpoint.check(ckpt).problems == ("state.pt is missing",)


def test_a_new_checkpoint_without_its_manifest_is_damaged(tmp_path):
    ckpt = fake_checkpoint(tmp_path, 1)
    (ckpt / MANIFEST).unlink()  # meta.json says a manifest was written: its absence is damage, not an old format
    verdict = checkpoint.check(ckpt)
    assert verdict.status == "damaged"
    assert verdict.problems == (f"{MANIFEST} is missing (the write did not finish, or the file was removed)",)


def test_changed_bytes_of_the_same_size_fail_the_hash(tmp_path):
    ckpt = fake_checkpoint(tmp_path, 1)
    data = bytearray((ckpt / WEIGHTS).read_bytes())
    data[-1] ^= 0xFF  # the last byte of the last float: same size, different contents
    (ckpt / WEIGHTS).write_bytes(bytes(data))
    assert checkpoint.check(ckpt).problems == (f"{WEIGHTS}: the sha256 differs from the manifest's (same size, changed contents)",)


def test_an_unreadable_manifest_is_damage_and_a_checkpoint_from_before_manifests_is_unverified(tmp_path):
    ckpt = fake_checkpoint(tmp_path, 1)
    (ckpt / MANIFEST).write_text('{"files": {')  # torn
    assert checkpoint.check(ckpt).problems[0].startswith(f"{MANIFEST} is unreadable")
    old = fake_checkpoint(tmp_path, 2, manifest=False)
    assert checkpoint.check(old).status == "unverified"
    assert verify(old, expects_manifest=True).status == "damaged"


# --------------------------------------------------------------------------- choosing the checkpoint to resume from


def test_a_run_directory_falls_back_to_the_newest_intact_checkpoint(tmp_path):
    step2, step4 = fake_checkpoint(tmp_path, 2), fake_checkpoint(tmp_path, 4)
    size = (step4 / WEIGHTS).stat().st_size
    with (step4 / WEIGHTS).open("r+b") as fh:
        fh.truncate(10)
    load = Loader()
    resumed = checkpoint.resume(tmp_path, load)
    assert load.calls == [step2] and resumed.path == step2 and resumed.meta["step"] == 2
    aside = tmp_path / "checkpoints" / "damaged-step-000004"
    assert resumed.notes == [
        f"skipped damaged checkpoint step-000004 ({WEIGHTS} is 10 bytes, the manifest says {size} (truncated); kept as {aside}); "
        "resuming from the newest intact one, step-000002"
    ]
    assert aside.is_dir() and not step4.exists()  # set aside: pruning keeps counting intact checkpoints only
    assert checkpoint.list_checkpoints(tmp_path) == [step2]
    (fake_checkpoint(tmp_path, 4) / "state.pt").unlink()  # step 4 saved again and damaged again: both copies kept
    checkpoint.resume(tmp_path, load)
    assert aside.is_dir() and aside.with_name("damaged-step-000004-1").is_dir()


def test_a_named_damaged_checkpoint_is_refused_without_falling_back(tmp_path):
    fake_checkpoint(tmp_path, 2)
    step4 = fake_checkpoint(tmp_path, 4)
    (step4 / "state.pt").unlink()
    load = Loader()
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.resume(step4, load)
    assert str(err.value).startswith(f"the checkpoint {step4} is damaged: state.pt is missing. Resume from the run directory")
    assert f"cohort train --resume {tmp_path}" in str(err.value)
    assert load.calls == [] and step4.is_dir()


def test_no_intact_checkpoint_names_each_and_the_fix(tmp_path):
    step1, step2 = fake_checkpoint(tmp_path, 1), fake_checkpoint(tmp_path, 2)
    (step1 / MANIFEST).unlink()
    (step2 / WEIGHTS).unlink()
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.resume(tmp_path, Loader())
    message = str(err.value)
    assert f"step-000002: {WEIGHTS} is missing; step-000001: {MANIFEST} is missing" in message
    assert message.endswith("Restore the damaged files from a copy, or start the run again with a new run.output_dir")


def test_checkpoints_from_before_manifests_load_unverified_and_fall_back_when_they_do_not_load(tmp_path):
    old1, old2 = fake_checkpoint(tmp_path, 1, manifest=False), fake_checkpoint(tmp_path, 2, manifest=False)
    load = Loader(fails=(old2,))
    resumed = checkpoint.resume(tmp_path, load)
    assert load.calls == [old2, old1] and resumed.path == old1 and resumed.verdict.status == "unverified"
    assert "step-000002 (it has no manifest (written before checkpoints were verified) and did not load: cannot read" in resumed.notes[0]


def test_an_intact_checkpoint_that_does_not_load_is_not_skipped(tmp_path):
    """Matching its manifest, the checkpoint is not damaged: the load error (a config mismatch, say) is the user's to see."""
    fake_checkpoint(tmp_path, 1)
    step2 = fake_checkpoint(tmp_path, 2)
    with pytest.raises(checkpoint.CheckpointError, match="incomplete metadata"):
        checkpoint.resume(tmp_path, Loader(fails=(step2,)))
    assert step2.is_dir()


def test_a_failure_before_the_first_step_names_the_checkpoints_already_saved(tmp_path):
    latest = fake_checkpoint(tmp_path, 3)
    saved = types.SimpleNamespace(parts=types.SimpleNamespace(run_dir=tmp_path, dist=LocalContext()),  # (a Checkpointed)
                                  state=types.SimpleNamespace(step=0))
    assert failure._save_last_good_state(saved, "complete") == (
        f"Nothing new saved (no step completed in this process); the checkpoints already saved are unchanged, the newest "
        f"is {latest}. Fix the cause, then resume with: cohort train --resume {tmp_path}"
    )
