"""`cohort convert` on a corpus of real launch scripts and configs of the peers (tests/convert/corpus, sources and
licences in its manifest.json): every file converts without a traceback into valid YAML; every option it sets is
accounted for (mapped, with its key=value on the line it became; or listed as not mapped, with a reason that is
not the generic "unknown"); and `cohort plan`'s config checks either accept the output or refuse it with reasons
that the output already states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cohort.config import CohortConfig, ConfigError
from cohort.convert.core import convert_input, render
from cohort.convert.sources import detect, read_trl, read_trl_command, read_verl
from cohort.plan.validate import validate_config
from tests.convert.test_examples import named_where

CORPUS = Path(__file__).resolve().parent / "corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
FILES = sorted(p for p in CORPUS.glob("*/*") if p.suffix in (".sh", ".yaml", ".yml", ".json"))
ENV = {"HOME": "/home/user"}  # the scripts' $HOME; nothing else from this machine's environment


def _options(path: Path) -> dict:
    kind = detect([str(path)])
    if kind == "trl":
        return read_trl(str(path))
    return (read_trl_command if kind == "trl_command" else read_verl)([str(path)], ENV)[0]


def test_the_corpus_is_real_and_attributed():
    listed = {entry["file"]: entry for entry in MANIFEST}
    assert sorted(listed) == [str(p.relative_to(CORPUS)) for p in FILES]
    assert len(FILES) >= 40
    for entry in MANIFEST:
        assert entry["repo"] in ("volcengine/verl", "huggingface/trl", "huggingface/open-r1"), entry
        assert len(entry["commit"]) == 40 and entry["path"] and entry["licence"] == "Apache-2.0", entry
    peers = {entry["file"].split("/")[0] for entry in MANIFEST}
    assert peers == {"verl", "trl", "open-r1"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_option_is_mapped_or_refused_with_its_reason(path):
    conversion = convert_input([str(path)], environ=ENV)
    text = render(conversion)
    tree = yaml.safe_load(text)  # valid YAML, whatever the values (multi-line prompts, unset variables)
    assert tree == conversion.tree()  # and what it holds is what the conversion set
    unmapped = {u.key: u for u in conversion.unmapped}
    options = _options(path)
    assert options, "nothing read"
    for key in options:
        places = set(named_where(text, key))
        if key in unmapped and unmapped[key].reason.startswith("partly:"):
            assert places == {"mapped", "not mapped"}, (key, places)
        elif key in unmapped:
            assert places == {"not mapped"}, (key, places)
        else:
            assert places == {"mapped"}, (key, places)
    for item in conversion.unmapped:
        assert "not among the" not in item.reason, f"{item.key}: refused without a reason"
        assert len(item.reason) > 20, item


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_cohort_plan_accepts_each_output_or_refuses_it_for_reasons_the_output_states(path):
    text = render(convert_input([str(path)], environ=ENV))
    cfg = CohortConfig.model_validate(yaml.safe_load(text))
    try:
        validate_config(cfg, check_files=False)  # the config checks of `cohort plan`; the model and data are elsewhere
    except ConfigError as exc:
        missing = [p for p in exc.problems if p not in text]
        assert not missing, missing


def test_the_cli_converts_every_file_without_a_traceback(tmp_path, capsys, monkeypatch):
    from cohort.cli import main

    monkeypatch.setenv("HOME", ENV["HOME"])
    for path in FILES:
        out = tmp_path / f"{path.stem}.yaml"
        assert main(["convert", str(path), "-o", str(out)]) == 0, path
        err = capsys.readouterr().err
        assert "Traceback" not in err and yaml.safe_load(out.read_text()), path
