"""The one rule of every registry (formats/, algorithms/, platforms.py): entries by their
`name`, each name once."""

from __future__ import annotations

from typing import Protocol, TypeVar


class Named(Protocol):
  @property
  def name(self) -> str: ...


T = TypeVar("T", bound=Named)


def add(table: dict[str, T], entry: T, what: str) -> T:
  """Register `entry` in `table` under its name; `what` names the registry's kind for the
  error ("format", "algorithm", "platform")."""
  if entry.name in table:
    raise ValueError(f"{what} {entry.name!r} is registered twice")
  table[entry.name] = entry
  return entry
