"""The transactions of an index run: the ONE transaction that writes what the files now are
(files, chunks, models, meta: ``generation + 1``, no vectors yet), filled a batch of files
at a time (`ChangeWriter`), and the vector writer's commits (`Commits`), each batch whole
and quick batches grouped.

Why one transaction filled in batches: readers see the previous generation until it
commits, and a crash or Ctrl-C before it leaves exactly that (SQLite drops what the
transaction wrote), while the run holds in memory only the batch it is writing. SQLite's
page cache spills what the transaction wrote to the WAL as it fills, so the store's side is
bounded too.

A chunk whose header and text are unchanged keeps its id when its file is edited (it only
moved): every derived index then holds exactly the same thing for it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence

from codesearch.indexes.registry import MAX_TOKENS_KEY, Delta
from codesearch.indexing.chunking import CHUNKER_VERSION
from codesearch.indexing.encoders import DISABLED_KEY, EMBEDDED_KEY, TOKENIZER_KEY, tokenizer_of
from codesearch.indexing.options import Run, Work
from codesearch.indexing.walk import WALK_SKIPPED_KEY, WALK_STAMP_KEY, with_git_vouch
from codesearch.store import Store

__all__ = ["COMMIT_GROUP_S", "WALK_EXCLUDE_KEY", "WALK_INCLUDE_KEY", "ChangeWriter", "Commits", "writing"]

#: Meta keys: the walk options of the last run (JSON lists), which a refresh reuses.
WALK_INCLUDE_KEY, WALK_EXCLUDE_KEY = "walk.include", "walk.exclude"


def _n_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


class ChangeWriter:
    """What one run's transaction has written so far, and how it writes a batch of files.

    Made by `writing`, which opens the transaction before the first batch and commits it,
    with the new generation, after the last.
    """

    def __init__(self, run: Run) -> None:
        self.run = run
        self.removed_chunks: list[tuple[int, str]] = []  # (chunk id, text hash) leaving the index
        self.added_chunks: list[int] = []
        self.changed_files: list[int] = []  # files whose content (hence file vector) changed
        self.files = 0  # files (re)written
        self.delta: Delta | None = None  # once the transaction has committed

    def touch(self, touched: Sequence[tuple[int, int, int]]) -> None:
        """Record new stats ``(file id, size, mtime_ns)`` of files whose content did not change."""
        self.run.store.touch_files(touched)

    def write(self, works: Sequence[Work]) -> None:
        """Write a batch of (re)chunked files and their chunks."""
        store = self.run.store
        # New files (most of a first index's writing): their rows, then their chunks, each in
        # one statement.
        new = [w for w in works if w.old_id is None]
        fids = store.insert_files((w.path, w.hash, w.size, w.mtime_ns, w.language, _n_lines(w.text)) for w in new)
        self.changed_files += fids
        self.added_chunks += store.insert_chunks(
            (fid, c, h) for fid, w in zip(fids, new, strict=True) for c, h in zip(w.chunks, w.hashes))
        for w in works:
            if w.old_id is None:
                continue
            fid = store.upsert_file(
                w.path, hash=w.hash, size=w.size, mtime_ns=w.mtime_ns, language=w.language,
                n_lines=_n_lines(w.text),
            )
            self.changed_files.append(fid)
            # Keep the id of a chunk whose header and text are unchanged (it only moved):
            # every derived index holds exactly the same thing for it.
            pool: dict[tuple[str, str], list[int]] = defaultdict(list)
            old_hash: dict[int, str] = {}
            for r in store.file_chunks(fid):
                pool[(r.chunk.header, r.text_hash)].append(r.id)
                old_hash[r.id] = r.text_hash
            for c, h in zip(w.chunks, w.hashes):
                ids = pool.get((c.header, h))
                if ids:
                    store.update_chunk_position(ids.pop(0), c)
                else:
                    self.added_chunks.append(store.insert_chunk(fid, c, h))
            gone = [cid for ids in pool.values() for cid in ids]
            store.delete_chunks(gone)
            self.removed_chunks += [(cid, old_hash[cid]) for cid in gone]
        self.files += len(works)

    def finish(self) -> Delta:
        """Write what the run knows once every batch is in: the files gone, the models, the
        meta and the generation (bumped when anything changed)."""
        run, store, roles = self.run, self.run.store, self.run.encoders.by_role()
        removed = run.changes.removed
        for f in removed:
            self.removed_chunks += [(r.id, r.text_hash) for r in store.file_chunks(f.id)]
        store.delete_files([f.id for f in removed])
        models_changed = any(role not in run.recorded for role in roles)
        changed = bool(self.files or removed or models_changed or run.plan.rechunk_all)
        for role, enc in roles.items():
            if role not in run.recorded:
                store.set_model(role, enc.name, enc.identity, int(enc.dim))
            # (whether the index keeps per-file means of chunk vectors: `registry.short_context`)
            store.set_meta(MAX_TOKENS_KEY.format(role=role), int(enc.max_length))
            # (`check_models` let this run in: the index's vectors are of this tokenizer, or
            # an older index recorded none)
            tokenizer = tokenizer_of(enc)
            if tokenizer is not None and store.get_meta(TOKENIZER_KEY.format(role=role)) != tokenizer:
                store.set_meta(TOKENIZER_KEY.format(role=role), tokenizer)
        if not run.opts.defer_vectors:  # a run that skipped the models says nothing about them
            store.set_meta(DISABLED_KEY, json.dumps(sorted(run.encoders.disabled)))
        store.set_meta("root", str(run.opts.root))
        store.set_meta("chunk_tokens", run.plan.budget)
        store.set_meta("chunk_counter", run.plan.counter_id)
        if run.plan.rechunk_all or not (run.changes.all_old and not run.opts.rebuild):
            # every chunk now comes from this chunker
            store.set_meta("chunker_version", CHUNKER_VERSION)
        store.set_meta("max_file_bytes", run.opts.max_file_bytes)
        # The walk options, so a later staleness check compares with the index as built.
        store.set_meta(WALK_INCLUDE_KEY, json.dumps(list(run.opts.include)))
        store.set_meta(WALK_EXCLUDE_KEY, json.dumps(list(run.opts.exclude)))
        if run.changes.stamp is not None:
            stamp = with_git_vouch(run.opts.root, run.changes.stamp, store.file_stats, run.changes.walk_started)
            store.set_meta(WALK_STAMP_KEY, stamp.to_json())
            store.set_meta(WALK_SKIPPED_KEY, json.dumps(run.changes.skipped, sort_keys=True))
        else:
            store.delete_meta(WALK_STAMP_KEY)
        store.set_meta("generation", run.prev_gen + 1 if changed else run.prev_gen)
        return Delta(
            removed_chunks=self.removed_chunks,
            added_chunks=self.added_chunks,
            removed_files=[f.id for f in removed],
            changed_files=self.changed_files,
            newly_encoded={},
        )


#: SQLite's page cache (KiB) while the run's transaction is open. Writing the 602,640 chunks
#: of a 114k-file first index took 13.7 CPU-s with SQLite's default 2 MB, 6.5 with 16 MB, 5.5
#: with 32 MB and 5.0 with 64 MB (load 16-19): the pages of the chunks' indexes stay in
#: memory instead of spilling to the WAL and being read back.
WRITE_CACHE_KIB = 65536


@contextlib.contextmanager
def writing(run: Run) -> Iterator[ChangeWriter]:
    """The run's ONE transaction: the body writes its batches through the `ChangeWriter`,
    then `ChangeWriter.finish` bumps the generation (its `Delta`, which brings the derived
    indexes to it, is then the writer's ``delta``) and the transaction commits. An error (or
    Ctrl-C) in the body rolls every batch back: readers never saw any of them."""
    store = run.store
    with store.page_cache(WRITE_CACHE_KIB), store.transaction():
        if run.opts.rebuild:
            embedded = store.get_meta(EMBEDDED_KEY)
            store.clear()  # files, chunks, models, meta (and so every derived generation)
            if embedded:  # how the cached vectors were made still holds
                store.set_meta(EMBEDDED_KEY, embedded)
        writer = ChangeWriter(run)
        yield writer
        writer.delta = writer.finish()


#: Batches written within this many seconds of the one before share a commit, and a group
#: takes batches for at most this long: SQLite's WAL rewrites every index page a commit
#: touches (64 KiB pages, keys in random order), so at a GPU cluster's rates one commit per 64
#: vectors cuts what the writer takes in by ~3x (BENCHMARKS.md, 'A large first index on
#: workers'). A batch that took longer (a CPU run of a real model) commits alone, at once.
COMMIT_GROUP_S = 1.0


class Commits:
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

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self.group: contextlib.AbstractContextManager[Store] | None = None  # the open transaction, if any
        self.opened = 0.0
        self.last: float | None = None  # when the previous batch was written
        self.on_commit: Callable[[], None] = lambda: None

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
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
