"""The store's schema: numbered migrations, and the checks that tell a damaged file or a
full disk from a bug.

``MIGRATIONS[i]`` takes the schema from version ``i`` to ``i + 1``; a store is migrated on
open, one step per transaction (`codesearch.store.connection.Connection`). Never edit a
released entry; append a new one.
"""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

from codesearch.errors import IndexCorruptError, IndexWriteError

#: Meta key: the model roles a run switched off with 'none' (JSON list). Here, below both
#: its writer (the index run) and a reader (search, which says when a query lost vectors).
DISABLED_KEY = "models.disabled"

# Numbered migrations: MIGRATIONS[i] takes the schema from version i to version i + 1.
# Never edit a released entry; append a new one (it runs on open, inside one transaction).
MIGRATIONS: list[str] = [
    """
    CREATE TABLE files (
        id INTEGER PRIMARY KEY AUTOINCREMENT,   -- never reused: ids live on in derived indexes
        path TEXT NOT NULL UNIQUE,
        hash TEXT NOT NULL,              -- xxh3_128 hex of the raw bytes
        size INTEGER NOT NULL,
        mtime_ns INTEGER NOT NULL,
        language TEXT NOT NULL,
        n_lines INTEGER NOT NULL
    );
    CREATE INDEX files_hash ON files(hash);
    CREATE TABLE chunks (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
        start_line INTEGER NOT NULL,
        end_line INTEGER NOT NULL,
        start_byte INTEGER NOT NULL,
        end_byte INTEGER NOT NULL,
        language TEXT NOT NULL,
        symbol TEXT,
        kind TEXT NOT NULL,
        scope TEXT,
        header TEXT NOT NULL,
        text TEXT NOT NULL,
        text_hash TEXT NOT NULL          -- xxh3_128 hex of text: the vectors cache key
    );
    CREATE INDEX chunks_file ON chunks(file_id);
    CREATE INDEX chunks_text_hash ON chunks(text_hash);
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE models (
        role TEXT PRIMARY KEY CHECK (role IN ('dense', 'colbert')),
        name TEXT NOT NULL,
        identity TEXT NOT NULL,
        dim INTEGER NOT NULL
    );
    CREATE TABLE vectors (
        model TEXT NOT NULL,             -- the encoder's identity (name + weights hash)
        kind TEXT NOT NULL CHECK (kind IN ('dense', 'colbert', 'file')),
        text_hash TEXT NOT NULL,
        dim INTEGER NOT NULL,
        n INTEGER NOT NULL,              -- rows: 1 for single vectors, tokens for ColBERT
        data BLOB NOT NULL,              -- float16, C order, (n, dim)
        PRIMARY KEY (model, kind, text_hash)
    ) WITHOUT ROWID;
    """,
    # 2: the vectors cache becomes a rowid table with a unique key. WITHOUT ROWID kept each
    # float16 blob (28-77 KB for a ColBERT text) inside a b-tree ordered by a random hash, so
    # every insert split and moved 64 KiB pages: a writer ceiling of ~960 ColBERT texts/s
    # (300 x 48) and ~3,800 dense vectors/s. Appended by rowid with a small unique index:
    # ~6,200 and ~21,000 in a short run (`benchmarks/ray_overhead.py --writer`; the steady state,
    # past WAL checkpoints, is in BENCHMARKS.md, 'A large first index on workers'). Reads are
    # the same SQL on either layout.
    """
    CREATE TABLE vectors_v2 (
        id INTEGER PRIMARY KEY,
        model TEXT NOT NULL,             -- the encoder's identity (name + weights hash)
        kind TEXT NOT NULL CHECK (kind IN ('dense', 'colbert', 'file')),
        text_hash TEXT NOT NULL,
        dim INTEGER NOT NULL,
        n INTEGER NOT NULL,              -- rows: 1 for single vectors, tokens for ColBERT
        data BLOB NOT NULL,              -- float16, C order, (n, dim)
        UNIQUE (model, kind, text_hash)
    );
    INSERT INTO vectors_v2(model, kind, text_hash, dim, n, data)
        SELECT model, kind, text_hash, dim, n, data FROM vectors;
    DROP TABLE vectors;
    ALTER TABLE vectors_v2 RENAME TO vectors;
    """,
    # 3: multi-vector arrays move out of the rows into append-only segment files, written
    # once (SQLite's WAL wrote each page twice, which bound the ColBERT writer at ~100 MB/s
    # of vectors on a 450 MB/s disk; `benchmarks/ray_overhead.py --writer`). A row with
    # ``seg`` NULL keeps its array in ``data`` (every row before this version); otherwise
    # ``data`` is empty and the array is ``n * dim * 2`` bytes at ``off`` in segment ``seg``.
    """
    ALTER TABLE vectors ADD COLUMN seg INTEGER;     -- segment file number, NULL: in data
    ALTER TABLE vectors ADD COLUMN off INTEGER;     -- byte offset in that segment
    ALTER TABLE vectors ADD COLUMN crc INTEGER;     -- zlib.crc32 of those bytes
    -- What compaction reads of each segment's rows, without a scan of every vector.
    CREATE INDEX vectors_seg ON vectors(seg, off, n, dim) WHERE seg IS NOT NULL;
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)
#: The oldest schema a read-only open reads as it is (a reader cannot migrate): the same
#: SELECTs run on every version from this one on, so a search after an upgrade of codesearch
#: works before the next index run upgrades the file.
READABLE_FROM = 1

CORRUPT_MARKERS = ("not a database", "malformed", "disk image", "file is encrypted")


#: SQLite's primary result codes for a write the disk refused.
_WRITE_REFUSED = (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR)


def refused(path: str, exc: sqlite3.Error) -> IndexWriteError | None:
    """The user's error for a write the disk refused (full, or an I/O error), else None.

    Why not `IndexCorruptError`: nothing is damaged (SQLite rolled the transaction back),
    and its way out, ``--rebuild``, would need more space than the failed run.
    """
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    if code not in _WRITE_REFUSED:
        return None
    what = "the disk is full" if code == sqlite3.SQLITE_FULL else f"the disk refused a write ({exc})"
    error = IndexWriteError(
        f"cannot write the index store {path}: {what} (free some space and run 'codesearch index' again; "
        "the last complete index still answers searches)"
    )
    error.why = what  # (for a caller that words it otherwise: a write after a run's commit)
    return error


def corrupt(path: str, detail: object) -> IndexCorruptError:
    return IndexCorruptError(
        f"Index store {path} cannot be read ({detail}); run 'codesearch index --rebuild' to recreate it"
    )


def check_header(path: Path) -> None:
    """Refuse a file that is not SQLite or is shorter than its header says (truncated).

    Reads the file with its own descriptor, and closing that drops every POSIX lock this
    process holds on the file: call it only when no connection of this process has the file
    open (`codesearch.store.connection` keeps that count).
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return  # a fresh file sqlite will initialise
    with open(path, "rb") as fh:
        header = fh.read(100)
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        raise corrupt(str(path), "not an SQLite database")
    page_size = struct.unpack(">H", header[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    n_pages = struct.unpack(">I", header[28:32])[0]
    change_counter, valid_for = struct.unpack(">I", header[24:28])[0], struct.unpack(">I", header[92:96])[0]
    # The in-header page count is only trustworthy when "version-valid-for" matches the
    # change counter (SQLite file format, section 1.3.7), and only with no WAL beside the
    # file: a checkpoint in progress may write page 1 before it extends the file.
    wal = path.with_name(path.name + "-wal")
    if change_counter == valid_for and not wal.exists() and size < n_pages * page_size:
        raise corrupt(str(path), f"truncated: {size} bytes, header says {n_pages * page_size}")
