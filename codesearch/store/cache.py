"""The user's vector cache: content-addressed vectors shared by every index of a user.

An index store already keeps one vector per (model identity, kind, text hash), but only for
its own repository. Coding agents work in many copies of one repository (a worktree per
task, a branch beside main, a fresh clone), and each copy embedded every chunk again. This
cache sits under the user's cache folder and is keyed by (model identity, kind, hash of the
exact text the encoder reads): an index run looks here before it encodes and adds what it
encodes. Whatever changes a vector changes the key: the model's weights, config and head
(its identity: pooling, prefixes, window), the tokenizer that turns the text into ids, the
kind (a chunk or a whole file), and the text itself, which holds the chunk's boundaries and
header, so a different chunker or budget never reuses a vector made for other text. (The
compute dtype does not: a GPU's bf16 vector of a text serves a CPU's run, as it does inside
one index.) It also keeps each file's chunks (line ranges and labels, not the text), keyed by
the file's content, name, language and every chunking parameter, so a new copy skips
tree-sitter and the tokenizer for the files another copy chunked (`codesearch.indexing.reuse`),
and the PLAID codec and codes of the multi-vectors an index compressed, keyed by the hash
of each float16 array, so a new copy's index skips k-means and the assignment of every
token (`codesearch.indexing.cachedcodes`).

It is the index store's format, reused: a SQLite ``vectors`` table (WAL) whose multi-vector
arrays go to append-only segment files (`codesearch.store.segments`), flushed before the
rows that point at them commit, checked by CRC on every read, compacted as space is freed.
So a kill -9 at any moment leaves rows that point at bytes on disk, and dead bytes at worst.

What differs from an index store:

- **Several writers.** Any number of processes write at once (4 worktrees indexed at once,
  a daemon). SQLite's write lock makes one appender at a time; a shared ``flock`` on
  ``maintenance.lock`` is held around each write, and eviction takes it exclusively, so no
  segment is unlinked while a writer may still append to it.
- **A size cap with LRU eviction.** Each row records when it was last used (to the
  hour); past the cap, the least recently used go and their segments are compacted, so the
  folder stays under the cap (`CODESEARCH_CACHE_SIZE`, default 4 GiB; 0 turns it off).
- **Best effort.** Nothing depends on it: indexes copy what they take from here, so
  deleting the folder never breaks a search; a damaged array reads as a miss; a cache that
  cannot be opened is set aside and made again (one a newer codesearch wrote is left
  alone, and not used).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import sqlite3
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from codesearch.errors import CodeSearchError, IndexCorruptError
from codesearch.store.rows import chunked
from codesearch.store.segments import SegmentError
from codesearch.store.vectors import SEGMENT_KINDS, SegmentArrays, decode_array, encode_array

__all__ = [
    "CACHE_FILE",
    "DEFAULT_LIMIT",
    "CacheStatus",
    "UserCache",
    "cache_folder",
    "cache_limit",
    "parse_size",
]

log = logging.getLogger(__name__)

CACHE_FILE = "cache.sqlite"
_LOCK_FILE = "maintenance.lock"
#: Default cap on the cache's size on disk (`CODESEARCH_CACHE_SIZE` overrides it).
DEFAULT_LIMIT = 4 * 2**30
#: Segment files of the cache are small, so eviction frees space one small file at a time.
CACHE_SEGMENT_BYTES = 64 * 2**20
#: A row's last use is recorded to this many seconds: a run that takes a vector again within
#: the hour writes nothing for it.
TOUCH_S = 3600
#: Meta key: every array kept in its row has its entry checksum (`entry_crc`).
_ENTRY_CRC_KEY = "entry_crc"
#: Values of one cached array (a long ColBERT text: 8192 tokens of 128).
_MAX_VALUES = 1 << 24
#: Eviction brings the live bytes down to this share of the cap, and compacts every segment
#: more than 1 - this share dead: the folder then holds at most the cap.
_EVICT_TO = 0.75

_MIGRATIONS = [
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE vectors (
        id INTEGER PRIMARY KEY,
        model TEXT NOT NULL,            -- the encoder's identity (weights, config, head)
        kind TEXT NOT NULL,             -- dense | file | colbert
        text_hash TEXT NOT NULL,        -- xxh3_128 hex of the exact text the encoder read
        dim INTEGER NOT NULL,           -- values per row
        n INTEGER NOT NULL,             -- rows: 1 for single vectors, tokens for ColBERT
        data BLOB NOT NULL,             -- the float16 array, or empty when it is in a segment
        seg INTEGER, off INTEGER, crc INTEGER,   -- where in which segment, and its CRC-32
        used INTEGER NOT NULL,          -- unix time of the last use, to the hour (LRU)
        UNIQUE (model, kind, text_hash)
    );
    CREATE INDEX vectors_used ON vectors(used);
    CREATE INDEX vectors_seg ON vectors(seg, off) WHERE seg IS NOT NULL;
    """,
    # 2: the chunks of a file: a new worktree skips tree-sitter and the tokenizer
    # for every file another copy chunked with the same parameters.
    """
    CREATE TABLE chunks (
        key TEXT PRIMARY KEY,           -- xxh3_128 hex of the chunking parameters, name and content
        data BLOB NOT NULL,             -- the file's chunk records (codesearch.indexing.reuse)
        crc INTEGER NOT NULL,           -- CRC-32 of data: a damaged entry is a miss
        used INTEGER NOT NULL           -- unix time of the last use, to the hour (LRU)
    );
    CREATE INDEX chunks_used ON chunks(used);
    """,
]

#: PLAID codes of cached multi-vectors, as tables every open adds when missing,
#: without a schema version of their own: a build that knows only the numbered migrations
#: refuses a cache of a newer version whole (and encodes everything), while these tables it
#: simply never reads. A codec (centroids and residual buckets, keyed by its fingerprint and
#: the model) and each text's codes under it: a new copy of a repository adopts the codec
#: that coded its texts in another copy, and skips k-means and the assignment of every token.
#: Three pages in all (a table without rowid, a table and its one index): with 64 KiB pages
#: every table and index costs an empty cache 64 KiB.
_CODE_TABLES = """
    CREATE TABLE IF NOT EXISTS codecs (
        model TEXT NOT NULL,            -- the encoder's identity, as in vectors
        codec TEXT NOT NULL,            -- ResidualCodec.fingerprint
        nbits INTEGER NOT NULL, dim INTEGER NOT NULL, centroids INTEGER NOT NULL,
        error REAL NOT NULL,            -- its build error (held-out reconstruction error)
        data BLOB NOT NULL,             -- float32 centroids, cutoffs, weights
        crc INTEGER NOT NULL,
        used INTEGER NOT NULL,
        PRIMARY KEY (model, codec)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS codes (
        id INTEGER PRIMARY KEY,
        model TEXT NOT NULL,
        codec TEXT NOT NULL,            -- the fingerprint of the codec that made them
        array_hash TEXT NOT NULL,       -- xxh3_128 hex of the float16 array they code
        n INTEGER NOT NULL,             -- tokens
        error REAL NOT NULL,            -- their summed reconstruction error
        data BLOB NOT NULL,             -- centroid ids, then packed residuals
        crc INTEGER NOT NULL,
        used INTEGER NOT NULL,
        UNIQUE (model, array_hash, codec)  -- (serves both lookups: by array, and by array and codec)
    );
"""


def parse_size(value: str) -> int:
    """``'4G'``, ``'500M'``, ``'2GiB'``, ``'1000000'`` -> bytes (``'0'``: 0).

    Raises
    ------
    ValueError
        Not a size.
    """
    units = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
             "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}
    text = value.strip().lower()
    number = text.rstrip("kmgtib")
    try:
        size = float(number) * units[text[len(number):]]
    except (ValueError, KeyError):
        raise ValueError(f"{value!r} is not a size (use bytes or a suffix: 500M, 4G)") from None
    if size < 0:
        raise ValueError(f"{value!r} is negative")
    return int(size)


def cache_folder() -> Path:
    """Where the cache lives: ``$CODESEARCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/codesearch/vectors``,
    else ``~/.cache/codesearch/vectors``."""
    explicit = os.environ.get("CODESEARCH_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "codesearch" / "vectors"


def cache_limit() -> int:
    """The cap in bytes: ``$CODESEARCH_CACHE_SIZE`` (``0``: no cache), else :data:`DEFAULT_LIMIT`.

    Raises
    ------
    CodeSearchError
        The variable is not a size.
    """
    raw = os.environ.get("CODESEARCH_CACHE_SIZE")
    if raw is None or not raw.strip():
        return DEFAULT_LIMIT
    try:
        return parse_size(raw)
    except ValueError as exc:
        raise CodeSearchError(f"CODESEARCH_CACHE_SIZE={raw!r}: {exc}") from None


@dataclass(frozen=True, slots=True)
class CacheStatus:
    """What ``codesearch cache status`` shows."""

    path: str
    enabled: bool
    limit_bytes: int
    live_bytes: int = 0  # bytes of the arrays rows refer to
    disk_bytes: int = 0  # the folder on disk (segments, database, its WAL)
    entries: dict[str, dict[str, int]] = field(default_factory=dict)  # model -> kind -> rows
    chunked_files: int = 0  # files whose chunks are cached
    coded_texts: int = 0  # texts whose PLAID codes are kept (under any codec)
    oldest_use: int | None = None  # unix time
    newest_use: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class UserCache(SegmentArrays):
    """The user's vector cache in one folder (see the module's notes).

    Open it with :meth:`open`, which serialises the first open of a new folder, repairs what
    it can and returns None when there is no cache to use; the constructor is the bare open.

    Example
    -------
    >>> import numpy as np, tempfile
    >>> with UserCache.open(tempfile.mkdtemp()) as cache:
    ...     cache.put_vectors("model@1", "dense", [("h1", np.ones(4, np.float32))])
    ...     sorted(cache.get_vectors("model@1", "dense", ["h1", "h2"]))
    1
    ['h1']
    """

    MIGRATIONS = _MIGRATIONS
    READABLE_FROM = 1
    SEGMENT_MAX_BYTES = CACHE_SEGMENT_BYTES

    def __init__(self, path: str | os.PathLike[str], *, limit: int = DEFAULT_LIMIT):
        super().__init__(path)
        self.folder = Path(self.path).parent
        self.limit = int(limit)
        self._lock_fd: int | None = None

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def open(cls, folder: str | os.PathLike[str] | None = None, *, limit: int | None = None) -> UserCache | None:
        """The cache in ``folder`` (default :func:`cache_folder`), made when missing.

        A cache whose database cannot be read (a damaged file) is set aside and made again:
        nothing depends on it. Returns None when the cache is off (a limit of 0) or the folder
        cannot be written (a read-only home, a full disk): a run then encodes what it needs.
        """
        limit = cache_limit() if limit is None else int(limit)
        if limit <= 0:
            return None
        where = Path(folder).expanduser() if folder is not None else cache_folder()
        for attempt in range(2):
            try:
                where.mkdir(parents=True, exist_ok=True)
                # Opening runs the migrations: two processes opening a new folder at once
                # would both read version 0 and the second would fail on tables the first
                # made (then set a sound cache aside). The open waits for writes and
                # evictions under way, which are short.
                with _flocked(where, exclusive=True):
                    return cls(where / CACHE_FILE, limit=limit)
            except IndexCorruptError as exc:
                if attempt:
                    break
                log.warning("the vector cache at %s cannot be read (%s); starting a new one", where, exc)
                _set_aside(where)
            except (CodeSearchError, OSError, sqlite3.Error) as exc:
                log.debug("no vector cache at %s: %s", where, exc)
                break
        return None

    def _migrate(self) -> None:
        # A newer codesearch's cache is not damaged: left as it is (and unused), never set aside.
        if self.schema_version > len(self.MIGRATIONS):
            raise CodeSearchError(
                f"the vector cache {self.path} has schema version {self.schema_version}, newer than this "
                f"codesearch understands ({len(self.MIGRATIONS)}); upgrade codesearch or set CODESEARCH_CACHE_DIR"
            )
        super()._migrate()
        if not self._exec("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'codes'").fetchone():
            self.conn.executescript(f"BEGIN IMMEDIATE;\n{_CODE_TABLES}\nCOMMIT;")
        if not self.readonly and self.get_meta(_ENTRY_CRC_KEY) is None:
            self._sum_inline_rows()

    def _sum_inline_rows(self) -> None:
        """Give the arrays kept in their rows, which a cache made before had no checksum for,
        their entry checksum (once per cache: `_ENTRY_CRC_KEY` says it is done)."""
        with self.transaction():
            rows = self._exec(
                "SELECT id, model, kind, text_hash, n, dim, data FROM vectors WHERE seg IS NULL AND crc IS NULL"
            )
            sums = [(entry_crc(model, kind, key, n, dim, data), vid)
                    for vid, model, kind, key, n, dim, data in rows if isinstance(data, bytes)]
            self.conn.executemany("UPDATE vectors SET crc = ? WHERE id = ?", sums)
            self.set_meta(_ENTRY_CRC_KEY, "1")

    def close(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None
        super().close()

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        """Shared around a write (any number at once), exclusive around eviction: no segment
        is compacted away while another process may append to it."""
        if self._lock_fd is None:
            self._lock_fd = _lock_fd(self.folder)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    # -- vectors -------------------------------------------------------------------------

    def get_vectors(self, model: str, kind: str, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """Key -> float32 ``(n, dim)`` array, for the keys that are cached (see `get_encoded`)."""
        return {key: decode_array(*found) for key, found in self.get_encoded(model, kind, keys).items()}

    def get_encoded(self, model: str, kind: str, keys: Sequence[str]) -> dict[str, tuple[int, int, bytes]]:
        """Key -> ``(n, dim, float16 bytes)`` as stored, for the keys that are cached (their
        use is recorded): an index copies them as they are. An array whose bytes are damaged
        reads as a miss, and its row goes."""
        out: dict[str, tuple[int, int, bytes]] = {}
        stale: list[int] = []
        damaged: list[tuple[int, int | None, int | None]] = []
        now = _now()
        if self.segments is not None and kind in SEGMENT_KINDS:
            self.segments.open_all(release=self._idle())  # a compaction after this keeps our bytes
        for part in chunked(list(dict.fromkeys(keys))):
            marks = ",".join("?" * len(part))
            rows = self._exec(
                "SELECT id, text_hash, n, dim, data, seg, off, crc, used FROM vectors"
                f" WHERE model = ? AND kind = ? AND text_hash IN ({marks})",
                (model, kind, *part),
            ).fetchall()
            for vid, key, n, dim, data, seg, off, crc, used in rows:
                try:
                    if not (isinstance(n, int) and isinstance(dim, int) and 0 < n * dim <= _MAX_VALUES):
                        raise SegmentError("no shape")
                    if seg is not None:
                        if self.segments is None:
                            raise SegmentError("no segment folder")
                        data = self.segments.read(seg, off, n * dim * 2, crc)
                    elif not isinstance(data, bytes) or crc != entry_crc(model, kind, key, n, dim, data):
                        raise SegmentError("an array whose row fails its checksum")
                except SegmentError:
                    # A miss: the run encodes it again. The row goes only if it still points
                    # there (a compaction may have just moved it, and unlinked what we read).
                    damaged.append((vid, seg, off))
                    continue
                out[key] = (n, dim, data)
                if used < now - TOUCH_S:
                    stale.append(vid)
        self._rows_update("UPDATE vectors SET used = ? WHERE id IN ({})", stale, (now,))
        if damaged:
            with contextlib.suppress(CodeSearchError, sqlite3.Error), self.transaction():
                self.conn.executemany("DELETE FROM vectors WHERE id = ? AND seg IS ? AND off IS ?", damaged)
        return out

    def put_vectors(self, model: str, kind: str, items: Iterable[tuple[str, np.ndarray]]) -> int:
        """Add vectors (float16 on disk); a key already cached keeps its array (the same key
        is the same text to the same model: another writer may have just put it). Returns
        how many rows were new."""
        rows = {key: encode_array(array) for key, array in items}
        if not rows:
            return 0
        now = _now()
        with self._locked(exclusive=False), self.transaction():
            for part in chunked(list(rows)):
                marks = ",".join("?" * len(part))
                for (key,) in self._exec(
                    f"SELECT text_hash FROM vectors WHERE model = ? AND kind = ? AND text_hash IN ({marks})",
                    (model, kind, *part),
                ).fetchall():
                    rows.pop(key, None)
            if not rows:
                return 0
            if kind in SEGMENT_KINDS and self.segments is not None:
                places = self.segments.append([blob for _, _, blob in rows.values()])
                values = [(model, kind, key, dim, n, b"", seg, off, crc, now)
                          for (key, (n, dim, _)), (seg, off, crc) in zip(rows.items(), places, strict=True)]
            else:
                values = [(model, kind, key, dim, n, blob, None, None, entry_crc(model, kind, key, n, dim, blob), now)
                          for key, (n, dim, blob) in rows.items()]
            self._writemany(
                "INSERT INTO vectors(model, kind, text_hash, dim, n, data, seg, off, crc, used)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
        if self.disk_bytes() > self.limit:
            self.prune()
        return len(values)

    # -- chunks --------------------------------------------------------------------------

    def get_chunks(self, keys: Sequence[str]) -> dict[str, bytes]:
        """Key -> the chunk records stored under it, for the keys that are cached (their use
        is recorded). An entry whose bytes fail their CRC reads as a miss, and goes."""
        out: dict[str, bytes] = {}
        stale: list[str] = []
        damaged: list[str] = []
        now = _now()
        for part in chunked(list(dict.fromkeys(keys))):
            marks = ",".join("?" * len(part))
            for key, data, crc, used in self._exec(
                f"SELECT key, data, crc, used FROM chunks WHERE key IN ({marks})", part
            ).fetchall():
                if not isinstance(data, bytes) or zlib.crc32(data) != crc:
                    damaged.append(key)
                    continue
                out[key] = data
                if used < now - TOUCH_S:
                    stale.append(key)
        self._rows_update("UPDATE chunks SET used = ? WHERE key IN ({})", stale, (now,))
        self._rows_update("DELETE FROM chunks WHERE key IN ({})", damaged)
        return out

    def put_chunks(self, items: Iterable[tuple[str, bytes]]) -> int:
        """Add or replace chunk records (the same key is the same content chunked the same
        way: a caller writes a key it could not read, and replaces records that did not fit).
        Returns how many rows were written."""
        now = _now()
        rows = [(key, data, zlib.crc32(data), now) for key, data in dict(items).items()]
        if not rows:
            return 0
        with self._locked(exclusive=False), self.transaction():
            before = self.conn.total_changes
            self._writemany("INSERT OR REPLACE INTO chunks(key, data, crc, used) VALUES (?, ?, ?, ?)", rows)
            added = self.conn.total_changes - before
        if added and self.disk_bytes() > self.limit:
            self.prune()
        return added

    # -- PLAID codes -----------------------------------------------------------------------

    def put_codec(self, model: str, codec: str, nbits: int, arrays: Sequence[np.ndarray], error: float) -> bool:
        """Keep a codec (``arrays``: centroids, cutoffs, weights) under its fingerprint
        ``codec``, with its build error; a codec already kept keeps its row. Returns whether
        it was new."""
        centroids = np.ascontiguousarray(arrays[0], np.float32)
        data = b"".join(np.ascontiguousarray(a, np.float32).tobytes() for a in arrays)
        with self._locked(exclusive=False), self.transaction():
            before = self.conn.total_changes
            self._exec(
                "INSERT OR IGNORE INTO codecs(model, codec, nbits, dim, centroids, error, data, crc, used)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (model, codec, int(nbits), int(centroids.shape[1]), int(centroids.shape[0]), float(error), data,
                 zlib.crc32(data), _now()),
            )
            return self.conn.total_changes > before

    def get_codec(self, model: str, codec: str) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, float] | None:
        """``(nbits, centroids, cutoffs, weights, build error)`` of a kept codec (its use is
        recorded), or None; one whose bytes fail their CRC or their shape is a miss, and goes."""
        row = self._exec(
            "SELECT nbits, dim, centroids, error, data, crc, used FROM codecs WHERE model = ? AND codec = ?",
            (model, codec),
        ).fetchone()
        if row is None:
            return None
        nbits, dim, k, error, data, crc, used = row
        n_buckets = 1 << int(nbits) if nbits in (2, 4) else 0
        if (not isinstance(data, bytes) or zlib.crc32(data) != crc or not n_buckets
                or len(data) != 4 * (k * dim + 2 * n_buckets - 1)):
            self._rows_update("DELETE FROM codecs WHERE model = ? AND codec IN ({})", [codec], (model,))
            return None
        flat = np.frombuffer(data, np.float32)
        centroids = flat[: k * dim].reshape(k, dim)
        cutoffs, weights = flat[k * dim : k * dim + n_buckets - 1], flat[k * dim + n_buckets - 1 :]
        if used < _now() - TOUCH_S:
            self._rows_update("UPDATE codecs SET used = ? WHERE model = ? AND codec IN ({})", [codec], (_now(), model))
        return int(nbits), centroids, cutoffs, weights, float(error)

    def code_coverage(self, model: str, keys: Sequence[str]) -> dict[str, tuple[int, int]]:
        """Codec fingerprint -> (arrays, tokens) of ``keys`` (hashes of float16 arrays, as
        `put_codes` takes them) whose codes are kept under it."""
        out: dict[str, list[int]] = {}
        for part in chunked(list(dict.fromkeys(keys))):
            marks = ",".join("?" * len(part))
            for codec, texts, tokens in self._exec(
                f"SELECT codec, count(*), sum(n) FROM codes WHERE model = ? AND array_hash IN ({marks}) GROUP BY codec",
                (model, *part),
            ).fetchall():
                got = out.setdefault(codec, [0, 0])
                got[0] += texts
                got[1] += tokens
        return {codec: (texts, tokens) for codec, (texts, tokens) in out.items()}

    def get_codes(self, model: str, codec: str, keys: Sequence[str]) -> dict[str, tuple[int, float, bytes]]:
        """Key -> ``(tokens, summed error, bytes)`` kept under ``codec`` (their use is
        recorded); an entry whose bytes fail their CRC is a miss, and goes."""
        out: dict[str, tuple[int, float, bytes]] = {}
        stale: list[int] = []
        damaged: list[int] = []
        now = _now()
        for part in chunked(list(dict.fromkeys(keys))):
            marks = ",".join("?" * len(part))
            for cid, key, n, error, data, crc, used in self._exec(
                "SELECT id, array_hash, n, error, data, crc, used FROM codes"
                f" WHERE model = ? AND codec = ? AND array_hash IN ({marks})",
                (model, codec, *part),
            ).fetchall():
                if not isinstance(data, bytes) or zlib.crc32(data) != crc:
                    damaged.append(cid)
                    continue
                out[key] = (int(n), float(error), data)
                if used < now - TOUCH_S:
                    stale.append(cid)
        self._rows_update("UPDATE codes SET used = ? WHERE id IN ({})", stale, (now,))
        self._rows_update("DELETE FROM codes WHERE id IN ({})", damaged)
        return out

    def put_codes(self, model: str, codec: str, items: Iterable[tuple[str, int, float, bytes]]) -> int:
        """Add ``(key, tokens, summed error, bytes)`` made under ``codec``. The key is the
        hash of the float16 array coded, not of a text: codes are a function of the array
        and the codec alone, so they fit whatever text or index an array is found under. A
        key already kept keeps its row (the same array under the same codec: the same codes).
        Returns how many rows were new."""
        now = _now()
        rows = [(model, codec, key, int(n), float(error), data, zlib.crc32(data), now) for key, n, error, data in items]
        if not rows:
            return 0
        with self._locked(exclusive=False), self.transaction():
            before = self.conn.total_changes
            self._writemany(
                "INSERT OR IGNORE INTO codes(model, codec, array_hash, n, error, data, crc, used)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            added = self.conn.total_changes - before
        if added and self.disk_bytes() > self.limit:
            self.prune()
        return added

    def count(self, model: str | None = None) -> int:
        """Rows cached (of ``model``, when given)."""
        if model is None:
            return self._exec("SELECT count(*) FROM vectors").fetchone()[0]
        return self._exec("SELECT count(*) FROM vectors WHERE model = ?", (model,)).fetchone()[0]

    def _rows_update(self, sql: str, ids: list, lead: tuple = ()) -> None:
        """Best effort (a use's record): a cache busy for longer than SQLite waits skips it."""
        if not ids:
            return
        with contextlib.suppress(CodeSearchError, sqlite3.Error), self.transaction():
            for part in chunked(ids):
                self._exec(sql.format(",".join("?" * len(part))), (*lead, *part))

    # -- size ----------------------------------------------------------------------------

    def disk_bytes(self) -> int:
        """Bytes of the folder: segment files, the database and its WAL."""
        total = sum((self.segments.sizes() if self.segments is not None else {}).values())
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += os.stat(self.path + suffix).st_size
        return total

    def live_bytes(self) -> int:
        """Bytes of the arrays rows refer to, and of the chunk records."""
        arrays = self._exec(f"SELECT coalesce(sum({self.ARRAY_BYTES}), 0) FROM vectors").fetchone()[0]
        return arrays + self._chunk_bytes()

    def _chunk_bytes(self) -> int:
        """Bytes kept in the database's own rows besides vectors: chunk records, PLAID codes
        and codecs."""
        return self._exec(
            "SELECT (SELECT coalesce(sum(length(data)), 0) FROM chunks) + (SELECT coalesce(sum(length(data)), 0)"
            " FROM codes) + (SELECT coalesce(sum(length(data)), 0) FROM codecs)"
        ).fetchone()[0]

    def prune(self, limit: int | None = None, *, everything: bool = False) -> tuple[int, int]:
        """Evict the least recently used rows until the cache holds under ``limit`` bytes
        (default its cap) and reclaim their space; ``everything`` empties it. Returns (rows
        evicted, bytes freed on disk). Waits for writes under way, and they for it."""
        limit = self.limit if limit is None else int(limit)
        with self._locked(exclusive=True):
            before = self.disk_bytes()
            self._checkpoint()
            with self.transaction():
                if everything:
                    evicted = sum(self._exec(f"DELETE FROM {table}").rowcount
                                  for table in ("vectors", "chunks", "codes", "codecs"))
                elif self.disk_bytes() > limit:
                    # Segments end at most 1 / _EVICT_TO of their live bytes (compaction below),
                    # beside the database itself: the live bytes that fit the cap with both. The
                    # database's own overhead leaves out the arrays stored in it (dense and file
                    # vectors) and its free pages: counted as overhead, they made the target 0,
                    # and a cache of dense vectors emptied itself on every write.
                    database = self.disk_bytes() - sum(self.segments.sizes().values() if self.segments else ())
                    overhead = max(0, database - self._inline_bytes() - self._free_bytes())
                    evicted = self._evict_to(int(_EVICT_TO * max(0, limit - overhead)))
                else:
                    evicted = 0
            self.compact_segments(dead_share=0.0 if everything else 1 - _EVICT_TO)
            self._checkpoint()
            if everything or self._free_bytes() * 4 > self._database_bytes() or (
                self._free_bytes() and self.disk_bytes() > limit
            ):
                # Deleted rows free pages, not the file: give them back, so that the file
                # shrinks below the cap and the next write does not prune again.
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("VACUUM")
                self._checkpoint()  # VACUUM wrote the whole database into the WAL
            return evicted, max(0, before - self.disk_bytes())

    def _inline_bytes(self) -> int:
        """Bytes of the arrays kept inside the database (the kinds without segment files, and
        the chunk records)."""
        inline = self._exec("SELECT coalesce(sum(length(data)), 0) FROM vectors WHERE seg IS NULL").fetchone()[0]
        return inline + self._chunk_bytes()

    def _free_bytes(self) -> int:
        """Bytes of the database's free pages (deleted rows' space, not yet given back)."""
        free = self._exec("PRAGMA freelist_count").fetchone()[0]
        return int(free) * int(self._exec("PRAGMA page_size").fetchone()[0])

    def _database_bytes(self) -> int:
        with contextlib.suppress(OSError):
            return os.stat(self.path).st_size
        return 0

    def _checkpoint(self) -> None:
        """Move the WAL's pages into the database and empty it (as far as readers allow)."""
        with contextlib.suppress(sqlite3.Error):
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _evict_to(self, target: int) -> int:
        """Delete rows (vectors and chunk records alike) oldest use first until the live
        bytes are at most ``target``."""
        live = self.live_bytes()
        doomed: dict[str, list] = {"vectors": [], "chunks": [], "codes": [], "codecs": []}
        for table, rid, size, _ in self._exec(
            f"SELECT 'vectors', id, {self.ARRAY_BYTES}, used FROM vectors"
            " UNION ALL SELECT 'chunks', key, length(data), used FROM chunks"
            " UNION ALL SELECT 'codes', id, length(data), used FROM codes"
            " UNION ALL SELECT 'codecs', model || char(0) || codec, length(data), used FROM codecs ORDER BY 4, 1, 2"
        ).fetchall():
            if live <= target:
                break
            doomed[table].append(rid)
            live -= size
        for table, column in (("vectors", "id"), ("chunks", "key"), ("codes", "id"),
                              ("codecs", "model || char(0) || codec")):
            for part in chunked(doomed[table]):
                self._exec(f"DELETE FROM {table} WHERE {column} IN ({','.join('?' * len(part))})", part)
        # Codes whose codec went are of no use (a new index adopts a codec, then its codes).
        orphans = self._exec(
            "DELETE FROM codes WHERE NOT EXISTS"
            " (SELECT 1 FROM codecs WHERE codecs.model = codes.model AND codecs.codec = codes.codec)"
        ).rowcount
        return sum(len(rows) for rows in doomed.values()) + max(0, orphans)

    def repair(self) -> int:
        """Drop rows whose arrays are damaged and reclaim dead segment space; returns how many
        rows went. (A read drops a damaged row it meets anyway; this checks every one.)"""
        with self._locked(exclusive=True):
            dropped = self.drop_damaged_vectors()
            self.compact_segments(dead_share=1 - _EVICT_TO)
            return dropped

    def status(self) -> CacheStatus:
        entries: dict[str, dict[str, int]] = {}
        for model, kind, n in self._exec("SELECT model, kind, count(*) FROM vectors GROUP BY model, kind"):
            entries.setdefault(model, {})[kind] = n
        oldest, newest = self._exec(
            "SELECT min(u), max(u) FROM (SELECT used AS u FROM vectors UNION ALL SELECT used FROM chunks"
            " UNION ALL SELECT used FROM codes)"
        ).fetchone()
        return CacheStatus(
            path=str(self.folder), enabled=True, limit_bytes=self.limit, live_bytes=self.live_bytes(),
            disk_bytes=self.disk_bytes(), entries=entries, oldest_use=oldest, newest_use=newest,
            chunked_files=self._exec("SELECT count(*) FROM chunks").fetchone()[0],
            coded_texts=self._exec("SELECT count(*) FROM codes").fetchone()[0],
        )


def entry_crc(model: str, kind: str, key: str, n: int, dim: int, data: bytes) -> int:
    """The checksum of a vector kept in its row: CRC-32 of its key, its shape and its bytes.

    Why the key and the shape too: a damaged byte anywhere in the row then reads as a miss,
    never as another text's vector, or this one's under another shape. (An array in a
    segment has the CRC of its bytes, checked by `Segments.read`; its shape is its size.)
    """
    head = f"{model}\x00{kind}\x00{key}\x00{n}\x00{dim}\x00".encode("utf-8", "surrogatepass")
    return zlib.crc32(data, zlib.crc32(head))


def _now() -> int:
    return int(time.time())


def _lock_fd(folder: Path) -> int:
    return os.open(folder / _LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


@contextlib.contextmanager
def _flocked(folder: Path, *, exclusive: bool) -> Iterator[None]:
    fd = _lock_fd(folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def _set_aside(folder: Path) -> None:
    """Remove an unreadable cache's own files (the database, its WAL, its segments), and
    nothing else: ``CODESEARCH_CACHE_DIR`` may name a folder that holds other things."""
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            (folder / (CACHE_FILE + suffix)).unlink()
    shutil.rmtree(folder / (CACHE_FILE + ".vectors"), ignore_errors=True)
