"""The records and names every layer shares: chunks, hits, search requests and modes,
progress events, the JSON documents the CLI and the server print, and the names of the
files in an index folder. Nothing here imports numpy or torch, and of codesearch only the
modules below it (`errors`, `pathnames`, `globs`, `languages`), so the CLI, the server and
every package above can use it for free.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Literal, TypeAlias

from codesearch.errors import QueryError
from codesearch.globs import check_globs
from codesearch.languages import canonical_language
from codesearch.pathnames import text_name, valid_text
from codesearch.textregex import check_regex

__all__ = [
    "DEFAULT",
    "DEFAULT_MAX_FILE_BYTES",
    "INDEX_DIR_NAME",
    "JSON",
    "MODES",
    "ROLES",
    "SCHEMA_VERSION",
    "Chunk",
    "Device",
    "IndexSummary",
    "JSONDict",
    "Mode",
    "ProgressEvent",
    "Role",
    "SearchHit",
    "SearchRequest",
    "SearchResult",
    "canonical_languages",
    "default_index_dir",
    "encoder_text",
    "hit_document",
    "model_option",
    "path_kind",
    "result_document",
]

#: JSON, as the documents, the records' ``to_dict()`` and the server's answers hold it.
JSON: TypeAlias = "str | int | float | bool | list[JSON] | dict[str, JSON] | None"
JSONDict: TypeAlias = "dict[str, JSON]"

SCHEMA_VERSION = 1
"""Version of the JSON documents `codesearch query --json/--jsonl` prints (and the server
returns). Bumped only when a field changes meaning or disappears; new fields may be added."""


#: The model argument that means "the model the index records, else the package default"
#: (``CodeSearch(model=DEFAULT)``); None means no such model.
DEFAULT = "default"


class Device(str, Enum):
    """``--device``: where the encoders run."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


def model_option(value: str | None) -> str | None:
    """``--model``/``--multi-model`` as typed: not given -> `DEFAULT` (the index's model,
    else the package default); ``"none"`` -> None (that index disabled); else the name."""
    if value is None:
        return DEFAULT
    return None if value.strip().lower() == "none" else value


#: What a model is for, as the store records it: ``dense`` (one vector per chunk and per
#: file; ``--model``) or ``colbert`` (multi-vector, searched through the PLAID index;
#: ``--multi-model``). One name per concept: the CLI's "multi" model has the role ``colbert``.
Role = Literal["dense", "colbert"]
ROLES: tuple[str, ...] = ("dense", "colbert")

# -- a search request: the same for the Python API, the CLI, HTTP and MCP -------------------

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
        At most one hit per file, and no snippet (as `no_snippet`): file names only.
    regex : str, optional
        Keep only chunks whose text matches this RE2 pattern (see `codesearch.textregex`:
        linear time, ``^``/``$`` per line, ``(?i)`` for any case); every chunk that matches
        can be ranked, so ``k`` hits come back whenever ``k`` chunks match.
    context : int
        Extra lines of the current file above and below each snippet.
    max_lines : int, optional
        Cut each snippet to this many lines: the hit's ``end_line`` then ends at the last
        line returned and its ``more_lines`` says how many lines of the chunk were cut.
    no_snippet : bool
        Return locations and scores only (empty ``text``).
    min_score : float, optional
        Leave out hits scoring below this.
    budget : int, optional
        Approximate token budget for the whole answer: hits best first until it is spent,
        the last one cut to fit (as `max_lines` cuts); the result says how many were left out.

    Raises
    ------
    QueryError
        An empty query, an unknown mode, ``k < 1``, an invalid glob or regex (or one past
        the limits), or an output control out of range.
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
    regex: str | None = None

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
        put(self, "languages", canonical_languages(_strings(self.languages, "a language")))
        globs = _strings(self.globs, "a glob")
        if globs:
            check_globs(globs)
        put(self, "globs", globs)
        if self.regex is not None:
            check_regex(self.regex)
        _check_int(self.context, "context", 0, "pass 0 or more lines")
        if self.max_lines is not None:
            _check_int(self.max_lines, "max_lines", 1, "pass 1 or more, or leave it out for whole snippets")
        if self.budget is not None:
            _check_int(self.budget, "budget", 1, "pass a number of tokens such as 2000")
        if self.min_score is not None:
            number = isinstance(self.min_score, (int, float)) and not isinstance(self.min_score, bool)
            if not number or not math.isfinite(self.min_score):
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
        **fields: object,
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
        """True when an output control (context, max_lines, no_snippet, min_score, budget) is
        set, `files_only` (which returns no snippets), or a regex (whose matching lines each
        hit marks)."""
        return bool(
            self.files_only
            or self.context
            or self.max_lines is not None
            or self.no_snippet
            or self.min_score is not None
            or self.budget is not None
            or self.regex is not None
        )

    def without_output(self) -> SearchRequest:
        """The same search with no output control (what a ranking needs)."""
        return SearchRequest(self.query, self.k, self.mode, self.languages, self.globs, self.files_only,
                             regex=self.regex)

    def to_dict(self) -> JSONDict:
        """JSON-ready: the mode as its name, tuples as lists."""
        doc = asdict(self)
        doc.update(mode=self.mode.value, languages=list(self.languages), globs=list(self.globs))
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> SearchRequest:
        """The inverse of `to_dict` (``language``/``glob`` single values accepted too)."""
        return cls.of(**dict(doc))


def canonical_languages(names: Iterable[str]) -> tuple[str, ...]:
    """Each name as the language it means; a name that is no language is a `QueryError`.

    A real language that an index lacks is not an error: it filters that index to nothing,
    as a glob that matches nothing does (and as it must across several served roots).
    """
    out: list[str] = []
    for name in names:
        lang = canonical_language(name)
        if lang is None:
            raise QueryError(f"unknown language {name!r} (use a language name such as python, go, rust, typescript)")
        out.append(lang)
    return tuple(dict.fromkeys(out))


def _check_int(value: object, name: str, least: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise QueryError(f"{name} must be a whole number, got {value!r} ({fix})")
    if value < least:
        raise QueryError(f"{name} must be at least {least}, got {value} ({fix})")


# -- the index folder ------------------------------------------------------------------------

INDEX_DIR_NAME = ".codesearch"
STORE_FILE = "store.sqlite"
LOCK_FILE = "lock"
#: Files larger than this are skipped unless the user says otherwise.
DEFAULT_MAX_FILE_BYTES = 1_000_000


def default_index_dir(root: str | Path) -> Path:
    """``<root>/.codesearch``, where an index lives unless told otherwise."""
    return Path(root).expanduser().resolve() / INDEX_DIR_NAME


# -- what a path is ----------------------------------------------------------------------------

TEST_PATH_RE = re.compile(
    r"(?:^|/)(?:tests?|__tests__|spec|specs|testing|testdata|test_?utils?)(?:/|$)"
    r"|(?:^|/)test_[^/]*$|_test\.[a-z]+$|_spec\.[a-z]+$|\.(?:test|spec)\.[a-z]+$"
    r"|(?:^|/)[^/]*(?:Tests?|Spec|Suite)\.[A-Za-z]+$"
)


DOC_PATH_RE = re.compile(
    r"(?:^|/)(?:docs?|_?examples?|samples?|tutorials?|docs_src)(?:/|$)"
    # Prose and build/config files: they mention every public name, so they match many
    # queries lexically, yet the code that implements the thing is what is looked for.
    r"|\.(?:md|markdown|rst|txt|adoc|xml|json|ya?ml|toml|ini|cfg|conf|properties|pro|lock|csv|svg|html?)$"
)


BENCH_PATH_RE = re.compile(r"(?:^|/)(?:bench|benches|benchmarks?)(?:/|$)")


def path_kind(path: str) -> int:
    """0 source, 1 test, 2 docs/examples/prose/config, 3 benchmark, from the path alone.

    Search demotes 1-3 when the query does not ask for them; an index run embeds 0 first.
    """
    if TEST_PATH_RE.search(path):
        return 1
    if DOC_PATH_RE.search(path):
        return 2
    if BENCH_PATH_RE.search(path):
        return 3
    return 0


# -- records ---------------------------------------------------------------------------------


def encoder_text(header: str, text: str) -> str:
    """What the encoder embeds of a chunk, and the lexical index reads: the header line,
    then the code. The one place this text is made (`Chunk.encoder_text`, and the store's
    reads of it without a `Chunk`)."""
    return header + "\n" + text


@dataclass(frozen=True, slots=True)
class Chunk:
    """A contiguous run of whole lines of one file, with what it defines.

    Attributes
    ----------
    path : str
        File path relative to the repository root.
    start_line, end_line : int
        1-based, inclusive line range.
    start_byte, end_byte : int
        Byte range of ``text`` in the UTF-8 encoding of the decoded file (see module doc).
    language : str
        Language name as given to `chunk_source`.
    symbol : str or None
        Name of the definition the chunk holds, as written (``"HttpClient"``, ``"Start"``;
        the enclosing names are in `scope`); for a merged group of several definitions
        their names joined by ``", "``; for a piece cut from a long definition that defines
        nothing itself, the innermost enclosing definition's name (its signature is the
        last part of `scope`); None for file-level code that defines nothing.
    kind : str
        ``"function"``, ``"method"``, ``"class"``, ``"struct"``, ``"enum"``, ``"interface"``,
        ``"trait"``, ``"impl"``, ``"module"``, ``"type"``, ... for a definition; ``"block"`` for
        merged groups and pieces of a split definition; ``"section"`` for a Markdown section;
        ``"text"`` for line/paragraph fallback chunks; ``"test"`` for test code inside a
        source file (a Zig ``test`` block, a Rust item marked ``#[test]`` or
        ``#[cfg(test)]``, and every chunk cut from inside one), which search demotes as it
        demotes test files; ``"imports"`` for a chunk of nothing but import, use, include
        or require lines (with package lines and comments), also demoted by search.
    scope : str or None
        Signatures of the enclosing definitions, outermost first, joined by ``" > "``
        (``"class HttpClient(BaseClient):"``); None at file level.
    text : str
        The source lines ``start_line..end_line`` exactly.
    header : str
        Context for the encoder: ``"path"`` or ``"path > scope"``.
    """

    path: str
    start_line: int
    end_line: int
    start_byte: int
    end_byte: int
    language: str
    symbol: str | None
    kind: str
    scope: str | None
    text: str
    header: str

    @property
    def encoder_text(self) -> str:
        """What the encoder embeds, and the lexical index reads: the header line, then the
        code (`encoder_text`)."""
        return encoder_text(self.header, self.text)

    def to_dict(self) -> dict:
        """Plain-JSON form of the chunk."""
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One ranked chunk.

    ``sources`` names the indexes that proposed it (``"lexical"``, ``"dense"``, ...).
    ``more_lines`` counts the chunk's lines after ``end_line`` that an output control
    (``max_lines``, ``budget``) cut off: ``text`` is always exactly the source of
    ``start_line..end_line``, and the chunk itself ends at ``end_line + more_lines``.
    ``match_lines``: with a ``regex``, the lines of ``text`` (file line numbers) it matches.
    """

    path: str
    start_line: int
    end_line: int
    score: float
    language: str
    symbol: str | None
    kind: str
    scope: str | None
    text: str
    chunk_id: int
    sources: tuple[str, ...] = ()
    more_lines: int = 0
    match_lines: tuple[int, ...] = ()

    @classmethod
    def of(cls, chunk: Chunk, *, chunk_id: int, score: float, sources: tuple[str, ...] = ()) -> SearchHit:
        """The hit of a stored chunk: its place, what it defines and its text, with the score
        and the indexes that proposed it. (A hit has no byte range or header: the JSON
        documents and the renderers never showed them.)"""
        return cls(
            path=chunk.path, start_line=chunk.start_line, end_line=chunk.end_line, score=score,
            language=chunk.language, symbol=chunk.symbol, kind=chunk.kind, scope=chunk.scope,
            text=chunk.text, chunk_id=chunk_id, sources=sources,
        )

    def to_dict(self) -> JSONDict:
        """A JSON-ready dict of every field."""
        return {
            "path": self.path,
            "start_line": self.start_line,
            "end_line": self.end_line,
            "score": round(float(self.score), 6),
            "language": self.language,
            "symbol": self.symbol,
            "kind": self.kind,
            "scope": self.scope,
            "text": self.text,
            "chunk_id": self.chunk_id,
            "sources": list(self.sources),
            "more_lines": self.more_lines,
            "match_lines": list(self.match_lines),
        }


@dataclass(frozen=True)
class SearchResult:
    """The hits of one query, with the indexes used and any notice for the user."""

    query: str
    mode: str
    hits: list[SearchHit]
    indexes_used: tuple[str, ...]
    notices: list[str] = field(default_factory=list)
    #: Ranked hits an output control (min_score, budget) left out; None when none was asked.
    left_out: int | None = None

    def to_dict(self) -> JSONDict:
        """A JSON-ready dict (hits as dicts)."""
        return {
            "query": self.query,
            "mode": self.mode,
            "hits": [h.to_dict() for h in self.hits],
            "indexes_used": list(self.indexes_used),
            "notices": list(self.notices),
        }


@dataclass(frozen=True)
class ProgressEvent:
    """One progress report; the CLI renders these with rich.

    ``done``/``total`` count the unit of the stage: files for ``walk``/``chunk``, texts
    for ``encode``, derived indexes for ``sync``.
    """

    stage: str  # 'walk' | 'chunk' | 'write' | 'sync' | 'searchable' | 'encode' | 'published'
    done: int
    total: int
    files: int = 0
    chunks: int = 0
    tokens: int = 0
    tokens_per_s: float = 0.0
    message: str = ""


@dataclass(frozen=True, slots=True)
class IndexSummary:
    """What an index run did."""

    root: str
    index_dir: str
    files_indexed: int  # new or changed (re-chunked)
    files_unchanged: int
    files_removed: int
    files_renamed: int
    skipped: dict[str, int]
    chunks_total: int
    chunks_encoded: int  # texts actually sent to an encoder (chunks and whole files)
    tokens_encoded: int
    seconds: float
    models: dict[str, str]
    notices: list[str]
    files_read: int = 0  # files whose bytes were read (stat changed, new, or re-chunk)
    #: Seconds per stage (walk, chunk, write, sync, encode): what bounds a run.
    stage_seconds: dict[str, float] = field(default_factory=dict)
    #: Texts whose vectors came from the user's vector cache (another worktree, branch or
    #: clone embedded them) instead of an encoder.
    texts_reused: int = 0

    def to_dict(self) -> JSONDict:
        return asdict(self)


# -- the JSON documents ----------------------------------------------------------------------


def hit_document(hit: SearchHit) -> JSONDict:
    """One hit as the stable JSON schema: path (relative to the indexed root), start_line,
    end_line (1-based, inclusive), score, language, symbol, kind, text (exactly those lines),
    ``more_lines`` only when an output control cut the snippet short, and ``match_lines``
    only with a regex (the file's line numbers, within the snippet, that it matches)."""
    doc: JSONDict = {
        "path": text_name(hit.path),  # JSON is UTF-8 text: a name that is not has its bytes as \xNN
        "start_line": hit.start_line,
        "end_line": hit.end_line,
        "score": float(hit.score),
        "language": hit.language,
        "symbol": hit.symbol,
        "kind": hit.kind,
        "text": hit.text,
    }
    if hit.more_lines:
        doc["more_lines"] = hit.more_lines  # the chunk goes on for this many lines past end_line
    if hit.match_lines:
        doc["match_lines"] = list(hit.match_lines)  # with a regex: the lines of text it matches
    return doc


def result_document(result: SearchResult) -> JSONDict:
    """A whole search as the stable JSON schema (``codesearch query --json``)."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "query": result.query,
        "mode": str(result.mode),
        "indexes_used": list(result.indexes_used),
        "notices": [valid_text(n) for n in result.notices],
        "results": [hit_document(h) for h in result.hits],
    }
    if result.left_out is not None:
        # Only when min_score or budget was asked for: ranked hits that were not returned.
        doc["left_out"] = result.left_out
    return doc
