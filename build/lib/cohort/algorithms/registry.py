"""A small name -> entry registry, one instance per kind of algorithm piece.

Choices:
- One `Registry` per kind (advantage estimators, policy losses, KL estimators,
  loss aggregations). Every entry of one registry has the same call signature,
  so a caller looks an entry up by name and calls it without special cases.
- Unknown names raise `ValueError` listing the valid names, because the name
  usually comes from a config file and the message is what the user reads.
- Registering a name twice raises `ValueError`: silently replacing an entry
  would change the maths behind a config name without anyone noticing.

Left out: plugin discovery (entry points) and aliases; add an entry under a
second name explicitly if an alias is ever needed.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to entries of one kind (e.g. ``"policy loss"``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")`` adds the decorated entry."""

        def add(entry: T) -> T:
            self.add(name, entry)
            return entry

        return add

    def add(self, name: str, entry: T) -> None:
        """Add ``entry`` under ``name``; a name already taken raises ValueError."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} names must be non-empty strings; got {name!r}")
        if name in self._entries:
            raise ValueError(
                f"{self.kind} {name!r} is already registered; pick another name "
                f"(taken: {', '.join(self.names())})"
            )
        self._entries[name] = entry

    def get(self, name: str) -> T:
        """The entry called ``name``; an unknown name raises ValueError with the valid ones."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}"
            ) from None

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={list(self._entries)})"
