"""Many files at once: `chunk_many` over a process pool when there are enough of them, in
input order, each file on its own (a worker shares nothing but the token counter)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import operator
import os
import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence

from codesearch.indexing.chunking.source import chunk_source
from codesearch.types import Chunk
from codesearch.workers import leave_signals_to_the_parent, start_method, stop_workers

log = logging.getLogger("codesearch.indexing.chunking")

# Below this many files a pool costs more than it saves (`benchmarks/index_speed.py
# --workers`). Forked workers start at once and inherit the parent's imports: on 2 cores they
# won from 128 files up (a fresh process, quiet machine). Forkserver workers (a caller with
# threads) import tree-sitter and build their parsers first, ~0.3-0.5 s: they lost below
# ~500 files.
PARALLEL_MIN_FILES = 200
PARALLEL_MIN_FILES_FORKSERVER = 1000

_worker_args: tuple[int, Callable[[str], int] | None] = (512, None)


def _init_worker(max_tokens: int, count_tokens: Callable[[str], int] | None) -> None:
    global _worker_args
    _worker_args = (max_tokens, count_tokens)
    leave_signals_to_the_parent()


def _chunk_item(item: tuple[str, str, str]) -> list[tuple]:
    path, text, language = item
    max_tokens, count_tokens = _worker_args
    chunks = chunk_source(path, text, language, max_tokens=max_tokens, count_tokens=count_tokens)
    # plain tuples: a third of the cost of pickling and unpickling Chunk objects (measured)
    return [_chunk_fields(c) for c in chunks]


_chunk_fields = operator.attrgetter(*(f.name for f in dataclasses.fields(Chunk)))


def _picklable(obj: object) -> bool:
    try:
        pickle.dumps(obj)
    except Exception:  # noqa: BLE001 - lambdas, closures, bound methods of unpicklable objects, ...
        return False
    return True


def chunk_many(
    items: Iterable[tuple[str, str, str]],
    *,
    max_tokens: int = 512,
    count_tokens: Callable[[str], int] | None = None,
    workers: int | None = None,
    min_files: int | None = None,
) -> Iterator[list[Chunk]]:
    """`chunk_source` over many ``(path, text, language)`` items, yielding each file's chunks
    in input order; the same chunks as calling `chunk_source` on each.

    With at least ``min_files`` items (default `PARALLEL_MIN_FILES`, or
    `PARALLEL_MIN_FILES_FORKSERVER` when the caller runs other threads), more than one worker
    (default ``os.cpu_count()``) and a ``count_tokens`` that pickles (None, or e.g.
    ``Encoder.token_counter()``; a lambda does not), files are chunked in a process pool:
    tree-sitter parsing is most of the cost and files share nothing. Otherwise, or if the
    pool breaks, they are chunked here.
    """
    items = list(items)
    with Chunker(len(items), max_tokens=max_tokens, count_tokens=count_tokens, workers=workers,
                 min_files=min_files) as chunker:
        yield from chunker.map(items)


class Chunker:
    """`chunk_many` for a stream of batches: one process pool (when ``n_files``, the files
    the caller expects in all, make one pay) chunks every batch given to :meth:`map`, so an
    index run that reads, chunks and writes its files a batch at a time starts its workers
    once. A context manager: leaving it stops the workers.

    Parameters are `chunk_many`'s; ``n_files`` stands for its ``len(items)``.
    """

    def __init__(self, n_files: int, *, max_tokens: int = 512, count_tokens: Callable[[str], int] | None = None,
                 workers: int | None = None, min_files: int | None = None) -> None:
        self.max_tokens, self.count_tokens = max_tokens, count_tokens
        n_workers = (os.cpu_count() or 1) if workers is None else workers
        method = _pool_method(n_files, min_files) if n_workers > 1 else None
        self._n_workers = n_workers
        self._method = method if method is not None and _picklable(count_tokens) else None
        self._pool: object | None = None

    def __enter__(self) -> Chunker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:  # a caller that stops early does not wait for the files it will not read
            pool.shutdown(wait=True, cancel_futures=True)  # type: ignore[attr-defined]

    def _start(self) -> object:
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            ctx = multiprocessing.get_context(self._method)
            if self._method == "forkserver":
                ctx.set_forkserver_preload([__name__])
            self._pool = ProcessPoolExecutor(self._n_workers, mp_context=ctx, initializer=_init_worker,
                                             initargs=(self.max_tokens, self.count_tokens))
        return self._pool

    def map(self, items: Sequence[tuple[str, str, str]]) -> Iterator[list[Chunk]]:
        """Each item's chunks, in order (see `chunk_many`)."""
        done = 0
        if self._method is not None and items:
            from concurrent.futures.process import BrokenProcessPool

            chunksize = max(1, min(32, len(items) // (self._n_workers * 8)))
            try:
                pool = self._start()
                try:
                    for rows in pool.map(_chunk_item, items, chunksize=chunksize):  # type: ignore[attr-defined]
                        done += 1
                        yield [Chunk(*row) for row in rows]
                except GeneratorExit:  # the caller stopped taking this batch: the pool stays for the next
                    raise
                except BaseException:  # Ctrl-C: the workers ignore it, and their files are not wanted
                    stop_workers(pool)
                    self._method = None  # (the pool is gone; whatever comes next is chunked here)
                    raise
                return
            except (BrokenProcessPool, OSError) as e:
                log.warning("parallel chunking failed (%s); chunking the remaining %d files here", e, len(items) - done)
                self._method = None
                with contextlib.suppress(Exception):
                    self.close()
        for path, text, language in items[done:]:
            yield chunk_source(path, text, language, max_tokens=self.max_tokens, count_tokens=self.count_tokens)


def _pool_method(n_files: int, min_files: int | None) -> str | None:
    """How to start pool workers for ``n_files`` files, or None when a pool does not pay."""
    method = start_method()
    threshold = PARALLEL_MIN_FILES if method == "fork" else PARALLEL_MIN_FILES_FORKSERVER
    return method if n_files >= (threshold if min_files is None else min_files) else None
