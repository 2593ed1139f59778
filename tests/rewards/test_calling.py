"""Built-in rewards called from plain Python return scores; the RewardSet still awaits them concurrently."""

import asyncio
import inspect
import threading
import time

import pytest

from cohort.rewards import RewardEntry, RewardSet, builtin_names, get
from cohort.rewards.calling import AsyncReward, async_implementation

# Options that build each built-in without a model or a service; reward_model needs a checkpoint.
BUILD_OPTIONS = {
    "soft_overlong": {"max_completion_length": 8, "cache_length": 2},
    "remote": {"url": "http://127.0.0.1:9"},
    "reasoning_gym": {"task": "chain_sum", "size": 4},  # builds the task's dataset offline, opens nothing
}


@pytest.mark.parametrize("name", [n for n in builtin_names() if n != "reward_model"])
def test_no_builtin_returns_a_coroutine_when_called(name):
    reward = get(name, **BUILD_OPTIONS.get(name, {}))
    try:
        assert not inspect.iscoroutinefunction(reward)
        assert not inspect.iscoroutinefunction(getattr(reward, "__call__"))
        awaited = async_implementation(reward)
        assert awaited is None or awaited == reward.acall  # one mechanism: either plain, or an acall
    finally:
        getattr(reward, "close", lambda: None)()


def test_accuracy_called_as_trl_users_call_accuracy_reward():
    pytest.importorskip("math_verify")
    accuracy = get("accuracy", num_workers=1)
    try:
        # \boxed{2} equals the gold $2$; "3" has no LaTeX anchor so nothing parses and it scores 0.0
        scores = accuracy(completions=[r"The answer is \boxed{2}", "3"], solution=["$2$", "$2$"])
        assert scores == [1.0, 0.0]

        async def in_a_notebook_cell():  # a loop is already running in this thread, as in Jupyter
            return accuracy(completions=[r"\boxed{\frac{1}{2}}"], solution=["$0.5$"])

        assert asyncio.run(in_a_notebook_cell()) == [1.0]
    finally:
        accuracy.close()


class SlowAsync(AsyncReward):
    """acall sleeps 0.4 s on the caller's loop and records the thread it ran on."""

    def __init__(self, value):
        self.value, self.threads = value, []

    async def acall(self, *, completions, **_):
        self.threads.append(threading.current_thread().name)
        await asyncio.sleep(0.4)
        return [self.value] * len(completions)


def test_the_reward_set_awaits_acall_concurrently_on_its_own_loop():
    rewards = [SlowAsync(float(i)) for i in range(3)]
    assert rewards[2](completions=["x", "y"]) == [2.0, 2.0]  # a plain call: the scores
    with RewardSet([RewardEntry(f"r{i}", r) for i, r in enumerate(rewards)]) as rs:
        start = time.perf_counter()
        out = rs.score(prompts=["p"] * 2, completions=["a", "b"], completion_ids=[[1], [2]])
        elapsed = time.perf_counter() - start
    assert out.total.tolist() == [3.0, 3.0]  # 0 + 1 + 2
    assert elapsed < 0.9  # three 0.4 s calls in series would take 1.2 s
    for r in rewards:  # awaited on the set's loop, not run through __call__'s helper
        assert r.threads[-1] == "cohort-reward-loop"


def test_async_implementation_of_each_kind():
    def plain(completions, **_):
        return [1.0]

    async def coroutine(completions, **_):
        return [1.0]

    class AsyncCallable:
        async def __call__(self, completions, **_):
            return [1.0]

    reward = SlowAsync(1.0)
    instance = AsyncCallable()
    assert async_implementation(plain) is None
    assert async_implementation(coroutine) is coroutine
    assert async_implementation(instance) is instance
    assert async_implementation(reward) == reward.acall
