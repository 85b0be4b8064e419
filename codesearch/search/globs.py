"""Path filters with ripgrep's ``--glob`` semantics, for query results.

What users know from ``rg -g``:

- each rule is a gitignore-style glob on the path relative to the root: ``*.py`` matches
  at any depth, ``src/**`` everything under ``src``, a leading ``/`` anchors;
- ``!rule`` excludes; the last rule that matches a path decides;
- with at least one rule that is not ``!``, a path must match one of them; with ``!``
  rules only, every path they do not exclude stays;
- ``{a,b}`` alternatives expand (``*.{rs,md}``; nested groups too), ``\\{`` is a literal.

A glob that matches nothing is a valid glob (the search then finds nothing); a glob that
cannot be parsed is a one-line `QueryError`.

Example
-------
>>> f = GlobFilter.of(["*.{rs,md}", "!tests/**"])
>>> [f.match(p) for p in ("src/main.rs", "README.md", "tests/cli.rs", "setup.py")]
[True, True, False, False]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from codesearch.errors import QueryError

__all__ = ["GlobFilter", "check_globs", "expand_braces", "scope_globs"]

_FIX = "fix the pattern, e.g. --glob '*.{rs,md}' or --glob '!tests/**'"


def expand_braces(pattern: str) -> list[str]:
    """``a{b,c}d`` -> ``["abd", "acd"]``, nested groups and several groups included.

    Braces inside ``[...]`` and escaped ones (``\\{``) are literal.

    Raises
    ------
    QueryError
        An unclosed ``{`` or a ``}`` with no ``{``.
    """
    group = _first_group(pattern)
    if group is None:
        return [pattern]
    start, end, options = group
    head, tail = pattern[:start], pattern[end + 1 :]
    out: list[str] = []
    for option in options:
        out.extend(expand_braces(head + option + tail))
    return list(dict.fromkeys(out))


def _first_group(pattern: str) -> tuple[int, int, list[str]] | None:
    """(index of ``{``, index of its ``}``, the top-level options) of the first group."""
    depth, start, cuts = 0, -1, []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":
            close = _class_end(pattern, i)
            if close < 0:
                raise QueryError(f"invalid glob {pattern!r}: '[' is never closed ({_FIX})")
            i = close + 1
            continue
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            if depth == 0:
                raise QueryError(f"invalid glob {pattern!r}: '}}' has no opening '{{' ({_FIX})")
            depth -= 1
            if depth == 0:
                bounds = [start, *cuts, i]
                return start, i, [pattern[a + 1 : b] for a, b in pairwise(bounds)]
        elif ch == "," and depth == 1:
            cuts.append(i)
        i += 1
    if depth:
        raise QueryError(f"invalid glob {pattern!r}: '{{' is never closed ({_FIX})")
    return None


def _class_end(pattern: str, i: int) -> int:
    """Index of the ``]`` closing the character class opened at ``i``, or -1."""
    j = i + 1
    if j < len(pattern) and pattern[j] in "!^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":  # "[]a]": a leading ] is a member
        j += 1
    while j < len(pattern):
        if pattern[j] == "\\":
            j += 2
            continue
        if pattern[j] == "]":
            return j
        j += 1
    return -1


def _rules(patterns: Iterable[str]) -> list[tuple[bool, str]]:
    """(excluded?, gitignore pattern) per expanded rule, in order; checks each pattern."""
    rules: list[tuple[bool, str]] = []
    for raw in patterns:
        negated = raw.startswith("!")
        body = raw[1:] if negated else raw
        if not body.strip():
            raise QueryError(f"invalid glob {raw!r}: nothing to match ({_FIX})")
        rules.extend((negated, expanded) for expanded in expand_braces(body))
    return rules


def check_globs(patterns: Sequence[str]) -> None:
    """Raise `QueryError` (one line) for the first pattern that cannot be parsed."""
    GlobFilter.of(patterns)


@dataclass(frozen=True, slots=True)
class GlobFilter:
    """A compiled set of ripgrep-style glob rules; `match` says whether a path is kept.

    Build with `GlobFilter.of(patterns)`.
    """

    patterns: tuple[str, ...]
    _spec: Any = field(default=None, repr=False, compare=False)
    _has_include: bool = field(default=False, repr=False, compare=False)

    @classmethod
    def of(cls, patterns: Sequence[str]) -> GlobFilter:
        """Compile ``patterns``.

        Raises
        ------
        QueryError
            A pattern that cannot be parsed (unclosed ``[`` or ``{``, a stray ``}``, a
            trailing ``\\``, an empty rule).
        """
        # gitignore's own negation gives "last matching rule wins": a rule that keeps is a
        # plain line, a rule that excludes is a `!` line, and check_file reports whether
        # the last matching line was a `!` one (include=None when no line matched).
        lines: list[str] = []
        has_include = False
        for raw in patterns:
            mine = [f"!{body}" if negated else body for negated, body in _rules([raw])]
            try:
                _spec(mine)  # checked alone, to name the bad one
            except (ValueError, TypeError) as exc:  # GitIgnorePatternError is a ValueError
                raise QueryError(f"invalid glob {raw!r}: {exc} ({_FIX})") from None
            lines.extend(mine)
            has_include = has_include or any(not line.startswith("!") for line in mine)
        return cls(tuple(patterns), _spec(lines), has_include)

    def match(self, path: str) -> bool:
        """True when the path (relative to the root, ``/``-separated) passes the rules."""
        if self._spec is None:
            return True
        verdict = self._spec.check_file(path).include
        return (not self._has_include) if verdict is None else bool(verdict)


def _spec(lines: list[str]) -> Any:
    """A plain `PathSpec` of gitignore patterns, not a `GitIgnoreSpec`: the latter lets a
    rule that names the file beat a later one that names its folder (git's rule for
    .gitignore files), while ripgrep's globs are last-match-wins: ``src/**`` then
    ``!src/**/tests`` must drop ``src/tests/a.rs``."""
    import pathspec

    try:
        return pathspec.PathSpec.from_lines("gitignore", lines)
    except KeyError:  # pathspec < 1.0 names the same patterns "gitwildmatch"
        return pathspec.PathSpec.from_lines("gitwildmatch", lines)


def scope_globs(subdir: str | None, patterns: Sequence[str]) -> tuple[str, ...]:
    """Rules that keep only paths under ``subdir`` (relative, posix) and pass ``patterns``.

    Each rule is rewritten relative to the folder: a slash-free rule matches at any depth
    below it (``*.py`` -> ``src/**/*.py``), a rule with a slash is anchored there
    (``io/*.go`` -> ``src/io/*.go``); ``!`` rules stay ``!``. With no rule that includes,
    ``src/**`` comes first, so that the ``!`` rules only take away from the folder.
    """
    if not subdir:
        return tuple(patterns)
    subdir = subdir.strip("/")
    scoped: list[str] = []
    for negated, body in _rules(patterns):
        g = body.lstrip("/")
        g = f"{subdir}/**/{g}" if "/" not in g.rstrip("/") else f"{subdir}/{g}"
        scoped.append(f"!{g}" if negated else g)
    if not any(not r.startswith("!") for r in scoped):
        scoped.insert(0, f"{subdir}/**")
    return tuple(scoped)
