"""The transactions of an index run: the ONE transaction that writes what the files now are
(files, chunks, models, meta: ``generation + 1``, no vectors yet), and the vector writer's
commits (`Commits`), each batch whole and quick batches grouped.

A chunk whose header and text are unchanged keeps its id when its file is edited (it only
moved): every derived index then holds exactly the same thing for it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

from codesearch.indexes.registry import MAX_TOKENS_KEY, Delta
from codesearch.indexing.chunking import CHUNKER_VERSION
from codesearch.indexing.encoders import DISABLED_KEY, EMBEDDED_KEY, TOKENIZER_KEY, tokenizer_of
from codesearch.indexing.options import Run
from codesearch.store import Store

__all__ = ["COMMIT_GROUP_S", "WALK_EXCLUDE_KEY", "WALK_INCLUDE_KEY", "Commits", "commit_changes"]

#: Meta keys: the walk options of the last run (JSON lists), which a refresh reuses.
WALK_INCLUDE_KEY, WALK_EXCLUDE_KEY = "walk.include", "walk.exclude"


def _n_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def commit_changes(run: Run) -> Delta:
    """Write what the files now are, in ONE transaction (``generation + 1``); no vectors yet."""
    store, roles = run.store, run.encoders.by_role()
    run.report("write", 0, 1, files=len(run.changes.work), chunks=run.chunks_made)
    removed_chunks: list[tuple[int, str]] = []  # (chunk id, text hash) leaving the index
    added_chunks: list[int] = []
    changed_files: list[int] = []  # files whose content (hence file vector) changed
    models_changed = any(role not in run.recorded for role in roles)
    changed = bool(run.changes.work or run.changes.removed or models_changed or run.plan.rechunk_all)
    new_gen = run.prev_gen + 1 if changed else run.prev_gen
    with store.transaction():
        if run.opts.rebuild:
            embedded = store.get_meta(EMBEDDED_KEY)
            store.clear()  # files, chunks, models, meta (and so every derived generation)
            if embedded:  # how the cached vectors were made still holds
                store.set_meta(EMBEDDED_KEY, embedded)
        for fid, size, mtime_ns in run.changes.touched:
            store.touch_file(fid, size=size, mtime_ns=mtime_ns)
        for f in run.changes.removed:
            removed_chunks += [(r.id, r.text_hash) for r in store.file_chunks(f.id)]
        store.delete_files([f.id for f in run.changes.removed])
        for w in run.changes.work:
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
        store.set_meta("generation", new_gen)
    run.report("write", 1, 1, files=len(run.changes.work), chunks=run.chunks_made)
    return Delta(
        removed_chunks=removed_chunks,
        added_chunks=added_chunks,
        removed_files=[f.id for f in run.changes.removed],
        changed_files=changed_files,
        newly_encoded={},
    )


#: Batches written within this many seconds of the one before share a commit, and a group
#: takes batches for at most this long: SQLite's WAL rewrites every index page a commit
#: touches (64 KiB pages, keys in random order), so at a GPU cluster's rates one commit per 64
#: vectors cuts what the writer takes in by ~3x (BENCHMARKS.md). A batch that took longer
#: (a CPU run of a real model) commits alone, at once.
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
