"""One search request, the same for the Python API, the CLI, HTTP and MCP.

`Mode` is the one list of search modes; `SearchRequest` carries a query with its filters
(languages, ripgrep-style globs) and its output controls (snippet lines, score threshold,
token budget), normalised and checked once, when it is made. Every front end builds one
and hands it on, so a bad value is the same one-line `QueryError` wherever it comes from.

Standard library only (the CLI imports this for its option types and must start fast).

Example
-------
>>> from codesearch.request import SearchRequest
>>> req = SearchRequest("parse the config", k=5, languages="python", globs=["src/**", "!**/tests/**"])
>>> req.mode.value, req.languages, req.globs
('hybrid', ('python',), ('src/**', '!**/tests/**'))
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from codesearch.errors import QueryError

__all__ = ["MODES", "Mode", "SearchRequest"]


class Mode(str, Enum):
    """Which indexes rank the hits.

    ``hybrid`` fuses every index the folder has; ``lexical`` is BM25 only (never loads a
    model); ``dense`` the single-vector index; ``colbert`` the multi-vector (PLAID) index.
    """

    hybrid = "hybrid"
    lexical = "lexical"
    dense = "dense"
    colbert = "colbert"

    def __str__(self) -> str:  # f"{mode}" and JSON show the value, not "Mode.hybrid"
        return self.value


#: The mode names, in the order help texts list them.
MODES: tuple[str, ...] = tuple(m.value for m in Mode)


def _strings(value: str | Iterable[str] | None, what: str) -> tuple[str, ...]:
    """``None`` -> (); ``"x"`` -> ("x",); a list or tuple -> a tuple of its stripped, non-empty items."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    out = []
    for item in items:
        if not isinstance(item, str):
            raise QueryError(f"{what} must be text, got {item!r} (pass a string or a list of strings)")
        if item.strip():
            out.append(item.strip())
    return tuple(dict.fromkeys(out))  # repeated values count once, first position kept


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """A query with its filters and output controls, checked when it is made.

    Parameters
    ----------
    query : str
        Words, an identifier, or a piece of code.
    k : int
        How many hits are ranked (or files, with `files_only`); output controls may return
        fewer.
    mode : Mode or str
        ``"hybrid"``, ``"lexical"``, ``"dense"`` or ``"colbert"``.
    languages : str or sequence of str
        Keep hits in any of these languages (``"python"``, ``"go"``); empty: all.
    globs : str or sequence of str
        ripgrep ``--glob`` rules on the path relative to the root: gitignore-style
        (``*.py`` at any depth, ``src/**``), ``!pattern`` excludes, ``{a,b}`` alternatives,
        the last matching rule wins; with any non-``!`` rule a path must match one.
    files_only : bool
        At most one hit per file.
    context : int
        Extra lines of the current file above and below each snippet.
    max_lines : int, optional
        Cut each snippet to this many lines, with a ``... (N more lines)`` marker.
    no_snippet : bool
        Return locations and scores only (empty ``text``).
    min_score : float, optional
        Leave out hits scoring below this.
    budget : int, optional
        Approximate token budget for the whole answer: hits best first until it is spent,
        the last one cut to fit; the result says how many were left out.

    Raises
    ------
    QueryError
        An empty query, an unknown mode, ``k < 1``, an invalid glob, or an output control
        out of range.
    """

    query: str
    k: int = 10
    mode: Mode = Mode.hybrid
    languages: tuple[str, ...] = ()
    globs: tuple[str, ...] = ()
    files_only: bool = False
    context: int = 0
    max_lines: int | None = None
    no_snippet: bool = False
    min_score: float | None = None
    budget: int | None = None

    def __post_init__(self) -> None:
        # Normalised in place (frozen: object.__setattr__) so that every front end may pass
        # what its users type: a mode name, one language or a list, one glob or a list.
        put = object.__setattr__
        if not isinstance(self.query, str) or not self.query.strip():
            raise QueryError("the query is empty (pass some words or code to search for)")
        try:
            put(self, "mode", Mode(self.mode))
        except ValueError:
            raise QueryError(f"unknown mode {self.mode!r} (use one of: {', '.join(MODES)})") from None
        _check_int(self.k, "k", 1, "pass k=10 for example")
        put(self, "languages", tuple(lang.lower() for lang in _strings(self.languages, "a language")))
        globs = _strings(self.globs, "a glob")
        if globs:
            from codesearch.globs import check_globs

            check_globs(globs)
        put(self, "globs", globs)
        _check_int(self.context, "context", 0, "pass 0 or more lines")
        if self.max_lines is not None:
            _check_int(self.max_lines, "max_lines", 1, "pass 1 or more, or leave it out for whole snippets")
        if self.budget is not None:
            _check_int(self.budget, "budget", 1, "pass a number of tokens such as 2000")
        if self.min_score is not None:
            if isinstance(self.min_score, bool) or not isinstance(self.min_score, (int, float)) or not math.isfinite(self.min_score):
                raise QueryError(f"min_score must be a number, got {self.min_score!r} (pass 0.5 for example)")
            put(self, "min_score", float(self.min_score))
        put(self, "files_only", bool(self.files_only))
        put(self, "no_snippet", bool(self.no_snippet))

    @classmethod
    def of(
        cls,
        query: str,
        k: int = 10,
        *,
        language: str | Iterable[str] | None = None,
        glob: str | Iterable[str] | None = None,
        **fields: Any,
    ) -> SearchRequest:
        """Build one from keyword arguments, taking the single-value names too.

        ``language``/``glob`` (one value or several, as the API, HTTP ``lang`` and MCP
        have always taken them) are added to ``languages``/``globs``.
        """
        languages = (*_strings(fields.pop("languages", None), "a language"), *_strings(language, "a language"))
        globs = (*_strings(fields.pop("globs", None), "a glob"), *_strings(glob, "a glob"))
        unknown = set(fields) - set(cls.__dataclass_fields__)
        if unknown:
            raise QueryError(f"unknown search option(s): {', '.join(sorted(unknown))} (see SearchRequest)")
        return cls(query, k, languages=languages, globs=globs, **fields)

    @property
    def shapes_output(self) -> bool:
        """True when an output control (context, max_lines, no_snippet, min_score, budget) is set."""
        return bool(
            self.context or self.max_lines is not None or self.no_snippet
            or self.min_score is not None or self.budget is not None
        )

    def without_output(self) -> SearchRequest:
        """The same search with no output control (what a ranking needs)."""
        return SearchRequest(self.query, self.k, self.mode, self.languages, self.globs, self.files_only)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the mode as its name, tuples as lists."""
        doc = asdict(self)
        doc.update(mode=self.mode.value, languages=list(self.languages), globs=list(self.globs))
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> SearchRequest:
        """The inverse of `to_dict` (``language``/``glob`` single values accepted too)."""
        return cls.of(**dict(doc))


def _check_int(value: Any, name: str, least: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise QueryError(f"{name} must be a whole number, got {value!r} ({fix})")
    if value < least:
        raise QueryError(f"{name} must be at least {least}, got {value} ({fix})")
