"""Publications of a run's vectors: each makes the vector indexes' files from the committed
vectors, then commits the new generation with them, so a search never finds the store
ahead of its index files; with an encoder that computes elsewhere, beside the batches."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from codesearch.indexes.registry import Delta, record_generation, sync_derived
from codesearch.indexing.cachedcodes import FLUSH_BYTES
from codesearch.indexing.codes import RunCodes
from codesearch.indexing.commit import Commits
from codesearch.indexing.options import Run
from codesearch.store import Store

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.indexes.plaid.coded import CodeBook

__all__ = ["PUBLISH_EVERY_S", "Publisher"]

#: A run publishes the vectors encoded so far (a new generation, vector indexes synced) at
#: most this often, and never more often than 3x the last publication's own cost, so a
#: query during a long first index sees the vectors grow at a bounded price.
PUBLISH_EVERY_S = 20.0


class Publisher:
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

    def __init__(self, run: Run, commits: Commits, *, background: bool) -> None:
        self.run, self.commits, self.background = run, commits, background
        self.pending: dict[str, set[str]] = defaultdict(set)  # encoded, not yet in the indexes
        self.last, self.cost = time.monotonic(), 0.0  # when the last one ended, what it took
        self.began = self.last  # when the last one started: what is pending came in since
        self._thread: threading.Thread | None = None
        self.codes: RunCodes | None = None  # PLAID codes from the workers (codesearch.indexing.codes)
        # Otherwise: codes from the user's vector cache, and where the index's own go (cachedcodes)
        self.book: CodeBook | None = None
        self.keepers: list = []  # CodeKeepers: what a publication's index computed goes to the cache
        self._done: tuple[int, list[str], dict[str, set[str]], float, list, BaseException | None] | None = None

    def add(self, kind: str, hashes: Iterable[str]) -> None:
        self.pending[kind].update(hashes)

    def due(self, left: int = 0) -> bool:
        """Whether to publish what is pending now; ``left``: the texts the stream has still to
        bring."""
        # Not while the codec trains: a publication that trained its own would waste the workers' codes.
        if self._thread is not None or not self.pending or (self.codes is not None and not self.codes.ready):
            return False
        now = time.monotonic()
        wait = max(PUBLISH_EVERY_S, 3 * self.cost) - (now - self.last)
        if wait <= 0:
            return True
        # Near the end of a stream beside the workers: when what is left comes in before the
        # next publication is due, the run's last publication, which the run waits for after
        # the workers' last batch, would hold all of it (25 s of 61 s of workers, stand-in
        # cluster at 4.1M tokens). Back to back, each publication holds what came in during the
        # one before.
        taken = sum(len(h) for h in self.pending.values())
        return self.background and left > 0 and left * (now - self.began) <= wait * taken

    def start(self, *, background: bool | None = None) -> None:
        """Publish what is pending: what is published is committed first."""
        self.commits.commit()
        encoded, self.pending = dict(self.pending), defaultdict(set)
        prev, started = self.run.store.generation, time.monotonic()
        self.began = started
        delta = Delta([], [], [], [], encoded)
        book = self.codes.book if self.codes is not None else self.book
        if book is not None and book.codec is None and book.keep is None:
            book = None
        if not (self.background if background is None else background):
            names = sync_derived(self.run.opts.idir, self.run.store, prev, delta, self.run.report, gen=prev + 1,
                                 codes=book)
            self._record(prev, names, encoded, started)
            return

        def publish() -> None:
            events: list[tuple[tuple, dict]] = []
            names: list[str] = []
            error: BaseException | None = None
            try:
                with Store(self.run.store.path, readonly=True) as snapshot:
                    snapshot.begin_read()  # one snapshot: counts and vectors agree
                    names = sync_derived(self.run.opts.idir, snapshot, prev, delta,
                                         lambda *a, **kw: events.append((a, kw)), gen=prev + 1, codes=book)
            except BaseException as exc:  # noqa: BLE001 (told on the writer's thread, by poll)
                error = exc
            self._done = (prev, names, encoded, started, events, error)

        # A daemon: a second Ctrl-C, which interrupts the writer's wait for it, ends the process.
        self._thread = threading.Thread(target=publish, name="codesearch-publish", daemon=True)
        self._thread.start()

    def poll(self) -> None:
        """Record a background publication that has ended (raising its error, if it failed);
        while one runs, write to the cache the codes its index has made so far."""
        if self._thread is None:
            return
        if self._thread.is_alive():
            self._flush_keepers()
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
            while self._thread.is_alive():  # (writing its codes to the cache as they pile up)
                self._thread.join(0.5)
                self._flush_keepers()
            self.poll()

    def _flush_keepers(self) -> None:
        """Write to the cache what the keepers hold past `FLUSH_BYTES` (on the writer's
        thread, while a publication runs on its own: it would hold all it codes till its end)."""
        for keeper in self.keepers:
            if keeper.pending_bytes > FLUSH_BYTES:
                keeper.flush()

    def _record(self, prev: int, names: list[str], encoded: dict[str, set[str]], started: float) -> None:
        store = self.run.store
        if store.generation != prev:  # only this writer moves the generation, and not while it publishes
            raise RuntimeError(f"store generation moved from {prev} to {store.generation} during a publication")
        record_generation(store, prev + 1, names)
        if self.codes is not None:  # the index holds them now
            self.codes.book.drop(encoded.get("colbert", ()))
        for keeper in self.keepers:  # on the writer's thread: the run's one connection to the cache
            keeper.flush()
        self.last = time.monotonic()
        self.cost = self.last - started
        self.run.report(
            "published", store.generation, store.generation, files=self.run.changes.indexed,
            chunks=self.run.chunks_made,
            message=f"vectors of {sum(len(h) for h in encoded.values()):,} texts are searchable",
        )
