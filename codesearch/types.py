"""The records and names every layer shares: chunks, hits, search modes, progress events,
the JSON documents the CLI and the server print, and the names of the files in an index
folder. Nothing here imports numpy, torch or another codesearch module but `errors`, so the
CLI, the server and every package below them can use it for free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path
import re
from typing import Any, Literal

__all__ = [
    "Chunk",
    "DEFAULT_MAX_FILE_BYTES",
    "INDEX_DIR_NAME",
    "IndexSummary",
    "MODES",
    "Mode",
    "ProgressEvent",
    "ROLES",
    "Role",
    "SCHEMA_VERSION",
    "SearchHit",
    "SearchResult",
    "default_index_dir",
    "path_kind",
    "hit_document",
    "result_document",
]

SCHEMA_VERSION = 1
"""Version of the JSON documents `codesearch query --json/--jsonl` prints (and the server
returns). Bumped only when a field changes meaning or disappears; new fields may be added."""

#: How a search ranks: ``hybrid`` fuses every index the folder has; the others use one.
Mode = Literal["hybrid", "lexical", "dense", "colbert"]
MODES: tuple[str, ...] = ("hybrid", "lexical", "dense", "colbert")

#: What a model is for, as the store records it: ``dense`` (one vector per chunk and per
#: file; ``--model``) or ``colbert`` (multi-vector, searched through the PLAID index;
#: ``--multi-model``). One name per concept: the CLI's "multi" model has the role ``colbert``.
Role = Literal["dense", "colbert"]
ROLES: tuple[str, ...] = ("dense", "colbert")

# -- the index folder ------------------------------------------------------------------------

INDEX_DIR_NAME = ".codesearch"
STORE_FILE = "store.sqlite"
LOCK_FILE = "lock"
#: Written by the first searcher of each index generation, read back by later processes.
CENTRALITY_FILE = "centrality.npz"
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
        """What the encoder embeds: the header line, then the code."""
        return self.header + "\n" + self.text

    def to_dict(self) -> dict:
        """Plain-JSON form of the chunk."""
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One ranked chunk.

    ``sources`` names the indexes that proposed it (``"lexical"``, ``"dense"``, ...).
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

    def to_dict(self) -> dict[str, Any]:
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
        }


@dataclass(frozen=True)
class SearchResult:
    """The hits of one query, with the indexes used and any notice for the user."""

    query: str
    mode: str
    hits: list[SearchHit]
    indexes_used: tuple[str, ...]
    notices: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
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

    stage: str  # 'walk' | 'chunk' | 'encode' | 'write' | 'sync'
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- the JSON documents ----------------------------------------------------------------------


def hit_document(hit: SearchHit) -> dict[str, Any]:
    """One hit as the stable JSON schema: path (relative to the indexed root), start_line,
    end_line (1-based, inclusive), score, language, symbol, kind, text."""
    return {
        "path": hit.path,
        "start_line": hit.start_line,
        "end_line": hit.end_line,
        "score": float(hit.score),
        "language": hit.language,
        "symbol": hit.symbol,
        "kind": hit.kind,
        "text": hit.text,
    }


def result_document(result: SearchResult) -> dict[str, Any]:
    """A whole search as the stable JSON schema (``codesearch query --json``)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "query": result.query,
        "mode": result.mode,
        "indexes_used": list(result.indexes_used),
        "notices": list(result.notices),
        "results": [hit_document(h) for h in result.hits],
    }
