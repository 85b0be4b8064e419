"""The vectors cache of a store: (model identity, kind, text hash) -> float16 array.

Content is embedded once: an index run looks here before it encodes, and every vector index
is rebuilt from here without encoding. Single vectors stay in their rows; the large
multi-vector (ColBERT) arrays go to append-only segment files beside the store
(`codesearch.store.segments`), written once instead of twice through SQLite's WAL, and
compacted as deletions free space.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from codesearch.store import schema
from codesearch.store.connection import Connection
from codesearch.store.rows import chunked, paths_at
from codesearch.store.segments import SegmentError


@dataclass(frozen=True, slots=True)
class VectorKind:
    """One kind of vector in the cache: which model makes it, of what text, in what shape.

    A new kind is an entry in `VECTOR_KINDS` (and, for the store's CHECK constraint on
    ``vectors.kind``, a migration), plus the derived index that searches it
    (`codesearch.indexes.registry.DERIVED`).
    """

    name: str
    role: str  # the model role ("dense" | "colbert") whose identity keys these vectors
    per_file: bool = False  # one vector per file, keyed by the file's hash (else per chunk text)
    multi: bool = False  # one (tokens, dim) array per text: kept in segment files on disk

    @property
    def keyed_by(self) -> tuple[str, str]:
        """(table, column) whose hash keys these vectors: files' content or chunks' text."""
        return ("files", "hash") if self.per_file else ("chunks", "text_hash")


#: Every vector kind, in the order an index run encodes them.
VECTOR_KINDS: dict[str, VectorKind] = {
    kind.name: kind
    for kind in (
        VectorKind("dense", "dense"),
        VectorKind("file", "dense", per_file=True),
        # Multi-vector arrays go to segment files (an on-disk store): tens of KB per text,
        # written once there instead of twice through SQLite's WAL. Single vectors (1.5 KB)
        # stay in rows: a query reads them, and their cost is per row, not per byte.
        VectorKind("colbert", "colbert", multi=True),
    )
}
#: Vector kinds in the cache, and the model role whose identity keys each of them.
KIND_ROLE = {name: kind.role for name, kind in VECTOR_KINDS.items()}
#: Kinds whose arrays go to segment files.
SEGMENT_KINDS = frozenset(name for name, kind in VECTOR_KINDS.items() if kind.multi)

#: The columns a vector read selects (table alias ``v``), on schema 3 and before it.
VEC_COLS = "v.n, v.dim, v.data, v.seg, v.off, v.crc"
VEC_COLS_BEFORE_3 = "v.n, v.dim, v.data, NULL, NULL, NULL"


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


class SegmentArrays(Connection):
    """A ``vectors`` table whose large arrays live in segment files: the reads that keep a
    snapshot's segments open, compaction, and the check that drops damaged arrays. The
    vectors cache of an index store (`VectorCache`) and the user's vector cache
    (`codesearch.store.cache.UserCache`) are both one: one on-disk format, one set of
    crash-safety rules.
    """

    #: SQL for the bytes a ``vectors`` row's array takes in its segment.
    ARRAY_BYTES = "n * dim * 2"

    def begin_read(self) -> None:
        """Open a read transaction that holds its snapshot until it ends (a pinned
        searcher's): segments are opened first, so the snapshot's stay readable."""
        if self.segments is not None:
            self.segments.open_all(release=self._idle())
        self._exec("BEGIN")

    def _idle(self) -> bool:
        """No read of this store holds a snapshot (so no unlinked segment is needed)."""
        return not self.conn.in_transaction and self._cursors == 0

    def compact_segments(self, dead_share: float = 0.5) -> int:
        """Reclaim segment space no row refers to; returns the bytes freed.

        A segment with no live array is unlinked. One more than ``dead_share`` dead (half,
        by default) has its live arrays copied to a new segment (the rows move in one
        transaction), then is unlinked. So dead space stays below about that share of the
        folder, and each byte is copied a bounded number of times. Only a writer calls this
        (under the index lock, or the vector cache's maintenance lock); readers that opened
        a segment before it goes keep reading it.
        """
        if self.segments is None or self.readonly or self._depth:
            return 0
        sizes = self.segments.sizes()
        if not sizes:
            return 0
        live = dict(
            self._exec(
                f"SELECT seg, sum({self.ARRAY_BYTES}) FROM vectors WHERE seg IS NOT NULL GROUP BY seg"
            ).fetchall()
        )
        sparse = [seg for seg, size in sizes.items() if 0 < live.get(seg, 0) < (1 - dead_share) * size]
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
                        f"SELECT id, {self.ARRAY_BYTES}, off, crc FROM vectors WHERE seg = ? ORDER BY off", (seg,)
                    ).fetchall()
                    for part in chunked(rows, 256):
                        blobs = [self.segments.read(seg, off, size, crc) for _, size, off, crc in part]
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
        # Our own descriptor of a file SQLite locks would drop its locks when closed (POSIX
        # drops a process's locks on any close); SQLite locks the database and -shm files,
        # never the -wal (checked in /proc/locks during a write), so this close is safe.
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
        rows = self._exec(
            f"SELECT id, {self.ARRAY_BYTES}, seg, off, crc FROM vectors WHERE seg IS NOT NULL ORDER BY seg, off"
        )
        bad = []
        for vid, size, seg, off, crc in rows:  # streamed: one array in memory at a time
            try:
                self.segments.read(seg, off, size, crc)
            except SegmentError:
                bad.append(vid)
        if not bad:
            return 0
        with self.transaction():
            for part in chunked(bad):
                self._exec(f"DELETE FROM vectors WHERE id IN ({','.join('?' * len(part))})", part)
        return len(bad)


class VectorCache(SegmentArrays):
    """The vectors cache of one store (`codesearch.store.Store` is one)."""

    def model_identity(self, kind: str) -> str | None:
        """The identity of the model whose vectors of ``kind`` the index uses, or None."""
        rec = self.models().get(KIND_ROLE[kind])
        return rec.identity if rec else None

    def drop_model_vectors(self, model: str) -> int:
        """Delete every cached vector of ``model`` (an identity whose vectors are stale: its
        tokenizer changed beside the same weights); returns how many. Their segment bytes
        are reclaimed as dead space."""
        with self.transaction():
            return self._exec("DELETE FROM vectors WHERE model = ?", (model,)).rowcount

    def cached_hashes(self, model: str, kind: str) -> set[str]:
        """Text hashes that have a cached vector for this model identity and kind."""
        rows = self._exec("SELECT text_hash FROM vectors WHERE model = ? AND kind = ?", (model, kind))
        return {r[0] for r in rows}

    def chunk_token_counts(self, model: str, kind: str) -> dict[str, int]:
        """Text hash -> rows of its cached array (a ColBERT text's tokens), for the texts of
        live chunks that have a vector of this model and kind."""
        rows = self._exec(
            "SELECT text_hash, n FROM vectors WHERE model = ? AND kind = ?"
            " AND text_hash IN (SELECT text_hash FROM chunks)", (model, kind),
        )
        return dict(rows.fetchall())

    def put_vectors(self, model: str, kind: str, items: Iterable[tuple[str, np.ndarray]]) -> int:
        """Cache vectors (float16 on disk); returns how many were written.

        Arrays of :data:`SEGMENT_KINDS` go to the segment files of an on-disk store, the
        others into their rows; a caller sees no difference.
        """
        return self.put_encoded(model, kind, [(text_hash, *encode_array(array)) for text_hash, array in items])

    def put_encoded(self, model: str, kind: str, encoded: Sequence[tuple[str, int, int, bytes]]) -> int:
        """Cache ``(text hash, n, dim, float16 bytes)`` arrays as :func:`encode_array` makes
        them (copied from the user's vector cache without a cast); returns how many."""
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

    def put_placed(self, model: str, kind: str, rows: Sequence[tuple[str, int, int, int, int, int]]) -> int:
        """Record arrays that already lie in this store's segment files: ``(text hash, n, dim,
        segment, offset, crc)`` each (an import's, checked where they lie, and not copied:
        `codesearch.indexing.adopt`). Returns how many."""
        if not rows:
            return 0
        self._writemany(
            "INSERT OR REPLACE INTO vectors(model, kind, text_hash, dim, n, data, seg, off, crc)"
            " VALUES (?, ?, ?, ?, ?, x'', ?, ?, ?)",
            [(model, kind, h, dim, n, seg, off, crc) for h, n, dim, seg, off, crc in rows],
        )
        return len(rows)

    def get_vectors(self, model: str, kind: str, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        """Text hash -> float32 (n, dim) array, for the hashes that are cached."""
        out: dict[str, np.ndarray] = {}
        for part in chunked(list(hashes)):
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
        table, col = VECTOR_KINDS[kind].keyed_by
        found: dict[int, np.ndarray] = {}
        for part in chunked(ids):
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

    def vector_lengths(self, kind: str, ids: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, rows)`` int64 of the chunks (or files) with a vector of ``kind`` for the
        recorded model, and each array's rows (a ColBERT text's tokens), read from the rows
        alone: no array is read. In the order of ``ids``, or by id when None: the order of
        :meth:`vectors_for` and :meth:`iter_vectors`, which a PLAID add that holds most
        documents' codes already calls only for the rest."""
        model = self.model_identity(kind)
        empty = np.zeros(0, dtype=np.int64)
        if model is None:
            return empty, empty.copy()
        table, col = VECTOR_KINDS[kind].keyed_by
        # (The joins of iter_vectors and vectors_for, and their plans: see the note in the latter.)
        sql = "SELECT t.id, v.n FROM {table} t {join} vectors v ON v.text_hash = t.{col} AND v.model = ? AND v.kind = ?"
        if ids is None:
            sql = sql.format(table=table, join="JOIN", col=col)
            found = dict(self._exec(f"{sql} ORDER BY t.id", (model, kind)).fetchall())
            keep = list(found)
        else:
            ids = [int(i) for i in ids]
            sql = sql.format(table=table, join="CROSS JOIN", col=col)
            found = {}
            for part in chunked(ids):
                marks = ",".join("?" * len(part))
                found.update(self._exec(f"{sql} WHERE t.id IN ({marks})", (model, kind, *part)).fetchall())
            keep = [i for i in ids if i in found]
        return np.asarray(keep, dtype=np.int64), np.asarray([found[i] for i in keep], dtype=np.int64)

    def iter_vectors(self, kind: str, batch: int = 4096) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
        """Every (id, vector) of ``kind`` for the recorded model, in id order, in batches."""
        model = self.model_identity(kind)
        if model is None:
            return
        table, col = VECTOR_KINDS[kind].keyed_by
        cur = self._vector_rows(
            f"SELECT t.id, {{cols}} FROM {table} t JOIN vectors v ON v.text_hash = t.{col}"
            f" AND v.model = ? AND v.kind = ? ORDER BY t.id",
            (model, kind),
            kind,
        )
        yield from self._batches(cur, batch)

    def _batches(self, cur: sqlite3.Cursor, batch: int) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
        """``(first column as int64, arrays of the rest)`` of ``cur``'s rows, ``batch`` at a time."""
        self._cursors += 1
        try:
            while rows := cur.fetchmany(batch):
                yield (np.asarray([r[0] for r in rows], dtype=np.int64), [self._array(*r[1:]) for r in rows])
        finally:
            self._cursors -= 1

    def iter_vectors_by_file(
        self, kind: str, file_ids: Sequence[int] | None = None, batch: int = 4096
    ) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
        """``(file id of each chunk, its vector)`` for the chunks with a vector of the
        per-chunk ``kind``, in batches, grouped by file (every chunk of a file in a row, by
        file id); only the files ``file_ids`` when given. What a per-file mean of chunk
        vectors is made from (`codesearch.indexes.dense.CentroidIndex`)."""
        model = self.model_identity(kind)
        if model is None or VECTOR_KINDS[kind].per_file:
            return
        sql = (
            "SELECT c.file_id, {cols} FROM chunks c CROSS JOIN vectors v ON v.text_hash = c.text_hash"
            " AND v.model = ? AND v.kind = ?"
        )
        parts = [None] if file_ids is None else list(chunked(sorted({int(f) for f in file_ids})))
        for part in parts:
            where = "" if part is None else f" WHERE c.file_id IN ({','.join('?' * len(part))})"
            cur = self._vector_rows(sql + where + " ORDER BY c.file_id", (model, kind, *(part or ())), kind)
            yield from self._batches(cur, batch)

    def _vector_rows(self, sql: str, params: Sequence[object], kind: str) -> sqlite3.Cursor:
        """Run a vector read (``{cols}`` in ``sql`` the columns :meth:`_array` takes, table
        alias ``v``), on any readable schema. For a kind kept in segments, every segment file
        is opened first, so one that a compaction unlinks after this read's snapshot began
        stays readable."""
        if self.segments is not None and kind in SEGMENT_KINDS:
            self.segments.open_all(release=self._idle())
        try:
            return self._exec(sql.format(cols=VEC_COLS), params)
        except sqlite3.OperationalError as exc:
            # A read-only open of a store from before schema 3 (a writer may migrate it
            # later; the columns then exist and the first form works again).
            if "no such column" not in str(exc):
                raise
            return self._exec(sql.format(cols=VEC_COLS_BEFORE_3), params)

    def _array(self, n: int, dim: int, data: bytes, seg: int | None, off: int | None, crc: int | None) -> np.ndarray:
        """The float32 array of one vectors row, from the row or from its segment."""
        if seg is None or self.segments is None:  # (an in-memory store never writes segments)
            if not isinstance(data, bytes) or len(data) != n * dim * 2:
                got = len(data) if isinstance(data, bytes) else 0
                raise schema.corrupt(self.path, f"a vector of {got} bytes where its shape says {n}x{dim}")
            return decode_array(n, dim, data)
        try:
            return decode_array(n, dim, self.segments.read(seg, off, n * dim * 2, crc))
        except SegmentError as exc:
            raise schema.corrupt(self.path, exc) from None

    def vectors_mark(self) -> int | None:
        """The largest row id of the vectors table: it grows whenever a vector is added or
        replaced (one lookup); None on a store from before row ids (schema 1)."""
        try:
            return self._exec("SELECT max(id) FROM vectors").fetchone()[0]
        except sqlite3.OperationalError:
            return None

    def count_with_vectors(self, kind: str) -> int:
        """How many chunks (or files, kind ``file``) have a cached vector of ``kind``."""
        model = self.model_identity(kind)
        if model is None:
            return 0
        table, col = VECTOR_KINDS[kind].keyed_by
        return self._exec(
            f"SELECT count(*) FROM {table} t JOIN vectors v ON v.text_hash = t.{col} AND v.model = ? AND v.kind = ?",
            (model, kind),
        ).fetchone()[0]

    def chunks_missing_vectors(self, model: str, kind: str) -> list[tuple[int, int, str, int]]:
        """``(chunk id, file id, text hash, characters of its encoder text)`` of one chunk of
        each text with no cached ``kind`` vector of ``model``, by id: what an encode stream
        plans with, without the texts (`encoder_texts` reads them a batch at a time)."""
        rows = self._exec(
            "SELECT min(c.id), c.file_id, c.text_hash, length(c.header) + 1 + length(c.text) FROM chunks c"
            " WHERE NOT EXISTS (SELECT 1 FROM vectors v WHERE v.model = ? AND v.kind = ?"
            " AND v.text_hash = c.text_hash) GROUP BY c.text_hash ORDER BY 1",
            (model, kind),
        )
        return rows.fetchall()

    def files_missing_vectors(self, model: str, kind: str = "file") -> list[tuple[int, str, str]]:
        """(file id, path, hash) of files with no cached vector of a per-file ``kind``."""
        rows = self._exec(
            "SELECT f.id, f.path, f.hash FROM files f WHERE NOT EXISTS (SELECT 1 FROM vectors v"
            " WHERE v.model = ? AND v.kind = ? AND v.text_hash = f.hash)",
            (model, kind),
        )
        return [tuple(r) for r in paths_at(rows.fetchall(), 1)]

    def chunk_ids_with_hashes(self, hashes: Iterable[str]) -> list[int]:
        """Ids of the chunks whose text hash is one of ``hashes``."""
        return self._ids_with_hashes("chunks", "text_hash", hashes)

    def hashes_of_chunks(self, ids: Iterable[int]) -> dict[int, str]:
        """Chunk id -> its text hash, for the ids that exist."""
        out: dict[int, str] = {}
        for part in chunked([int(i) for i in ids]):
            marks = ",".join("?" * len(part))
            out.update(self._exec(f"SELECT id, text_hash FROM chunks WHERE id IN ({marks})", part).fetchall())
        return out

    def files_of_chunks(self, ids: Iterable[int]) -> set[int]:
        """The ids of the files that hold the chunks ``ids`` (those that exist)."""
        out: set[int] = set()
        for part in chunked([int(i) for i in ids]):
            marks = ",".join("?" * len(part))
            out.update(r[0] for r in self._exec(f"SELECT DISTINCT file_id FROM chunks WHERE id IN ({marks})", part))
        return out

    def file_ids_with_hashes(self, hashes: Iterable[str]) -> list[int]:
        """Ids of the files whose content hash is one of ``hashes``."""
        return self._ids_with_hashes("files", "hash", hashes)

    def _ids_with_hashes(self, table: str, col: str, hashes: Iterable[str]) -> list[int]:
        out: list[int] = []
        for part in chunked(list(hashes)):
            marks = ",".join("?" * len(part))
            out += [r[0] for r in self._exec(f"SELECT id FROM {table} WHERE {col} IN ({marks})", part)]
        return out

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
