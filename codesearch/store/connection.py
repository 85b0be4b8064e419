"""The SQLite connection under a `codesearch.store.Store`: opening, migrations, transactions,
and the ``meta`` and ``models`` tables.

On disk the journal is WAL, so readers never block the writer and always see the last
committed state; the schema version is ``PRAGMA user_version``, with numbered migrations
(`codesearch.store.schema`) applied on open.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from codesearch.errors import IndexCorruptError
from codesearch.store import schema
from codesearch.store.records import ModelRecord
from codesearch.store.rows import from_db, to_db
from codesearch.store.segments import SEGMENT_BYTES, Segments

_C = TypeVar("_C", bound="Connection")

# The database files this process has a connection on, by resolved path and by
# (st_dev, st_ino). SQLite locks them with POSIX locks, and POSIX drops *every* lock a
# process holds on a file when it closes any descriptor of that file: the header check's
# own open and close would release the shared lock an open connection holds for its whole
# life in WAL mode, and another process could then take the file out of WAL mode, deleting
# the WAL (and the commits in it) under that connection. So the check reads the file only
# when no connection of this process has it open; the first open checked it already.
_OPEN_LOCK = threading.Lock()
_OPEN: Counter[object] = Counter()


def _file_keys(path: str) -> list[object]:
    """The keys of ``path`` in `_OPEN`: its resolved path and, once it exists, its inode."""
    keys: list[object] = [os.path.realpath(path)]
    with contextlib.suppress(OSError):
        st = os.stat(path)
        keys.append((st.st_dev, st.st_ino))
    return keys


def _register(path: str, *, check: bool) -> list[object]:
    """Count a connection on ``path`` as open, after `schema.check_header` when ``check`` and
    no other connection of this process has the file open. Returns the keys to release."""
    with _OPEN_LOCK:
        keys = _file_keys(path)
        if check and not any(_OPEN[k] for k in keys):
            schema.check_header(Path(path))
        _OPEN.update(keys)
    return keys


def _release(keys: list[object]) -> None:
    with _OPEN_LOCK:
        _OPEN.subtract(keys)
        for k in keys:
            if _OPEN[k] <= 0:
                del _OPEN[k]


#: Limits of a connection to someone else's SQLite file (`open_untrusted`): no value longer
#: than a chunk or an array can be (a 1 MB file's text, a 2 MB inline array of old stores),
#: no statement past what our few SELECTs compile to, nothing attached, no trigger depth.
#: (Python 3.10's sqlite3 has neither the names nor ``setlimit``: there a connection runs without them.)
_LIMITS = (
    ("SQLITE_LIMIT_LENGTH", 16 << 20),
    ("SQLITE_LIMIT_SQL_LENGTH", 100_000),
    ("SQLITE_LIMIT_COLUMN", 100),
    ("SQLITE_LIMIT_EXPR_DEPTH", 100),
    ("SQLITE_LIMIT_COMPOUND_SELECT", 4),
    ("SQLITE_LIMIT_VDBE_OP", 100_000),
    ("SQLITE_LIMIT_FUNCTION_ARG", 8),
    ("SQLITE_LIMIT_ATTACHED", 0),
    ("SQLITE_LIMIT_LIKE_PATTERN_LENGTH", 100),
    ("SQLITE_LIMIT_VARIABLE_NUMBER", 1000),
    ("SQLITE_LIMIT_TRIGGER_DEPTH", 1),
    ("SQLITE_LIMIT_WORKER_THREADS", 0),
)
UNTRUSTED_LIMITS = {getattr(sqlite3, name): value for name, value in _LIMITS if hasattr(sqlite3, name)}
#: SQLite VM steps between two looks at the clock of `open_untrusted`'s budget.
_PROGRESS_STEPS = 10_000


def open_untrusted(path: str | os.PathLike[str], *, deadline: float) -> sqlite3.Connection:
    """A read-only connection to a SQLite file someone else made (an export's store).

    What it guards against, as SQLite allows from Python 3.11 (which has no
    ``SQLITE_DBCONFIG_DEFENSIVE``): nothing can be written (``mode=ro``, ``query_only``), no
    lock is taken nor ``-wal``/``-shm`` file read or made beside it (``immutable``: the file is
    a private copy nobody changes); functions of the file's own schema (views, triggers,
    defaults) may not run anything but innocuous SQL (``trusted_schema=OFF``); pages are
    checked as they are read (``cell_size_check``); values, statements and recursion are
    bounded (`UNTRUSTED_LIMITS`), and every statement stops at ``deadline``
    (``time.monotonic()`` seconds) with ``sqlite3.OperationalError('interrupted')``.

    The caller still reads only the tables and columns it knows by name, after checking
    that they are tables of its own schema (`codesearch.indexing.adopt`): a view named like
    a table would run on every read.
    """
    uri = Path(path).resolve().as_uri() + "?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        for limit, value in UNTRUSTED_LIMITS.items() if hasattr(conn, "setlimit") else ():
            conn.setlimit(limit, value)
        for pragma in ("trusted_schema = OFF", "cell_size_check = ON", "query_only = ON", "mmap_size = 0",
                       "cache_size = -16000"):
            conn.execute(f"PRAGMA {pragma}")
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_STEPS)
    except BaseException:
        conn.close()
        raise
    return conn


class Connection:
    """The SQLite connection of one index store: opening it (WAL on disk, read-only, a full
    disk), its migrations, its transactions, and the two small tables every part reads:
    ``meta`` and ``models``. `codesearch.store.Store` adds the rest.

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
        self.segments = (
            None if memory
            else Segments(Path(self.path + ".vectors"), readonly=readonly, max_bytes=self.SEGMENT_MAX_BYTES)
        )
        self._cursors = 0  # iter_vectors generators under way (their snapshots need segments)
        self._open_keys: list[object] = []
        self._opened: weakref.finalize | None = None
        if not memory:
            if readonly and not Path(self.path).exists():
                raise schema.corrupt(self.path, "file does not exist")
            # Counted before SQLite opens the file, so no other thread's header check
            # closes a descriptor of it while this connection holds a lock; uncounted on
            # close, or when a connection nobody closed is collected.
            self._open_keys = _register(self.path, check=True)
            self._opened = weakref.finalize(self, _release, self._open_keys)
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
            if not memory and len(self._open_keys) == 1:
                # A new file: its inode is known only now that SQLite has made it.
                inode = _register(self.path, check=False)
                _release(list(self._open_keys))
                self._open_keys[:] = inode
        except BaseException as exc:
            with contextlib.suppress(Exception):
                self.conn.close()
            self._release_file()
            if isinstance(exc, sqlite3.DatabaseError):
                raise (schema.refused(self.path, exc) or schema.corrupt(self.path, exc)) from exc
            raise

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
            if schema.refused(self.path, exc) is None or (wal.exists() and wal.stat().st_size > 0):
                raise
            conn.close()
        return sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None, check_same_thread=False)

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection and the segment files (idempotent)."""
        with contextlib.suppress(Exception):
            self.conn.close()
        self._release_file()
        if self.segments is not None:
            self.segments.close()

    def _release_file(self) -> None:
        if self._opened is not None:
            self._opened()  # runs once

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    #: The numbered migrations of this kind of database and the oldest version a read-only
    #: open reads as it is; None: the index store's (`codesearch.store.schema`, read at
    #: open). The user's vector cache has its own.
    MIGRATIONS: list[str] | None = None
    READABLE_FROM: int | None = None
    #: Bytes at which a new segment file starts (see `codesearch.store.segments`).
    SEGMENT_MAX_BYTES: int = SEGMENT_BYTES

    def _migrate(self) -> None:
        version = self.schema_version
        migrations = schema.MIGRATIONS if self.MIGRATIONS is None else self.MIGRATIONS
        readable_from = schema.READABLE_FROM if self.READABLE_FROM is None else self.READABLE_FROM
        latest = len(migrations)
        if version > latest:
            raise IndexCorruptError(
                f"Index store {self.path} has schema version {version}, newer than this codesearch "
                f"understands ({latest}); upgrade codesearch or run 'codesearch index --rebuild'"
            )
        if version == latest:
            return
        if self.readonly and version >= readable_from:
            return
        if self.readonly:
            raise IndexCorruptError(
                f"Index store {self.path} has schema version {version}, older than {latest}; "
                "run 'codesearch index' once to upgrade it"
            )
        for target in range(version + 1, latest + 1):
            # One script per step, with its version bump, in one transaction: a crash leaves
            # either the old version or the new one.
            self.conn.executescript(
                f"BEGIN IMMEDIATE;\n{migrations[target - 1]}\nPRAGMA user_version = {target};\nCOMMIT;"
            )

    @contextlib.contextmanager
    def transaction(self: _C) -> Iterator[_C]:
        """Group writes atomically; nested calls join the outer transaction (savepoints).

        Example
        -------
        >>> from codesearch.store import Store
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

    @contextlib.contextmanager
    def page_cache(self, kib: int) -> Iterator[None]:
        """SQLite's page cache at ``kib`` KiB for the block (then back to what it was)."""
        before = self.conn.execute("PRAGMA cache_size").fetchone()[0]
        self.conn.execute(f"PRAGMA cache_size = {-int(kib)}")
        try:
            yield
        finally:
            self.conn.execute(f"PRAGMA cache_size = {int(before)}")

    def _exec(self, sql: str, params: Sequence[object] = ()) -> sqlite3.Cursor:
        try:
            return self.conn.execute(sql, params)
        except sqlite3.DatabaseError as exc:
            self._raise_for(exc)
            raise

    def _raise_for(self, exc: sqlite3.DatabaseError) -> None:
        """Raise the user's error for ``exc`` (a full disk, a damaged file), if it has one."""
        refused = schema.refused(self.path, exc)
        if refused is not None:
            raise refused from exc
        if any(m in str(exc).lower() for m in schema.CORRUPT_MARKERS):
            raise schema.corrupt(self.path, exc) from exc

    def _write(self, sql: str, params: Sequence[object] = ()) -> sqlite3.Cursor:
        # Every write goes through a transaction; a bare call opens (and commits) its own.
        if self._depth == 0:
            with self.transaction():
                return self._exec(sql, params)
        return self._exec(sql, params)

    def _writemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        with self.transaction():
            try:
                self.conn.executemany(sql, rows)
            except sqlite3.DatabaseError as exc:
                self._raise_for(exc)
                raise

    # -- meta ------------------------------------------------------------------------------

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        row = self._exec("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else from_db(row[0])

    def set_meta(self, key: str, value: object) -> None:
        # (The root of a repository whose folder name is not UTF-8 is kept as bytes.)
        self._write("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, to_db(str(value))))

    def delete_meta(self, key: str) -> None:
        self._write("DELETE FROM meta WHERE key = ?", (key,))

    def meta(self) -> dict[str, str]:
        return {k: from_db(v) for k, v in self._exec("SELECT key, value FROM meta").fetchall()}

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
