"""One gitignore-style line (a ripgrep ``--glob`` rule) to a regex that cannot backtrack
exponentially.

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
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from codesearch.errors import QueryError
from codesearch.globs.limits import _FIX

_ANY = "[^/]"
_END = r"(?=/|\Z)"  # the end of a path segment


class _Atoms:
    """Numbers the atomic groups of one compiled regex (Python 3.10 has no ``(?>...)``)."""

    #: What ends a path segment inside an atomic group, and the end of the path.
    end = _END
    eos = r"\Z"

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, body: str) -> str:
        # A lookahead is atomic in Python's engine: it matches once, and the backreference
        # then consumes exactly what it matched; nothing backtracks into it.
        self.n += 1
        return f"(?=(?P<a{self.n}>{body}))(?P=a{self.n})"


class _Plain(_Atoms):
    """The same regexes for RE2, an automaton that never backtracks: plain groups, no
    lookahead (none is needed there: a segment's regex cannot match a ``/``, and what
    follows it in the regex is a ``/`` or the end), RE2's end of text."""

    end = ""
    eos = r"\z"

    def __call__(self, body: str) -> str:
        return f"(?:{body})"


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
        return atomic(head + atomic.end)
    middle = "".join(atomic(f"{_ANY}*?{''.join(p)}") for p in pieces[1:-1])
    return atomic(f"{head}{middle}{_ANY}*{''.join(pieces[-1])}{atomic.end}")


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
        tail = "/?" + atomic.eos  # ripgrep's "src/*": one level, not below
    else:
        tail = f"(?:/|{atomic.eos})"
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



def _compiled(regex: str | None) -> Any:
    return None if regex is None else re.compile(regex, re.DOTALL).match


