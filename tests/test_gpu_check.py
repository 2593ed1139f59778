"""bench/gpu_check.py cannot waste a lent GPU's run: each part's JSON is on disk as soon as the part ends, and a part
that raises is recorded while the next one still runs (before, the JSON was written once at the end, so a part dying
after a minute, as the 0.5B part did on transformers 5.17, left nothing)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_part_is_written_as_it_ends_and_a_failing_part_does_not_stop_the_next(tmp_path):
    gpu_check = _gpu_check()
    seen_on_disk = []

    def fails():
        raise TypeError("ContinuousBatchingConfig.__init__() got an unexpected keyword argument 'page_size'")

    def second():
        seen_on_disk.append(sorted(p.name for p in tmp_path.iterdir()))  # what a killed run would have left
        return {"steps": 2}

    doc = gpu_check.run_parts({"big": fails, "demo": second}, tmp_path, {"device": "cpu"})
    assert seen_on_disk == [["big.json", "summary.json"]]
    big = json.loads((tmp_path / "big.json").read_text())
    assert big["error"].startswith("TypeError: ContinuousBatchingConfig") and "Traceback" in big["traceback"]
    assert json.loads((tmp_path / "demo.json").read_text())["steps"] == 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) == {"device", "big", "demo"} and doc["demo"]["steps"] == 2


def test_the_allocator_peak_is_kept_per_phase():
    # A fake allocator: `read` returns the peak since the last reset; each phase's entry and exit ends a window. The
    # trace, by hand: before "generate" opens, 100 -> outside; generate's window 700 -> generate; between the phases 20
    # -> outside; "update" encloses a nested "logprob": update's first window 300 -> update, logprob's 900 -> logprob,
    # the rest of update's 500 -> update (max 500); after it, the final mark's 50 -> outside (max(100, 20, 50) = 100).
    gpu_check = _gpu_check()
    windows = iter([100, 700, 20, 300, 900, 500, 50])
    resets = []
    phases = gpu_check.PhasePeaks(lambda: next(windows), lambda: resets.append(1))
    with phases("generate"):
        pass
    with phases("update"):
        with phases("logprob"):
            pass
    phases.mark()
    assert phases.peaks == {"outside": 100, "generate": 700, "update": 500, "logprob": 900}
    assert len(resets) == 7 and set(phases.pop()) == {"timing/generate_s", "timing/update_s", "timing/logprob_s"}
