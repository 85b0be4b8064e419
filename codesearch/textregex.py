"""The ``--regex`` filter of a search: a pattern each hit's text must match, compiled for a
linear-time engine and held to limits, so that no pattern a request sends can hang a server.

Why RE2 (the ``google-re2`` wheel) and not Python's `re`: `re` backtracks, and a pattern such
as ``(a+)+$`` on a line of 30 ``a`` takes longer than the universe. RE2 runs a DFA or an NFA
simulation, never backtracking: matching costs time linear in the text, times at most the
size of the compiled program, which `REGEX_LIMITS` bounds (the pattern's length, and the
memory RE2 may use for the program and its DFA; past that RE2 refuses to compile, or falls
back to its slower, still linear, NFA). What RE2 cannot do, by design: backreferences
(``\\1``) and lookaround (``(?=...)``); such a pattern is a `QueryError` saying so.

Syntax: RE2's, which is Python's and ripgrep's for everything else (``\\b``, ``\\d``,
``(?i)``, ``[[:alpha:]]``, named groups). A pattern matches anywhere in a chunk's text;
``^`` and ``$`` match at each line's start and end (as in ripgrep, which searches lines);
``.`` does not match a newline unless the pattern says ``(?s)``. Case-sensitive unless it
says ``(?i)``.

Just above `codesearch.globs` (which holds the clock a server's search stops
at: `globs.glob_deadline`): both are filters whose cost the request chooses.
"""

from __future__ import annotations

import bisect
import functools
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from codesearch.errors import QueryError
from codesearch.globs import search_deadline

__all__ = ["REGEX_LIMITS", "RegexLimits", "TextRegex", "check_regex", "compile_regex"]


@dataclass(frozen=True, slots=True)
class RegexLimits:
    """How much one search's regex may ask.

    Attributes
    ----------
    chars:
        Characters of the pattern, as typed. Long enough for an alternation of a few dozen
        identifiers; a pattern is compiled per distinct request, and its program's size
        grows with its length.
    program:
        Instructions of the compiled program. Matching is linear in the text, but the
        constant grows with the program when the DFA's states outgrow its cache and RE2
        steps its NFA instead: ``(\\w+\\s*){200}x`` (2,005 instructions) took 0.6 s per MB
        of text here, ``{100}`` 0.25 s, ``{20}`` under 0.01 s. An alternation of 50
        identifiers takes a few hundred.
    max_mem:
        Bytes RE2 may use for the compiled program and its DFA cache; a pattern whose
        program does not fit is refused when it is compiled.
    """

    chars: int = 1000
    program: int = 1000
    max_mem: int = 8 << 20


REGEX_LIMITS = RegexLimits()

_FIX = "fix the pattern, e.g. --regex 'Retry-After|backoff'"


@dataclass(frozen=True, slots=True, eq=False)
class TextRegex:
    """A compiled ``--regex`` pattern (see the module doc for its syntax)."""

    pattern: str
    _search: Any
    _finditer: Any = None

    def match_lines(self, text: str) -> list[int]:
        """The lines of ``text`` (0-based) that a match of the pattern touches, as ripgrep
        prints them: each line a match starts on, and every line a match across lines spans
        (a pattern with ``\\n`` or ``(?s)``)."""
        data = text.encode("utf-8", "surrogateescape")
        starts = [0]
        at = data.find(b"\n")
        while at != -1:
            starts.append(at + 1)
            at = data.find(b"\n", at + 1)
        found: set[int] = set()
        for m in self._finditer(data):
            begin, end = m.span()
            first = bisect.bisect_right(starts, begin) - 1
            last = bisect.bisect_right(starts, max(begin, end - 1)) - 1
            found.update(range(first, last + 1))
        return sorted(line for line in found if line < len(starts) and (starts[line] < len(data) or line == 0))

    def match(self, text: str) -> bool:
        """Whether the pattern matches anywhere in ``text``."""
        # As UTF-8 bytes: the wrapper's str path maps every byte offset back to characters
        # (1.7x the time on numpy's chunks), and a lone surrogate stays a byte RE2 skips.
        return self._search(text.encode("utf-8", "surrogateescape")) is not None

    def matches(self, texts: Iterable[str]) -> Iterator[bool]:
        """`match` of each text, stopping at the deadline of `codesearch.globs.glob_deadline`
        if one is set (a server's search that timed out stops here, not after every chunk).

        Raises
        ------
        QueryError
            The deadline passed.
        """
        deadline = search_deadline()
        for n, text in enumerate(texts):
            if deadline is not None and n % 256 == 0 and time.monotonic() > deadline:
                raise QueryError(f"the regex filter ran past the search's time limit after {n:,} chunks "
                                 "(narrow the search with --glob, --lang or a path, or simplify the pattern)")
            yield self.match(text)


def check_regex(pattern: object, limits: RegexLimits = REGEX_LIMITS) -> str:
    """``pattern``, checked: text within the limits that RE2 compiles. Returns it unchanged.

    Raises
    ------
    QueryError
        Not text, empty, longer than ``limits.chars``, not valid RE2 syntax (backreferences
        and lookaround included), or a program larger than ``limits.max_mem``.
    """
    compile_regex(pattern, limits)
    return pattern  # type: ignore[return-value]  # compile_regex checked it is a str


def compile_regex(pattern: object, limits: RegexLimits = REGEX_LIMITS) -> TextRegex:
    """The `TextRegex` of ``pattern`` (cached: a server sees the same few patterns again).

    Raises
    ------
    QueryError
        As `check_regex`.
    """
    if not isinstance(pattern, str):
        raise QueryError(f"regex must be text, got {pattern!r} ({_FIX})")
    if not pattern:
        raise QueryError(f"the regex is empty ({_FIX}, or leave it out)")
    if len(pattern) > limits.chars:
        raise QueryError(
            f"the regex is {len(pattern):,} characters, over the limit of {limits.chars:,} per search "
            "(shorten it, or narrow the search with --glob or --lang instead)"
        )
    return _compile(pattern, limits)


@functools.lru_cache(maxsize=128)
def _compile(pattern: str, limits: RegexLimits) -> TextRegex:
    try:
        import re2
    except ImportError:  # pragma: no cover - a dependency; absent only from a broken install
        raise QueryError("the regex filter needs the google-re2 package (pip install google-re2)") from None
    options = re2.Options()
    options.max_mem = limits.max_mem
    options.log_errors = False  # RE2 would print its own copy of the error on stderr
    options.never_capture = True  # whether it matches is all the filter asks
    try:
        # (?m): ^ and $ at every line, as ripgrep's lines; the pattern's own flags still apply.
        compiled = re2.compile(("(?m)" + pattern).encode("utf-8", "surrogateescape"), options)
    except re2.error as exc:
        raise QueryError(f"invalid regex {pattern!r}: {_reason(exc)} ({_hint(pattern, exc)})") from None
    if compiled.programsize > limits.program:
        raise QueryError(
            f"the regex compiles to {compiled.programsize:,} instructions, over the limit of {limits.program:,} "
            "per search (use smaller counted repeats such as {n} or fewer alternatives)"
        )
    return TextRegex(pattern, compiled.search, compiled.finditer)


def _reason(exc: Exception) -> str:
    raw = exc.args[0] if exc.args else ""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    text = " ".join(text.replace("(?m)", "", 1).split())  # one line, the pattern as typed
    return text[:200] or "RE2 cannot compile it"


def _hint(pattern: str, exc: Exception) -> str:
    message = str(exc).lower()
    if "too large" in message or "pattern too large" in message:
        return f"its compiled program is over {REGEX_LIMITS.max_mem >> 20} MiB; use fewer or smaller repeats"
    if any(look in pattern for look in ("(?=", "(?!", "(?<=", "(?<!")):
        return "lookaround is not supported: the filter runs in linear time; " + _FIX
    if "\\1" in pattern or "\\2" in pattern:
        return "backreferences are not supported: the filter runs in linear time; " + _FIX
    return _FIX
