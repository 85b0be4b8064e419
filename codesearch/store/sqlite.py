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
with numbered migrations applied on open. It is built in layers, each a module: the
connection, transactions, ``meta`` and ``models`` (`connection`), the vectors cache
(`vectors`), and here files and chunks.

Example
-------
>>> store = Store(":memory:")
>>> with store.transaction():
...     fid = store.upsert_file("a.py", hash="h", size=3, mtime_ns=1, language="python", n_lines=1)
>>> store.file_paths()
{1: 'a.py'}
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence

from codesearch.store.records import ChunkMeta, FileRecord, ModelRecord, StoredChunk
from codesearch.store.rows import CHUNK_SQL, chunked, from_db, paths_at, stored_chunk, to_db
from codesearch.store.vectors import KIND_ROLE, SEGMENT_KINDS, VectorCache, decode_array, encode_array
from codesearch.types import Chunk, encoder_text

__all__ = [
    "KIND_ROLE",
    "SEGMENT_KINDS",
    "ChunkMeta",
    "FileRecord",
    "ModelRecord",
    "Store",
    "StoredChunk",
    "decode_array",
    "encode_array",
]


class Store(VectorCache):
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
    One writer at a time is enforced by :class:`IndexLock`, not here.
    """

    # -- files -----------------------------------------------------------------------------

    def files(self) -> dict[str, FileRecord]:
        """Path -> file record, for every indexed file."""
        rows = self._exec("SELECT id, path, hash, size, mtime_ns, language, n_lines FROM files").fetchall()
        rows = paths_at(rows, 1)
        return {r[1]: FileRecord(*r) for r in rows}

    def file_paths(self) -> dict[int, str]:
        """File id -> relative path."""
        return {i: from_db(p) for i, p in self._exec("SELECT id, path FROM files").fetchall()}

    def file_stats(self) -> list[tuple[str, int, int]]:
        """``(path, size, mtime_ns)`` of every indexed file: what a no-op check compares
        (without a `FileRecord` made for each)."""
        return paths_at(self._exec("SELECT path, size, mtime_ns FROM files").fetchall(), 0)  # type: ignore[return-value]

    def file_sizes(self) -> list[tuple[int, str, int]]:
        """``(file id, path, size)`` of every indexed file."""
        return paths_at(self._exec("SELECT id, path, size FROM files").fetchall(), 1)  # type: ignore[return-value]

    def file_record(self, file_id: int) -> FileRecord | None:
        row = self._exec(
            "SELECT id, path, hash, size, mtime_ns, language, n_lines FROM files WHERE id = ?", (file_id,)
        ).fetchone()
        return FileRecord(*paths_at([row], 1)[0]) if row else None

    def file_hashes(self, paths: Sequence[str]) -> dict[str, str]:
        """Path -> content hash, for those of ``paths`` that are indexed."""
        out: dict[str, str] = {}
        for part in chunked([to_db(p) for p in paths]):
            marks = ",".join("?" * len(part))
            out.update(
                paths_at(self._exec(f"SELECT path, hash FROM files WHERE path IN ({marks})", part).fetchall(), 0)
            )
        return out

    def upsert_file(self, path: str, *, hash: str, size: int, mtime_ns: int, language: str, n_lines: int) -> int:
        """Insert or update a file row (keyed by path); returns its id, stable across updates."""
        path = to_db(path)
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

    def touch_files(self, stats: Sequence[tuple[int, int, int]]) -> None:
        """`touch_file` for many ``(file id, size, mtime_ns)``."""
        if stats:
            self._writemany("UPDATE files SET size = ?, mtime_ns = ? WHERE id = ?",
                            [(size, mtime_ns, fid) for fid, size, mtime_ns in stats])

    def delete_files(self, file_ids: Sequence[int]) -> None:
        """Delete files and (cascade) their chunks."""
        with self.transaction():
            for part in chunked(list(file_ids)):
                marks = ",".join("?" * len(part))
                self._exec(f"DELETE FROM chunks WHERE file_id IN ({marks})", part)
                self._exec(f"DELETE FROM files WHERE id IN ({marks})", part)

    # -- chunks ----------------------------------------------------------------------------

    def chunk_records(self, ids: Sequence[int]) -> list[StoredChunk]:
        """The chunks of ``ids``, in the order of ``ids`` (missing ids are left out)."""
        ids = [int(i) for i in ids]
        found: dict[int, StoredChunk] = {}
        for part in chunked(ids):
            marks = ",".join("?" * len(part))
            for r in self._exec(f"{CHUNK_SQL} WHERE c.id IN ({marks})", part):
                found[r[0]] = stored_chunk(r)
        return [found[i] for i in ids if i in found]

    def chunk_texts(self, ids: Sequence[int] | None = None) -> list[tuple[int, str]]:
        """``(id, text)`` of the chunks of ``ids`` (every chunk when None), by id: what a
        search's regex filter reads, without the rest of each record."""
        if ids is None:
            return self._exec("SELECT id, text FROM chunks ORDER BY id").fetchall()
        out: list[tuple[int, str]] = []
        for part in chunked([int(i) for i in ids]):
            marks = ",".join("?" * len(part))
            out.extend(self._exec(f"SELECT id, text FROM chunks WHERE id IN ({marks})", part).fetchall())
        return sorted(out)

    def encoder_texts(self, ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        """Chunk id -> (`Chunk.encoder_text`, text hash) of the chunks of ``ids``: what an
        encode batch reads (missing ids are left out)."""
        out: dict[int, tuple[str, str]] = {}
        for part in chunked([int(i) for i in ids]):
            marks = ",".join("?" * len(part))
            for cid, header, text, h in self._exec(
                f"SELECT id, header, text, text_hash FROM chunks WHERE id IN ({marks})", part
            ):
                out[cid] = (encoder_text(header, text), h)
        return out

    def iter_chunk_records(self) -> Iterator[StoredChunk]:
        """Every chunk, by id."""
        for r in self._exec(f"{CHUNK_SQL} ORDER BY c.id"):
            yield stored_chunk(r)

    def file_chunks(self, file_id: int) -> list[StoredChunk]:
        """The chunks of one file, in file order."""
        rows = self._exec(f"{CHUNK_SQL} WHERE c.file_id = ? ORDER BY c.start_byte, c.id", (file_id,))
        return [stored_chunk(r) for r in rows]

    def iter_chunk_meta(self) -> Iterator[ChunkMeta]:
        """Every chunk's `ChunkMeta`, by id.

        What a searcher keeps in memory, read without the chunk text and header (SQLite
        then skips the text's overflow pages): a fraction of :meth:`iter_chunk_records`'s
        cost on a large index. Fetch text for the few chunks shown with :meth:`chunk_records`.
        """
        rows = self._exec(
            "SELECT c.id, c.file_id, f.path, c.start_line, c.end_line, c.language, c.symbol, c.kind, c.scope"
            " FROM chunks c JOIN files f ON f.id = c.file_id ORDER BY c.id"
        ).fetchall()
        if self._exec("SELECT 1 FROM files WHERE typeof(path) = 'blob' LIMIT 1").fetchone():
            rows = paths_at(rows, 2)  # (only then: a pass over every row costs on a large index)
        return map(ChunkMeta._make, rows)

    def iter_file_chunks(self, file_ids: Sequence[int] | None = None, *,
                         between: tuple[int, int] | None = None) -> Iterator[tuple]:
        """The chunks of ``file_ids`` (of every file when None; of the files whose ids lie in
        ``between``, both ends included, when that is given), grouped by file: files by id,
        a file's chunks by id, each as ``(id, file_id, path, start_line, end_line, language,
        symbol, kind, scope, header, text)``.

        What the lexical index is written from. A cursor read row by row (the chunks table's
        ``file_id`` index gives the order, so SQLite sorts nothing), so a large index is
        never held in memory at once.
        """
        sql = (
            "SELECT c.id, c.file_id, f.path, c.start_line, c.end_line, c.language, c.symbol, c.kind, c.scope,"
            " c.header, c.text FROM chunks c JOIN files f ON f.id = c.file_id"
        )
        parts = [None] if file_ids is None else list(chunked(sorted({int(i) for i in file_ids})))
        for part in parts:
            if part is None and between is not None:
                cursor = self._exec(f"{sql} WHERE c.file_id BETWEEN ? AND ? ORDER BY c.file_id, c.id",
                                    (int(between[0]), int(between[1])))
            elif part is None:
                cursor = self._exec(f"{sql} ORDER BY c.file_id, c.id")
            else:
                cursor = self._exec(f"{sql} WHERE c.file_id IN ({','.join('?' * len(part))}) ORDER BY c.file_id, c.id",
                                    part)
            try:
                for row in cursor:
                    yield row if not isinstance(row[2], bytes) else (*row[:2], from_db(row[2]), *row[3:])
            except sqlite3.DatabaseError as exc:
                self._raise_for(exc)
                raise

    def chunk_counts(self) -> list[tuple[int, int]]:
        """``(file_id, chunks)`` of every file with chunks, by id: the files
        `iter_file_chunks` yields, and how many rows each."""
        rows = self._exec("SELECT c.file_id, COUNT(*) FROM chunks c JOIN files f ON f.id = c.file_id"
                          " GROUP BY c.file_id ORDER BY c.file_id")
        return rows.fetchall()

    def file_chunk_ids(self, file_id: int) -> list[int]:
        """Ids of a file's chunks, in file order."""
        rows = self._exec("SELECT id FROM chunks WHERE file_id = ? ORDER BY start_byte, id", (file_id,))
        return [r[0] for r in rows]

    def chunk_hashes(self) -> dict[int, str]:
        """Chunk id -> text hash, for every chunk."""
        return dict(self._exec("SELECT id, text_hash FROM chunks").fetchall())

    def insert_chunk(self, file_id: int, c: Chunk, text_hash: str) -> int:
        """Insert one chunk of file ``file_id`` (its path is the file's); returns its id."""
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

    def insert_files(self, rows: Iterable[tuple[str, str, int, int, str, int]]) -> list[int]:
        """Insert files ``(path, hash, size, mtime_ns, language, n_lines)`` that are not in the
        store, in order, in one statement; returns their ids, in that order."""
        return self._insert_many(
            "files", "INSERT INTO files(path, hash, size, mtime_ns, language, n_lines) VALUES (?, ?, ?, ?, ?, ?)",
            ((to_db(path), *rest) for path, *rest in rows),
        )

    def insert_chunks(self, items: Iterable[tuple[int, Chunk, str]]) -> list[int]:
        """Insert chunks ``(file id, chunk, text hash)``, in order, in one statement; returns
        their ids, in that order."""
        return self._insert_many(
            "chunks",
            "INSERT INTO chunks(file_id, start_line, end_line, start_byte, end_byte, language, symbol,"
            " kind, scope, header, text, text_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            ((fid, c.start_line, c.end_line, c.start_byte, c.end_byte, c.language, c.symbol, c.kind, c.scope,
              c.header, c.text, h) for fid, c, h in items),
        )

    def _insert_many(self, table: str, sql: str, rows: Iterable[Sequence[object]]) -> list[int]:
        """``executemany`` of an insert into ``table`` (``files`` or ``chunks``); the new rows' ids.

        ``AUTOINCREMENT`` gives a new row an id above any the table has had, so the new rows
        are those above the largest id before the statement (one writer, under the index lock).
        """
        with self.transaction():
            row = self._exec(f"SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = '{table}'), 0),"
                             f" coalesce((SELECT max(id) FROM {table}), 0))").fetchone()
            before = int(row[0])
            try:
                self.conn.executemany(sql, rows)
            except sqlite3.DatabaseError as exc:
                self._raise_for(exc)
                raise
            return [r[0] for r in self._exec(f"SELECT id FROM {table} WHERE id > ? ORDER BY id", (before,))]

    def update_chunk_position(self, chunk_id: int, c: Chunk) -> None:
        """Move a kept chunk (same header and text) to its new place in an edited file."""
        self._write(
            "UPDATE chunks SET start_line = ?, end_line = ?, start_byte = ?, end_byte = ?, language = ?,"
            " symbol = ?, kind = ?, scope = ? WHERE id = ?",
            (c.start_line, c.end_line, c.start_byte, c.end_byte, c.language, c.symbol, c.kind, c.scope, chunk_id),
        )

    def delete_chunks(self, ids: Sequence[int]) -> None:
        with self.transaction():
            for part in chunked([int(i) for i in ids]):
                self._exec(f"DELETE FROM chunks WHERE id IN ({','.join('?' * len(part))})", part)

    def count(self, table: str) -> int:
        if table not in ("files", "chunks", "vectors"):
            raise ValueError(table)
        return self._exec(f"SELECT count(*) FROM {table}").fetchone()[0]

    def language_counts(self) -> dict[str, int]:
        """Language -> number of files."""
        rows = self._exec("SELECT language, count(*) FROM files GROUP BY language ORDER BY 2 DESC")
        return dict(rows.fetchall())

    def clear(self) -> None:
        """Forget every file, chunk, model and meta entry (the vectors cache stays)."""
        with self.transaction():
            self._exec("DELETE FROM chunks")
            self._exec("DELETE FROM files")
            self._exec("DELETE FROM models")
            self._exec("DELETE FROM meta")
