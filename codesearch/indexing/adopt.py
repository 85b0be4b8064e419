"""What an import takes from the store of an export, and the checks that make that safe.

An export is someone else's file (a CI job's, a colleague's), and the daemon that imports it
serves every repository and agent session of its user. So nothing in it is believed because
it is there; what an import keeps is either checked against the working tree or rebuilt:

- **The store is read, never opened as ours.** `open_untrusted` (read-only, no trusted
  schema, bounded values, a time budget), then only our five tables, by name, after checking
  that each is a table of this version's schema, word for word: a view named ``files`` (an
  endless recursive one made an import grow for a minute), a trigger, a virtual table or an
  extra column is refused, and nothing of its schema is copied. Rows go into a new store
  made by this version (`Store`), one value at a time, each of the type and size it must be.
- **A file and its chunks are taken when the working tree says the same.** The file at that
  path holds that content (its hash), and every chunk is the file's text at its lines: the
  bytes at its recorded range, the range at its recorded lines, the header its path and
  scope, the symbol and scope words of that file. A file that fails any of it (changed since
  the export, gone, or crafted) is left out, and the index run that follows the import
  chunks it from the working tree. So every text a search serves is the file's.
- **Vectors are taken for texts of the working tree only.** Each array must be of a model the
  export records, of its size, finite; the import copies them into the new store, and once
  the index run has brought the store up to date, every array whose text the store does not
  hold goes (`Store.prune_vectors`). A vector is the export's word for what a model makes of
  a text, the one thing an import cannot check without the model; it changes a ranking, never
  what is served.
- **Nothing derived is taken.** The lexical index, centrality, FAISS and PLAID files are
  rebuilt from the new store through the registry (`sync_derived`); of the export's PLAID
  index only its codec and each text's codes are read, through the index's own loader, and
  only when the codec checks in full (shapes, finite values, bounds) and the codes fit it
  and their text's vector: a build then skips k-means, as a second worktree does.
- **Meta and models**: the keys an index run reads, each checked (bounded, parsed, globs
  that compile); the models must be the manifest's.

Every refusal is an `ExportError` in one line that names the member and row that failed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

import numpy as np

from codesearch.errors import CodeSearchError, ExportError
from codesearch.globs import GitIgnore
from codesearch.indexes.registry import DERIVED, Delta, sync_derived
from codesearch.indexing.commit import WALK_EXCLUDE_KEY, WALK_INCLUDE_KEY
from codesearch.indexing.encoders import DISABLED_KEY, EMBEDDED_KEY, TOKENIZER_KEY, VECTORS_PENDING_KEY
from codesearch.indexing.export import Manifest, check_repository
from codesearch.languages import LANGUAGES
from codesearch.pathnames import text_name
from codesearch.store import KIND_ROLE, VECTOR_KINDS, Store
from codesearch.store.connection import open_untrusted
from codesearch.store.files import decode_source, hash_bytes, hash_text, read_inside
from codesearch.store.rows import chunked, from_db
from codesearch.store.segments import SegmentError, Segments
from codesearch.types import ROLES, STORE_FILE, Chunk

__all__ = ["Adoption", "ExportStore", "adopt_export", "adopt_into", "export_codes"]

log = logging.getLogger(__name__)

#: Rows an export may hold: well past a 114k-file monorepo (600k chunks), far below what
#: would hold this process's memory (each chunk costs ~100 bytes here until it is checked).
MAX_FILES = 1_000_000
MAX_CHUNKS = 5_000_000
MAX_VECTORS = 50_000_000
#: Tokens of one multi-vector array (the longest context of any checkpoint is 8192), and
#: values of one vector.
MAX_TOKENS = 1 << 15
MAX_DIM = 1 << 14
#: Sizes of the strings of one row.
MAX_PATH = 4096
MAX_LABEL = 8192  # a symbol, a scope, a header beyond its path
MAX_META = 1 << 16
MAX_WALK_GLOBS = 256
#: Seconds an import may spend reading the export's store: a fixed part, and a part per MB.
READ_BUDGET_S = 60.0
READ_S_PER_MB = 0.05

_HEX32 = re.compile(r"[0-9a-f]{32}")
_KIND = re.compile(r"[a-z_]{1,32}")
_WORD = re.compile(r"\w+")

#: The tables an import reads, and their columns, in the order it reads them.
TABLES = {
    "meta": ("key", "value"),
    "models": ("role", "name", "identity", "dim"),
    "files": ("id", "path", "hash", "size", "mtime_ns", "language", "n_lines"),
    "chunks": ("id", "file_id", "start_line", "end_line", "start_byte", "end_byte", "language", "symbol", "kind",
               "scope", "header", "text", "text_hash"),
    "vectors": ("id", "model", "kind", "text_hash", "dim", "n", "data", "seg", "off", "crc"),
}


def _is_int(value: object, lo: int = 0, hi: int = 1 << 62) -> bool:
    return type(value) is int and lo <= value <= hi


def _is_str(value: object, most: int) -> bool:
    return type(value) is str and len(value) <= most


def _safe_path(value: object) -> str | None:
    """The stored path as a relative path inside a repository, or None (absolute, ``..``,
    empty parts, NUL, too long, not text)."""
    if type(value) not in (str, bytes) or len(value) > MAX_PATH:
        return None
    path = from_db(value)
    parts = path.split("/")
    if "\x00" in path or any(p in ("", ".", "..") for p in parts):
        return None
    return path


# -- meta ------------------------------------------------------------------------------


def _json(value: str) -> object:
    if len(value) > MAX_META:
        raise ValueError(f"{len(value):,} characters, more than {MAX_META:,}")
    return json.loads(value)


def _walk_globs(value: str) -> None:
    globs = _json(value)
    if not isinstance(globs, list) or len(globs) > MAX_WALK_GLOBS:
        raise ValueError(f"not a list of at most {MAX_WALK_GLOBS} patterns")
    if not all(_is_str(g, 1024) for g in globs):
        raise ValueError("a pattern that is not text of at most 1024 characters")
    GitIgnore.of(globs)  # (a line git cannot read matches nothing, as in a walk)


def _int_text(lo: int, hi: int) -> Callable[[str], None]:
    def check(value: str) -> None:
        if not re.fullmatch(r"\d{1,15}", value) or not lo <= int(value) <= hi:
            raise ValueError(f"not a number from {lo} to {hi}")

    return check


def _short(value: str) -> None:
    if len(value) > 256:
        raise ValueError("longer than 256 characters")


def _roles(value: str) -> None:
    roles = _json(value)
    if not isinstance(roles, list) or not set(roles) <= set(ROLES):
        raise ValueError(f"not a list of model roles ({', '.join(ROLES)})")


def _small_json(value: str) -> None:
    _json(value)


#: Meta keys an import takes from an export (each checked); the rest are this checkout's own
#: (the root, notices said) or derived (generations), and are made here.
ADOPTED_META: dict[str, Callable[[str], None]] = {
    "chunk_tokens": _int_text(1, 1 << 20),
    "chunk_counter": _short,
    "chunker_version": _int_text(0, 1 << 20),
    "max_file_bytes": _int_text(1, 1 << 40),
    WALK_INCLUDE_KEY: _walk_globs,
    WALK_EXCLUDE_KEY: _walk_globs,
    DISABLED_KEY: _roles,
    VECTORS_PENDING_KEY: _roles,
    EMBEDDED_KEY: _small_json,
    **{TOKENIZER_KEY.format(role=role): _short for role in ROLES},
}


# -- the export's store ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _File:
    id: int
    path: str
    hash: str
    language: str


class ExportStore:
    """The store of an export, read as someone else's file (see the module's notes).

    Parameters
    ----------
    path
        The store file unpacked from the export.
    file
        The export (for the errors).
    member
        Its name in the export (for the errors).
    """

    def __init__(self, path: Path, file: Path, member: str = STORE_FILE) -> None:
        self.file, self.member = file, member
        if not path.is_file():
            raise self.damaged("the export holds no store")
        size_mb = path.stat().st_size / 1e6
        self.budget_s = READ_BUDGET_S + READ_S_PER_MB * size_mb
        self._conn: sqlite3.Connection | None = None
        with self._reading("it cannot be opened"):
            self._conn = open_untrusted(path, deadline=time.monotonic() + self.budget_s)
            self._check_schema()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> ExportStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def damaged(self, why: str) -> ExportError:
        why = " ".join(why.split())  # (SQLite's messages quote the file's own SQL, line breaks and all)
        return ExportError(
            f"{self.file} is damaged: {self.member}: {why[:300]}; nothing was imported (copy or download the "
            "export again, or run 'codesearch index' to build the index here)"
        )

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """Within the block, SQLite's errors (damage, the time budget, a limit) are one line."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if "interrupted" in str(exc):
                raise self.damaged(f"reading it took longer than {self.budget_s:.0f} s") from None
            raise self.damaged(f"{what} ({exc})") from None
        except UnicodeDecodeError:  # (an error message of SQLite's quoting bytes of the file that are not UTF-8)
            raise self.damaged(f"{what} (text that is not UTF-8)") from None
        except (MemoryError, RecursionError, OverflowError) as exc:
            raise self.damaged(f"{what} ({type(exc).__name__})") from None

    def _check_schema(self) -> None:
        """Refuse a store whose tables are not this version's tables: anything else named
        like them (a view, a virtual table) would run code of the file's choosing on read."""
        conn = self._conn
        assert conn is not None
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        with Store(":memory:") as ours:
            if version != ours.schema_version:
                raise self.damaged(f"schema version {version} where this codesearch reads {ours.schema_version}")
            expected = dict(ours.conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            ).fetchall())
        found: dict[str, tuple[str, str | None]] = {}
        for kind, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master"):
            if name in expected:
                found[name] = (kind, sql)
        for name in TABLES:
            kind, sql = found.get(name, (None, None))
            if kind is None:
                raise self.damaged(f"it has no table {name!r}")
            if kind != "table" or sql != expected[name]:
                raise self.damaged(f"{name!r} is a {kind} of another schema than codesearch makes")

    def _select(self, table: str, where: str = "", params: tuple = ()) -> sqlite3.Cursor:
        """Our columns of ``table``, read in its own order (NOT INDEXED: an index of the file
        is never trusted to list its rows)."""
        cols = ", ".join(TABLES[table])
        assert self._conn is not None
        return self._conn.execute(f"SELECT {cols} FROM main.{table} NOT INDEXED {where}", params)

    # -- rows ----------------------------------------------------------------------------

    def meta(self) -> dict[str, str]:
        """The meta entries an import takes (`ADOPTED_META`), each checked."""
        out: dict[str, str] = {}
        with self._reading("its meta table cannot be read"):
            for n, (key, value) in enumerate(self._select("meta")):
                if n > 10_000:
                    raise self.damaged("its meta table holds more than 10,000 rows")
                check = ADOPTED_META.get(key) if type(key) is str else None
                if check is None:
                    continue
                if type(value) is not str:
                    raise self.damaged(f"meta {key!r} is not text")
                try:
                    check(value)
                except (ValueError, TypeError, RecursionError) as exc:
                    raise self.damaged(f"meta {key!r} = {value[:60]!r} ({str(exc)[:80] or 'not readable'})") from None
                out[key] = value
        return out

    def models(self) -> dict[str, tuple[str, str, int]]:
        """Role -> (name, identity, dim), each checked."""
        out: dict[str, tuple[str, str, int]] = {}
        with self._reading("its models table cannot be read"):
            for n, (role, name, identity, dim) in enumerate(self._select("models")):
                if n >= len(ROLES) or role not in ROLES or role in out:
                    raise self.damaged(f"models row {n + 1} is not one model per role ({', '.join(ROLES)})")
                if not (_is_str(name, MAX_PATH) and _is_str(identity, 1024) and _is_int(dim, 1, MAX_DIM)):
                    raise self.damaged(f"models row {n + 1} ({role}) is not a name, identity and size")
                out[role] = (name, identity, dim)
        return out

    def files(self) -> list[_File]:
        """Every file row (the paths checked: relative, inside the repository)."""
        out: list[_File] = []
        with self._reading("its files table cannot be read"):
            for row in self._select("files"):
                fid, path, digest, _size, _mtime, language, _lines = row
                where = f"files row {len(out) + 1}"
                if len(out) >= MAX_FILES:
                    raise self.damaged(f"more than {MAX_FILES:,} files")
                rel = _safe_path(path)
                if rel is None:
                    raise self.damaged(f"{where} has the path {str(path)[:80]!r}, not a path inside a repository")
                if not _is_int(fid, 1) or type(digest) is not str or language not in LANGUAGES:
                    raise self.damaged(f"{where} ({rel!r}) is not an id, a hash and a language")
                out.append(_File(fid, rel, digest, language))
        if len({f.id for f in out}) != len(out) or len({f.path for f in out}) != len(out):
            raise self.damaged("its files table repeats an id or a path")
        return out

    def chunk_ids(self) -> dict[int, list[int]]:
        """File id -> its chunks' ids (every chunk, read without its text)."""
        out: dict[int, list[int]] = {}
        seen = 0
        with self._reading("its chunks table cannot be read"):
            assert self._conn is not None
            for cid, fid in self._conn.execute("SELECT id, file_id FROM main.chunks NOT INDEXED"):
                seen += 1
                if seen > MAX_CHUNKS:
                    raise self.damaged(f"more than {MAX_CHUNKS:,} chunks")
                if not (_is_int(cid, 1) and _is_int(fid, 1)):
                    raise self.damaged(f"chunks row {seen} has no id or file id")
                out.setdefault(fid, []).append(cid)
        return out

    def chunk_ranges(self, ids: list[int]) -> list[tuple]:
        """``(id, start_byte, end_byte, bytes of its text)`` of the chunks of ``ids``: what a
        chunk claims to hold, and its text's size, without its text."""
        rows: list[tuple] = []
        with self._reading("its chunks table cannot be read"):
            assert self._conn is not None
            for part in chunked(ids):
                rows += self._conn.execute(
                    "SELECT id, start_byte, end_byte, length(CAST(text AS BLOB)) FROM main.chunks NOT INDEXED"
                    f" WHERE id IN ({','.join('?' * len(part))})", tuple(part)).fetchall()
        return rows

    def chunks(self, ids: list[int]) -> list[tuple]:
        """The rows (`TABLES['chunks']`'s columns) of ``ids``, by id."""
        rows: list[tuple] = []
        with self._reading("its chunks table cannot be read"):
            for part in chunked(ids):
                rows += self._select("chunks", f"WHERE id IN ({','.join('?' * len(part))})", tuple(part)).fetchall()
        return sorted(rows, key=lambda r: r[0])

    def vectors(self) -> Iterator[tuple]:
        """Every vectors row (`TABLES['vectors']`'s columns), streamed."""
        with self._reading("its vectors table cannot be read"):
            cur = self._select("vectors")
            n = 0
            while rows := cur.fetchmany(256):
                n += len(rows)
                if n > MAX_VECTORS:
                    raise self.damaged(f"more than {MAX_VECTORS:,} vectors")
                yield from rows


# -- checking files and chunks against the working tree --------------------------------


class _Text:
    """One file of the working tree as the chunker saw it: its text, that text's UTF-8
    bytes, where each line starts, and its words."""

    def __init__(self, data: bytes) -> None:
        self.text = decode_source(data)
        self.data = self.text.encode("utf-8", "surrogatepass")
        lines = self.data.split(b"\n")
        # line i (0-based) spans bytes [starts[i], starts[i + 1] - 1), as `Doc.line_bytes`
        self.starts = [0, *accumulate(len(raw) + 1 for raw in lines)]
        self.n_lines = len(lines) - (1 if not lines[-1] else 0)
        self._said: dict[str, bool] = {}  # (the chunks of one definition share its scope)

    def says(self, label: str) -> bool:
        """Every word of ``label`` is in this file's text (a word cut short where a long
        signature was cut is a part of one)."""
        said = self._said.get(label)
        if said is None:
            said = self._said[label] = all(w in self.text for w in _WORD.findall(label))
        return said

    def holds(self, row: tuple, f: _File, header_path: str) -> bool:
        """Whether the chunk ``row`` is this file's text at its lines, and says so of itself."""
        _cid, _fid, start, end, start_byte, end_byte, language, symbol, kind, scope, header, text, text_hash = row
        if not (_is_int(start, 1) and _is_int(end, start, self.n_lines) and type(text) is str):
            return False
        if not (_is_int(start_byte) and _is_int(end_byte)):
            return False
        if start_byte != self.starts[start - 1] or end_byte != self.starts[end] - 1:
            return False
        if self.data[start_byte:end_byte] != text.encode("utf-8", "surrogatepass") or text_hash != hash_text(text):
            return False
        if language != f.language or type(kind) is not str or not _KIND.fullmatch(kind):
            return False
        labels = [x for x in (symbol, scope) if x is not None]
        if not all(_is_str(x, MAX_LABEL) for x in labels):
            return False
        if header != (header_path if scope is None else f"{header_path} > {scope}"):
            return False
        # The labels a hit shows (symbol, scope) are words of this file: no word of the
        # export's choosing is served as this file's.
        return all(self.says(x) for x in labels)


@dataclass
class Adoption:
    """What an import took from an export's store."""

    paths: list[str] = field(default_factory=list)  # every file path the export holds
    files: int = 0  # files taken as they were (checked against the working tree)
    left: int = 0  # files left to the index run (changed, or not what the export says)
    gone: int = 0  # files not in the working tree (or no regular file inside it)
    vectors: int = 0
    #: The export's id of each chunk taken -> its text hash (how the export's PLAID index
    #: knows the texts: `export_codes`).
    chunk_hashes: dict[int, str] = field(default_factory=dict)


def adopt_export(
    export: ExportStore, store: Store, root: Path, *, models: dict[str, tuple[str, str, int]],
    check_paths: Callable[[list[str]], None] | None = None, segments: Segments | None = None,
) -> Adoption:
    """Copy into the new, empty ``store`` what ``export`` holds that the checkout at ``root``
    confirms (see the module's notes), in one transaction.

    ``models``: the roles and models the export's manifest records (its store must record the
    same). ``check_paths(paths)`` runs on the export's file paths before any file is read
    (the repository check). ``segments``: the export's segment files.

    Raises
    ------
    ExportError
        A store that cannot be read, of another schema, or with a row that is not what its
        table holds.
    """
    recorded = export.models()
    if recorded != models:
        raise export.damaged("its models are not the ones its manifest names")
    meta = export.meta()
    files = export.files()
    adoption = Adoption(paths=[f.path for f in files])
    if check_paths is not None:
        check_paths(adoption.paths)
    chunk_ids = export.chunk_ids()
    with store.transaction():
        for role, (name, identity, dim) in models.items():
            store.set_model(role, name, identity, dim)
        for key, value in meta.items():
            store.set_meta(key, value)
        store.set_meta("root", str(root))
        for f in files:
            try:
                data, st = read_inside(root, f.path)
            except OSError:
                adoption.gone += 1  # gone, or no regular file inside the root: the run decides
                continue
            taken = _adopt_file(export, store, f, chunk_ids.get(f.id, []), data, st)
            if taken is None:
                adoption.left += 1
            else:
                adoption.files += 1
                adoption.chunk_hashes.update(taken)
        adoption.vectors = _adopt_vectors(export, store, models, segments)
    return adoption


def _adopt_file(export: ExportStore, store: Store, f: _File, ids: list[int], data: bytes,
                st: os.stat_result) -> dict[int, str] | None:
    """Copy the file ``f`` and its chunks ``ids`` when the working tree's ``data`` (read with
    the stat ``st``) confirms every one, and return the export's id -> text hash of each;
    None (nothing copied) when it does not."""
    if hash_bytes(data) != f.hash:
        return None  # changed since the export: the run chunks it
    text = _Text(data)
    if not _fits(export.chunk_ranges(ids), len(ids), text):
        return None
    rows = export.chunks(ids)  # (each text of its range's size, together at most the file's)
    header_path = text_name(f.path)
    if len(rows) != len(ids) or not all(text.holds(row, f, header_path) for row in rows):
        log.info("%s: its chunks are not the file's text; chunking it from the working tree", f.path)
        return None
    # The stat of the bytes just checked: the run finds the file unchanged, and reads it no more.
    fid = store.upsert_file(f.path, hash=f.hash, size=st.st_size, mtime_ns=st.st_mtime_ns, language=f.language,
                            n_lines=text.n_lines)
    for _, _, start, end, start_byte, end_byte, language, symbol, kind, scope, header, body, text_hash in rows:
        chunk = Chunk(f.path, start, end, start_byte, end_byte, language, symbol, kind, scope, body, header)
        store.insert_chunk(fid, chunk, text_hash)
    return {row[0]: row[-1] for row in rows}


def _fits(ranges: list[tuple], expected: int, text: _Text) -> bool:
    """Whether chunks of these ``(id, start_byte, end_byte, text bytes)`` can be pieces of
    ``text``: one per id, at most one a line, in its bounds, apart, each text of its range's
    size. Checked before any text is read: a chunk's text is read only if it can match."""
    if len(ranges) != expected or expected > text.n_lines:
        return False
    if not all(_is_int(start) and _is_int(end) and _is_int(size) for _, start, end, size in ranges):
        return False
    after = 0  # where the chunks so far end
    for start, end, size in sorted(r[1:] for r in ranges):
        if start < after or end > len(text.data) or size != end - start:
            return False
        after = end
    return True


def _adopt_vectors(export: ExportStore, store: Store, models: dict[str, tuple[str, str, int]],
                   segments: Segments | None) -> int:
    """Take every vector of a model ``models`` names whose array is of that model's size and
    finite; returns how many. An array in the row is copied; one in a segment (``segments``:
    the export's, now the new store's own) is recorded where it lies, once read there and
    checked. (The run's prune drops those of texts the index does not hold.)"""
    dims = {identity: (role, dim) for role, (_, identity, dim) in models.items()}
    batch: dict[tuple[str, str], list[tuple[str, int, int, bytes]]] = {}
    placed: dict[tuple[str, str], list[tuple[str, int, int, int, int, int]]] = {}
    taken = 0
    for n, (_vid, model, kind, text_hash, dim, rows, data, seg, off, crc) in enumerate(export.vectors(), 1):
        where = f"vectors row {n}"
        if kind not in VECTOR_KINDS or model not in dims or dims[model] != (KIND_ROLE[kind], dim):
            raise export.damaged(f"{where} is not a vector of a model the export records")
        if type(text_hash) is not str or not _HEX32.fullmatch(text_hash):
            raise export.damaged(f"{where} has no text hash")
        most = MAX_TOKENS if VECTOR_KINDS[kind].multi else 1
        if not _is_int(rows, 1, most):
            raise export.damaged(f"{where} holds {rows!r} rows (a {kind} vector has 1 to {most})")
        size = rows * dim * 2
        blob = _array_bytes(export, where, size, data, seg, off, crc, segments)
        values = np.frombuffer(blob, dtype=np.float16)
        if not bool(np.isfinite(values).all()):
            raise export.damaged(f"{where} holds values that are not finite numbers")
        if seg is None:  # (copied, in batches: the arrays are in memory meanwhile)
            pending = batch.setdefault((model, kind), [])
            pending.append((text_hash, rows, dim, blob))
            if len(pending) >= 256:
                taken += store.put_encoded(model, kind, batch.pop((model, kind)))
        else:
            pending = placed.setdefault((model, kind), [])
            pending.append((text_hash, rows, dim, seg, off, crc))
            if len(pending) >= 4096:
                taken += store.put_placed(model, kind, placed.pop((model, kind)))
    taken += sum(store.put_encoded(m, k, items) for (m, k), items in batch.items())
    taken += sum(store.put_placed(m, k, items) for (m, k), items in placed.items())
    return taken


def _array_bytes(export: ExportStore, where: str, size: int, data: object, seg: object, off: object, crc: object,
                 segments: Segments | None) -> bytes:
    """The float16 bytes of one vectors row: in the row, or at its place in a segment."""
    if seg is None:
        if type(data) is not bytes or len(data) != size:
            raise export.damaged(f"{where} holds {len(data) if isinstance(data, bytes) else 'no'} bytes, "
                                 f"its shape says {size}")
        return data
    if segments is None or not (_is_int(seg, 0, 999_999) and _is_int(off) and _is_int(crc, 0, 0xFFFFFFFF)):
        raise export.damaged(f"{where} points at no segment")
    try:
        return segments.read(seg, off, size, crc)
    except SegmentError as exc:
        raise export.damaged(f"{where}: {exc}") from None


def adopt_into(unpacked: Path, index_dir: Path, root: Path, manifest: Manifest, file: Path) -> Adoption:
    """The import of the export ``file`` whose members are unpacked in ``unpacked``: a new
    store at ``index_dir`` holding what the checkout at ``root`` confirms (`adopt_export`),
    after the repository check, and every derived index built from it (the multi-vector one
    with the export's codes, when they check: `export_codes`)."""
    models = {role: (m.get("name"), m.get("identity"), m.get("dim")) for role, m in manifest.models.items()}
    vectors = STORE_FILE + ".vectors"
    if (unpacked / vectors).is_dir():
        # The export's segment files become the new store's: an array is recorded where it
        # lies once checked there (what no row records is dead space, reclaimed by the run's
        # prune), not copied (240 MB of ColBERT vectors written and synced again).
        os.replace(unpacked / vectors, index_dir / vectors)
    with ExportStore(unpacked / STORE_FILE, file) as export, Store(index_dir / STORE_FILE) as store:
        segments = Segments(index_dir / vectors, readonly=True)
        try:
            adoption = adopt_export(export, store, root, models=models, segments=segments,
                                    check_paths=lambda paths: check_repository(manifest, paths, root, file))
        finally:
            segments.close()
        codes = export_codes(unpacked, store, adoption.chunk_hashes)
        sync_derived(index_dir, store, store.generation, Delta([], [], [], [], {}), lambda *_a, **_k: None,
                     codes=codes)
    return adoption


# -- the codes of the export's PLAID index ---------------------------------------------


def export_codes(folder: Path, store: Store, chunk_hashes: dict[int, str]):  # -> CodeBook | None
    """The codec and codes of the export's PLAID index in the export's index ``folder`` (the
    registry's layout), by text hash, for the texts of ``chunk_hashes`` (the export's chunk
    id -> text hash of each chunk taken) whose vector ``store`` holds; None when it has no
    codec that checks in full (a build then trains its own).

    The index is read by its own loader (which checks its files), then the codec checked as
    an import needs it: its size is the model's, its values finite, its buckets ordered, its
    build error a distance between unit vectors; each text's codes index its centroids, and
    are as many as its vector has tokens.
    """
    from codesearch.indexes.plaid.codec import DocCodes
    from codesearch.indexes.plaid.coded import CodeBook

    spec = DERIVED["plaid"]
    model = store.models().get(spec.role() or "")
    path = folder / spec.filename
    if model is None or not path.exists() or not chunk_hashes:
        return None
    try:
        index = spec.cls().load(path)
    except (CodeSearchError, ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError,
            RecursionError) as exc:
        log.info("the export's multi-vector index is not read (%s); its codes are made again", exc)
        return None
    codec = getattr(index, "codec", None)
    if codec is None or not _codec_ok(codec, model.dim) or not 0.0 <= float(index.build_error) <= 2.0:
        return None
    tokens = store.chunk_token_counts(model.identity, spec.kind)
    k = len(codec.centroids)
    docs: dict[str, DocCodes] = {}
    for doc_id, (codes, packed) in index.doc_codes(list(chunk_hashes)).items():
        text_hash = chunk_hashes[doc_id]
        n = tokens.get(text_hash)
        codes, packed = np.asarray(codes), np.asarray(packed)
        if n is None or len(codes) != n or packed.shape != (n, codec.packed_dim) or packed.dtype != np.uint8:
            continue
        if not np.issubdtype(codes.dtype, np.integer) or (n and (int(codes.min()) < 0 or int(codes.max()) >= k)):
            # No codec makes a code past its centroids: the index was damaged or crafted, and
            # none of its codes is taken (a build trains its own codec).
            log.info("the export's multi-vector index holds a code past its centroids; its codes are made again")
            return None
        # (A build takes the codec's held-out error, never the documents' own: 0 here.)
        docs[text_hash] = DocCodes(codes.astype(codec.code_dtype), packed, 0.0)
    if not docs:
        return None
    book = CodeBook(codec, float(index.build_error))
    book.put(codec.fingerprint, docs.items())
    return book


def _codec_ok(codec, dim: int) -> bool:
    """A codec an index can use for vectors of ``dim`` values."""
    buckets = 1 << codec.nbits if codec.nbits in (2, 4) else 0
    c, cut, w = (np.asarray(a) for a in (codec.centroids, codec.cutoffs, codec.weights))
    return bool(
        buckets and c.ndim == 2 and c.shape[1] == dim and 1 <= len(c) <= 1 << 20
        and cut.shape == (buckets - 1,) and w.shape == (buckets,)
        and all(np.issubdtype(a.dtype, np.floating) and np.isfinite(a).all() for a in (c, cut, w))
        and (np.diff(cut) >= 0).all()
    )
