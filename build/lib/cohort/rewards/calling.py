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

A function may return ``Scores`` (a list with a ``metrics`` attribute: per-row values
under a name) instead of a plain list; the RewardSet logs the mean of each as
``rewards/<function>/<name>``. The verl adapter uses it for the extra keys of verl's
dict results.

``names_parameter(fn, name)`` decides who gets the optional arguments of multi-turn rollouts (``conversations``,
``environments``): only a function with a parameter of that name, so built-ins and ``**kwargs`` functions never
receive objects they would not expect (a remote reward could not send an environment over HTTP).

Choices: a synchronous call made while an event loop runs in the calling thread
(a Jupyter cell) runs the coroutine on a fresh loop in a helper thread and waits
for it, since the running loop cannot be re-entered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any


class DaemonThreads(concurrent.futures.Executor):
    """Runs each call on a new daemon thread (a hung reward never blocks interpreter exit); callers cap them."""

    def submit(self, fn, /, *args, **kwargs):  # noqa: ANN001 - Executor's signature
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                future.set_exception(exc)

        threading.Thread(target=run, name="cohort-reward", daemon=True).start()
        return future


def run_sync(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` to completion from synchronous code and return its result."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: the usual script case
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cohort-reward-sync") as pool:
        return pool.submit(asyncio.run, coroutine).result()


class RewardRowError(Exception):
    """Raised *by a reward function* to say which row failed (``RewardError`` shows it)."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index = index


class Scores(list):
    """A list of scores, one per completion, plus ``metrics``: ``{name: [value or None per completion]}``."""

    def __init__(self, scores: Iterable[Any] = (), metrics: dict[str, list[Any]] | None = None):
        super().__init__(scores)
        self.metrics = metrics or {}


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


def names_parameter(function: Callable[..., Any], name: str) -> bool:
    """Whether ``function`` (or the ``acall`` awaited for it) has a parameter called ``name`` by name (``**kwargs``
    does not count): the optional arguments (``conversations``, ``environments``) go only to functions that ask."""
    target = async_implementation(function) or function
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False
    return name in parameters and parameters[name].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                            inspect.Parameter.KEYWORD_ONLY)
