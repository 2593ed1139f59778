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


def test_migrating_option_tables_are_generated_from_the_mapping_tables():
    from cohort.convert.option_tables import markers, render as render_tables

    page = (README.parent / "docs" / "migrating.md").read_text()
    assert all(markers(kind)[0] in page and markers(kind)[1] in page for kind in ("verl", "trl"))
    assert render_tables(page) == page, "docs/migrating.md option tables are stale: run `.venv/bin/python -m cohort.docs`"
