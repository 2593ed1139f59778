"""The README's configuration reference is generated from the config declarations and must match them."""

from pathlib import Path

from cohort.docs import render

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_config_reference_is_current():
    text = README.read_text()
    assert render(text) == text, "README config reference is stale: run `.venv/bin/python -m cohort.docs`"


def test_ci_runs_the_readme_test_command():
    ci = (README.parent / ".ci" / "run").read_text()
    assert "make test" in README.read_text() and ci.strip().endswith("make test")
