"""How rows map to records: text that SQLite must hold as bytes, parameter lists in parts,
and the one query that reads a chunk."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

from codesearch.store.records import StoredChunk
from codesearch.types import Chunk

_T = TypeVar("_T")

#: A chunk's columns in `Chunk`'s order after its ids (table aliases ``c`` and ``f``).
CHUNK_SQL = (
    "SELECT c.id, c.file_id, c.text_hash, f.path, c.start_line, c.end_line, c.start_byte, c.end_byte,"
    " c.language, c.symbol, c.kind, c.scope, c.text, c.header FROM chunks c JOIN files f ON f.id = c.file_id"
)


def stored_chunk(row: Sequence[object]) -> StoredChunk:
    """The `StoredChunk` of a row of `CHUNK_SQL`."""
    return StoredChunk(row[0], row[1], row[2], Chunk(from_db(row[3]), *row[4:]))


def chunked(seq: Sequence[_T], size: int = 900) -> Iterator[Sequence[_T]]:
    # SQLite caps bound parameters (999 on old builds); stay under it.
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def to_db(text: str) -> str | bytes:
    """A path (or a meta value) as the store keeps it: as text, or, for a file name that is
    not valid UTF-8 (which Python holds with surrogate escapes, as ``os.listdir`` returns
    it), as its bytes in a BLOB. SQLite text must be UTF-8; the bytes keep the name whole,
    so the file can be opened again by it, and a BLOB never equals any text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape")
    return text


def from_db(value: str | bytes) -> str:
    """The path :func:`to_db` stored, surrogate escapes included."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def paths_at(rows: list[tuple[object, ...]], i: int) -> list[tuple[object, ...]]:
    """``rows`` with the stored path at column ``i`` made a str (rows of text paths as they are)."""
    return [r if not isinstance(r[i], bytes) else (*r[:i], from_db(r[i]), *r[i + 1 :]) for r in rows]
