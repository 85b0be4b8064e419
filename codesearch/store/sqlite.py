"""The SQLite store: the source of truth of an index.

Every derived index (lexical, dense, PLAID) can be rebuilt from what is here, and the
vectors cache means a rebuild never re-encodes. The tables:

``files``    one row per indexed file: path, content hash (xxh3_128), size, mtime_ns, ...
``chunks``   one row per chunk: position, symbol, header, exact text, hash of the text
``meta``     key/value: root, chunk budget, generation, derived-index generations, ...
``models``   role (``dense`` | ``colbert``) -> model name, identity, vector size
``vectors``  the cache: (model identity, kind, text hash) -> float16 array; the large
             multi-vector (ColBERT) arrays live in append-only segment files beside the
             store (``store/segments.py``), their rows say where

The class reads like sqlite-utils: ``Store(":memory:")`` in tests, WAL on disk, every
write inside ``with store.transaction():``, the schema version in ``PRAGMA user_version``
with numbered migrations applied on open.

Example
-------
>>> store = Store(":memory:")
>>> with store.transaction():
...     fid = store.upsert_file("a.py", hash="h", size=3, mtime_ns=1, language="python", n_lines=1)
>>> store.file_paths()
{1: 'a.py'}
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from codesearch.errors import IndexCorruptError, IndexWriteError
from codesearch.store.segments import SegmentError, Segments

#: Vector kinds in the cache, and the model role whose identity keys each of them.
KIND_ROLE = {"dense": "dense", "file": "dense", "colbert": "colbert"}
#: Kinds whose arrays go to segment files (an on-disk store): tens of KB per text, written
#: once there instead of twice through SQLite's WAL. Single vectors (1.5 KB) stay in rows:
#: a query reads them, and their cost is per row, not per byte.
SEGMENT_KINDS = frozenset({"colbert"})

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
    # ~6,200 and ~21,000 in a short run (BENCHMARKS.md, session 4; the steady state, past
    # WAL checkpoints, is in session 5). Reads are the same SQL on either layout.
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
    # of vectors on a 450 MB/s disk; BENCHMARKS.md, session 6). A row with ``seg`` NULL
    # keeps its array in ``data`` (every row before this version); otherwise ``data`` is
    # empty and the array is ``n * dim * 2`` bytes at ``off`` in segment ``seg``.
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

_CORRUPT_MARKERS = ("not a database", "malformed", "disk image", "file is encrypted")

#: The columns a vector read selects (table alias ``v``), on schema 3 and before it.
_VEC_COLS = "v.n, v.dim, v.data, v.seg, v.off, v.crc"
_VEC_COLS_BEFORE_3 = "v.n, v.dim, v.data, NULL, NULL, NULL"


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """One chunk as search results show it (the shared contract)."""

    id: int
    file_id: int
    path: str
    start_line: int
    end_line: int
    language: str
    symbol: str | None
    kind: str
    scope: str | None
    header: str
    text: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ChunkRow:
    """A full ``chunks`` row, with the byte range and the text hash the pipeline needs."""

    id: int
    file_id: int
    start_line: int
    end_line: int
    start_byte: int
    end_byte: int
    language: str
    symbol: str | None
    kind: str
    scope: str | None
    header: str
    text: str
    text_hash: str

    @property
    def encoder_text(self) -> str:
        """What the encoder sees: the same ``header + "\\n" + text`` as ``Chunk.encoder_text``."""
        return self.header + "\n" + self.text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """The model an index was built with, for one role (``dense`` or ``colbert``)."""

    role: str
    name: str
    identity: str
    dim: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_CHUNK_RECORD_SQL = (
    "SELECT c.id, c.file_id, f.path, c.start_line, c.end_line, c.language, c.symbol, c.kind,"
    " c.scope, c.header, c.text FROM chunks c JOIN files f ON f.id = c.file_id"
)
_CHUNK_ROW_COLS = (
    "id, file_id, start_line, end_line, start_byte, end_byte, language, symbol, kind, scope,"
    " header, text, text_hash"
)


def _chunked(seq: Sequence[Any], size: int = 900) -> Iterator[Sequence[Any]]:
    # SQLite caps bound parameters (999 on old builds); stay under it.
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def encode_array(array: np.ndarray) -> tuple[int, int, bytes]:
    """(n, dim, float16 bytes) of a 1-D or 2-D float array."""
    a = np.asarray(array)
    if a.dtype not in (np.float32, np.float16):  # float64 and the rest: through float32, as always
        a = a.astype(np.float32)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise ValueError(f"expected a 1-D or 2-D array, got shape {a.shape}")
    return a.shape[0], a.shape[1], _cast(a, np.float16).tobytes()


def decode_array(n: int, dim: int, data: bytes) -> np.ndarray:
    """The float32 (n, dim) array stored by :func:`encode_array`."""
    return _cast(np.frombuffer(data, dtype=np.float16).reshape(n, dim), np.float32)


def _cast(a: np.ndarray, dtype: type) -> np.ndarray:
    """``a`` as a C-ordered array of ``dtype``, bit for bit what numpy's cast makes (a NaN
    stays a NaN, its payload bits may differ).

    numpy converts between float32 and float16 element by element, 5-8x slower than torch's
    vectorised cast (51 us against 7 us for a 300 x 48 ColBERT text): CPU that the process
    writing or reading vectors spends per text. Torch is used when this process has already
    imported it (it has, whenever it made the vectors); the store itself never imports it.
    """
    torch = sys.modules.get("torch")
    if not hasattr(torch, "from_numpy") or a.dtype == dtype or a.dtype not in (np.float32, np.float16):
        return np.ascontiguousarray(a, dtype=dtype)
    a = np.ascontiguousarray(a)
    if not a.flags.writeable:  # bytes read from SQLite or a segment: torch takes only writable memory
        a = a.copy()
    return torch.from_numpy(a).to(torch.float16 if dtype is np.float16 else torch.float32).numpy()


def _to_db(text: str) -> str | bytes:
    """A path (or a meta value) as the store keeps it: as text, or, for a file name that is
    not valid UTF-8 (which Python holds with surrogate escapes, as ``os.listdir`` returns
    it), as its bytes in a BLOB. SQLite text must be UTF-8; the bytes keep the name whole,
    so the file can be opened again by it, and a BLOB never equals any text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape")
    return text


def _from_db(value: str | bytes) -> str:
    """The path :func:`_to_db` stored, surrogate escapes included."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def _paths_at(rows: list[Any], i: int) -> list[Any]:
    """``rows`` with the stored path at column ``i`` made a str (rows of text paths as they are)."""
    return [r if not isinstance(r[i], bytes) else (*r[:i], _from_db(r[i]), *r[i + 1 :]) for r in rows]


#: SQLite's primary result codes for a write the disk refused.
_WRITE_REFUSED = (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR)


def _refused(path: str, exc: sqlite3.Error) -> IndexWriteError | None:
    """The user's error for a write the disk refused (full, or an I/O error), else None.

    Why not `IndexCorruptError`: nothing is damaged (SQLite rolled the transaction back),
    and its way out, ``--rebuild``, would need more space than the failed run.
    """
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    if code not in _WRITE_REFUSED:
        return None
    what = "the disk is full" if code == sqlite3.SQLITE_FULL else f"the disk refused a write ({exc})"
    return IndexWriteError(
        f"cannot write the index store {path}: {what} (free some space and run 'codesearch index' again; "
        "the last complete index still answers searches)"
    )


def _corrupt(path: str, detail: object) -> IndexCorruptError:
    return IndexCorruptError(
        f"Index store {path} cannot be read ({detail}); run 'codesearch index --rebuild' to recreate it"
    )


def _check_header(path: Path) -> None:
    """Refuse a file that is not SQLite or is shorter than its header says (truncated)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return  # a fresh file sqlite will initialise
    with open(path, "rb") as fh:
        header = fh.read(100)
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        raise _corrupt(str(path), "not an SQLite database")
    page_size = struct.unpack(">H", header[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    n_pages = struct.unpack(">I", header[28:32])[0]
    change_counter, valid_for = struct.unpack(">I", header[24:28])[0], struct.unpack(">I", header[92:96])[0]
    # The in-header page count is only trustworthy when "version-valid-for" matches the
    # change counter (SQLite file format, section 1.3.7), and only with no WAL beside the
    # file: a checkpoint in progress may write page 1 before it extends the file.
    wal = path.with_name(path.name + "-wal")
    if change_counter == valid_for and not wal.exists() and size < n_pages * page_size:
        raise _corrupt(str(path), f"truncated: {size} bytes, header says {n_pages * page_size}")


class Store:
    """SQLite store of one index (files, chunks, meta, models, vectors cache).

    Parameters
    ----------
    path
        The database file, or ``":memory:"`` (tests).
    readonly
        Open without writing anything (no migration); a store of an older schema then
        raises :class:`IndexCorruptError` asking for ``codesearch index``.

    Notes
    -----
    On disk the journal is WAL, so readers never block the writer and always see the last
    committed state. One writer at a time is enforced by :class:`IndexLock`, not here.
    """

    def __init__(self, path: str | os.PathLike[str] = ":memory:", *, readonly: bool = False):
        self.path = str(path)
        self.readonly = readonly
        self._depth = 0
        memory = self.path == ":memory:"
        # The segment folder is named after the store file, so two stores in one folder
        # never share it.
        self.segments = None if memory else Segments(Path(self.path + ".vectors"), readonly=readonly)
        self._cursors = 0  # iter_vectors generators under way (their snapshots need segments)
        if not memory:
            _check_header(Path(self.path))
            if readonly and not Path(self.path).exists():
                raise _corrupt(self.path, "file does not exist")
        try:
            if readonly and not memory:
                self.conn = self._connect_readonly()
            else:
                self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.conn.execute("PRAGMA busy_timeout = 10000")
            self.conn.execute("PRAGMA foreign_keys = ON")
            if not memory and not readonly:
                # Set before the first table exists (it is then fixed for the file; an older
                # store keeps its 4 KiB pages). A ColBERT vector is a 77 KB blob that takes
                # 19 overflow pages at 4 KiB: 64 KiB pages wrote 2.2x faster (1,128 -> 2,472
                # texts/s for 300x128 float16 blobs, 64 per commit).
                self.conn.execute("PRAGMA page_size = 65536")
                self.conn.execute("PRAGMA journal_mode = WAL")
                # NORMAL in WAL mode is durable against process crashes (kill -9); only a
                # power loss can drop the last commits, never corrupt the file.
                self.conn.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            with contextlib.suppress(Exception):
                self.conn.close()
            raise (_refused(self.path, exc) or _corrupt(self.path, exc)) from exc

    def _connect_readonly(self) -> sqlite3.Connection:
        """A read-only connection; on a full disk, one that needs no space, when it can.

        A reader of a WAL store creates the ``-shm`` (and ``-wal``) files when the last
        connection before it removed them: on a full disk it cannot, and every search would
        fail until space is freed. When no ``-wal`` file holds commits (every commit is in
        the main file, as the last connection to close leaves it), the main file alone is
        the index: it is then opened as immutable, which needs neither file.
        """
        uri = Path(self.path).resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA user_version").fetchone()
            return conn
        except sqlite3.DatabaseError as exc:
            wal = Path(self.path + "-wal")
            if _refused(self.path, exc) is None or (wal.exists() and wal.stat().st_size > 0):
                raise
            conn.close()
        return sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None, check_same_thread=False)

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection and the segment files (idempotent)."""
        with contextlib.suppress(Exception):
            self.conn.close()
        if self.segments is not None:
            self.segments.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise IndexCorruptError(
                f"Index store {self.path} has schema version {version}, newer than this codesearch "
                f"understands ({SCHEMA_VERSION}); upgrade codesearch or run 'codesearch index --rebuild'"
            )
        if version == SCHEMA_VERSION:
            return
        if self.readonly and version >= READABLE_FROM:
            return
        if self.readonly:
            raise IndexCorruptError(
                f"Index store {self.path} has schema version {version}, older than {SCHEMA_VERSION}; "
                "run 'codesearch index' once to upgrade it"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            # One script per step, with its version bump, in one transaction: a crash leaves
            # either the old version or the new one.
            self.conn.executescript(
                f"BEGIN IMMEDIATE;\n{MIGRATIONS[target - 1]}\nPRAGMA user_version = {target};\nCOMMIT;"
            )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Store]:
        """Group writes atomically; nested calls join the outer transaction (savepoints).

        Example
        -------
        >>> store = Store(":memory:")
        >>> with store.transaction():
        ...     store.set_meta("root", "/repo")
        """
        if self._depth == 0:
            self._exec("BEGIN IMMEDIATE")
        else:
            self._exec(f"SAVEPOINT sp{self._depth}")
        self._depth += 1
        try:
            yield self
        except BaseException:
            self._depth -= 1
            # On a full disk (and a few other errors) SQLite has rolled the whole
            # transaction back already: a ROLLBACK then fails ("no transaction is active")
            # and would hide the error that says what happened.
            if self.conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    if self._depth == 0:
                        self.conn.execute("ROLLBACK")
                    else:
                        self.conn.execute(f"ROLLBACK TO sp{self._depth}")
                        self.conn.execute(f"RELEASE sp{self._depth}")
            raise
        self._depth -= 1
        if self._depth == 0:
            try:
                if self.segments is not None:
                    self.segments.sync()  # the rows' bytes reach the disk before the rows do
                self._exec("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
                raise
        else:
            self._exec(f"RELEASE sp{self._depth}")

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self.conn.execute(sql, params)
        except sqlite3.DatabaseError as exc:
            self._raise_for(exc)
            raise

    def _raise_for(self, exc: sqlite3.DatabaseError) -> None:
        """Raise the user's error for ``exc`` (a full disk, a damaged file), if it has one."""
        refused = _refused(self.path, exc)
        if refused is not None:
            raise refused from exc
        if any(m in str(exc).lower() for m in _CORRUPT_MARKERS):
            raise _corrupt(self.path, exc) from exc

    def _write(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        # Every write goes through a transaction; a bare call opens (and commits) its own.
        if self._depth == 0:
            with self.transaction():
                return self._exec(sql, params)
        return self._exec(sql, params)

    def _writemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self.transaction():
            try:
                self.conn.executemany(sql, rows)
            except sqlite3.DatabaseError as exc:
                self._raise_for(exc)
                raise

    # -- meta ------------------------------------------------------------------------------

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        row = self._exec("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else _from_db(row[0])

    def set_meta(self, key: str, value: object) -> None:
        # (The root of a repository whose folder name is not UTF-8 is kept as bytes.)
        self._write("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, _to_db(str(value))))

    def delete_meta(self, key: str) -> None:
        self._write("DELETE FROM meta WHERE key = ?", (key,))

    def meta(self) -> dict[str, str]:
        return {k: _from_db(v) for k, v in self._exec("SELECT key, value FROM meta").fetchall()}

    @property
    def generation(self) -> int:
        """Bumped by every committed index run; derived indexes record the one they hold."""
        return int(self.get_meta("generation", "0") or 0)

    # -- models ----------------------------------------------------------------------------

    def models(self) -> dict[str, ModelRecord]:
        """Role -> the model recorded for it."""
        rows = self._exec("SELECT role, name, identity, dim FROM models").fetchall()
        return {r[0]: ModelRecord(*r) for r in rows}

    def set_model(self, role: str, name: str, identity: str, dim: int) -> None:
        self._write(
            "INSERT OR REPLACE INTO models(role, name, identity, dim) VALUES (?, ?, ?, ?)",
            (role, name, identity, int(dim)),
        )

    def model_identity(self, kind: str) -> str | None:
        """The identity of the model whose vectors of ``kind`` the index uses, or None."""
        rec = self.models().get(KIND_ROLE[kind])
        return rec.identity if rec else None

    # -- files -----------------------------------------------------------------------------

    def files(self) -> dict[str, FileRecord]:
        """Path -> file record, for every indexed file."""
        rows = self._exec("SELECT id, path, hash, size, mtime_ns, language, n_lines FROM files").fetchall()
        rows = _paths_at(rows, 1)
        return {r[1]: FileRecord(*r) for r in rows}

    def file_paths(self) -> dict[int, str]:
        """File id -> relative path."""
        return {i: _from_db(p) for i, p in self._exec("SELECT id, path FROM files").fetchall()}

    def file_record(self, file_id: int) -> FileRecord | None:
        row = self._exec(
            "SELECT id, path, hash, size, mtime_ns, language, n_lines FROM files WHERE id = ?", (file_id,)
        ).fetchone()
        return FileRecord(*_paths_at([row], 1)[0]) if row else None

    def file_hashes(self, paths: Sequence[str]) -> dict[str, str]:
        """Path -> content hash, for those of ``paths`` that are indexed."""
        out: dict[str, str] = {}
        for part in _chunked([_to_db(p) for p in paths]):
            marks = ",".join("?" * len(part))
            out.update(
                _paths_at(self._exec(f"SELECT path, hash FROM files WHERE path IN ({marks})", part).fetchall(), 0)
            )
        return out

    def upsert_file(self, path: str, *, hash: str, size: int, mtime_ns: int, language: str, n_lines: int) -> int:
        """Insert or update a file row (keyed by path); returns its id, stable across updates."""
        path = _to_db(path)
        with self.transaction():
            row = self._exec("SELECT id FROM files WHERE path = ?", (path,)).fetchone()
            if row:
                self._exec(
                    "UPDATE files SET hash = ?, size = ?, mtime_ns = ?, language = ?, n_lines = ? WHERE id = ?",
                    (hash, size, mtime_ns, language, n_lines, row[0]),
                )
                return row[0]
            cur = self._exec(
                "INSERT INTO files(path, hash, size, mtime_ns, language, n_lines) VALUES (?, ?, ?, ?, ?, ?)",
                (path, hash, size, mtime_ns, language, n_lines),
            )
            return int(cur.lastrowid)

    def touch_file(self, file_id: int, *, size: int, mtime_ns: int) -> None:
        """Record a new stat for a file whose content did not change."""
        self._write("UPDATE files SET size = ?, mtime_ns = ? WHERE id = ?", (size, mtime_ns, file_id))

    def delete_files(self, file_ids: Sequence[int]) -> None:
        """Delete files and (cascade) their chunks."""
        with self.transaction():
            for part in _chunked(list(file_ids)):
                marks = ",".join("?" * len(part))
                self._exec(f"DELETE FROM chunks WHERE file_id IN ({marks})", part)
                self._exec(f"DELETE FROM files WHERE id IN ({marks})", part)

    # -- chunks ----------------------------------------------------------------------------

    def chunk_records(self, ids: Sequence[int]) -> list[ChunkRecord]:
        """The records of ``ids``, in the order of ``ids`` (missing ids are left out)."""
        ids = [int(i) for i in ids]
        found: dict[int, ChunkRecord] = {}
        for part in _chunked(ids):
            marks = ",".join("?" * len(part))
            for r in _paths_at(self._exec(f"{_CHUNK_RECORD_SQL} WHERE c.id IN ({marks})", part).fetchall(), 2):
                found[r[0]] = ChunkRecord(*r)
        return [found[i] for i in ids if i in found]

    def iter_chunk_records(self) -> Iterator[ChunkRecord]:
        """Every chunk, by id."""
        for r in self._exec(f"{_CHUNK_RECORD_SQL} ORDER BY c.id"):
            yield ChunkRecord(*r) if not isinstance(r[2], bytes) else ChunkRecord(*_paths_at([r], 2)[0])

    def iter_chunk_meta(self) -> Iterator[tuple[int, int, str, int, int, str, str | None, str, str | None]]:
        """Every chunk's ``(id, file_id, path, start_line, end_line, language, symbol, kind, scope)``, by id.

        What a searcher keeps in memory, read without the chunk text and header (SQLite
        then skips the text's overflow pages): a fraction of :meth:`iter_chunk_records`'s
        cost on a large index. Fetch text for the few chunks shown with :meth:`chunk_records`.
        """
        rows = self._exec(
            "SELECT c.id, c.file_id, f.path, c.start_line, c.end_line, c.language, c.symbol, c.kind, c.scope"
            " FROM chunks c JOIN files f ON f.id = c.file_id ORDER BY c.id"
        ).fetchall()
        if self._exec("SELECT 1 FROM files WHERE typeof(path) = 'blob' LIMIT 1").fetchone():
            rows = _paths_at(rows, 2)  # (only then: a pass over every row costs on a large index)
        return iter(rows)

    def file_chunk_ids(self, file_id: int) -> list[int]:
        """Ids of a file's chunks, in file order."""
        rows = self._exec("SELECT id FROM chunks WHERE file_id = ? ORDER BY start_byte, id", (file_id,))
        return [r[0] for r in rows]

    def chunk_rows(self, file_id: int | None = None) -> list[ChunkRow]:
        """Full chunk rows, of one file or of all."""
        if file_id is None:
            rows = self._exec(f"SELECT {_CHUNK_ROW_COLS} FROM chunks ORDER BY id")
        else:
            rows = self._exec(
                f"SELECT {_CHUNK_ROW_COLS} FROM chunks WHERE file_id = ? ORDER BY start_byte, id", (file_id,)
            )
        return [ChunkRow(*r) for r in rows]

    def chunk_hashes(self) -> dict[int, str]:
        """Chunk id -> text hash, for every chunk."""
        return dict(self._exec("SELECT id, text_hash FROM chunks").fetchall())

    def insert_chunk(self, file_id: int, c: Any, text_hash: str) -> int:
        """Insert one chunk (anything with the ``Chunk`` fields); returns its id."""
        cur = self._write(
            "INSERT INTO chunks(file_id, start_line, end_line, start_byte, end_byte, language, symbol,"
            " kind, scope, header, text, text_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                file_id,
                c.start_line,
                c.end_line,
                c.start_byte,
                c.end_byte,
                c.language,
                c.symbol,
                c.kind,
                c.scope,
                c.header,
                c.text,
                text_hash,
            ),
        )
        return int(cur.lastrowid)

    def update_chunk_position(self, chunk_id: int, c: Any) -> None:
        """Move a kept chunk (same header and text) to its new place in an edited file."""
        self._write(
            "UPDATE chunks SET start_line = ?, end_line = ?, start_byte = ?, end_byte = ?, language = ?,"
            " symbol = ?, kind = ?, scope = ? WHERE id = ?",
            (c.start_line, c.end_line, c.start_byte, c.end_byte, c.language, c.symbol, c.kind, c.scope, chunk_id),
        )

    def delete_chunks(self, ids: Sequence[int]) -> None:
        with self.transaction():
            for part in _chunked([int(i) for i in ids]):
                self._exec(f"DELETE FROM chunks WHERE id IN ({','.join('?' * len(part))})", part)

    def count(self, table: str) -> int:
        if table not in ("files", "chunks", "vectors"):
            raise ValueError(table)
        return self._exec(f"SELECT count(*) FROM {table}").fetchone()[0]

    # -- vectors cache ---------------------------------------------------------------------

    def cached_hashes(self, model: str, kind: str) -> set[str]:
        """Text hashes that have a cached vector for this model identity and kind."""
        rows = self._exec("SELECT text_hash FROM vectors WHERE model = ? AND kind = ?", (model, kind))
        return {r[0] for r in rows}

    def put_vectors(self, model: str, kind: str, items: Iterable[tuple[str, np.ndarray]]) -> int:
        """Cache vectors (float16 on disk); returns how many were written.

        Arrays of :data:`SEGMENT_KINDS` go to the segment files of an on-disk store, the
        others into their rows; a caller sees no difference.
        """
        encoded = [(text_hash, *encode_array(array)) for text_hash, array in items]
        if not encoded:
            return 0
        with self.transaction():  # segment appends happen under the store's write lock
            if kind in SEGMENT_KINDS and self.segments is not None:
                places = self.segments.append([blob for *_, blob in encoded])
                rows = [
                    (model, kind, h, dim, n, b"", seg, off, crc)
                    for (h, n, dim, _), (seg, off, crc) in zip(encoded, places, strict=True)
                ]
            else:
                rows = [(model, kind, h, dim, n, blob, None, None, None) for h, n, dim, blob in encoded]
            self._writemany(
                "INSERT OR REPLACE INTO vectors(model, kind, text_hash, dim, n, data, seg, off, crc)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        return len(rows)

    def get_vectors(self, model: str, kind: str, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        """Text hash -> float32 (n, dim) array, for the hashes that are cached."""
        out: dict[str, np.ndarray] = {}
        for part in _chunked(list(hashes)):
            marks = ",".join("?" * len(part))
            rows = self._vector_rows(
                "SELECT v.text_hash, {cols} FROM vectors v WHERE v.model = ? AND v.kind = ?"
                f" AND v.text_hash IN ({marks})",
                (model, kind, *part),
                kind,
            )
            for h, *where in rows:
                out[h] = self._array(*where)
        return out

    def vectors_for(self, ids: Sequence[int], kind: str) -> tuple[np.ndarray, list[np.ndarray]]:
        """Vectors of chunks (kind ``dense`` | ``colbert``) or files (kind ``file``) by id.

        Returns ``(found_ids int64, arrays)`` in the order of ``ids``, leaving out ids with
        no cached vector for the recorded model. Each array is float32 ``(n, dim)``: one row
        for ``dense``/``file``, one per token for ``colbert``.
        """
        model = self.model_identity(kind)
        ids = [int(i) for i in ids]
        if model is None or not ids:
            return np.zeros(0, dtype=np.int64), []
        table, col = ("files", "hash") if kind == "file" else ("chunks", "text_hash")
        found: dict[int, np.ndarray] = {}
        for part in _chunked(ids):
            marks = ",".join("?" * len(part))
            # CROSS JOIN: SQLite then looks the ids up first and each one's vector by its key.
            # Left to itself (no statistics) it chose, for a long IN list, to walk every vector
            # of the model and probe the ids: 11 s per 900 ids at 60k vectors, 6.5 ms this way.
            rows = self._vector_rows(
                f"SELECT t.id, {{cols}} FROM {table} t CROSS JOIN vectors v ON v.text_hash = t.{col}"
                f" AND v.model = ? AND v.kind = ? WHERE t.id IN ({marks})",
                (model, kind, *part),
                kind,
            )
            for i, *where in rows:
                found[i] = self._array(*where)
        keep = [i for i in ids if i in found]
        return np.asarray(keep, dtype=np.int64), [found[i] for i in keep]

    def iter_vectors(self, kind: str, batch: int = 4096) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
        """Every (id, vector) of ``kind`` for the recorded model, in id order, in batches."""
        model = self.model_identity(kind)
        if model is None:
            return
        table, col = ("files", "hash") if kind == "file" else ("chunks", "text_hash")
        cur = self._vector_rows(
            f"SELECT t.id, {{cols}} FROM {table} t JOIN vectors v ON v.text_hash = t.{col}"
            f" AND v.model = ? AND v.kind = ? ORDER BY t.id",
            (model, kind),
            kind,
        )
        self._cursors += 1
        try:
            while rows := cur.fetchmany(batch):
                yield (np.asarray([r[0] for r in rows], dtype=np.int64), [self._array(*r[1:]) for r in rows])
        finally:
            self._cursors -= 1

    def begin_read(self) -> None:
        """Open a read transaction that holds its snapshot until it ends (a pinned
        searcher's): segments are opened first, so the snapshot's stay readable."""
        if self.segments is not None:
            self.segments.open_all(release=self._idle())
        self._exec("BEGIN")

    def _idle(self) -> bool:
        """No read of this store holds a snapshot (so no unlinked segment is needed)."""
        return not self.conn.in_transaction and self._cursors == 0

    def _vector_rows(self, sql: str, params: Sequence[Any], kind: str) -> sqlite3.Cursor:
        """Run a vector read (``{cols}`` in ``sql`` the columns :meth:`_array` takes, table
        alias ``v``), on any readable schema. For a kind kept in segments, every segment file
        is opened first, so one that a compaction unlinks after this read's snapshot began
        stays readable."""
        if self.segments is not None and kind in SEGMENT_KINDS:
            self.segments.open_all(release=self._idle())
        try:
            return self._exec(sql.format(cols=_VEC_COLS), params)
        except sqlite3.OperationalError as exc:
            # A read-only open of a store from before schema 3 (a writer may migrate it
            # later; the columns then exist and the first form works again).
            if "no such column" not in str(exc):
                raise
            return self._exec(sql.format(cols=_VEC_COLS_BEFORE_3), params)

    def _array(self, n: int, dim: int, data: bytes, seg: int | None, off: int | None, crc: int | None) -> np.ndarray:
        """The float32 array of one vectors row, from the row or from its segment."""
        if seg is None or self.segments is None:  # (an in-memory store never writes segments)
            return decode_array(n, dim, data)
        try:
            return decode_array(n, dim, self.segments.read(seg, off, n * dim * 2, crc))
        except SegmentError as exc:
            raise _corrupt(self.path, exc) from None

    def count_with_vectors(self, kind: str) -> int:
        """How many chunks (or files, kind ``file``) have a cached vector of ``kind``."""
        model = self.model_identity(kind)
        if model is None:
            return 0
        table, col = ("files", "hash") if kind == "file" else ("chunks", "text_hash")
        return self._exec(
            f"SELECT count(*) FROM {table} t JOIN vectors v ON v.text_hash = t.{col} AND v.model = ? AND v.kind = ?",
            (model, kind),
        ).fetchone()[0]

    def chunks_missing_vectors(self, model: str, kind: str) -> list[tuple[int, int, str, str]]:
        """(chunk id, file id, text hash, encoder text) of chunks with no cached ``kind`` vector."""
        rows = self._exec(
            "SELECT c.id, c.file_id, c.text_hash, c.header || char(10) || c.text FROM chunks c"
            " WHERE NOT EXISTS (SELECT 1 FROM vectors v WHERE v.model = ? AND v.kind = ?"
            " AND v.text_hash = c.text_hash)",
            (model, kind),
        )
        return [tuple(r) for r in rows]

    def files_missing_vectors(self, model: str) -> list[tuple[int, str, str]]:
        """(file id, path, hash) of files with no cached file-level vector."""
        rows = self._exec(
            "SELECT f.id, f.path, f.hash FROM files f WHERE NOT EXISTS (SELECT 1 FROM vectors v"
            " WHERE v.model = ? AND v.kind = 'file' AND v.text_hash = f.hash)",
            (model,),
        )
        return [tuple(r) for r in _paths_at(rows.fetchall(), 1)]

    def chunk_ids_with_hashes(self, hashes: Iterable[str]) -> list[int]:
        """Ids of the chunks whose text hash is one of ``hashes``."""
        return self._ids_with_hashes("chunks", "text_hash", hashes)

    def file_ids_with_hashes(self, hashes: Iterable[str]) -> list[int]:
        """Ids of the files whose content hash is one of ``hashes``."""
        return self._ids_with_hashes("files", "hash", hashes)

    def _ids_with_hashes(self, table: str, col: str, hashes: Iterable[str]) -> list[int]:
        out: list[int] = []
        for part in _chunked(list(hashes)):
            marks = ",".join("?" * len(part))
            out += [r[0] for r in self._exec(f"SELECT id FROM {table} WHERE {col} IN ({marks})", part)]
        return out

    def language_counts(self) -> dict[str, int]:
        """Language -> number of files."""
        rows = self._exec("SELECT language, count(*) FROM files GROUP BY language ORDER BY 2 DESC")
        return dict(rows.fetchall())

    def prune_vectors(self, *, keep_unreferenced: int = 0) -> int:
        """Drop cached vectors nothing refers to; returns how many were dropped.

        Vectors of models the index no longer records always go. Unreferenced vectors of the
        recorded models (old versions of edited code) are kept while there are at most
        ``keep_unreferenced`` of them, so switching branches back and forth stays cheap.
        Segment space the dropped vectors held is reclaimed (:meth:`compact_segments`).
        """
        models = {m.identity for m in self.models().values()}
        with self.transaction():
            marks = ",".join("?" * len(models))
            dropped = self._exec(
                f"DELETE FROM vectors WHERE model NOT IN ({marks})" if models else "DELETE FROM vectors",
                tuple(models),
            ).rowcount
            unref_sql = (
                "FROM vectors v WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.text_hash = v.text_hash)"
                " AND NOT EXISTS (SELECT 1 FROM files f WHERE f.hash = v.text_hash)"
            )
            n_unref = self._exec(f"SELECT count(*) {unref_sql}").fetchone()[0]
            if n_unref > keep_unreferenced:
                dropped += self._exec(
                    "DELETE FROM vectors WHERE (model, kind, text_hash) IN (SELECT v.model, v.kind, v.text_hash "
                    + unref_sql
                    + ")"
                ).rowcount
        self.compact_segments()
        return dropped

    def compact_segments(self) -> int:
        """Reclaim segment space no row refers to; returns the bytes freed.

        A segment with no live array is unlinked. One more than half dead has its live
        arrays copied to a new segment (the rows move in one transaction), then is
        unlinked. So dead space stays below about half the folder, and each byte is copied
        a bounded number of times. Only a writer calls this (under the index lock); readers
        that opened a segment before it goes keep reading it.
        """
        if self.segments is None or self.readonly or self._depth:
            return 0
        sizes = self.segments.sizes()
        if not sizes:
            return 0
        live = dict(
            self._exec("SELECT seg, sum(n * dim * 2) FROM vectors WHERE seg IS NOT NULL GROUP BY seg").fetchall()
        )
        sparse = [seg for seg, size in sizes.items() if 0 < live.get(seg, 0) and 2 * live[seg] < size]
        # (An empty file at the top is the one a compaction started and nothing used yet.)
        empty = [seg for seg, size in sizes.items() if not live.get(seg) and (size or seg != max(sizes))]
        if not sparse and not empty:
            return 0
        if sparse or max(sizes) in empty:
            # Copies go to a segment of their own, numbered above every other: the highest
            # number always stays on disk, so no number is reused while the folder exists.
            self.segments.rotate()
        moved = []
        for seg in sparse:
            try:
                with self.transaction():
                    rows = self._exec(
                        "SELECT id, n, dim, off, crc FROM vectors WHERE seg = ? ORDER BY off", (seg,)
                    ).fetchall()
                    for part in _chunked(rows, 256):
                        blobs = [self.segments.read(seg, off, n * dim * 2, crc) for _, n, dim, off, crc in part]
                        places = self.segments.append(blobs)
                        self.conn.executemany(
                            "UPDATE vectors SET seg = ?, off = ? WHERE id = ?",
                            [(s, o, r[0]) for r, (s, o, _) in zip(part, places, strict=True)],
                        )
            except SegmentError:
                continue  # damaged: left for drop_damaged_vectors (a rebuild) to find
            moved.append(seg)
        # The commits that emptied these segments must be on disk before the files go:
        # with synchronous=NORMAL a commit is durable only once the WAL is synced, and a
        # power loss would otherwise keep the unlink and lose the commit.
        self._sync_wal()
        self.segments.remove([*empty, *moved])
        self.segments.open_all(release=self._idle())  # this store's descriptors of them close
        return sum(sizes[seg] - live.get(seg, 0) for seg in (*empty, *moved))

    def _sync_wal(self) -> None:
        """Make every commit so far durable (fsync the WAL; a checkpoint's pages are synced
        by SQLite itself)."""
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(self.path + "-wal", os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def drop_damaged_vectors(self) -> int:
        """Delete cached arrays whose segment bytes are missing, short or fail their CRC, so
        the next encode makes them again; returns how many. Reads every segment array once
        (what a rebuild of the multi-vector index reads anyway)."""
        if self.segments is None:
            return 0
        self.segments.open_all(release=self._idle())
        rows = self._exec("SELECT id, n, dim, seg, off, crc FROM vectors WHERE seg IS NOT NULL ORDER BY seg, off")
        bad = []
        for vid, n, dim, seg, off, crc in rows:  # streamed: one array in memory at a time
            try:
                self.segments.read(seg, off, n * dim * 2, crc)
            except SegmentError:
                bad.append(vid)
        if not bad:
            return 0
        with self.transaction():
            for part in _chunked(bad):
                self._exec(f"DELETE FROM vectors WHERE id IN ({','.join('?' * len(part))})", part)
        return len(bad)

    def clear(self) -> None:
        """Forget every file, chunk, model and meta entry (the vectors cache stays)."""
        with self.transaction():
            self._exec("DELETE FROM chunks")
            self._exec("DELETE FROM files")
            self._exec("DELETE FROM models")
            self._exec("DELETE FROM meta")
