"""The incremental index build: walk -> chunk -> encode what is missing -> store -> sync.

The store (``store.sqlite``) is the truth; lexical, dense and PLAID indexes are derived
from it. A run does its work in an order that survives a crash or Ctrl-C at any moment:

1. walk the files; a file whose size and mtime_ns match the store costs one ``stat``;
   a file whose stat changed is read and hashed (xxh3_128); same hash -> only its stat is
   recorded, no re-chunk; a new hash -> re-chunked;
2. encode the texts that have no vector in the cache yet (keyed by model identity, kind
   and text hash), committing each batch: a killed run leaves those vectors behind and
   the next run skips them;
3. ONE transaction writes files, chunks, models and meta (``generation + 1``);
4. every derived index is brought to the new generation - incrementally when its saved
   generation is the previous one, else rebuilt from the store's vectors (no encoding) -
   written atomically, and its generation recorded in meta. A crash between 3 and 4 shows
   up as a generation mismatch, which :func:`load_derived` and the next run heal.

Example
-------
>>> from codesearch.indexing.pipeline import build_index, resolve_encoders
>>> encoders, notices = resolve_encoders()                       # doctest: +SKIP
>>> summary = build_index("path/to/repo", encoders=encoders)     # doctest: +SKIP
>>> summary.files_indexed, summary.chunks_encoded                # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from codesearch.encoder.base import Encoder, Encoders, encode_stream
from codesearch.errors import (
    IndexCorruptError,
    IndexWriteError,
    NothingToIndexError,
    PathError,
)
from codesearch.indexes.registry import DERIVED, Delta, record_generation, sync_derived
from codesearch.indexing.chunking import CHUNKER_VERSION
from codesearch.indexing.encoders import (
    DISABLED_KEY,
    EMBEDDED_KEY,
    VECTORS_PENDING_KEY,
    check_models,
    chunk_budget,
)
from codesearch.pathnames import text_name
from codesearch.store import IndexLock, Store
from codesearch.store.files import decode_source, read_inside
from codesearch.types import (
    CENTRALITY_FILE,
    LOCK_FILE,
    STORE_FILE,
    IndexSummary,
    ProgressEvent,
    default_index_dir,
    path_kind,
)

#: Meta keys: the walk options of the last run (JSON lists), which a refresh reuses.
WALK_INCLUDE_KEY, WALK_EXCLUDE_KEY = "walk.include", "walk.exclude"
#: Texts per encode call (and per committed batch of cached vectors).
ENCODE_BATCH = 64


ENCODE_BATCH_CHARS = 64_000


def hash_bytes(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def _hash_text(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


def _n_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def check_root(root: str | os.PathLike[str]) -> Path:
    path = Path(root).expanduser()
    if not path.exists():
        raise PathError(f"path {str(root)!r} does not exist (pass the folder of a repository)")
    if not path.is_dir():
        raise PathError(f"path {str(root)!r} is not a folder (pass the folder of a repository)")
    return path.resolve()


def _prepare_index_dir(index_dir: Path) -> None:
    index_dir.mkdir(parents=True, exist_ok=True)
    gitignore = index_dir / ".gitignore"
    if not gitignore.exists():
        # The folder ignores itself, so an index inside a repo never shows up in git status.
        gitignore.write_text("*\n")


def _file_text_for_encoder(path: str, text: str, max_length: int) -> str:
    # The encoder truncates at its max length anyway; cutting the string first keeps a
    # 1 MB file from being tokenized whole (code runs well under 16 chars per token).
    return f"{text_name(path)}\n{text[: max(1, max_length) * 16]}"


def _remove_index_files(index_dir: Path) -> None:
    for name in (STORE_FILE, STORE_FILE + "-wal", STORE_FILE + "-shm", CENTRALITY_FILE):
        (index_dir / name).unlink(missing_ok=True)
    shutil.rmtree(index_dir / (STORE_FILE + ".vectors"), ignore_errors=True)  # its segments
    for spec in DERIVED.values():
        p = index_dir / spec.filename
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


@dataclass
class _Work:
    """A file that is (re-)chunked this run."""

    path: str
    language: str
    size: int
    mtime_ns: int
    hash: str
    text: str
    chunks: list[Any] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    old_id: int | None = None


class _Progress:
    def __init__(self, callback: Callable[[ProgressEvent], None] | None):
        self.callback = callback

    def __call__(self, stage: str, done: int, total: int, **kw: Any) -> None:
        if self.callback is not None:
            self.callback(ProgressEvent(stage, done, total, **kw))


def build_index(
    root: str | os.PathLike[str],
    *,
    index_dir: str | os.PathLike[str] | None = None,
    encoders: Encoders | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    max_file_bytes: int = 1_000_000,
    rebuild: bool = False,
    chunk_tokens: int | None = None,
    progress: Callable[[ProgressEvent], None] | None = None,
    defer_vectors: bool = False,
    load_encoders: Callable[[], Encoders] | None = None,
) -> IndexSummary:
    """Bring the index of ``root`` up to date with its files, encoding only what changed.

    The run is searchable early: files, chunks and the lexical index are committed first
    (a ``searchable`` progress event says so), then the vectors are encoded, most useful
    files first, and published to the vector indexes as they come.

    Parameters
    ----------
    root
        The repository folder.
    index_dir
        Where the index lives; default ``<root>/.codesearch``.
    encoders
        From :func:`resolve_encoders`; None (or both fields None) builds a lexical-only
        index. Chunks that lack vectors of a model the index records get them on the next
        run that has the model.
    include, exclude, max_file_bytes
        Passed to :func:`codesearch.indexing.walk.walk`.
    rebuild
        Build the index anew: every file re-read and re-chunked, new chunk ids, models
        recorded from ``encoders`` (another model than before is allowed), every derived
        index rebuilt. It happens inside the existing store, so a killed rebuild leaves the
        old index or a resumable new one; vectors of the same model and text still come from the cache. An
        unreadable store is deleted first. Like any run, it commits files and chunks before
        their vectors: readers see the new lexical index first.
    chunk_tokens
        Chunk budget; default 512 tokens, or less when a multi-vector model's window is
        shorter (a single-vector model with a shorter window reads each chunk's start). A different
        budget than the last run re-chunks every file (vectors still come from the cache
        when chunk texts match).
    progress
        Called with :class:`ProgressEvent` s.
    defer_vectors
        With no encoders given, say that the recorded models' vectors of changed code come
        with the next run that has them (a lexical search's refresh), not that they are
        unavailable.
    load_encoders
        Instead of ``encoders``: called for them once the repository is searchable. The run
        first indexes it with no model, then loads the models (importing torch and reading
        weights takes seconds on a CPU) and encodes, under the same lock: a first index
        with a model is searchable as soon as a lexical-only one.

    Raises
    ------
    PathError
        ``root`` does not exist or is not a folder.
    NothingToIndexError
        No indexable file (the message says what was skipped).
    ModelMismatchError
        The index records another model than ``encoders`` hold (use ``rebuild``).
    IndexLockedError
        Another indexer is writing this index.
    IndexCorruptError
        The store cannot be read (use ``rebuild``).
    IndexWriteError, OSError
        The index folder cannot be written (a full disk): the last complete index is kept,
        and a first run leaves nothing behind.
    """
    t0 = time.perf_counter()
    root_path = check_root(root)
    idir = Path(index_dir).expanduser().resolve() if index_dir is not None else default_index_dir(root_path)
    encoders = encoders or Encoders()
    report = _Progress(progress)
    dir_existed = idir.is_dir()
    gitignore_existed = (idir / ".gitignore").exists()
    lock_existed = (idir / LOCK_FILE).exists()
    try:
        _prepare_index_dir(idir)
    except OSError:
        with contextlib.suppress(OSError):  # (a full disk: the .gitignore may be half written)
            if not gitignore_existed:
                (idir / ".gitignore").unlink(missing_ok=True)
            if not dir_existed:
                idir.rmdir()
        raise
    # A searcher may hold the lock for a moment to save an index it rebuilt; wait for that,
    # never for another writer.
    lock = IndexLock(idir).acquire(wait_for_readers=30.0)
    store_existed = (idir / STORE_FILE).is_file()  # under the lock: no writer is between

    def forget_this_run() -> None:
        # A first run that committed nothing: leaving its empty store would make a query
        # answer "no results" instead of "not indexed yet". Only what this run wrote goes
        # (nothing else is written before the first commit).
        for name in (STORE_FILE, STORE_FILE + "-wal", STORE_FILE + "-shm"):
            (idir / name).unlink(missing_ok=True)
        shutil.rmtree(idir / (STORE_FILE + ".vectors"), ignore_errors=True)
        if not gitignore_existed:
            (idir / ".gitignore").unlink(missing_ok=True)
        # Still under the lock: the lock file goes (an unlinked file stays lockable
        # through our descriptor), then the folder if this run made it.
        with contextlib.suppress(OSError):
            if not lock_existed:
                lock.path.unlink()
            if not dir_existed:
                idir.rmdir()

    try:
        try:
            store = Store(idir / STORE_FILE)
        except IndexCorruptError:
            if not rebuild:
                raise
            # Unreadable: nothing to keep. (A readable store is rebuilt in place instead, so
            # readers see the old index until the new one commits.)
            _remove_index_files(idir)
            store = Store(idir / STORE_FILE)
        except (IndexWriteError, OSError):
            if not store_existed:
                forget_this_run()
            raise
        try:
            walk = (include, exclude, max_file_bytes, chunk_tokens)
            if load_encoders is None:
                return _build(_Run(store, root_path, idir, encoders, *walk, rebuild, defer_vectors, report, t0))
            # Lexical first: a run with no model (its vectors, and the models switched off,
            # are the next run's to say), then the models, then a run that finds every file
            # as the first one left it and encodes.
            lexical = _build(_Run(store, root_path, idir, Encoders(), *walk, rebuild, True, report, t0))
            loaded = load_encoders()
            quiet = _Progress(_after_searchable(progress))
            return _then(lexical, _build(_Run(store, root_path, idir, loaded, *walk, False, defer_vectors, quiet, t0)))
        except (NothingToIndexError, IndexWriteError, OSError) as exc:
            committed = True
            if not store_existed and not isinstance(exc, NothingToIndexError):
                try:
                    committed = store.generation > 0
                except Exception:  # noqa: BLE001 (a store that cannot say held no commit of ours)
                    committed = False
            store.close()
            if not store_existed and (isinstance(exc, NothingToIndexError) or not committed):
                forget_this_run()
            raise
        finally:
            store.close()
    finally:
        lock.release()


def _after_searchable(progress: Callable[[ProgressEvent], None] | None) -> Callable[[ProgressEvent], None] | None:
    """The second run of a lazy load: its walk, chunk, write and sync repeat what the user
    has just seen (nothing changed in between), so only its encoding is reported."""
    if progress is None:
        return None
    quiet = {"walk", "chunk", "write", "sync", "searchable"}
    return lambda event: None if event.stage in quiet else progress(event)


def _then(lexical: IndexSummary, encoded: IndexSummary) -> IndexSummary:
    """One summary for a lexical run and the run with models that followed it."""
    stages = dict(lexical.stage_seconds)
    for stage, sec in encoded.stage_seconds.items():
        stages[stage] = round(stages.get(stage, 0.0) + sec, 3)
    return dataclasses.replace(
        encoded,
        # the second run re-chunks only for a short-window model (every file) or a race
        files_indexed=max(lexical.files_indexed, encoded.files_indexed),
        files_unchanged=lexical.files_unchanged,
        files_removed=lexical.files_removed + encoded.files_removed,
        files_renamed=lexical.files_renamed + encoded.files_renamed,
        # the lexical run's notices are about vectors, which the second run encodes
        files_read=lexical.files_read + encoded.files_read,
        stage_seconds=stages,
    )


@dataclass
class _Run:
    """One index run: its inputs, and what its stages found (filled in stage order)."""

    store: Store
    root: Path
    idir: Path
    encoders: Encoders
    include: Sequence[str]
    exclude: Sequence[str]
    max_file_bytes: int
    chunk_tokens: int | None
    rebuild: bool
    defer_vectors: bool
    report: _Progress
    t0: float
    notices: list[str] = field(default_factory=list)
    prev_gen: int = 0
    recorded: dict[str, Any] = field(default_factory=dict)
    # walk + read
    skipped: dict[str, int] = field(default_factory=dict)
    all_old: dict[str, Any] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    work: list[_Work] = field(default_factory=list)
    touched: list[tuple[int, int, int]] = field(default_factory=list)  # (file id, size, mtime_ns)
    removed: list[Any] = field(default_factory=list)
    unchanged: int = 0
    files_read: int = 0
    # chunking
    budget: int = 0
    counter: Callable[[str], int] | None = None
    counter_id: str = "approx"
    rechunk_all: bool = False
    chunks_made: int = 0
    # encoding
    texts_encoded: int = 0
    tokens_encoded: int = 0


def _build(run: _Run) -> IndexSummary:
    """The stages, in the order that keeps every moment of a run searchable or resumable."""
    # A rebuild starts from nothing - no recorded models, no files - but inside the same
    # store: the old index stays readable until the commit replaces it, and vectors of the
    # same model and text still come from the cache.
    if not run.rebuild:
        check_models(run.store, run.encoders, run.idir)
    else:
        # The way out of a damaged vectors segment (its reads ask for --rebuild): the arrays
        # whose bytes fail their check go, and this run encodes those texts again.
        run.store.drop_damaged_vectors()
    run.prev_gen = run.store.generation
    run.recorded = {} if run.rebuild else run.store.models()
    stages: dict[str, float] = {}
    mark = time.perf_counter()

    def timed(stage: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        stages[stage] = round(stages.get(stage, 0.0) + now - mark, 3)
        mark = now

    _walk_and_read(run)
    timed("walk")
    _chunk(run)
    timed("chunk")
    delta = _commit(run)
    timed("write")
    # Searchable now: lexical (and any vector index whose vectors were all cached).
    sync_derived(run.idir, run.store, run.prev_gen, delta, run.report)
    timed("sync")
    run.report(
        "searchable", 1, 1, files=len(run.work), chunks=run.chunks_made,
        message=f"searchable: {run.store.count('chunks'):,} chunks in the lexical index",
    )
    _encode(run)
    timed("encode")  # with the vector indexes' syncs while it ran
    # Old versions of edited code stay cached (cheap branch switches) up to about the size
    # of the live index; past that they go.
    run.store.prune_vectors(keep_unreferenced=max(10_000, run.store.count("chunks")))
    models = {role: rec.name for role, rec in run.store.models().items()}
    return IndexSummary(
        root=str(run.root),
        index_dir=str(run.idir),
        files_indexed=len(run.work),
        files_unchanged=run.unchanged,
        files_removed=len(run.removed) if not run.rebuild else sum(1 for p in run.all_old if p not in run.seen),
        files_renamed=_renamed(run),
        skipped=run.skipped,
        chunks_total=run.store.count("chunks"),
        chunks_encoded=run.texts_encoded,
        tokens_encoded=run.tokens_encoded,
        seconds=time.perf_counter() - run.t0,
        models=models,
        notices=run.notices,
        files_read=run.files_read,
        stage_seconds=stages,
    )


# -- 1. walk and read what changed ---------------------------------------------------------------


def _walk_and_read(run: _Run) -> None:
    """Walk the files; read and hash only those whose stat changed; decide the chunk budget."""
    from codesearch.indexing.walk import walk

    store = run.store
    run.report("walk", 0, 0, message="walking files")
    result = walk(
        run.root, include=run.include, exclude=run.exclude, max_file_bytes=run.max_file_bytes, index_dir=run.idir
    )
    run.skipped = {reason: len(paths) for reason, paths in result.skipped.items() if paths}
    run.all_old = store.files()
    old_files = {} if run.rebuild else run.all_old
    if not result.files and not old_files:
        what = ", ".join(f"{n} {reason}" for reason, n in sorted(run.skipped.items())) or "no files at all"
        raise NothingToIndexError(
            f"nothing to index under {run.root} (skipped: {what}); check the path and --include/--exclude"
        )
    run.report("walk", len(result.files), len(result.files), files=len(result.files))

    budget, counter, counter_id = chunk_budget(run.encoders, run.chunk_tokens)
    old_budget, old_counter = (
        (None, None) if run.rebuild else (store.get_meta("chunk_tokens"), store.get_meta("chunk_counter"))
    )
    present = {e.identity for e in run.encoders.by_role().values()}
    degraded = counter_id == "approx" and old_counter not in (None, "approx") and old_counter not in present
    if degraded:
        # A run without the recorded model (offline) keeps the old chunks and budget, and
        # chunks changed files with the approximate count; the record stays the model's.
        counter_id = old_counter
        if run.chunk_tokens is None and old_budget:
            budget = int(old_budget)
    # Re-chunk everything when the budget changes, or when a real tokenizer replaces the
    # approximate count (a short-window ColBERT model added to a lexical-only index). Chunks
    # counted exactly stay when a run estimates with the same model (the estimate never
    # makes a chunk too long for a window that does not need exact counts).
    run.rechunk_all = bool(old_files) and (
        old_budget != str(budget) or (not degraded and counter_id != "approx" and old_counter != counter_id)
        # chunks from another release's chunker (kept ids and vectors where the text is the same)
        or (not degraded and store.get_meta("chunker_version") != str(CHUNKER_VERSION))
    )
    run.budget, run.counter, run.counter_id = budget, counter, counter_id

    for sf in result.files:
        run.seen.add(sf.path)
        old = old_files.get(sf.path)
        if old is not None and not run.rechunk_all and old.size == sf.size and old.mtime_ns == sf.mtime_ns:
            run.unchanged += 1
            continue
        try:
            # Inside the root and a regular file, as the walk found it: a file swapped since
            # (for a symlink out of the repository, a FIFO) is not read.
            data, st = read_inside(run.root, sf.path)
        except OSError:
            run.skipped["unreadable"] = run.skipped.get("unreadable", 0) + 1
            run.seen.discard(sf.path)  # a file that vanished mid-run leaves the index
            continue
        run.files_read += 1
        digest = hash_bytes(data)
        if old is not None and old.hash == digest and not run.rechunk_all:
            run.touched.append((old.id, st.st_size, st.st_mtime_ns))
            run.unchanged += 1
            continue
        text = decode_source(data)
        run.work.append(
            _Work(sf.path, sf.language, st.st_size, st.st_mtime_ns, digest, text,
                  old_id=old.id if old else None)
        )
    run.removed = [f for p, f in old_files.items() if p not in run.seen]


def _renamed(run: _Run) -> int:
    removed_hashes = {f.hash for f in run.removed}
    return sum(1 for w in run.work if w.old_id is None and w.hash in removed_hashes)


# -- 2. chunk ------------------------------------------------------------------------------------


def _chunk(run: _Run) -> None:
    """Chunk the new and changed files (per file, sharing nothing: a process pool for many)."""
    from codesearch.indexing.chunking import chunk_many

    n = len(run.work)
    # A name that is not UTF-8 goes into each chunk's header (text the store and the
    # encoder take) as valid Unicode; the file row keeps the name itself.
    pieces = chunk_many(((text_name(w.path), w.text, w.language) for w in run.work), max_tokens=run.budget,
                        count_tokens=run.counter)
    for i, (w, chunks) in enumerate(zip(run.work, pieces)):
        w.chunks = list(chunks)
        w.hashes = [_hash_text(c.text) for c in w.chunks]
        run.chunks_made += len(w.chunks)
        if (i + 1) % 50 == 0:
            run.report("chunk", i + 1, n, files=i + 1, chunks=run.chunks_made)
    run.report("chunk", n, n, files=n, chunks=run.chunks_made)


# -- 3. one transaction: files, chunks, models, meta -----------------------------------------------


def _commit(run: _Run) -> Delta:
    """Write what the files now are, in ONE transaction (``generation + 1``); no vectors yet."""
    store, roles = run.store, run.encoders.by_role()
    run.report("write", 0, 1, files=len(run.work), chunks=run.chunks_made)
    removed_chunks: list[tuple[int, str]] = []  # (chunk id, text hash) leaving the index
    added_chunks: list[int] = []
    changed_files: list[int] = []  # files whose content (hence file vector) changed
    models_changed = any(role not in run.recorded for role in roles)
    changed = bool(run.work or run.removed or models_changed or run.rechunk_all)
    new_gen = run.prev_gen + 1 if changed else run.prev_gen
    with store.transaction():
        if run.rebuild:
            embedded = store.get_meta(EMBEDDED_KEY)
            store.clear()  # files, chunks, models, meta (and so every derived generation)
            if embedded:  # how the cached vectors were made still holds
                store.set_meta(EMBEDDED_KEY, embedded)
        for fid, size, mtime_ns in run.touched:
            store.touch_file(fid, size=size, mtime_ns=mtime_ns)
        for f in run.removed:
            removed_chunks += [(r.id, r.text_hash) for r in store.file_chunks(f.id)]
        store.delete_files([f.id for f in run.removed])
        for w in run.work:
            fid = store.upsert_file(
                w.path, hash=w.hash, size=w.size, mtime_ns=w.mtime_ns, language=w.language,
                n_lines=_n_lines(w.text),
            )
            changed_files.append(fid)
            # Keep the id of a chunk whose header and text are unchanged (it only moved):
            # every derived index holds exactly the same thing for it.
            pool: dict[tuple[str, str], list[int]] = defaultdict(list)
            old_hash: dict[int, str] = {}
            if w.old_id is not None:
                for r in store.file_chunks(fid):
                    pool[(r.chunk.header, r.text_hash)].append(r.id)
                    old_hash[r.id] = r.text_hash
            for c, h in zip(w.chunks, w.hashes):
                ids = pool.get((c.header, h))
                if ids:
                    store.update_chunk_position(ids.pop(0), c)
                else:
                    added_chunks.append(store.insert_chunk(fid, c, h))
            gone = [cid for ids in pool.values() for cid in ids]
            store.delete_chunks(gone)
            removed_chunks += [(cid, old_hash[cid]) for cid in gone]
        for role, enc in roles.items():
            if role not in run.recorded:
                store.set_model(role, enc.name, enc.identity, int(enc.dim))
        if not run.defer_vectors:  # a run that skipped the models says nothing about them
            store.set_meta(DISABLED_KEY, json.dumps(sorted(run.encoders.disabled)))
        store.set_meta("root", str(run.root))
        store.set_meta("chunk_tokens", run.budget)
        store.set_meta("chunk_counter", run.counter_id)
        if run.rechunk_all or not (run.all_old and not run.rebuild):  # every chunk now comes from this chunker
            store.set_meta("chunker_version", CHUNKER_VERSION)
        store.set_meta("max_file_bytes", run.max_file_bytes)
        # The walk options, so a later staleness check compares with the index as built.
        store.set_meta(WALK_INCLUDE_KEY, json.dumps(list(run.include)))
        store.set_meta(WALK_EXCLUDE_KEY, json.dumps(list(run.exclude)))
        store.set_meta("generation", new_gen)
    run.report("write", 1, 1, files=len(run.work), chunks=run.chunks_made)
    return Delta(
        removed_chunks=removed_chunks,
        added_chunks=added_chunks,
        removed_files=[f.id for f in run.removed],
        changed_files=changed_files,
        newly_encoded={},
    )


# -- 4. vectors: every chunk and file that lacks one, most useful first ------------------------------

#: Batches written within this many seconds of the one before share a commit, and a group
#: takes batches for at most this long: SQLite's WAL rewrites every index page a commit
#: touches (64 KiB pages, keys in random order), so at a GPU cluster's rates one commit per 64
#: vectors cuts what the writer takes in by ~3x (BENCHMARKS.md). A batch that took longer
#: (a CPU run of a real model) commits alone, at once.
COMMIT_GROUP_S = 1.0


class _Commits:
    """The vector writer's transactions: each batch whole or not at all (a savepoint), and
    batches that come in quick succession grouped into one commit.

    A group takes batches for at most :data:`COMMIT_GROUP_S` and commits when the next batch
    is written, when :meth:`commit_if_older` finds it that old (a cluster's encoder calls it
    while it waits), before a publication, at the end of a model's stream, or when the run
    fails. So a killed run loses the batch in flight and at most one group: the batches of
    about :data:`COMMIT_GROUP_S` of encoding. A batch written :data:`COMMIT_GROUP_S` or more
    after the one before commits alone, at once, as every batch did before grouping.
    ``on_commit`` runs after each commit (progress counts committed texts).
    """

    def __init__(self, store: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self.group: Any = None  # the open transaction, when batches wait in one
        self.opened = 0.0
        self.last: float | None = None  # when the previous batch was written
        self.on_commit: Callable[[], None] = lambda: None

    @contextlib.contextmanager
    def batch(self):
        now = self.clock()
        quick = self.last is not None and now - self.last < COMMIT_GROUP_S
        if self.group is None:
            self.group = self.store.transaction()
            self.group.__enter__()
            self.opened = now
        with self.store.transaction():  # a savepoint: a batch that fails leaves nothing
            yield
        self.last = self.clock()
        if not quick or self.last - self.opened >= COMMIT_GROUP_S:
            self.commit()

    def commit_if_older(self) -> None:
        """Commit the open group once it is :data:`COMMIT_GROUP_S` old."""
        if self.group is not None and self.clock() - self.opened >= COMMIT_GROUP_S:
            self.commit()

    def commit(self, *, report: bool = True) -> None:
        """Commit the open group (if any); run it before anything else writes."""
        if self.group is not None:
            group, self.group = self.group, None
            group.__exit__(None, None, None)
            if report:
                self.on_commit()


#: A run publishes the vectors encoded so far (a new generation, vector indexes synced) at
#: most this often, and never more often than 3x the last publication's own cost, so a
#: query during a long first index sees the vectors grow at a bounded price.
PUBLISH_EVERY_S = 20.0


def _encodes_elsewhere(enc: Encoder) -> bool:
    """Whether ``enc`` computes off this process's CPU (a pool of workers, a GPU): then a
    publication runs beside its batches, not between them."""
    return enc.offloaded


class _Publisher:
    """The publications of a run's vectors: each makes the vector indexes' files from the
    committed vectors, then commits the new generation with them (`sync_derived` with
    ``gen``, then `record_generation`), so a search never finds the store ahead of its
    index files.

    For an encoder that computes elsewhere (:func:`_encodes_elsewhere`) a publication runs
    in a thread that reads a snapshot of the store through a read-only connection of its
    own, while the writer goes on taking batches: on a large first index the PLAID build
    takes minutes, and the workers would wait that long. The writer alone writes the store:
    it records a finished publication when it next looks (:meth:`poll`), and tells the
    publication's progress events then, on its own thread.
    """

    def __init__(self, run: _Run, commits: _Commits, *, background: bool) -> None:
        self.run, self.commits, self.background = run, commits, background
        self.pending: dict[str, set[str]] = defaultdict(set)  # encoded, not yet in the indexes
        self.last, self.cost = time.monotonic(), 0.0  # when the last one ended, what it took
        self._thread: threading.Thread | None = None
        self._done: tuple[int, list[str], dict[str, set[str]], float, list, BaseException | None] | None = None

    def add(self, kind: str, hashes: Iterable[str]) -> None:
        self.pending[kind].update(hashes)

    def due(self) -> bool:
        return (self._thread is None and bool(self.pending)
                and time.monotonic() - self.last >= max(PUBLISH_EVERY_S, 3 * self.cost))

    def start(self, *, background: bool | None = None) -> None:
        """Publish what is pending: what is published is committed first."""
        self.commits.commit()
        encoded, self.pending = dict(self.pending), defaultdict(set)
        prev, started = self.run.store.generation, time.monotonic()
        delta = Delta([], [], [], [], encoded)
        if not (self.background if background is None else background):
            names = sync_derived(self.run.idir, self.run.store, prev, delta, self.run.report, gen=prev + 1)
            self._record(prev, names, encoded, started)
            return

        def publish() -> None:
            events: list[tuple[tuple, dict]] = []
            names: list[str] = []
            error: BaseException | None = None
            try:
                with Store(self.run.store.path, readonly=True) as snapshot:
                    snapshot.begin_read()  # one snapshot: counts and vectors agree
                    names = sync_derived(self.run.idir, snapshot, prev, delta,
                                         lambda *a, **kw: events.append((a, kw)), gen=prev + 1)
            except BaseException as exc:  # noqa: BLE001 (told on the writer's thread, by poll)
                error = exc
            self._done = (prev, names, encoded, started, events, error)

        # A daemon: a second Ctrl-C, which interrupts the writer's wait for it, ends the process.
        self._thread = threading.Thread(target=publish, name="codesearch-publish", daemon=True)
        self._thread.start()

    def poll(self) -> None:
        """Record a background publication that has ended (raising its error, if it failed)."""
        if self._thread is None or self._thread.is_alive():
            return
        self._thread.join()
        self._thread, done, self._done = None, self._done, None
        assert done is not None
        prev, names, encoded, started, events, error = done
        for args, kw in events:
            self.run.report(*args, **kw)
        if error is not None:
            raise error
        self.commits.commit()  # its batches first: 'published' must mean committed
        self._record(prev, names, encoded, started)

    def finish(self) -> None:
        """Wait for the publication in flight (if any) and record it."""
        if self._thread is not None:
            self._thread.join()
            self.poll()

    def _record(self, prev: int, names: list[str], encoded: dict[str, set[str]], started: float) -> None:
        store = self.run.store
        if store.generation != prev:  # only this writer moves the generation, and not while it publishes
            raise RuntimeError(f"store generation moved from {prev} to {store.generation} during a publication")
        record_generation(store, prev + 1, names)
        self.last = time.monotonic()
        self.cost = self.last - started
        self.run.report(
            "published", store.generation, store.generation, files=len(self.run.work), chunks=self.run.chunks_made,
            message=f"vectors of {sum(len(h) for h in encoded.values()):,} texts are searchable",
        )


def _encode(run: _Run) -> None:
    """Encode what the vector cache lacks for the committed chunks and files, in batches that
    are each committed whole (a killed run loses the batch in flight, and at most one group
    of quick batches: see :class:`_Commits`), and publish the vectors to the indexes as they
    come.

    The order makes a partial index answer most questions: source code before tests, then
    docs, examples and benchmarks (`types.path_kind`), small files before large ones.
    """
    store, roles = run.store, run.encoders.by_role()
    pending = [role for role in run.recorded if role not in roles]
    if pending and run.defer_vectors and (run.work or run.rechunk_all):
        with store.transaction():  # the next search that uses the vectors adds them
            store.set_meta(VECTORS_PENDING_KEY, json.dumps(pending))
    elif roles and not pending:
        with store.transaction():  # this run encodes whatever lacks a vector
            store.delete_meta(VECTORS_PENDING_KEY)
    for role in run.recorded:
        if role not in roles:
            if run.defer_vectors:
                run.notices.append(
                    f"changed code has no {role} vectors yet; the next 'codesearch index' (or a search that "
                    "needs them) adds them"
                )
            else:
                # Offline run of an index that has vectors: they are added by a later run.
                run.notices.append(
                    f"No {role} encoder in this run; new or changed chunks have no {role} vectors yet "
                    f"(run 'codesearch index' again with {run.recorded[role].name} available to add them)"
                )
    if not roles:
        return
    files = {f.id: f for f in store.files().values()}
    texts = {w.path: (w.hash, w.text) for w in run.work}

    def priority(path: str, size: int) -> tuple[int, int]:
        return (path_kind(path), size)

    # One stream of texts per encoder (a dense model's chunks and whole files together), so
    # a small edit costs one encode call, not one per kind.
    streams: list[tuple[Any, list[tuple[tuple[int, int], str, str, str]]]] = []
    for role, enc in roles.items():
        items: dict[tuple[str, str], tuple[tuple[int, int], str, str, str]] = {}
        for kind in ("dense", "file") if role == "dense" else ("colbert",):
            if kind == "file":
                for fid, path, h in store.files_missing_vectors(enc.identity):
                    if (kind, h) not in items:
                        text = _current_text(run.root, path, h, texts)
                        if text is not None:
                            items[(kind, h)] = (priority(path, files[fid].size), kind, h,
                                                _file_text_for_encoder(path, text, enc.max_length))
            else:
                for sc in store.chunks_missing_vectors(enc.identity, kind):
                    h = sc.text_hash
                    if (kind, h) not in items:  # the cache is keyed by text: a copy is encoded once
                        f = files[sc.file_id]
                        items[(kind, h)] = (priority(f.path, f.size), kind, h, sc.chunk.encoder_text)
        if items:
            streams.append((enc, sorted(items.values(), key=lambda it: it[0])))
    total = sum(len(items) for _, items in streams)
    if not total:
        return
    commits = _Commits(store)
    publisher = _Publisher(run, commits, background=any(_encodes_elsewhere(enc) for enc, _ in streams))
    try:
        _encode_streams(run, streams, roles, total, commits, publisher)
    except BaseException:
        # The batches of an open group are whole: a failed run keeps them, and a publication
        # in flight ends (its files are written whole) before the run lets go of the index.
        # If the store itself failed, the run's own error is the one to tell.
        with contextlib.suppress(Exception):
            commits.commit(report=False)
        with contextlib.suppress(Exception):
            publisher.finish()
        raise


def _encode_streams(
    run: _Run, streams: list, roles: dict[str, Any], total: int, commits: _Commits, publisher: _Publisher
) -> None:
    store = run.store
    enc_t0 = time.perf_counter()
    kinds = [""]  # the kinds of the last batch, for the progress message

    def committed() -> None:  # progress counts what is committed: a killed run keeps that much
        elapsed = max(time.perf_counter() - enc_t0, 1e-9)
        run.report(
            "encode", run.texts_encoded, total, files=len(run.work), chunks=run.chunks_made,
            tokens=run.tokens_encoded, tokens_per_s=run.tokens_encoded / elapsed, message=kinds[0],
        )

    commits.on_commit = committed
    for enc, items in streams:
        batches = list(_batches([(kind, h, t) for _, kind, h, t in items], _batch_size(enc)))
        texts_of = ([t for _, _, t in b] for b in batches)

        def idle() -> None:  # while a pool of workers (codesearch[ray]) computes
            commits.commit_if_older()
            publisher.poll()

        outputs = encode_stream(enc, texts_of, kind="document", idle=idle)
        for batch, out in zip(batches, outputs):
            vectors = list(out) if enc.multivector else [np.asarray(out)[i] for i in range(len(batch))]
            by_kind: dict[str, list[tuple[str, np.ndarray]]] = defaultdict(list)
            for (kind, h, _), v in zip(batch, vectors):
                by_kind[kind].append((h, v))
            tokens = sum(min(n, int(enc.max_length)) for n in enc.count_tokens([t for _, _, t in batch]))
            with commits.batch():  # the batch is cached whole or not at all
                for kind, pairs in by_kind.items():
                    store.put_vectors(enc.identity, kind, pairs)
                run.texts_encoded += len(batch)
                run.tokens_encoded += tokens
                kinds[0] = "/".join(by_kind)
            for kind, pairs in by_kind.items():
                publisher.add(kind, (h for h, _ in pairs))
            publisher.poll()
            if run.texts_encoded < total and publisher.due():
                publisher.start()
        # How this model was embedded, for 'status': recorded as its stream ends, so that a
        # run that fails in the next model's stream still tells how this one's were made.
        embedded = {role: enc.describe() for role, e in roles.items() if e is enc}
        commits.commit()
        with store.transaction():
            store.set_meta(EMBEDDED_KEY, json.dumps(json.loads(store.get_meta(EMBEDDED_KEY) or "{}") | embedded))
    publisher.finish()
    if publisher.pending:
        publisher.start(background=False)  # the last one: nothing left to run beside


def _current_text(root: Path, path: str, expected_hash: str, texts: dict[str, tuple[str, str]]) -> str | None:
    """The text of ``path`` if it still has the hash the store records (else None: the next
    run, which sees the new content, encodes it)."""
    if path in texts and texts[path][0] == expected_hash:
        return texts[path][1]
    try:
        data, _ = read_inside(root, path)
    except OSError:
        return None
    return decode_source(data) if hash_bytes(data) == expected_hash else None


def _batch_size(enc: Encoder) -> tuple[int, int]:
    """(texts, characters) per encode call and committed batch.

    On a CPU the encoder's own budget is small and a batch of 64 texts keeps each commit
    (and so what a kill loses) small. A GPU wants far larger passes (up to 262k tokens,
    `Encoder.batch_tokens`): there the call holds about what the encoder can run at once,
    at about 4 characters per token, so the device is never fed 20k-token crumbs.
    """
    budget = int(enc.batch_tokens)
    if not enc.offloaded or budget <= 0:
        return ENCODE_BATCH, ENCODE_BATCH_CHARS
    return max(ENCODE_BATCH, budget // 64), max(ENCODE_BATCH_CHARS, 4 * budget)


def _batches(
    items: list[tuple[str, str, str]], size: tuple[int, int] | None = None
) -> Iterable[list[tuple[str, str, str]]]:
    """Consecutive runs of (kind, hash, text) of at most ``size`` = (texts, characters)."""
    max_texts, max_chars = size or (ENCODE_BATCH, ENCODE_BATCH_CHARS)
    batch: list[tuple[str, str, str]] = []
    chars = 0
    for item in items:
        if batch and (len(batch) >= max_texts or chars + len(item[2]) > max_chars):
            yield batch
            batch, chars = [], 0
        batch.append(item)
        chars += len(item[2])
    if batch:
        yield batch
