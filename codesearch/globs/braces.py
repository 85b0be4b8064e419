"""``{a,b}`` alternatives of ripgrep globs, and the rules a list of globs expands to.

Brace expansion is counted before it is done, so ``{a,b}`` sixteen times is refused at
once instead of expanding into 65,536 rules; the limits (`GlobLimits`) say how much one
request may ask for, and name themselves in the error.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from codesearch.errors import QueryError
from codesearch.globs.limits import _FIX, MAX_BRACE_DEPTH, MAX_EXPANDED_RULES


def escape_glob(text: str) -> str:
    """``text`` as a glob that matches exactly it (a folder name with ``[`` or ``{`` in it).

    >>> escape_glob("a[1]{x}")
    'a\\\\[1\\\\]\\\\{x\\\\}'
    """
    return "".join(f"\\{ch}" if ch in "\\[]{}*?!#," else ch for ch in text)


def _brace_tree(pattern: str) -> list[Any]:
    """``a{b,c{d,e}}f`` -> ``["a", [["b"], ["c", [["d"], ["e"]]]], "f"]``: a sequence of
    text pieces and groups, a group being a list of alternative sequences.

    Braces inside ``[...]`` and escaped ones (``\\{``) are text.

    Raises
    ------
    QueryError
        An unclosed ``{`` or ``[``, a ``}`` with no ``{``, groups nested too deep.
    """
    top: list[Any] = []
    stack: list[tuple[list[Any], list[list[Any]]]] = []  # (sequence the group sits in, its options)
    seq, text = top, []
    i, n = 0, len(pattern)

    def flush() -> None:
        if text:
            seq.append("".join(text))
            text.clear()

    while i < n:
        ch = pattern[i]
        if ch == "\\":
            text.append(pattern[i : i + 2])
            i += 2
            continue
        if ch == "[":
            close = _class_end(pattern, i)
            if close < 0:
                raise QueryError(f"invalid glob {pattern!r}: '[' is never closed ({_FIX})")
            text.append(pattern[i : close + 1])
            i = close + 1
            continue
        if ch == "{":
            if len(stack) >= MAX_BRACE_DEPTH:
                raise QueryError(f"glob {pattern[:60]!r} nests braces more than {MAX_BRACE_DEPTH} deep (the limit; "
                                 "flatten the groups: {a,b,c} for {a,{b,c}})")
            flush()
            option: list[Any] = []
            stack.append((seq, [option]))
            seq = option
        elif ch == "}":
            if not stack:
                raise QueryError(f"invalid glob {pattern!r}: '}}' has no opening '{{' ({_FIX})")
            flush()
            outer, options = stack.pop()
            outer.append(options)
            seq = outer
        elif ch == "," and stack:
            flush()
            seq = []
            stack[-1][1].append(seq)
        else:
            text.append(ch)
        i += 1
    if stack:
        raise QueryError(f"invalid glob {pattern!r}: '{{' is never closed ({_FIX})")
    flush()
    return top


def _count(seq: list[Any], cap: int) -> int:
    """How many strings a sequence expands to, saturating at ``cap + 1``."""
    total = 1
    for item in seq:
        if isinstance(item, list):
            total *= min(sum(_count(option, cap) for option in item), cap + 1)
            total = min(total, cap + 1)
    return total


def _expand(seq: list[Any]) -> Iterable[str]:
    parts = [[item] if isinstance(item, str) else [s for option in item for s in _expand(option)] for item in seq]
    return ("".join(p) for p in itertools.product(*parts))


def expand_braces(pattern: str, *, limit: int | None = None) -> list[str]:
    """``a{b,c}d`` -> ``["abd", "acd"]``, nested groups and several groups included.

    Braces inside ``[...]`` and escaped ones (``\\{``) are literal. Repeated results
    count once, first position kept.

    Parameters
    ----------
    limit:
        Refuse a pattern that would expand to more strings than this (counted before
        expanding); default `MAX_EXPANDED_RULES`.

    Raises
    ------
    QueryError
        An unclosed ``{`` or a ``}`` with no ``{``, or too many alternatives.
    """
    limit = MAX_EXPANDED_RULES if limit is None else limit
    tree = _brace_tree(pattern)
    count = _count(tree, limit)
    if count > limit:
        shown = pattern if len(pattern) <= 60 else pattern[:57] + "..."
        raise QueryError(
            f"glob {shown!r} expands to more than {limit} alternatives (the limit of one search; "
            "use fewer {a,b} groups, or a wildcard such as *.{rs,md})"
        )
    return list(dict.fromkeys(_expand(tree)))


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


def _rules(patterns: Iterable[str], limit: int | None = None) -> list[tuple[bool, str]]:
    """(excluded?, gitignore pattern) per expanded rule, in order; checks each pattern."""
    return [(negated, body) for negated, body, _raw in _sourced_rules(patterns, limit)]


def _sourced_rules(patterns: Iterable[str], limit: int | None = None) -> list[tuple[bool, str, str]]:
    """`_rules`, each with the pattern it came from. The rules of all patterns together
    are counted before any is expanded, against ``limit`` (default `MAX_EXPANDED_RULES`)."""
    limit = MAX_EXPANDED_RULES if limit is None else limit
    trees: list[tuple[bool, list[Any], str]] = []
    total = 0
    for raw in patterns:
        negated = raw.startswith("!")
        body = raw[1:] if negated else raw
        if not body.strip():
            raise QueryError(f"invalid glob {raw!r}: nothing to match ({_FIX})")
        tree = _brace_tree(body)
        total += _count(tree, limit)
        if total > limit:
            shown = raw if len(raw) <= 60 else raw[:57] + "..."
            raise QueryError(
                f"the globs expand to more than {limit} rules at {shown!r} (the limit of one search; "
                "use fewer {a,b} groups, or a wildcard such as *.{rs,md})"
            )
        trees.append((negated, tree, raw))
    return [(negated, body, raw) for negated, tree, raw in trees for body in dict.fromkeys(_expand(tree))]

