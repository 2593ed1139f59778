"""code_tests: code extraction, test splitting, and scoring MBPP-style rows."""

import pytest

from cohort.rewards import RewardError, RewardSet, get
from cohort.rewards.code import extract_code, split_tests
from cohort.rewards.sandbox import SandboxUnavailable


@pytest.fixture(scope="module")
def code_tests():
    try:
        reward = get("code_tests", run_timeout_s=2.0, max_parallel=4)
    except SandboxUnavailable as exc:
        pytest.fail(f"no sandbox here: {exc}; this project's machines (root, unshare, cgroups) must provide one — a skip would hide every hostile-program test")
    yield reward
    reward.close()


def test_extract_code():
    text = "Try:\n```python\nx = 1\n```\nBetter:\n```Python\nx = 2\n```\nDone."
    assert extract_code(text) == "x = 2\n"
    assert extract_code("```\ny = 3\n```") == "y = 3\n"  # unlabelled fence
    assert extract_code("```js\nlet a;\n```\n```py\nz = 4\n```") == "z = 4\n"
    assert extract_code("def f():\n    return 1") == "def f():\n    return 1"  # no fence: whole text


def test_split_tests():
    assert split_tests(["assert f(1) == 1", "assert f(2) == 2"]) == ["assert f(1) == 1", "assert f(2) == 2"]
    source = "import math\nassert f(1) == 1\nx = f(2)\nassert x == 2\nprint('done')"
    assert split_tests(source) == ["import math\nassert f(1) == 1", "x = f(2)\nassert x == 2", "print('done')"]
    humaneval = "def check(candidate):\n    assert candidate(1) == 1\n\ncheck(f)"
    assert len(split_tests(humaneval)) == 1
    assert split_tests([]) is None and split_tests(None) is None and split_tests("") is None
    assert split_tests("assert (") is None and split_tests(["assert f(", "assert 1"]) is None
    import numpy as np

    assert split_tests(np.array(["assert 1", "assert 2"])) == ["assert 1", "assert 2"]  # from parquet


# Three MBPP-style rows (task 2 of MBPP: similar elements of two tuples), as the model might answer.
MBPP_TESTS = [
    "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
    "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
    "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)",
]
CORRECT = """Here is my solution.
```python
def similar_elements(test_tup1, test_tup2):
    return tuple(sorted(set(test_tup1) & set(test_tup2)))
```
"""
UNSORTED = "```python\ndef similar_elements(a, b):\n    return tuple(x for x in a if x in b)\n```"
BROKEN = "```python\ndef similar_elements(a, b)\n    return ()\n```"  # syntax error


@pytest.mark.slow
def test_scores_mbpp_rows(code_tests):
    chat = [{"role": "assistant", "content": CORRECT}]
    completions = [CORRECT, chat, UNSORTED, BROKEN, "```python\nwhile True: pass\n```", CORRECT]
    tests = [MBPP_TESTS] * 5 + [[]]
    scores = code_tests(prompts=[""] * 6, completions=completions, completion_ids=[[]] * 6, tests=tests)
    # UNSORTED keeps the order of the first tuple: (4, 5) ✓, (3, 4) ✓, (14, 13) ≠ (13, 14) ✗ → 2/3
    assert scores == [1.0, 1.0, pytest.approx(2 / 3), 0.0, 0.0, None]


def test_string_tests_and_setup_column(code_tests):
    reward = get("code_tests", tests_column="test", setup_column="test_setup_code", run_timeout_s=2.0)
    try:
        scores = reward(
            completions=["def f(x):\n    return SCALE * x"] * 2,
            test=["assert f(1) == 10\nassert f(2) == 20", "assert f(1) == 1"],
            test_setup_code=["SCALE = 10", "SCALE = 10"],
        )
    finally:
        reward.close()
    assert scores == [1.0, 0.0]


def test_missing_column_is_a_reward_error(code_tests):
    from cohort.rewards import RewardEntry

    with RewardSet([RewardEntry("code_tests", code_tests)]) as rs:
        with pytest.raises(RewardError, match="tests column 'tests'"):
            rs.score(prompts=["p"], completions=["x = 1"], completion_ids=[[1]], columns={"test_list": [["assert 1"]]})


def test_through_from_specs():
    try:
        rs = RewardSet.from_specs([{"name": "code_tests", "tests_column": "test_list", "run_timeout_s": 2.0}])
    except SandboxUnavailable as exc:
        pytest.fail(f"no sandbox here: {exc}; this project's machines (root, unshare, cgroups) must provide one — a skip would hide every hostile-program test")
    with rs:
        out = rs.score(
            prompts=["p", "p"],
            completions=[CORRECT, BROKEN],
            completion_ids=[[1], [1]],
            columns={"test_list": [MBPP_TESTS, MBPP_TESTS]},
            group_size=2,
        )
    assert out.total.tolist() == [1.0, 0.0]
