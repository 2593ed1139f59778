"""A checkpoint's manifest: every file it holds with its size and sha256, written last, checked before a resume.

`manifest.json` lists each file of the checkpoint directory (relative path, bytes,
sha256) and is written after every other file is complete, under a temporary name
that is renamed into place, so its presence says the write finished and its
contents say what the write produced. A checkpoint damaged afterwards (a file
truncated by a full disk or a copy cut short, a file removed, bits changed) no
longer matches it, and `verify` names the file and what differs.

sha256 (hashlib, no new dependency): measured 1.2 GB/s on this 2-core machine
under load (blake2b 0.6, md5 0.65, a plain read 5 GB/s), so a 1 GB checkpoint
costs under a second to hash when written and again when resumed from; a cheaper
non-cryptographic hash would need a new dependency for a cost that is small next
to writing the files.

Left out: files that are in the directory but not in the manifest are not
reported (a note a person put there is not damage), and the manifest does not
sign anything: it detects damage, not tampering.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

MANIFEST = "manifest.json"
HASH = "sha256"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What `verify` found: `intact` (matches its manifest), `unverified` (written before manifests), or `damaged`."""

    status: str
    problems: tuple[str, ...] = ()

    @property
    def summary(self) -> str:
        """The problems in one line; the first three named, the rest counted."""
        shown = "; ".join(self.problems[:3])
        more = len(self.problems) - 3
        return shown + (f"; and {more} more" if more > 0 else "")


def file_hash(path: Path, algorithm: str = HASH) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, algorithm).hexdigest()


def write_manifest(directory: Path) -> Path:
    """List every file under `directory` (size, sha256) in `directory/manifest.json`, written atomically; returns its path."""
    directory = Path(directory)
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST and not p.name.startswith(f".{MANIFEST}"))
    entries = {p.relative_to(directory).as_posix(): {"bytes": p.stat().st_size, HASH: file_hash(p)} for p in files}
    tmp = directory / f".{MANIFEST}.tmp"
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump({"hash": HASH, "files": entries}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    final = directory / MANIFEST
    os.replace(tmp, final)
    return final


def verify(directory: Path, *, expects_manifest: bool) -> Verdict:
    """Check `directory` against its manifest. `expects_manifest`: the checkpoint was written by code that writes one
    (its meta.json says so, or meta.json itself is gone), so a missing manifest is damage rather than an older format."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        if expects_manifest:
            return Verdict("damaged", (f"{MANIFEST} is missing (the write did not finish, or the file was removed)",))
        return Verdict("unverified")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        entries = manifest["files"]
        algorithm = manifest.get("hash", HASH)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Verdict("damaged", (f"{MANIFEST} is unreadable ({exc})",))
    problems = _size_problems(directory, entries)
    if not problems:  # sizes first (cheap); hashes only when every size matches
        problems = [f"{name}: the {algorithm} differs from the manifest's (same size, changed contents)"
                    for name, entry in entries.items() if file_hash(directory / name, algorithm) != entry.get(algorithm)]
    return Verdict("damaged", tuple(problems)) if problems else Verdict("intact")


def _size_problems(directory: Path, entries: dict) -> list[str]:
    problems = []
    for name, entry in entries.items():
        file = directory / name
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif (size := file.stat().st_size) != entry["bytes"]:
            kind = "truncated" if size < entry["bytes"] else "longer than written"
            problems.append(f"{name} is {size} bytes, the manifest says {entry['bytes']} ({kind})")
    return problems

