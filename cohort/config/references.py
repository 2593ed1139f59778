"""A Python object as the text a config file records for it: `module:qualname`, or `<python NAME>` for one no import
finds again (a lambda, a function in a notebook).

The config's serializers (a reward or a tool given to `cohort.train` as the function itself) and the reward registry
(`cohort.rewards.reward_registry.resolve` refuses the `<python ...>` marker with its fix) both read this, so it sits with
the config, below the rewards package. Standard library only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

# How a config file records a reward object that no import path finds (a lambda, a function in a notebook).
IN_PROCESS_MARK = "<python "


def reference(target: Callable[..., Any]) -> str:
    """What a config file records for a reward given as an object: ``module:qualname`` when that import finds this very
    object again (so `--resume` and other processes can use it), else ``<python NAME>``."""
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if module and qualname and module != "__main__" and "<" not in qualname:
        try:
            found: Any = importlib.import_module(module)
            for part in qualname.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            found = None
        if found is target:
            return f"{module}:{qualname}"
    return f"{IN_PROCESS_MARK}{qualname or type(target).__name__}>"
