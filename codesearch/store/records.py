"""What the store hands out: a file, a stored chunk (the one `Chunk` record with its ids), the
chunk metadata a searcher keeps in memory, and a recorded model."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

from codesearch.types import Chunk, JSONDict

__all__ = ["ChunkMeta", "FileRecord", "ModelRecord", "StoredChunk"]


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One indexed file."""

    id: int
    path: str
    hash: str
    size: int
    mtime_ns: int
    language: str
    n_lines: int

    def to_dict(self) -> JSONDict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class StoredChunk:
    """A chunk as the store keeps it: its id (stable while its header and text are), its
    file's id, the hash of its text (the vectors cache key), and the `Chunk` itself."""

    id: int
    file_id: int
    text_hash: str
    chunk: Chunk

    def to_dict(self) -> JSONDict:
        """The ids and the hash, then the chunk's own fields."""
        return {"id": self.id, "file_id": self.file_id, "text_hash": self.text_hash, **self.chunk.to_dict()}


class ChunkMeta(NamedTuple):
    """One chunk without its text: what a searcher keeps in memory of every chunk
    (`codesearch.search.corpus.Corpus`). A tuple, so that reading a large index stays fast."""

    id: int
    file_id: int
    path: str
    start_line: int
    end_line: int
    language: str
    symbol: str | None
    kind: str
    scope: str | None


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """The model an index was built with, for one role (``dense`` or ``colbert``)."""

    role: str
    name: str
    identity: str
    dim: int

    def to_dict(self) -> JSONDict:
        return asdict(self)
