"""How a reward function is called: plainly from Python, or awaited by the RewardSet.

A built-in whose work is naturally asynchronous (the math checker waits on a
process pool, ``remote`` on HTTP) subclasses ``AsyncReward`` and writes its body as
``async def acall(self, **batch)``. Calling the object itself, as a user checking
data does (``accuracy(completions=[...], solution=[...])``), runs ``acall`` to the
end and returns the list of scores; the RewardSet instead awaits ``acall`` on its
own event loop, so the functions of one batch still run at the same time.

``async_implementation(fn)`` is the one place that decides how a function is
awaited: its ``acall`` when it has one (any object may offer it, not only the
built-ins), else the function itself when it is ``async def`` (or an object with
an ``async def __call__``), else None (a plain function, run on a thread).

Choices: a synchronous call made while an event loop runs in the calling thread
(a Jupyter cell) runs the coroutine on a fresh loop in a helper thread and waits
for it, since the running loop cannot be re-entered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


def run_sync(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` to completion from synchronous code and return its result."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: the usual script case
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cohort-reward-sync") as pool:
        return pool.submit(asyncio.run, coroutine).result()


class AsyncReward:
    """Base of the asynchronous built-ins: subclasses define ``async def acall(self, **batch)``."""

    async def acall(self, **batch: Any) -> list[Any]:
        raise NotImplementedError

    def __call__(self, **batch: Any) -> list[Any]:
        """The scores, computed now; the RewardSet awaits ``acall`` instead."""
        return run_sync(self.acall(**batch))


def async_implementation(function: Callable[..., Any]) -> Callable[..., Awaitable[Any]] | None:
    """The coroutine function to await for ``function``, or None when it is synchronous."""
    acall = getattr(function, "acall", None)
    if acall is not None and inspect.iscoroutinefunction(acall):
        return acall
    if inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(getattr(function, "__call__", None)):
        return function
    return None
