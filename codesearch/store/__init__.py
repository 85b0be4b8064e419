"""The source of truth of an index (SQLite), its locks, and atomic file writes.

>>> from codesearch.store import Store
>>> Store(":memory:").generation
0
"""

from codesearch import _compat
from codesearch.store.files import atomic_write, read_text
from codesearch.store.lock import IndexLock, ReadWriteLock
from codesearch.store.records import ChunkMeta, FileRecord, ModelRecord, StoredChunk
from codesearch.store.sqlite import Store
from codesearch.store.vectors import KIND_ROLE, VECTOR_KINDS, VectorKind

__all__ = [
    "KIND_ROLE",
    "VECTOR_KINDS",
    "ChunkMeta",
    "FileRecord",
    "IndexLock",
    "ModelRecord",
    "ReadWriteLock",
    "Store",
    "StoredChunk",
    "VectorKind",
    "atomic_write",
    "read_text",
]

#: The two chunk records became one: `StoredChunk` (ids, text hash, and the `Chunk`).
__getattr__ = _compat.moved_names(
    __name__,
    {"ChunkRecord": "codesearch.store.records:StoredChunk", "ChunkRow": "codesearch.store.records:StoredChunk"},
)
