"""cohort.rewards: reward functions, their registry, and the RewardSet the trainer calls.

In RL from verifiable rewards the reward function *is* the task. The contract is
TRL's: ``fn(prompts=, completions=, completion_ids=, **columns) -> list[float | None]``,
``def`` or ``async def``; ``None`` means "not applicable to this row". verl's per-sample
contract, ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``, is
recognised by its parameters and adapted (``cohort.rewards.verl``). Built-ins called
from plain Python return their scores (``cohort.rewards.calling``).

- ``get(name, **options)`` builds a reward function: a built-in (``numeric_match``, ``exact_match``,
  ``accuracy``, ``reasoning_accuracy``, ``think_format``, ``soft_overlong``,
  ``code_tests``, ``reward_model``, ``remote``, ``verl_default``, ``dapo_math``) or your own by import path
  (``my_module.my_reward`` / ``my_module:my_reward``).
- ``resolve(name, options=None)`` checks a name (and options) without building anything;
  ``validate_spec(spec)`` checks a whole RewardSet spec the same way (config validation).
- ``describe_builtins()`` / ``format_builtins()`` list the built-ins and their options.
- ``RewardSet.from_specs(specs, ...)`` runs several functions concurrently, applies the
  failure policy, and aggregates them; see ``cohort.rewards.reward_set``.

See docs/rewards.md for the full contract, each built-in, and the code sandbox.
"""

from cohort.rewards.calling import AsyncReward, Scores
from cohort.rewards.reward_registry import (
    BuiltinInfo,
    Resolved,
    builtin_names,
    describe_builtins,
    format_builtins,
    get,
    register,
    resolve,
)
from cohort.rewards.reward_set import (
    RewardEntry,
    RewardError,
    RewardOutput,
    RewardRowError,
    RewardSet,
    aggregate,
    validate_spec,
)

__all__ = [
    "AsyncReward",
    "BuiltinInfo",
    "Resolved",
    "RewardEntry",
    "RewardError",
    "RewardOutput",
    "RewardRowError",
    "RewardSet",
    "Scores",
    "aggregate",
    "builtin_names",
    "describe_builtins",
    "format_builtins",
    "get",
    "register",
    "resolve",
    "validate_spec",
]
