"""`GitIgnore`: ignore files and ``--include``/``--exclude`` patterns, matched as git does.

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
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from codesearch.globs.regex import _ANY, _Atoms, _atoms_regex, _compiled, _Dropped, _groups_regex

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


