"""`GlobFilter`: ripgrep's ``--glob`` rules of a search, compiled (see `codesearch.globs`
for what they mean), checked against the request's limits, and scoped to a folder."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from codesearch.errors import QueryError
from codesearch.globs.braces import _rules, _sourced_rules, escape_glob
from codesearch.globs.limits import _DEADLINE, _FIX, GLOB_LIMITS, MAX_EXPANDED_RULES, GlobLimits
from codesearch.globs.regex import _Atoms, _line_regex, _Plain


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
    #: Every rule in one RE2 set (None where RE2 cannot hold them), and keep? of each, in order.
    _set: Any = field(default=None, repr=False, compare=False)
    _keeps: tuple[bool, ...] = field(default=(), repr=False, compare=False)

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

        Each path is matched against every rule at once (one pass of RE2's automaton over
        the path, whatever the number of rules): 64 rules of 30 wildcards took 0.4-0.6 s per
        search on 2,000 paths one rule at a time.

        Raises
        ------
        QueryError
            The deadline passed (a server's search timed out, or its server stops: its
            thread stops here).
        """
        deadline = _DEADLINE.get()
        rules, keeps, default = self._set, self._keeps, not self._has_include
        for n, path in enumerate(paths):
            if deadline is not None and n % 1024 == 0 and deadline.passed():
                raise QueryError(f"the glob filter ran past the search's time limit after {n:,} paths "
                                 "(narrow the globs, or search a folder with path)")
            if rules is None:
                yield self.match(path)
                continue
            try:
                hit = rules.Match(path)
            except UnicodeEncodeError:  # a name that is not UTF-8 (surrogate escapes): one rule at a time
                yield self.match(path)
                continue
            yield keeps[max(hit)] if hit else default



@functools.lru_cache(maxsize=256)
def _compile(patterns: tuple[str, ...], limits: GlobLimits | None) -> GlobFilter:
    """`GlobFilter.of`, cached: a server compiles the same few filters for every request.

    One regex per rule rather than one alternation of all: the atomic groups are numbered
    groups (`_Atoms`), and the engine saves every group's mark at each backtracking point,
    so a single regex of hundreds of rules cost ten times as much per path.
    """
    compiled: list[tuple[Any, bool]] = []
    plain: list[str] = []
    most = 0  # wildcards of the rule with the most
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
        plain.append(_line_regex(line, _Plain())[0] or "")
        most = max(most, wildcards)
    keeps = tuple(keep for _, keep in compiled)
    # A few simple rules ('*.py', '!tests/**') cost less one at a time (0.6 us a path for
    # three) than a call into the set (~2 us); more, or longer ones, far more.
    rules = _rule_set(plain) if len(plain) > _FEW_RULES or most > _FEW_RULES else None
    return GlobFilter(patterns, tuple(reversed(compiled)), has_include, rules, keeps)


#: Rules (and wildcards in one rule) up to which a filter matches one rule at a time.
_FEW_RULES = 4
#: Memory RE2 may give one set's automaton (states are made as paths need them; past this
#: it would stop with no answer, so a set stays far below).
_SET_MAX_MEM = 64 << 20


def _rule_set(regexes: Sequence[str]) -> Any:
    """The rules' RE2 regexes (`_Plain`) in one set anchored at the path's start, or None
    where RE2 refuses them (then each rule is matched on its own)."""
    if not regexes:
        return None
    import re2

    options = re2.Options()
    options.max_mem = _SET_MAX_MEM
    rules = re2.Set.MatchSet(options)
    try:
        for regex in regexes:
            rules.Add("(?s)" + regex)
        rules.Compile()
    except re2.error:
        return None
    return rules



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
