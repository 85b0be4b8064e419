"""The incremental index build: walk -> chunk -> commit -> sync -> encode what is missing.

The store (``store.sqlite``) is the truth; lexical, dense and PLAID indexes are derived
from it. A run does its work in an order that survives a crash or Ctrl-C at any moment:

1. walk the files; a file whose size and mtime_ns match the store costs one ``stat``;
2. ONE transaction writes files, chunks, models and meta (``generation + 1``), filled a
   batch of changed files at a time: each batch is read and hashed (xxh3_128; same hash ->
   only its stat is recorded, no re-chunk), chunked (or its chunks taken from the user's
   cache), written, and dropped, so a run holds at most one batch of texts and chunks
   (`BATCH_BYTES`, `BATCH_FILES`) whatever the repository's size. A crash or Ctrl-C before
   the commit leaves the previous generation (the chunks already made stay in the user's
   cache: the next run does not chunk them again);
3. every derived index is brought to the new generation - incrementally when its saved
   generation is the previous one, else rebuilt from the store (no encoding) - written
   atomically, and its generation recorded in meta. A crash between 2 and 3 shows up as a
   generation mismatch, which :func:`load_derived` and the next run heal;
4. encode the texts that have no vector in the cache yet (keyed by model identity, kind
   and text hash), reading them from the store a batch at a time and committing each
   batch: a killed run leaves those vectors behind and the next run skips them; the
   vector indexes are published as the vectors come.

This module holds the run and its first two stages; `options` what they hand on,
`commit`, `encode` and `publish` the stages after them.

Example
-------
>>> from codesearch.indexing.encoders import resolve_encoders
>>> from codesearch.indexing.run import build_index
>>> encoders, notices = resolve_encoders()                       # doctest: +SKIP
>>> summary = build_index("path/to/repo", encoders=encoders)     # doctest: +SKIP
>>> summary.files_indexed, summary.chunks_encoded                # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from codesearch import _compat
from codesearch.encoder.base import Encoders
from codesearch.errors import (
    IndexCorruptError,
    IndexWriteError,
    NothingToIndexError,
    PathError,
)
from codesearch.indexes.registry import DERIVED, LEGACY_FILES, Delta, sync_derived
from codesearch.indexing.chunking import CHUNKER_VERSION
from codesearch.indexing.commit import WALK_EXCLUDE_KEY, WALK_INCLUDE_KEY, writing
from codesearch.indexing.encode import encode_missing
from codesearch.indexing.encoders import check_models, chunk_budget, forget_other_tokenizers
from codesearch.indexing.options import Progress, Run, RunOptions, Work
from codesearch.indexing.reuse import Reuse
from codesearch.pathnames import text_name
from codesearch.store import IndexLock, Store
from codesearch.store.files import FolderReader, decode_source, hash_bytes, hash_text
from codesearch.types import (
    LOCK_FILE,
    STORE_FILE,
    IndexSummary,
    ProgressEvent,
    default_index_dir,
)

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.indexing.chunking.parallel import Chunker

__all__ = ["BATCH_BYTES", "BATCH_FILES", "WALK_EXCLUDE_KEY", "WALK_INCLUDE_KEY", "build_index", "check_root"]

#: A batch of changed files is read, chunked and written together, then dropped: this many
#: bytes of source at most (one larger file makes a batch of its own), or this many files.
#: Its texts and chunks take about 3x its bytes in memory.
BATCH_BYTES = 16 << 20
BATCH_FILES = 2_000

#: Names that moved to the stage modules (the tuning knobs are patched where they are read).
__getattr__ = _compat.moved_names(__name__, {
    "ENCODE_BATCH": "codesearch.indexing.encode",
    "ENCODE_BATCH_CHARS": "codesearch.indexing.encode",
    "COMMIT_GROUP_S": "codesearch.indexing.commit",
    "PUBLISH_EVERY_S": "codesearch.indexing.publish",
    "hash_bytes": "codesearch.store.files",
})


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


def _remove_index_files(index_dir: Path) -> None:
    for name in (STORE_FILE, STORE_FILE + "-wal", STORE_FILE + "-shm", *LEGACY_FILES):
        (index_dir / name).unlink(missing_ok=True)
    shutil.rmtree(index_dir / (STORE_FILE + ".vectors"), ignore_errors=True)  # its segments
    for spec in DERIVED.values():
        p = index_dir / spec.filename
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


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
    report = Progress(progress)
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
            opts = RunOptions(root_path, idir, tuple(include), tuple(exclude), max_file_bytes, chunk_tokens, rebuild,
                              defer_vectors)
            if load_encoders is None:
                return _build(Run(opts, store, encoders, report, t0))
            # Lexical first: a run with no model (its vectors, and the models switched off,
            # are the next run's to say), then the models, then a run that finds every file
            # as the first one left it and encodes.
            lexical = _build(Run(dataclasses.replace(opts, defer_vectors=True), store, Encoders(), report, t0))
            loaded = load_encoders()
            quiet = Progress(_after_searchable(progress))
            return _then(lexical, _build(Run(dataclasses.replace(opts, rebuild=False), store, loaded, quiet, t0)))
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


def _build(run: Run) -> IndexSummary:
    """The stages, in the order that keeps every moment of a run searchable or resumable."""
    # A rebuild starts from nothing - no recorded models, no files - but inside the same
    # store: the old index stays readable until the commit replaces it, and vectors of the
    # same model and text still come from the cache.
    if not run.opts.rebuild:
        check_models(run.store, run.encoders, run.opts.idir)
    else:
        # The way out of a damaged vectors segment (its reads ask for --rebuild): the arrays
        # whose bytes fail their check go, and this run encodes those texts again.
        run.store.drop_damaged_vectors()
        forget_other_tokenizers(run.store, run.encoders)
    run.prev_gen = run.store.generation
    run.recorded = {} if run.opts.rebuild else run.store.models()
    stages = _Stopwatch()
    _walk_and_read(run)
    stages.lap("walk")
    delta = _read_chunk_write(run, stages)
    try:
        # Searchable now: lexical (and any vector index whose vectors were all cached).
        sync_derived(run.opts.idir, run.store, run.prev_gen, delta, run.report)
        stages.lap("sync")
        run.report(
            "searchable", 1, 1, files=run.changes.indexed, chunks=run.chunks_made,
            message=f"searchable: {run.store.count('chunks'):,} chunks in the lexical index",
        )
        encode_missing(run)
        stages.lap("encode")  # with the vector indexes' syncs while it ran
    except IndexWriteError as exc:
        # Past the commit, "the last complete index still answers" is not so: the files' new
        # content does, without all of its vectors.
        raise IndexWriteError(
            f"the index of {run.opts.root} holds the files' new content, but not all of its vectors and indexes "
            f"could be written: {getattr(exc, 'why', exc)} (free some space and run 'codesearch index' again)"
        ) from exc
    with contextlib.suppress(IndexWriteError):
        # Old versions of edited code stay cached (cheap branch switches) up to about the size
        # of the live index; past that they go. (On a full disk, for the next run: the run's
        # work is done, and this only frees space.)
        run.store.prune_vectors(keep_unreferenced=max(10_000, run.store.count("chunks")))
    models = {role: rec.name for role, rec in run.store.models().items()}
    return IndexSummary(
        root=str(run.opts.root),
        index_dir=str(run.opts.idir),
        files_indexed=run.changes.indexed,
        files_unchanged=run.changes.unchanged,
        files_removed=(
            len(run.changes.removed) if not run.opts.rebuild
            else sum(1 for p in run.changes.all_old if p not in run.changes.seen)
        ),
        files_renamed=run.changes.renamed,
        skipped=run.changes.skipped,
        chunks_total=run.store.count("chunks"),
        chunks_encoded=run.texts_encoded,
        tokens_encoded=run.tokens_encoded,
        seconds=time.perf_counter() - run.t0,
        models=models,
        notices=run.notices,
        files_read=run.changes.files_read,
        stage_seconds=stages.seconds,
        texts_reused=run.texts_reused,
    )


class _Stopwatch:
    """Seconds by stage, a lap at a time (the stages of a batch take turns)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.mark = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(self.seconds.get(stage, 0.0) + now - self.mark, 3)
        self.mark = now


# -- 1. walk -------------------------------------------------------------------------------------


def _walk_and_read(run: Run) -> None:
    """Walk the files and compare their stats with the store's: the files to read (new or
    changed stat) and the files gone; decide the chunk budget. What the files hold is read
    by the next stage, a batch at a time."""
    from codesearch.indexing.walk import walk

    store = run.store
    run.report("walk", 0, 0, message="walking files")
    run.changes.all_old = store.files()
    old_files = {} if run.opts.rebuild else run.changes.all_old
    _plan_chunks(run, bool(old_files))
    run.changes.walk_started = time.time()
    result = walk(
        run.opts.root, include=run.opts.include, exclude=run.opts.exclude, max_file_bytes=run.opts.max_file_bytes,
        index_dir=run.opts.idir,
        # A file this index kept, whose size and mtime are unchanged, is kept with its
        # language without being opened again (this run does not read it either): an edit
        # in a 114k-file repository sniffs one file, not all. Not when every file is
        # chunked again: then each is read, so each is looked at.
        known=old_files if not run.plan.rechunk_all else None,
    )
    run.changes.skipped = {reason: len(paths) for reason, paths in result.skipped.items() if paths}
    run.changes.stamp = result.stamp
    if not result.files and not old_files:
        what = ", ".join(f"{n} {reason}" for reason, n in sorted(run.changes.skipped.items())) or "no files at all"
        raise NothingToIndexError(
            f"nothing to index under {run.opts.root} (skipped: {what}); check the path and --include/--exclude"
        )
    run.report("walk", len(result.files), len(result.files), files=len(result.files))

    for sf in result.files:
        run.changes.seen.add(sf.path)
        old = old_files.get(sf.path)
        if old is not None and not run.plan.rechunk_all and old.size == sf.size and old.mtime_ns == sf.mtime_ns:
            run.changes.unchanged += 1
        else:
            run.changes.changed.append((sf, old))
    run.changes.removed = _removed(run)


def _plan_chunks(run: Run, has_files: bool) -> None:
    """The chunk budget and token count of this run, and whether every file is chunked again."""
    store = run.store
    budget, counter, counter_id = chunk_budget(run.encoders, run.opts.chunk_tokens)
    old_budget, old_counter = (
        (None, None) if run.opts.rebuild else (store.get_meta("chunk_tokens"), store.get_meta("chunk_counter"))
    )
    present = {e.identity for e in run.encoders.by_role().values()}
    degraded = counter_id == "approx" and old_counter not in (None, "approx") and old_counter not in present
    if degraded:
        # A run without the recorded model (offline) keeps the old chunks and budget, and
        # chunks changed files with the approximate count; the record stays the model's.
        counter_id = old_counter
        if run.opts.chunk_tokens is None and old_budget:
            budget = int(old_budget)
    # Re-chunk everything when the budget changes, or when a real tokenizer replaces the
    # approximate count (a short-window ColBERT model added to a lexical-only index). Chunks
    # counted exactly stay when a run estimates with the same model (the estimate never
    # makes a chunk too long for a window that does not need exact counts).
    run.plan.rechunk_all = has_files and (
        old_budget != str(budget) or (not degraded and counter_id != "approx" and old_counter != counter_id)
        # chunks from another release's chunker (kept ids and vectors where the text is the same)
        or (not degraded and store.get_meta("chunker_version") != str(CHUNKER_VERSION))
    )
    run.plan.budget, run.plan.counter, run.plan.counter_id = budget, counter, counter_id


# -- 2. read, chunk and write, a batch at a time -------------------------------------------------


def _read_chunk_write(run: Run, stages: _Stopwatch) -> Delta:
    """Read, chunk and write the changed files a batch at a time, in the run's one
    transaction; returns what it changed, for the derived indexes."""
    from codesearch.indexing.chunking.parallel import Chunker
    from codesearch.indexing.reuse import chunking_key

    changed = run.changes.changed
    n = len(changed)
    # Every file gone is known now (one that vanishes while it is read joins them).
    removed_hashes = {f.hash for f in run.changes.removed}
    chunking = chunking_key(run.plan.budget, run.plan.counter) if changed else None
    reuse = Reuse.open() if chunking is not None else Reuse(None)
    try:
        with Chunker(n, max_tokens=run.plan.budget, count_tokens=run.plan.counter) as chunker, \
                writing(run) as writer:
            run.report("write", 0, n, files=0)
            done = 0
            for batch, touched in _read_batches(run):
                writer.touch(touched)
                done += len(touched)
                stages.lap("walk")  # (reading is the walk's, as it always was)
                _chunk(run, batch, chunking, reuse, chunker,
                       lambda k, done=done: run.report("chunk", done + k, n, files=run.changes.indexed + k,
                                                       chunks=run.chunks_made))
                done += len(batch)
                run.report("chunk", done, n, files=run.changes.indexed + len(batch), chunks=run.chunks_made)
                stages.lap("chunk")
                writer.write(batch)
                run.changes.indexed += len(batch)
                run.changes.renamed += sum(1 for w in batch if w.old_id is None and w.hash in removed_hashes)
                run.report("write", done, n, files=run.changes.indexed, chunks=run.chunks_made)
                stages.lap("write")
            run.changes.removed = _removed(run)
            run.report("chunk", n, n, files=run.changes.indexed, chunks=run.chunks_made)
        stages.lap("write")
    finally:
        reuse.close()
    run.report("write", n, n, files=run.changes.indexed, chunks=run.chunks_made)
    assert writer.delta is not None
    return writer.delta


def _removed(run: Run) -> list:
    """The store's files that this run did not keep (gone, or unreadable now)."""
    old_files = {} if run.opts.rebuild else run.changes.all_old
    return [f for p, f in old_files.items() if p not in run.changes.seen]


def _read_batches(run: Run) -> Iterator[tuple[list[Work], list[tuple[int, int, int]]]]:
    """The changed files, read and hashed a batch at a time: ``(files to chunk, files only
    touched (id, size, mtime_ns))``, at most `BATCH_BYTES` or `BATCH_FILES` at a time."""
    with FolderReader(run.opts.root) as reader:
        batch: list[Work] = []
        touched: list[tuple[int, int, int]] = []
        size = 0
        for sf, old in run.changes.changed:
            try:
                # Inside the root and a regular file, as the walk found it: a file swapped since
                # (for a symlink out of the repository, a FIFO) is not read.
                data, st = reader.read(sf.path)
            except OSError:
                run.changes.skipped["unreadable"] = run.changes.skipped.get("unreadable", 0) + 1
                run.changes.seen.discard(sf.path)  # a file that vanished mid-run leaves the index
                run.changes.stamp = None  # (the walk kept it: its stamp no longer says what the index holds)
                continue
            run.changes.files_read += 1
            digest = hash_bytes(data)
            if old is not None and old.hash == digest and not run.plan.rechunk_all:
                touched.append((old.id, st.st_size, st.st_mtime_ns))
                run.changes.unchanged += 1
            else:
                if batch and (size + len(data) > BATCH_BYTES or len(batch) >= BATCH_FILES):
                    yield batch, touched
                    batch, touched, size = [], [], 0
                batch.append(Work(sf.path, sf.language, st.st_size, st.st_mtime_ns, digest, decode_source(data),
                                  old_id=old.id if old else None))
                size += len(data)
            del data
            if len(touched) >= BATCH_FILES:
                yield [], touched
                touched = []
        if batch or touched:
            yield batch, touched


def _chunk(run: Run, work: list[Work], chunking: str | None, reuse: Reuse, chunker: Chunker,
           progress: Callable[[int], None] = lambda done: None) -> None:
    """Chunk a batch of new and changed files (per file, sharing nothing: the `Chunker`'s
    process pool for many), taking from the user's cache the chunks of every file another
    index chunked the same way (a worktree, a branch, a clone: tree-sitter and the tokenizer
    skipped). ``progress`` gets the files of the batch done so far, now and then."""
    from codesearch.indexing.reuse import chunk_key, pack_chunks, unpack_chunks

    if not work:
        return
    # A name that is not UTF-8 goes into each chunk's header (text the store and the
    # encoder take) as valid Unicode; the file row keeps the name itself.
    names = [text_name(w.path) for w in work]
    keys = [chunk_key(chunking, name, w.language, w.hash) for name, w in zip(names, work)] if chunking else []
    found = reuse.take_chunks(keys)
    missing: list[int] = []
    for i, w in enumerate(work):
        cached = found.get(keys[i]) if keys else None
        chunks = unpack_chunks(cached, names[i], w.text, w.language) if cached is not None else None
        if chunks is None:
            missing.append(i)
        else:
            w.chunks = chunks
    del found
    run.files_chunks_reused += len(work) - len(missing)
    made: list[tuple[str, bytes]] = []
    pieces = chunker.map([(names[i], work[i].text, work[i].language) for i in missing])
    for done, (i, chunks) in enumerate(zip(missing, pieces, strict=True), start=len(work) - len(missing) + 1):
        work[i].chunks = chunks
        if keys:
            made.append((keys[i], pack_chunks(names[i], chunks)))
        if done % 50 == 0:
            progress(done)
    # Kept before the batch is written: a run killed before its commit chunks none of
    # these again.
    reuse.keep_chunks(made)
    for w in work:
        w.hashes = [hash_text(c.text) for c in w.chunks]
        run.chunks_made += len(w.chunks)
