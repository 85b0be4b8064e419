"""Path filters: ripgrep's ``--glob`` semantics for query results (`GlobFilter`), and
gitignore's for ignore files and ``index --include/--exclude`` (`GitIgnore`), both matched
in linear time.

What users know from ``rg -g``:

- each rule is a gitignore-style glob on the path relative to the root: ``*.py`` matches
  at any depth, ``src/**`` everything under ``src``, a leading ``/`` anchors;
- ``!rule`` excludes; the last rule that matches a path decides;
- with at least one rule that is not ``!``, a path must match one of them; with ``!``
  rules only, every path they do not exclude stays;
- ``{a,b}`` alternatives expand (``*.{rs,md}``; nested groups too), ``\\{`` is a literal.

A glob that matches nothing is a valid glob (the search then finds nothing); a glob that
cannot be parsed, or one past the limits below, is a one-line `QueryError`.

Why not hand the rules to ``pathspec`` (as this module once did): it translates ``*?*?*?Z``
into ``[^/]*[^/][^/]*[^/]...``, which Python's backtracking regex engine matches in time
exponential in the number of wildcards, holding the interpreter lock all along (22 pairs
against a 45-character name froze a whole server). Here each rule compiles to a regex in
which no two quantifiers compete for the same characters: a path is cut into segments, and
in a segment every ``*`` but the last takes the shortest run after which the next fixed-width
piece matches, committed in an atomic group; the same between ``**`` groups. The earliest
placement of each piece is the right one (moving a piece left only leaves more room for
the next), so nothing is lost, and matching costs about (path length x pattern length).
The line semantics (normalisation, anchoring, ``foo/*`` matching one level) are
``pathspec``'s gitignore patterns, checked against it in the tests; two edge cases differ
on purpose: a negated class ``[!x]`` never matches ``/``, and a path segment holding a
newline is matched like any other character.

`GitIgnore` reads the lines as git does (dir.c's ``add_pattern``/``match_pathname`` and
wildmatch), checked against ``git check-ignore`` in the tests, on the same kind of
linear-time regexes: no brace expansion; trailing spaces go unless escaped; a line with
no ``/`` but a trailing one matches names at any depth; ``**`` is special only as a whole
segment (``***`` too), or right after the literal head git compares before wildmatch runs
(``ab**/c`` matches ``abc``); ``a/**`` is what is below ``a``, not ``a``; classes are
wildmatch's (``[z-a]`` is ``z``, ``[[:digit:]]``); a line wildmatch aborts on (an
unclosed ``[``, a trailing ``\\``) matches nothing (pathspec raised, which stopped the
walk). A path is judged by the last line that matches it itself; that nothing below an
ignored folder comes back is the walker's part, as it is git's: it never enters one.
One difference is left: git matches bytes, this matches characters (``?`` is one ``é``
here, two ``?`` in git).

Brace expansion is counted before it is done, so ``{a,b}`` sixteen times is refused at
once instead of expanding into 65,536 rules; the limits (`GlobLimits`) say how much one
request may ask for, and name themselves in the error.

Example
-------
>>> f = GlobFilter.of(["*.{rs,md}", "!tests/**"])
>>> [f.match(p) for p in ("src/main.rs", "README.md", "tests/cli.rs", "setup.py")]
[True, True, False, False]
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from codesearch.errors import QueryError

__all__ = [
    "GLOB_LIMITS",
    "MAX_EXPANDED_RULES",
    "GitIgnore",
    "GlobFilter",
    "GlobLimits",
    "check_globs",
    "escape_glob",
    "expand_braces",
    "glob_deadline",
    "scope_globs",
    "search_deadline",
]

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


def escape_glob(text: str) -> str:
    """``text`` as a glob that matches exactly it (a folder name with ``[`` or ``{`` in it).

    >>> escape_glob("a[1]{x}")
    'a\\\\[1\\\\]\\\\{x\\\\}'
    """
    return "".join(f"\\{ch}" if ch in "\\[]{}*?!#," else ch for ch in text)


# -- braces --------------------------------------------------------------------------------


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


# -- one gitignore line -> a regex that cannot backtrack exponentially ------------------------

_ANY = "[^/]"
_END = r"(?=/|\Z)"  # the end of a path segment


class _Atoms:
    """Numbers the atomic groups of one compiled regex (Python 3.10 has no ``(?>...)``)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, body: str) -> str:
        # A lookahead is atomic in Python's engine: it matches once, and the backreference
        # then consumes exactly what it matched; nothing backtracks into it.
        self.n += 1
        return f"(?=(?P<a{self.n}>{body}))(?P=a{self.n})"


class _Dropped(Exception):
    """A gitignore line git reads as matching nothing (an unclosed ``[``)."""


def _segment_atoms(seg: str, pattern: str) -> tuple[list[str | None], int]:
    """A pattern segment as atoms: a one-character regex each, or None for ``*``; and
    how many wildcards it holds. Same reading as pathspec's ``_translate_segment_glob``."""
    atoms: list[str | None] = []
    wildcards = 0
    i, end = 0, len(seg)
    while i < end:
        ch = seg[i]
        i += 1
        if ch == "\\":
            if i >= end:
                raise QueryError(f"invalid glob {pattern!r}: a '\\' ends a segment, with nothing to escape ({_FIX})")
            atoms.append(re.escape(seg[i]))
            i += 1
        elif ch == "*":
            if not atoms or atoms[-1] is not None:  # "**" inside a segment is one "*"
                atoms.append(None)
                wildcards += 1
        elif ch == "?":
            atoms.append(_ANY)
            wildcards += 1
        elif ch == "[":
            j = i
            if j < end and seg[j] in "!^":
                j += 1
            if j < end and seg[j] == "]":
                j += 1
            while j < end and seg[j] != "]":
                j += 1
            if j < end:
                atoms.append(_char_class(seg[i:j], pattern))
                wildcards += 1
                i = j + 1
            else:
                atoms.append(re.escape("["))  # an unclosed '[' in this segment is a literal
        else:
            atoms.append(re.escape(ch))
    return atoms, wildcards


def _char_class(body: str, pattern: str) -> str:
    """``[...]`` contents (between the brackets) as a Python class of escaped members.

    Read as pathspec hands them to ``re``: ``!`` or ``^`` first negates, a ``]`` first is a
    member, ``a-z`` a range, every other character itself (a backslash included). A negated
    class never matches ``/``.
    """
    negated = body[:1] in ("!", "^")
    chars = body[1:] if negated else body
    members: list[str] = []
    i = 0
    while i < len(chars):
        if i + 2 < len(chars) and chars[i + 1] == "-":
            lo, hi = chars[i], chars[i + 2]
            if lo > hi:
                raise QueryError(f"invalid glob {pattern!r}: the range {lo}-{hi} is backwards ({_FIX})")
            members.append(f"{re.escape(lo)}-{re.escape(hi)}")
            i += 3
        else:
            members.append(re.escape(chars[i]))
            i += 1
    inner = "".join(members)
    return f"[^/{inner}]" if negated else f"[{inner}]" if inner else "(?!)"


def _segment_regex(seg: str, pattern: str, atomic: _Atoms) -> tuple[str, int]:
    """A regex that matches one whole path segment (up to a ``/`` or the end), atomically."""
    if seg == "*":
        return atomic(f"{_ANY}+"), 1  # pathspec: a lone '*' segment is never empty
    atoms, wildcards = _segment_atoms(seg, pattern)
    return _atoms_regex(atoms, atomic), wildcards


def _atoms_regex(atoms: Sequence[str | None], atomic: _Atoms) -> str:
    """One-character regexes and stars (None) as a regex for one whole path segment."""
    pieces: list[list[str]] = [[]]  # the fixed-width runs between stars
    for atom in atoms:
        if atom is None:
            pieces.append([])
        else:
            pieces[-1].append(atom)
    head = "".join(pieces[0])
    if len(pieces) == 1:
        return atomic(head + _END)
    middle = "".join(atomic(f"{_ANY}*?{''.join(p)}") for p in pieces[1:-1])
    return atomic(f"{head}{middle}{_ANY}*{''.join(pieces[-1])}{_END}")


def _normalize(segs: list[str], is_dir_pattern: bool) -> tuple[list[str] | None, str | None]:
    """pathspec's segment normalisation (``GitIgnoreBasicPattern.__normalize_segments``):
    the segments with ``**`` made explicit, or an override: ``"all"`` (every path) or
    ``"nested"`` (every path with a ``/``)."""
    if not segs[0]:
        del segs[0]  # a leading '/' anchors
    elif (len(segs) == 1 or (len(segs) == 2 and not segs[1])) and segs[0] != "**":
        segs.insert(0, "**")  # a single segment matches at any depth
    if not segs:
        return None, None
    if not segs[-1]:
        segs[-1] = "**"  # "dir/": everything below it
    for i in range(len(segs) - 1, 0, -1):
        if segs[i - 1] == "**" and segs[i] == "**":
            del segs[i]
    if segs == ["**"]:
        return None, "nested" if is_dir_pattern else "all"
    if segs == ["**", "*"]:
        return None, "all"
    if segs == ["**", "*", "**"]:
        return None, "nested"
    return segs, None


def _line_regex(line: str, atomic: _Atoms) -> tuple[str | None, bool | None, int]:
    """(regex for ``re.match``, include?, wildcards) of one gitignore line; regex None for
    a line that matches nothing (blank, a ``#`` comment). Mirrors pathspec's
    ``GitIgnoreBasicPattern.pattern_to_regex`` (matched there with ``re.search``).
    """
    original = line
    if not line.endswith("\\ "):
        line = line.rstrip()
    if not line or line.startswith("#"):
        return None, None, 0
    include = not line.startswith("!")
    if not include:
        line = line[1:]
    segs = line.split("/")
    wildcards = segs.count("**")  # as typed: not the '**' that normalisation adds
    is_dir_pattern = not segs[-1] and line != "/"
    normal, override = _normalize(segs, is_dir_pattern)
    if override == "all":
        return ".", include, max(wildcards, 1)
    if override == "nested":
        return "[^/]*/", include, max(wildcards, 1)
    if normal is None:
        raise QueryError(f"invalid glob {original!r}: nothing to match ({_FIX})")
    # Groups of consecutive segments between '**'s; a '**' before a group lets it start at
    # any segment, a '**' at the end asks for something below the last group.
    groups: list[list[str]] = [[]]
    floats = [normal[0] == "**"]
    for seg in normal:
        if seg == "**":
            if groups[-1]:
                groups.append([])
                floats.append(True)
        else:
            groups[-1].append(seg)
    trailing = normal[-1] == "**"
    if not groups[-1]:
        groups.pop()
        floats.pop()
    if trailing:
        tail = "/"  # something below the last group
    elif groups[-1][-1] == "*":
        tail = "/?\\Z"  # ripgrep's "src/*": one level, not below
    else:
        tail = "(?:/|\\Z)"
    regexes: list[list[str]] = []
    for group in groups:
        regexes.append([])
        for seg in group:
            regex, count = _segment_regex(seg, original, atomic)
            regexes[-1].append(regex)
            wildcards += count
    return _groups_regex(regexes, floats, tail, atomic), include, wildcards


def _groups_regex(groups: list[list[str]], floats: list[bool], tail: str, atomic: _Atoms) -> str:
    """Groups of segment regexes, a ``**`` between each two (and before the first where
    ``floats`` says so), then ``tail``: one regex for ``re.match``."""
    out: list[str] = []
    for n, (group, floating) in enumerate(zip(groups, floats)):
        body = "/".join(group)
        skip = "(?:[^/]+/)*?" if floating else ""
        if n < len(groups) - 1:
            # The earliest place this group fits is the best one for the groups after it.
            out.append(atomic(skip + body) + "/")
        else:
            out.append(f"{skip}{body}{tail}")
    return "".join(out)


# -- one gitignore line as git reads it (dir.c, wildmatch.c) ----------------------------------

_DSTAR = "**"  # a segment that is a '**' wildmatch treats specially: any number of folders
_POSIX_CLASSES = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9",
    "graph": "!-~", "lower": "a-z", "print": " -~", "punct": "!-/:-@\\[-`{-~", "space": " \\t\\n\\r",
    "upper": "A-Z", "xdigit": "0-9A-Fa-f",
}


@dataclass(frozen=True, slots=True)
class _GitLine:
    """One gitignore line compiled: its match of a path itself (``re.match`` on the path
    without a trailing ``/``), of a folder above it (None where a match of a folder above
    always comes with a match of the path itself), and git's flags."""

    exact: Any
    folder: Any
    negated: bool
    dirs_only: bool


def _git_trim(line: str) -> str:
    """git's ``trim_trailing_spaces``: unescaped trailing spaces go (not tabs), ``\\ `` stays."""
    end = len(line)
    cut = None
    i = 0
    while i < end:
        ch = line[i]
        if ch == " ":
            cut = i if cut is None else cut
        elif ch == "\\":
            i += 1
            if i >= end:
                return line
            cut = None
        else:
            cut = None
        i += 1
    return line if cut is None else line[:cut]


def _git_class(pattern: str, i: int) -> tuple[str, int]:
    """The ``[...]`` opened at ``i`` as wildmatch reads it: a Python class that never matches
    ``/``, and the index after its ``]``. Raises `_Dropped` where wildmatch aborts (no ``]``,
    a trailing ``\\``, an unknown ``[:name:]``)."""
    n = len(pattern)
    j = i + 1
    negated = j < n and pattern[j] in "!^"
    j += negated
    members: list[str] = []
    prev: str | None = None
    first = True
    while True:
        if j >= n:
            raise _Dropped(pattern)
        ch = pattern[j]
        if ch == "]" and not first:
            break
        first = False
        if ch == "\\":
            j += 1
            if j >= n:
                raise _Dropped(pattern)
            members.append(re.escape(pattern[j]))
            prev = pattern[j]
        elif ch == "-" and prev is not None and j + 1 < n and pattern[j + 1] != "]":
            j += 1
            hi = pattern[j]
            if hi == "\\":
                j += 1
                if j >= n:
                    raise _Dropped(pattern)
                hi = pattern[j]
            if prev <= hi:  # a backwards range adds nothing (its first end is a member already)
                members.append(f"{re.escape(prev)}-{re.escape(hi)}")
            prev = None
        elif ch == "[" and pattern[j + 1 : j + 2] == ":":
            close = pattern.find("]", j + 2)
            if close < 0:
                raise _Dropped(pattern)
            name = pattern[j + 2 : close]
            if close - (j + 2) < 1 or not name.endswith(":"):  # no ":]": a plain '['
                members.append(re.escape("["))
                prev = "["
            else:
                if name[:-1] not in _POSIX_CLASSES:
                    raise _Dropped(pattern)
                members.append(_POSIX_CLASSES[name[:-1]])
                prev = None
                j = close
        else:
            members.append(re.escape(ch))
            prev = ch
        j += 1
    inner = "".join(members)
    if negated:
        return f"[^/{inner}]", j + 1
    return (f"(?!/)[{inner}]" if inner else "(?!)"), j + 1


def _git_segments(pattern: str, *, basename: bool) -> list[Any]:
    """A pathname pattern (no leading ``/``) as segments: `_DSTAR`, or a list of atoms (a
    one-character regex, or None for ``*``). With ``basename`` (a pattern with no ``/``,
    matched against a name), every star is a plain ``*``.

    Raises
    ------
    _Dropped
        Wildmatch would abort on it, or it cannot match a path (an empty segment).
    """
    segs: list[Any] = [[]]
    n = len(pattern)
    i = 0
    while i < n:
        ch = pattern[i]
        if ch == "*":
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            special = (not basename and j - i >= 2 and (i == 0 or pattern[i - 1] == "/")
                       and (j == n or pattern[j] == "/" or pattern.startswith("\\/", j)))
            if not special:
                if not segs[-1] or segs[-1][-1] is not None:
                    segs[-1].append(None)
            elif pattern.startswith("\\/", j):  # '**' then an escaped '/': at least one folder
                segs[-1].append(None)
                segs.append(_DSTAR)
                segs.append([])
                j += 2
            else:
                segs[-1] = _DSTAR
                if j < n:
                    segs.append([])
                    j += 1
            i = j
            continue
        if ch == "/" or pattern.startswith("\\/", i):
            segs.append([])
            i += 1 if ch == "/" else 2
            continue
        if ch == "\\":
            if i + 1 >= n:
                raise _Dropped(pattern)
            segs[-1].append(re.escape(pattern[i + 1]))
            i += 2
        elif ch == "?":
            segs[-1].append(_ANY)
            i += 1
        elif ch == "[":
            regex, i = _git_class(pattern, i)
            segs[-1].append(regex)
        else:
            segs[-1].append(re.escape(ch))
            i += 1
    if any(seg == [] for seg in segs):
        raise _Dropped(pattern)  # "a//b", a trailing '/': git needs an empty folder name there
    out: list[Any] = []
    for seg in segs:  # "**/**" is one "**"
        if not (seg is _DSTAR and out and out[-1] is _DSTAR):
            out.append(seg)
    return out


def _git_regexes(pattern: str, *, basename: bool) -> tuple[str, str | None]:
    """(regex of the path itself, regex of a folder above it or None) for one pattern."""
    segs = _git_segments(pattern, basename=basename)
    if basename:
        segs.insert(0, _DSTAR)
    if segs == [_DSTAR]:
        return "", None  # every path
    atomic = _Atoms()
    groups: list[list[str]] = [[]]
    floats = [segs[0] is _DSTAR]
    for seg in segs:
        if seg is _DSTAR:
            if groups[-1]:
                groups.append([])
                floats.append(True)
        else:
            groups[-1].append(_atoms_regex(seg, atomic))
    if segs[-1] is _DSTAR:  # "dir/**": what is below it; matching a folder above means matching the path
        groups.pop()
        floats.pop()
        return _groups_regex(groups, floats, "/", atomic), None
    exact = _groups_regex(groups, floats, "\\Z", atomic)
    return exact, _groups_regex(groups, floats, "/", atomic)  # (its groups numbered on: no clash)


def _git_pathname(pattern: str, start: int | None = None) -> tuple[list[str], list[str]]:
    """Regexes of the path itself and of a folder above it (each list: any one matching) for a
    pattern with a ``/``, read by wildmatch from ``start`` on (default: after the literal head
    git compares itself).

    That start matters: ``ab**/c`` is wildmatch's ``**/c`` after ``ab``, a ``**`` at the
    start of its pattern, so special: it matches ``abc``, ``ab/c`` and ``abx/y/c``.
    """
    if start is None:
        start = next((n for n, ch in enumerate(pattern) if ch in "*?[\\"), len(pattern))
    stars = start
    while stars < len(pattern) and pattern[stars] == "*":
        stars += 1
    rest = pattern[stars:]
    if not (0 < start and pattern[start - 1] != "/" and stars - start >= 2
            and (not rest or rest[0] == "/" or rest.startswith("\\/"))):
        e, f = _git_regexes(pattern, basename=False)
        return [e], [] if f is None else [f]
    prefix = pattern[:start]
    if rest.startswith("\\/"):  # '**' then a '/': at least one folder
        return _git_pathname(prefix + "*/**/" + rest[2:], -1)
    while (m := re.match(r"\*\*+(/|\Z)", rest[1:])) is not None:  # "**/**/" is one "**/"
        rest = rest[m.end():] if m.group(1) else ""
    if not rest:
        return [re.escape(prefix)], []  # the head, then anything
    # wildmatch first tries the rest right where '**/' began (no folder), then after some.
    exact: list[str] = []
    folder: list[str] = []
    for variant, at in ((prefix + rest[1:], start), (prefix + "*/**" + rest, -1)):
        with contextlib.suppress(_Dropped):
            e, f = _git_pathname(variant, at)
            exact += e
            folder += f
    return exact, folder


def _git_line(line: str) -> _GitLine | None:
    """One line of an ignore file as git's ``add_pattern`` and ``match_pathname`` /
    ``match_basename`` read it; None for a line that matches nothing.

    Raises
    ------
    _Dropped
        A line wildmatch aborts on (an unclosed ``[``, a trailing ``\\``): it matches nothing.
    """
    if line.startswith("#"):
        return None
    line = _git_trim(line.removesuffix("\r"))
    negated = line.startswith("!")
    line = line[1:] if negated else line
    dirs_only = line.endswith("/")
    line = line[:-1] if dirs_only else line
    if not line:
        return None
    if "/" not in line:
        e, f = _git_regexes(line, basename=True)
        exact, folder = [e], [] if f is None else [f]
    else:
        exact, folder = _git_pathname(line.removeprefix("/"))
    if not exact:
        return None
    return _GitLine(_compiled_any(exact), _compiled_any(folder), negated, dirs_only)


def _compiled_any(regexes: list[str]) -> Any:
    """``re.match`` of any of ``regexes`` (each compiled alone: their atomic groups are
    numbered from 1), None for none."""
    if not regexes:
        return None
    if len(regexes) == 1:
        return _compiled(regexes[0])
    matchers = [_compiled(r) for r in regexes]
    return lambda path: next((m for m in (match(path) for match in matchers) if m is not None), None)


# -- the filter ------------------------------------------------------------------------------


def check_globs(patterns: Sequence[str], limits: GlobLimits = GLOB_LIMITS) -> None:
    """Raise `QueryError` (one line) for the first pattern that cannot be parsed or that
    goes past ``limits``; cheap whatever the input (nothing is expanded before counting)."""
    if len(patterns) > limits.globs:
        raise QueryError(f"{len(patterns)} globs in one search (the limit is {limits.globs}; "
                         "merge them with {a,b} or use a wider glob)")
    for raw in patterns:
        if len(raw) > limits.chars:
            raise QueryError(f"glob {raw[:40] + '...'!r} is {len(raw)} characters long "
                             f"(the limit is {limits.chars}; use a shorter glob or a wildcard)")
    GlobFilter.of(patterns, limits)


@dataclass(frozen=True, slots=True)
class GlobFilter:
    """A compiled set of ripgrep-style glob rules; `match` says whether a path is kept.

    Build with `GlobFilter.of(patterns)`.
    """

    patterns: tuple[str, ...]
    #: (compiled rule's match, keep?) per rule that can match, the last rule first.
    _rules: tuple[tuple[Any, bool], ...] = field(default=(), repr=False, compare=False)
    _has_include: bool = field(default=False, repr=False, compare=False)

    @classmethod
    def of(cls, patterns: Sequence[str], limits: GlobLimits | None = None) -> GlobFilter:
        """Compile ``patterns``.

        Parameters
        ----------
        limits:
            Refuse patterns past these (`check_globs` passes `GLOB_LIMITS`). Without, only
            brace expansion is bounded (to `MAX_EXPANDED_RULES`), as rules built by the
            library itself (`scope_globs`) may be longer than what a user may send.

        Raises
        ------
        QueryError
            A pattern that cannot be parsed (unclosed ``[`` or ``{``, a stray ``}``, a
            trailing ``\\``, an empty rule, a backwards range), or past the limits.
        """
        return _compile(tuple(patterns), limits)

    def match(self, path: str) -> bool:
        """True when the path (relative to the root, ``/``-separated) passes the rules."""
        for matches, keep in self._rules:  # the last rule that matches decides
            if matches(path) is not None:
                return keep
        return not self._has_include

    def matches(self, paths: Iterable[str]) -> Iterator[bool]:
        """`match` of each path, stopping at the deadline of `glob_deadline` if one is set.

        Raises
        ------
        QueryError
            The deadline passed (a server's search timed out: its thread stops here).
        """
        deadline = _DEADLINE.get()
        for n, path in enumerate(paths):
            if deadline is not None and n % 1024 == 0 and time.monotonic() > deadline:
                raise QueryError(f"the glob filter ran past the search's time limit after {n:,} paths "
                                 "(narrow the globs, or search a folder with path)")
            yield self.match(path)


@dataclass(frozen=True, slots=True)
class GitIgnore:
    """Gitignore lines (an ignore file, or ``--include``/``--exclude`` patterns), compiled.

    `check` says what the lines say of a path itself, as git's ``last_matching_pattern``
    does: ``True`` ignored (the last line that matches it is a plain line), ``False``
    re-included (a ``!`` line), ``None`` no line matches it. A folder is checked as
    ``"path/"`` (lines ending in ``/`` match only folders). What lies below an ignored
    folder is the caller's part, as it is git's: git never enters an ignored folder, so a
    later line cannot re-include what is below it; the walker checks each folder on the way
    down (`codesearch.indexing.walk`), and that also makes a deeper ignore file's ``!dir/``
    win over a shallower one's ``dir/``. `match` (``--include``/``--exclude``, one file of
    lines) answers for a path alone, folders above it included.

    No braces: ``{`` is a character here, as in git.

    Build with `GitIgnore.of(lines)`.
    """

    #: Each line that can match, the last line first.
    _rules: tuple[_GitLine, ...] = field(default=(), repr=False)

    @classmethod
    def of(cls, lines: Iterable[str]) -> GitIgnore:
        """Compile ``lines``; one git cannot match (an unclosed ``[``, a trailing ``\\``)
        matches nothing, as in git: an ignore file found on disk, or patterns an index
        recorded, never stop a walk."""
        compiled: list[_GitLine] = []
        for line in lines:
            try:
                rule = _git_line(line)
            except (_Dropped, re.error, RecursionError, OverflowError):
                continue
            if rule is not None:
                compiled.append(rule)
        return cls(tuple(reversed(compiled)))

    def __bool__(self) -> bool:
        return bool(self._rules)

    def check(self, path: str) -> bool | None:
        """True when the last line that matches ``path`` itself ignores it, False when it is
        a ``!`` line, None when no line matches it (a folder: ``"path/"``)."""
        is_dir = path.endswith("/")
        name = path[:-1] if is_dir else path
        for rule in self._rules:  # the last line first
            if (is_dir or not rule.dirs_only) and rule.exact(name) is not None:
                return not rule.negated
        return None

    def match(self, path: str) -> bool:
        """True when the lines ignore ``path`` (for ``--exclude``), or select it (``--include``):
        the last line that matches the path itself decides; failing one, the last that matches
        a folder above it (``src/`` selects ``src/a/b.py``; ``src/`` then ``!src/gen/`` does
        not select ``src/gen/x.py``)."""
        verdict = self.check(path)
        if verdict is not None:
            return verdict
        name = path.removesuffix("/")
        for rule in self._rules:
            if rule.folder is not None and rule.folder(name) is not None:
                return not rule.negated
        return False


def _compiled(regex: str | None) -> Any:
    return None if regex is None else re.compile(regex, re.DOTALL).match


_DEADLINE: ContextVar[float | None] = ContextVar("codesearch_glob_deadline", default=None)


@contextlib.contextmanager
def glob_deadline(deadline: float | None) -> Iterator[None]:
    """Within this block (this thread), `GlobFilter.matches` gives up at ``deadline``
    (``time.monotonic()`` seconds).

    Why: a search in a server thread cannot be killed when its request times out; the glob
    filter is the one part of it whose cost the request chooses (up to `GLOB_LIMITS`: a few
    seconds per 100,000 paths), so it is the part that looks at the clock.
    """
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def search_deadline() -> float | None:
    """The deadline `glob_deadline` set for this thread, or None: the other filters whose cost
    a request chooses (`codesearch.textregex`) stop at it too."""
    return _DEADLINE.get()


@functools.lru_cache(maxsize=256)
def _compile(patterns: tuple[str, ...], limits: GlobLimits | None) -> GlobFilter:
    """`GlobFilter.of`, cached: a server compiles the same few filters for every request.

    One regex per rule rather than one alternation of all: the atomic groups are numbered
    groups (`_Atoms`), and the engine saves every group's mark at each backtracking point,
    so a single regex of hundreds of rules cost ten times as much per path.
    """
    compiled: list[tuple[Any, bool]] = []
    has_include = False
    for negated, body, raw in _sourced_rules(patterns, MAX_EXPANDED_RULES if limits is None else limits.rules):
        line = f"!{body}" if negated else body
        has_include = has_include or not line.startswith("!")
        regex, include, wildcards = _line_regex(line, _Atoms())
        if limits is not None and wildcards > limits.wildcards:
            raise QueryError(f"glob {raw[:60]!r} has {wildcards} wildcards in one rule (the limit is "
                             f"{limits.wildcards}; use fewer *, ? and [...])")
        if regex is None:
            continue
        try:
            compiled.append((re.compile(regex, re.DOTALL).match, bool(include)))
        except (re.error, RecursionError, OverflowError) as exc:  # a bug of ours, said in one line
            raise QueryError(f"invalid glob {raw!r}: {exc} ({_FIX})") from None
    return GlobFilter(patterns, tuple(reversed(compiled)), has_include)


def scope_globs(subdir: str | None, patterns: Sequence[str]) -> tuple[str, ...]:
    """Rules that keep only paths under ``subdir`` (relative, posix) and pass ``patterns``.

    Each rule is rewritten relative to the folder: a slash-free rule matches at any depth
    below it (``*.py`` -> ``src/**/*.py``), a rule with a slash is anchored there
    (``io/*.go`` -> ``src/io/*.go``); ``!`` rules stay ``!``. With no rule that includes,
    ``src/**`` comes first, so that the ``!`` rules only take away from the folder. The
    folder's name is escaped: a folder called ``a[1]`` is that folder, not ``a1``.
    """
    if not subdir:
        return tuple(patterns)
    subdir = escape_glob(subdir.strip("/"))
    scoped: list[str] = []
    for negated, body in _rules(patterns):
        g = body.lstrip("/")
        g = f"{subdir}/**/{g}" if "/" not in g.rstrip("/") else f"{subdir}/{g}"
        scoped.append(f"!{g}" if negated else g)
    if not any(not r.startswith("!") for r in scoped):
        scoped.insert(0, f"{subdir}/**")
    return tuple(scoped)
