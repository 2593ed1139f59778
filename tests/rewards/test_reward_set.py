"""RewardSet: concurrency, failure policy, contract checks, aggregation, metrics."""

import asyncio
import math
import threading
import time

import numpy as np
import pytest

from cohort.rewards import RewardEntry, RewardError, RewardRowError, RewardSet, aggregate


def const(value):
    def reward(completions, **kwargs):
        return [value] * len(completions)

    return reward


def batch(n=4):
    return dict(
        prompts=[f"p{i}" for i in range(n)],
        completions=[f"c{i}" for i in range(n)],
        completion_ids=[[1] * (i + 1) for i in range(n)],
    )


def test_from_specs_names_weights_and_scores():
    specs = [
        {"name": "numeric_match"},
        {"name": "numeric_match", "weight": 0.5, "position": "first"},
        {"name": "soft_overlong", "max_completion_length": 4, "cache_length": 2, "alias": "length"},
    ]
    with RewardSet.from_specs(specs) as rs:
        assert rs.names == ["numeric_match", "numeric_match_2", "length"]
        assert rs.weights == [1.0, 0.5, 1.0]
        out = rs.score(
            prompts=["q"] * 4,
            completions=["1 then 2", "2 then 1", "3", "x"],
            completion_ids=[[0], [0, 0], [0, 0, 0], [0] * 5],
            columns={"answer": ["2", "2", "3", "none"]},
            group_size=2,
        )
    # soft_overlong with L=4, C=2: lengths 1,2 → 0; 3 → (2-3)/2 = -0.5; 5 → -1
    expected = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, -0.5], [np.nan, np.nan, -1.0]])
    np.testing.assert_array_equal(out.per_function, expected)
    # totals: 1 + 0.5*0 + 0 = 1; 0 + 0.5 + 0 = 0.5; 1 + 0.5 - 0.5 = 1; only length scored: -1
    np.testing.assert_array_equal(out.total, [1.0, 0.5, 1.0, -1.0])
    assert out.per_function.dtype == np.float64 and out.per_function.shape == (4, 3)
    assert out.metrics["rewards/numeric_match/mean"] == pytest.approx(2 / 3)
    assert out.metrics["rewards/numeric_match/errors"] == 0.0
    assert out.metrics["timing/reward/length_s"] >= 0.0


def test_total_is_nan_only_when_nothing_scored():
    def none_for_first(completions, **kwargs):
        return [None] + [1.0] * (len(completions) - 1)

    with RewardSet([RewardEntry("a", none_for_first), RewardEntry("b", const(None))]) as rs:
        out = rs.score(**batch(3))
    assert math.isnan(out.total[0]) and list(out.total[1:]) == [1.0, 1.0]
    assert math.isnan(out.metrics["rewards/b/mean"]) and math.isnan(out.metrics["rewards/b/std"])


def test_metrics_std_is_bessel_corrected():
    def values(completions, **kwargs):
        return [0.0, 1.0, None, 2.0]

    with RewardSet([RewardEntry("v", values)]) as rs:
        out = rs.score(**batch(4))
    # non-NaN entries 0, 1, 2: mean 1, sample variance ((1 + 0 + 1) / 2) = 1
    assert out.metrics["rewards/v/mean"] == 1.0 and out.metrics["rewards/v/std"] == 1.0


def test_async_and_sync_functions_run_concurrently():
    started = []

    async def slow_async(completions, **kwargs):
        started.append(time.perf_counter())
        await asyncio.sleep(0.4)
        return [1.0] * len(completions)

    def slow_sync(completions, **kwargs):
        started.append(time.perf_counter())
        time.sleep(0.4)
        return [2.0] * len(completions)

    entries = [RewardEntry(f"a{i}", slow_async) for i in range(3)] + [
        RewardEntry(f"s{i}", slow_sync) for i in range(3)
    ]
    with RewardSet(entries) as rs:
        start = time.perf_counter()
        out = rs.score(**batch())
        elapsed = time.perf_counter() - start
    assert elapsed < 1.2  # six 0.4 s calls in series would take 2.4 s
    assert out.total.tolist() == [9.0] * 4


def test_max_concurrency_caps_calls_in_flight():
    in_flight = 0
    peak = 0
    lock = threading.Lock()

    def tracked(completions, **kwargs):
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.05)
        with lock:
            in_flight -= 1
        return [0.0] * len(completions)

    with RewardSet([RewardEntry(f"t{i}", tracked) for i in range(6)], max_concurrency=2) as rs:
        rs.score(**batch())
    assert peak == 2


def test_columns_are_passed_through():
    seen = {}

    def spy(prompts, completions, completion_ids, **columns):
        seen.update(columns, prompts=prompts, ids=completion_ids)
        return [0.0] * len(completions)

    with RewardSet([RewardEntry("spy", spy)]) as rs:
        rs.score(**batch(2), columns={"answer": ["1", "2"], "level": [3, 4]})
    assert seen["answer"] == ["1", "2"] and seen["level"] == [3, 4] and seen["prompts"] == ["p0", "p1"]
    with RewardSet([RewardEntry("spy", spy)]) as rs:
        with pytest.raises(ValueError, match="one entry per completion"):
            rs.score(**batch(2), columns={"answer": ["1"]})
        with pytest.raises(ValueError, match="clash"):
            rs.score(**batch(2), columns={"completions": ["1", "2"]})


def test_raise_policy_names_function_exception_and_completion():
    def broken(completions, **kwargs):
        raise ZeroDivisionError("division by zero")

    with RewardSet([RewardEntry("ok", const(1.0)), RewardEntry("broken", broken)]) as rs:
        with pytest.raises(RewardError) as info:
            rs.score(**batch())
    message = str(info.value)
    assert "'broken'" in message and "ZeroDivisionError: division by zero" in message and "'c0'" in message


def test_row_error_points_at_the_offending_completion():
    def picky(completions, **kwargs):
        raise RewardRowError(2, "cannot read this one")

    with RewardSet([RewardEntry("picky", picky)]) as rs:
        with pytest.raises(RewardError, match=r"completion\[2\]: 'c2'"):
            rs.score(**batch())


def test_long_completion_is_truncated_in_the_error():
    def broken(completions, **kwargs):
        raise ValueError("nope")

    with RewardSet([RewardEntry("broken", broken)]) as rs:
        with pytest.raises(RewardError) as info:
            rs.score(prompts=["p"], completions=["x" * 10_000], completion_ids=[[1]])
    assert len(str(info.value)) < 1000 and "more characters" in str(info.value)


def test_none_policy_counts_errors_and_keeps_other_functions():
    def broken(completions, **kwargs):
        raise RuntimeError("flaky")

    entries = [RewardEntry("ok", const(1.0)), RewardEntry("flaky", broken, on_error="none")]
    with RewardSet(entries) as rs:
        out = rs.score(**batch())
    assert np.isnan(out.per_function[:, 1]).all()
    assert out.total.tolist() == [1.0] * 4
    assert out.metrics["rewards/flaky/errors"] == 4.0 and out.metrics["rewards/ok/errors"] == 0.0


def test_timeouts_async_and_sync():
    async def hangs(completions, **kwargs):
        await asyncio.sleep(30)

    def sleeps(completions, **kwargs):
        time.sleep(2)
        return [0.0] * len(completions)

    with RewardSet([RewardEntry("hangs", hangs)], timeout_s=0.2) as rs:
        start = time.perf_counter()
        with pytest.raises(RewardError, match=r"'hangs' failed: TimeoutError"):
            rs.score(**batch())
        assert time.perf_counter() - start < 2
    spec_timeout = RewardEntry("sleeps", sleeps, on_error="none", timeout_s=0.2)
    with RewardSet([spec_timeout, RewardEntry("ok", const(0.5))]) as rs:
        start = time.perf_counter()
        out = rs.score(**batch())
        assert time.perf_counter() - start < 1.5
    assert out.metrics["rewards/sleeps/errors"] == 4.0 and out.total.tolist() == [0.5] * 4


@pytest.mark.parametrize(
    "returned, match",
    [
        ([1.0, 1.0], r"returned 2 values for 4 completions"),
        (None, r"returned a NoneType for 4 completions"),
        ([1.0, float("nan"), 0.0, 0.0], r"returned the non-finite value nan at index 1"),
        ([1.0, 0.0, float("inf"), 0.0], r"returned the non-finite value inf at index 2"),
        ([1.0, "yes", 0.0, 0.0], r"returned a str \('yes'\) at index 1"),
    ],
)
def test_contract_violations_always_raise(returned, match):
    def bad(completions, **kwargs):
        return returned

    with RewardSet([RewardEntry("bad", bad, on_error="none")]) as rs:
        with pytest.raises(RewardError, match=r"'bad' " + match):
            rs.score(**batch())


def test_accepts_numpy_and_bool_outputs():
    def arr(completions, **kwargs):
        return np.array([1, 0, 1, 0])

    def flags(completions, **kwargs):
        return [True, False, None, np.float32(0.5)]

    with RewardSet([RewardEntry("arr", arr), RewardEntry("flags", flags)]) as rs:
        out = rs.score(**batch())
    np.testing.assert_array_equal(out.per_function, [[1, 1], [0, 0], [1, np.nan], [0, 0.5]])


def test_sum_then_normalize_by_hand():
    per_function = np.array([[1.0, np.nan], [0.0, 2.0], [np.nan, np.nan]])
    # row 0: 2*1 (second is None); row 1: 2*0 + 0.5*2 = 1; row 2: nothing scored → NaN
    total = aggregate(per_function, [2.0, 0.5], "sum_then_normalize", 1)
    assert total[0] == 2.0 and total[1] == 1.0 and math.isnan(total[2])


def test_normalize_then_sum_by_hand():
    # two groups of 3; function a = [1, 0, 0 | 1, 1, 1], function b = [2, 4, None | 5, None, None]
    per_function = np.array([[1, 2], [0, 4], [0, np.nan], [1, 5], [1, np.nan], [1, np.nan]], dtype=float)
    total = aggregate(per_function, [1.0, 0.5], "normalize_then_sum", 3)
    # group 1, a: mean 1/3, sample std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    std_a = math.sqrt(1 / 3)
    z_a = [(2 / 3) / (std_a + 1e-4), (-1 / 3) / (std_a + 1e-4), (-1 / 3) / (std_a + 1e-4)]
    # group 1, b: entries 2, 4: mean 3, sample std sqrt(2); the None row does not count
    z_b = [-1 / (math.sqrt(2) + 1e-4), 1 / (math.sqrt(2) + 1e-4)]
    expected = [z_a[0] + 0.5 * z_b[0], z_a[1] + 0.5 * z_b[1], z_a[2]]
    np.testing.assert_allclose(total[:3], expected, rtol=1e-12)
    # group 2: a is constant → z = 0; b has one entry → std 0, z = 0
    np.testing.assert_array_equal(total[3:], [0.0, 0.0, 0.0])


def test_normalize_then_sum_through_the_set_and_group_check():
    def ramp(completions, **kwargs):
        return [float(i % 2) for i in range(len(completions))]

    with RewardSet([RewardEntry("ramp", ramp)], aggregation="normalize_then_sum") as rs:
        out = rs.score(**batch(4), group_size=2)
        # each group is [0, 1]: mean 0.5, sample std sqrt(0.5)
        z = 0.5 / (math.sqrt(0.5) + 1e-4)
        np.testing.assert_allclose(out.total, [-z, z, -z, z])
        with pytest.raises(ValueError, match="groups of group_size=3"):
            rs.score(**batch(4), group_size=3)


def test_validate_spec_builds_nothing_and_says_what_to_fix(monkeypatch):
    from cohort.rewards import reward_registry as registry, validate_spec

    built = []
    monkeypatch.setitem(registry._FACTORIES, "numeric_match", lambda **kw: built.append(kw))
    spec = {"name": "soft_overlong", "max_completion_length": 8, "cache_length": 2, "weight": 0.5,
            "on_error": "none", "timeout_s": 5, "alias": "length"}
    assert validate_spec(spec).name == "soft_overlong"
    assert validate_spec("numeric_match").kind == "builtin" and built == []
    cases = [
        ({"weight": 1}, "needs a 'name'"),
        ({"name": "numeric_match", "weight": "heavy"}, "weight must be a finite number"),
        ({"name": "numeric_match", "on_error": "skip"}, "on_error must be one of"),
        ({"name": "numeric_match", "timeout_s": 0}, "timeout_s must be a positive"),
        ({"name": "numeric_match", "alias": ""}, "alias must be a non-empty string"),
        ({"name": "soft_overlong", "max_completion_length": 8}, r"needs the option\(s\) \['cache_length'\]"),
        ({"name": "code_tests", "timeout": 3}, r"no option\(s\) \['timeout'\]"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            validate_spec(bad)


def test_bad_configuration():
    with pytest.raises(ValueError, match="aggregation"):
        RewardSet([RewardEntry("a", const(1.0))], aggregation="mean")
    with pytest.raises(ValueError, match="on_error"):
        RewardSet.from_specs([{"name": "numeric_match", "on_error": "ignore"}])
    with pytest.raises(ValueError, match="unique"):
        RewardSet([RewardEntry("a", const(1.0)), RewardEntry("a_2", const(1.0)), RewardEntry("a", const(1.0))])
    with pytest.raises(ValueError, match="unknown reward"):
        RewardSet.from_specs([{"name": "nope"}])


def test_close_closes_functions_and_refuses_more_work():
    closed = []

    class Closable:
        def __call__(self, completions, **kwargs):
            return [0.0] * len(completions)

        def close(self):
            closed.append(True)

    rs = RewardSet([RewardEntry("c", Closable())])
    rs.score(**batch())
    rs.close()
    rs.close()  # idempotent
    assert closed == [True]
    with pytest.raises(RuntimeError, match="closed"):
        rs.score(**batch())


def test_async_function_keeps_its_event_loop_across_calls():
    loops = set()

    async def remember(completions, **kwargs):
        loops.add(id(asyncio.get_running_loop()))
        return [0.0] * len(completions)

    with RewardSet([RewardEntry("r", remember)]) as rs:
        rs.score(**batch())
        rs.score(**batch())
    assert len(loops) == 1


def test_score_from_inside_a_running_event_loop():
    async def main():
        with RewardSet([RewardEntry("a", const(1.0))]) as rs:
            return rs.score(**batch())

    assert asyncio.run(main()).total.tolist() == [1.0] * 4


def test_a_hung_sync_function_does_not_block_interpreter_exit(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "hang.py"
    script.write_text(
        "import time\n"
        "from cohort.rewards import RewardEntry, RewardSet\n"
        "def hangs(completions, **kwargs):\n"
        "    time.sleep(600)\n"
        "rs = RewardSet([RewardEntry('hangs', hangs, on_error='none')], timeout_s=0.2)\n"
        "out = rs.score(prompts=['p'], completions=['c'], completion_ids=[[1]])\n"
        "print(out.metrics['rewards/hangs/errors'])\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1.0"


def test_unscored_rows_reach_no_function_and_score_nan():
    seen = []

    def length(prompts, completions, **kwargs):
        seen.append(list(completions))
        return [float(len(c)) for c in completions]

    with RewardSet([RewardEntry("length", length, 1.0), RewardEntry("two", const(2.0), 0.5)]) as rs:
        data = batch(4)
        data["completions"] = ["a", "bb", "ccc", "dddd"]
        out = rs.score(**data, group_size=2, unscored=[False, True, False, True])
        assert seen == [["a", "ccc"]]  # the failed rows 1 and 3 never reach a function
        # rows 0 and 2: 1 × len + 0.5 × 2 = 2.0 and 4.0; rows 1 and 3: every column NaN, so the total is NaN
        np.testing.assert_array_equal(out.total, [2.0, np.nan, 4.0, np.nan])
        assert out.metrics["rewards/length/mean"] == 2.0  # (1 + 3) / 2, over the scored rows only
        nothing = rs.score(**data, group_size=2, unscored=[True] * 4)
        assert seen == [["a", "ccc"]] and np.isnan(nothing.total).all()  # no call when every row failed
