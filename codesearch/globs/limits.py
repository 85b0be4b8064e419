"""How much one request may ask of the path filters, and the clock a server's search
stops at: the parts of a filter's cost that the request chooses."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

_FIX = "fix the pattern, e.g. --glob '*.{rs,md}' or --glob '!tests/**'"


@dataclass(frozen=True, slots=True)
class GlobLimits:
    """How much one search may ask of the glob filter.

    Matching is linear in the path and the pattern whatever the limits; they bound the
    work of one request (every indexed path is matched against every rule) and the size of
    what a request makes the server compile. A regex filter would take the same shape:
    a length, a count of operators, a count of alternatives.

    Attributes
    ----------
    globs:
        Patterns per search.
    chars:
        Characters per pattern, as typed.
    rules:
        Rules after ``{a,b}`` expansion, over all patterns (counted before expanding).
    wildcards:
        ``*``, ``?`` and ``[...]`` per rule.
    """

    globs: int = 32
    chars: int = 256
    rules: int = 64
    wildcards: int = 32


GLOB_LIMITS = GlobLimits()

#: Rules that brace expansion may make where no `GlobLimits` applies (the library's own
#: rules, `expand_braces` called alone): counted before expanding, like the limits.
MAX_EXPANDED_RULES = 1024
#: ``{`` inside ``{`` inside ...: the expansion recurses on this depth.
MAX_BRACE_DEPTH = 32



class Deadline:
    """When a search's filters give up: at ``at`` (``time.monotonic()`` seconds), or at their
    next look at the clock once `stop` is called (a server shutting down stops the searches
    it can no longer answer)."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = float(at)

    def stop(self) -> None:
        self.at = -math.inf

    def passed(self) -> bool:
        return time.monotonic() > self.at


_DEADLINE: ContextVar[Deadline | None] = ContextVar("codesearch_glob_deadline", default=None)


@contextlib.contextmanager
def glob_deadline(deadline: float | Deadline | None) -> Iterator[None]:
    """Within this block (this thread), `GlobFilter.matches` gives up at ``deadline``
    (``time.monotonic()`` seconds, or a `Deadline` another thread may stop).

    Why: a search in a server thread cannot be killed when its request times out; the glob
    filter is the one part of it whose cost the request chooses, so it is the part that
    looks at the clock.
    """
    if deadline is not None and not isinstance(deadline, Deadline):
        deadline = Deadline(deadline)
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def search_deadline() -> float | None:
    """The deadline `glob_deadline` set for this thread (``time.monotonic()`` seconds; -inf
    once stopped), or None: the other filters whose cost a request chooses
    (`codesearch.textregex`) stop at it too."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline.at

