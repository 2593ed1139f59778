"""The one reader of a run's JSON Lines files: a torn last line is skipped with a warning, a bad line before it is an
error naming the file and the line."""

from __future__ import annotations

import pytest

from cohort.runs.jsonl import RunFileError, read_jsonl


def test_a_torn_last_line_is_skipped_with_a_warning_naming_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "rew')  # killed while writing step 3: line 3 is cut
    with pytest.warns(RuntimeWarning, match=r"metrics.jsonl line 3: a torn last line"):
        assert read_jsonl(path) == [{"step": 1}, {"step": 2}]


def test_a_bad_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text('{"step": 1}\n\n{"step": 2,\n{"step": 3}\n')  # line 3 (after a blank line 2) is not JSON
    with pytest.raises(RunFileError, match=r"eval.jsonl line 3: not JSON"):
        read_jsonl(path)
    path.write_text('{"step": 1}\n[1, 2]\n{"step": 3}\n')  # JSON, but a list: not a record
    with pytest.raises(RunFileError, match=r"eval.jsonl line 2: a JSON list, not an object"):
        read_jsonl(path)


def test_blank_lines_and_a_missing_file_read_as_no_records(tmp_path):
    path = tmp_path / "completions.jsonl"
    path.write_text('\n{"step": 1, "prompt": "2+2="}\n\n')
    assert read_jsonl(path) == [{"step": 1, "prompt": "2+2="}]
    assert read_jsonl(tmp_path / "absent.jsonl") == []
