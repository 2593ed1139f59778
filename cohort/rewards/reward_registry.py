"""The reward registry: names to reward functions.

A reward function follows TRL's contract: it is called with keyword arguments
``prompts=``, ``completions=``, ``completion_ids=`` and every other dataset column
(each a list with one entry per completion) and returns ``list[float | None]``, one
entry per completion; it may be ``def`` or ``async def``.

A *name* is either
- a built-in (``numeric_match``, ``accuracy``, …; see ``describe_builtins()``), whose
  factory receives the options and returns the function, or
- an import path to your own object, ``pkg.module.attr`` or ``pkg.module:attr``:
  * a **class**: instantiated once with the options as keyword arguments; the
    instance is the reward function (use this when set-up is costly: a model, a
    client);
  * a **function**: the options are forwarded as extra keyword arguments on every
    call (they must match the function's parameters, or it must take ``**kwargs``);
    with no options the function is used as is;
- or the Python object itself (a function, a callable instance, or a class), as the
  Python API (``cohort.train(reward_funcs=[fn])``) passes it: it resolves exactly as
  if it had been imported from its path. ``reference(obj)`` (cohort.config.references) is the string a config
  file records for it: its import path when it has one, else ``<python ...>``, a
  marker that resolving refuses with the fix (a lambda cannot be written to a file).

A built-in declares the dataset columns it reads (``register(name, needs=[Needs(...)])``);
``needed_columns(name, options)`` says which, so config validation can compare them with
the data's columns before any model loads (``cohort.rewards.columns``).

``resolve(name)`` checks a name without building anything (config validation runs it
before any model loads): built-in factories are not called; an import path is
imported and its attribute looked up, nothing is instantiated.

Choices: built-in modules import lazily (math-verify, transformers are imported only
when a function that needs them is built or called); registering a name twice fails.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from cohort.config.module_names import import_failure
from cohort.config.references import IN_PROCESS_MARK, reference

RewardFunction = Callable[..., Any]

# Modules whose import registers the built-ins; each imports only light dependencies.
_BUILTIN_MODULES = (
    "cohort.rewards.numeric",
    "cohort.rewards.exact",
    "cohort.rewards.format",
    "cohort.rewards.math_answers",
    "cohort.rewards.code",
    "cohort.rewards.reward_model",
    "cohort.rewards.http_reward",
    "cohort.rewards.verl",
    "cohort.rewards.dapo",
    "cohort.rewards.reasoning_gym",
)
_FACTORIES: dict[str, Callable[..., RewardFunction]] = {}
_NEEDS: dict[str, tuple[Needs, ...]] = {}
_loaded = False

REQUIRED = "<required>"
# Keys of a RewardSet spec that the set itself reads; they never reach a reward's options.
SPEC_KEYS = ("name", "weight", "on_error", "timeout_s", "alias", "contract")


class BuiltinInfo(NamedTuple):
    """One row of ``describe_builtins()``: the name, its options with defaults, its doc."""

    name: str
    options: dict[str, Any]
    doc: str


class Needs(NamedTuple):
    """A column a built-in reads: the one named by its option ``option`` when set, else the first of ``default`` present.

    ``default`` empty: needed only when the option is set (an optional column).
    """

    what: str
    option: str | None
    default: tuple[str, ...]

    def candidates(self, options: Mapping[str, Any]) -> tuple[str, ...]:
        chosen = options.get(self.option) if self.option else None
        return (chosen,) if chosen else self.default


class ColumnNeed(NamedTuple):
    """A need resolved for given options: any one of ``columns`` will do; ``option`` (if any) can name another."""

    what: str
    option: str | None
    columns: tuple[str, ...]


class Resolved(NamedTuple):
    """What a name refers to: ``kind`` is "builtin", "class" or "function"."""

    name: str
    kind: str
    display_name: str
    target: Any


def register(
    name: str, *, needs: Sequence[Needs] = ()
) -> Callable[[Callable[..., RewardFunction]], Callable[..., RewardFunction]]:
    """Decorator: register ``factory(**options) -> reward function`` under ``name``, reading the columns ``needs``."""

    def decorate(factory: Callable[..., RewardFunction]) -> Callable[..., RewardFunction]:
        if name in _FACTORIES:
            raise ValueError(f"reward {name!r} is already registered")
        shadowed = sorted(set(inspect.signature(factory).parameters) & set(SPEC_KEYS))
        if shadowed:
            raise ValueError(f"reward {name!r}: options {shadowed} would be taken by the RewardSet spec")
        _FACTORIES[name] = factory
        _NEEDS[name] = tuple(needs)
        return factory

    return decorate


def _builtins() -> dict[str, Callable[..., RewardFunction]]:
    global _loaded
    if not _loaded:
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)
        _loaded = True
    return _FACTORIES


def builtin_names() -> list[str]:
    return sorted(_builtins())


def needed_columns(name: str, options: Mapping[str, Any] | None = None) -> list[ColumnNeed]:
    """The columns a built-in reads with these options; [] for your own functions."""
    if name not in _builtins():
        return []
    options = options or {}
    return [ColumnNeed(n.what, n.option, n.candidates(options)) for n in _NEEDS[name] if n.candidates(options)]


def _unknown_name_message(name: str, detail: str = "") -> str:
    return (
        f"unknown reward {name!r}{detail}. Built-in rewards: {', '.join(builtin_names())}. "
        f"For your own function give its import path, 'my_module.my_reward' or "
        f"'my_module:my_reward' (the module must be importable, e.g. on PYTHONPATH); a class "
        f"there is instantiated with the options, a function gets them on every call."
    )


def _import_target(name: str) -> tuple[str, Any]:
    module_name, sep, attr = name.partition(":")
    if not sep:
        module_name, _, attr = name.rpartition(".")
    if not module_name or not attr:
        raise ValueError(_unknown_name_message(name))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - a missing module, or the user's module raising as it imports
        raise ValueError(_unknown_name_message(name, f" ({import_failure(module_name, exc)})")) from exc
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(_unknown_name_message(name, f" ({module_name!r} has no attribute {attr!r})"))
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"reward {name!r} points at a {type(target).__name__}, which is not callable")
    return attr.split(".")[-1], target


def _check_options(name: str, function: Callable[..., Any], options: Mapping[str, Any], *, strict: bool) -> None:
    """Unknown options fail (listing the valid ones); with ``strict``, missing required ones too."""
    params = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) and not strict:
        return
    accepted = {k for k, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ValueError(f"reward {name!r} has no option(s) {unknown}; its options are {sorted(accepted)}")
    if strict:
        missing = [k for k, p in params.items() if p.default is p.empty and k in accepted and k not in options]
        if missing:
            raise ValueError(f"reward {name!r} needs the option(s) {missing}")


def resolve(name: str | Callable[..., Any], options: Mapping[str, Any] | None = None) -> Resolved:
    """Check that ``name`` (and, if given, ``options``) names a reward; build nothing.

    ``name`` may also be the callable itself (see the module docstring). Raises
    ``ValueError`` for an unknown name (listing the built-ins and the import-path
    form) or for options the reward does not take.
    """
    if callable(name):
        return _resolve_object(name, options)
    if isinstance(name, str) and name.startswith(IN_PROCESS_MARK):
        raise ValueError(
            f"reward {name!r} was a Python object given to cohort.train, which a config file cannot hold: give it again "
            f"(cohort.train(config, reward_funcs=[...])), or define it in a module and name it by its import path"
        )
    if not isinstance(name, str) or not name:
        raise ValueError(_unknown_name_message(str(name)))
    factories = _builtins()
    if name in factories:
        resolved = Resolved(name, "builtin", name, factories[name])
        if options is not None:
            _check_options(name, factories[name], options, strict=True)
        return resolved
    if "." not in name and ":" not in name:
        raise ValueError(_unknown_name_message(name))
    display, target = _import_target(name)
    kind = "class" if inspect.isclass(target) else "function"
    if options:
        init = target.__init__ if kind == "class" else target
        _check_options(name, init, options, strict=False)
    return Resolved(name, kind, display, target)


def _resolve_object(target: Callable[..., Any], options: Mapping[str, Any] | None) -> Resolved:
    """A reward given as the Python object: a class (instantiated with the options) or a function / callable instance."""
    kind = "class" if inspect.isclass(target) else "function"
    display = getattr(target, "__name__", None) or type(target).__name__
    display = "lambda" if display == "<lambda>" else display
    if options:
        init = target.__init__ if kind == "class" else target
        _check_options(display, init, options, strict=False)
    return Resolved(reference(target), kind, display, target)


def get(name: str | Callable[..., Any], **options: Any) -> RewardFunction:
    """The reward function called ``name``, built with ``options`` (see module docstring)."""
    return instantiate(resolve(name, options), options)


def instantiate(resolved: Resolved, options: Mapping[str, Any]) -> RewardFunction:
    """The reward function of an already resolved name: a factory or class called with the options, or a function
    with the options bound."""
    if resolved.kind in ("builtin", "class"):
        return resolved.target(**options)
    if not options:
        return resolved.target
    return with_options(resolved.target, options)


def with_options(function: RewardFunction, options: Mapping[str, Any]) -> RewardFunction:
    """``function`` with ``options`` forwarded on every call; stays ``async`` if it was."""
    options = dict(options)
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def bound_async(**kwargs: Any) -> Any:
            return await function(**kwargs, **options)

        return bound_async

    @functools.wraps(function)
    def bound(**kwargs: Any) -> Any:
        return function(**kwargs, **options)

    return bound


def _first_paragraph(doc: str | None) -> str:
    text = inspect.cleandoc(doc or "")
    return text.split("\n\n", 1)[0].replace("\n", " ")


def describe_builtins() -> list[BuiltinInfo]:
    """One ``(name, options, doc)`` row per built-in; required options show ``<required>``."""
    rows = []
    for name in builtin_names():
        factory = _FACTORIES[name]
        options = {
            k: (REQUIRED if p.default is p.empty else p.default)
            for k, p in inspect.signature(factory).parameters.items()
            if p.kind is p.KEYWORD_ONLY
        }
        rows.append(BuiltinInfo(name, options, _first_paragraph(factory.__doc__)))
    return rows


def format_builtins(width: int = 100) -> str:
    """The table ``cohort rewards list`` prints: name, one-line doc, options."""
    import textwrap

    lines = []
    for info in describe_builtins():
        lines.append(info.name)
        lines.extend(textwrap.wrap(info.doc, width=width, initial_indent="    ", subsequent_indent="    "))
        if info.options:
            opts = ", ".join(f"{k}={v!r}" if v is not REQUIRED else f"{k} (required)" for k, v in info.options.items())
            lines.extend(textwrap.wrap(f"options: {opts}", width=width, initial_indent="    ", subsequent_indent="      "))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
