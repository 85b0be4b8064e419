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

The package, one purpose per module (everything public is imported from here,
``from codesearch.globs import GlobFilter``):

- `codesearch.globs.limits`: what one request may ask (`GlobLimits`) and the clock a
  server's search stops at (`glob_deadline`);
- `codesearch.globs.braces`: ``{a,b}`` expansion, counted before it is done;
- `codesearch.globs.regex`: one gitignore-style line to a regex that cannot backtrack
  exponentially;
- `codesearch.globs.ripgrep`: `GlobFilter`, the ``--glob`` rules of a search;
- `codesearch.globs.gitignore`: `GitIgnore`, ignore files and ``--include``/``--exclude``.

Example
-------
>>> f = GlobFilter.of(["*.{rs,md}", "!tests/**"])
>>> [f.match(p) for p in ("src/main.rs", "README.md", "tests/cli.rs", "setup.py")]
[True, True, False, False]
"""

from __future__ import annotations

from codesearch.globs.braces import _rules as _rules  # the rules a pattern expands to (the tests read them)
from codesearch.globs.braces import escape_glob, expand_braces
from codesearch.globs.gitignore import GitIgnore
from codesearch.globs.limits import GLOB_LIMITS, MAX_EXPANDED_RULES, GlobLimits, glob_deadline, search_deadline
from codesearch.globs.ripgrep import GlobFilter, check_globs, scope_globs

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
