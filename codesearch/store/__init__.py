"""The source of truth of an index (SQLite), its locks, and atomic file writes.

>>> from codesearch.store import Store
>>> Store(":memory:").generation
0
"""

from codesearch.store.files import atomic_write, read_text
from codesearch.store.lock import IndexLock, ReadWriteLock
from codesearch.store.sqlite import (
    KIND_ROLE,
    ChunkRecord,
    ChunkRow,
    FileRecord,
    ModelRecord,
    Store,
)

__all__ = [
    "KIND_ROLE",
    "ChunkRecord",
    "ChunkRow",
    "FileRecord",
    "IndexLock",
    "ModelRecord",
    "ReadWriteLock",
    "Store",
    "atomic_write",
    "read_text",
]
