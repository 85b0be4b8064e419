"""What the HTTP routes and the MCP tools both call: search, index, status, health.

Searches run on a thread pool of bounded size, never on the event loop, with a per-request
timeout and a bounded number of waiting requests: a flood of slow queries gets quick 503s
instead of an ever-growing queue, and one slow search cannot stall the others. A request is
checked (`SearchRequest`, its globs) in the pool too: validation is work a hostile request
chooses the size of, and the event loop also answers ``/health``.

A thread cannot be killed, so a timed-out search goes on to its end; what bounds it is the
request's own limits (linear glob matching, `GlobLimits`, `MAX_K`). What must not wait for
it is shutdown: the pool's threads are daemon threads, which the interpreter does not join
at exit (`concurrent.futures.ThreadPoolExecutor` joins its workers, so one stuck search
kept a stopped server alive).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from codesearch import __version__
from codesearch.errors import NotIndexedError, QueryError, ServerError
from codesearch.globs.limits import Deadline
from codesearch.server.batching import batching_stats
from codesearch.server.repos import RepoSet
from codesearch.types import JSONDict, SearchRequest, SearchResult

SCHEMA_VERSION = 1
MAX_K = 1000  # results per search; bounds the work and the response size of one request


class ServerBusyError(ServerError):
    """More searches are waiting than the server queues; retry shortly."""


class SearchTimeoutError(ServerError):
    """A search took longer than the server's per-request timeout."""


class ServerStoppingError(ServerError):
    """The server is shutting down (SIGTERM): searches in flight are answered with this."""


_STOPPING = "the server is shutting down (retry once it is started again)"


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on search work.

    Attributes
    ----------
    workers:
        Threads that run searches (the rest wait in the queue).
    max_pending:
        Searches running or waiting; one more is answered 503 at once.
    timeout_s:
        Per-search limit; past it the request gets 504 (the thread finishes its search
        in the background and its slot frees then; its glob filter stops at the limit).
    """

    workers: int = 8
    max_pending: int = 64
    timeout_s: float = 10.0


class DaemonPool:
    """A fixed number of daemon threads running submitted calls, first come first served.

    What `ThreadPoolExecutor` does, less the join at exit: `shutdown` cancels the calls
    still queued and returns at once, and the process may exit while a call runs.

    Parameters
    ----------
    workers:
        Threads, started on the first `submit`.
    name:
        Prefix of the threads' names.
    """

    def __init__(self, workers: int, name: str):
        self._workers = workers
        self._name = name
        self._queue: queue.SimpleQueue[tuple[Future, Callable[[], object]] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._idle = threading.Condition()
        self._running = 0

    def submit(self, fn: Callable[[], object]) -> Future:
        """Queue ``fn()``; its `Future` holds the result or the exception.

        Raises
        ------
        RuntimeError
            After `shutdown`.
        """
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the search pool is shut down")
            if len(self._threads) < self._workers:
                thread = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
                thread.start()
                self._threads.append(thread)
            self._queue.put((future, fn))
        return future

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn = item
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while queued (its request timed out or the server stops)
            with self._idle:
                self._running += 1
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting request
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                with self._idle:
                    self._running -= 1
                    self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the running calls to return; True when none runs."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def shutdown(self) -> None:
        """Cancel every queued call and stop the idle threads; running calls are not waited for."""
        with self._lock:
            self._closed = True
            threads = len(self._threads)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in range(threads):
            self._queue.put(None)


class Service:
    """The served repositories plus the bounded search pool.

    Parameters
    ----------
    repos:
        The roots being served.
    limits:
        Thread pool size, queue bound and timeout for searches.
    pool:
        Run searches on this pool, shared with other services (the daemon's views of its
        roots); default a pool of ``limits.workers`` threads of its own.
    """

    def __init__(self, repos: RepoSet, limits: Limits = Limits(), *, pool: DaemonPool | None = None):
        self.repos = repos
        self.limits = limits
        self.started_at = time.time()
        self._pool = pool if pool is not None else DaemonPool(limits.workers, "codesearch-search")
        self._pending = 0  # searches running or waiting
        self._pending_lock = threading.Lock()
        # Searches in flight: each one's clock (its filters stop when it is stopped) and the
        # future its request waits on besides the search, set when the server stops.
        self._stopping = False
        self._in_flight: dict[Deadline, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}

    def stop(self) -> None:
        """Answer every search in flight with `ServerStoppingError` now, stop their filters
        at their next look at the clock, and refuse new ones (on SIGTERM, before the HTTP
        server's graceful shutdown, which would otherwise cancel them: a plain-text 500 and
        a traceback each). Safe from a signal handler: it only sets flags and schedules."""
        with self._pending_lock:
            self._stopping = True
            in_flight = list(self._in_flight.items())
        for deadline, (loop, stopped) in in_flight:
            deadline.stop()
            with contextlib.suppress(RuntimeError):  # (a loop that closed meanwhile)
                loop.call_soon_threadsafe(_settle, stopped)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the search pool and close the repositories, within about ``timeout`` seconds.

        Queued searches are cancelled. Running ones get ``timeout`` to finish; past it the
        repositories stay open under them (closing an index a thread is reading is how a
        process crashes) and the process exits without them: the pool's threads are daemon
        threads.
        """
        deadline = time.monotonic() + timeout
        self._pool.shutdown()
        if not self._pool.wait_idle(timeout):
            return
        self.repos.close(max(deadline - time.monotonic(), 0.0))

    # -- search --------------------------------------------------------------------------

    def search_sync(
        self,
        query: str | SearchRequest,
        k: int = 10,
        *,
        mode: str = "hybrid",
        lang: str | list[str] | None = None,
        glob: str | list[str] | None = None,
        files_only: bool = False,
        path: str | None = None,
        repo: str | None = None,
        **options: object,
    ) -> JSONDict:
        """Run one search in the calling thread; returns the CLI's ``--json`` document.

        ``query`` is a `SearchRequest` (the routes build one), or the query text with the
        request's fields as keywords (``lang``/``glob`` for ``languages``/``globs``).
        Without ``path``/``repo`` every served root is searched and the hits are merged by
        score; with several roots served, each hit also carries ``repo`` (the root's name)
        and its ``path`` stays relative to that root. `RepoSet.select` says how ``path``
        and ``repo`` pick roots. Output controls (max_lines, min_score, budget) apply once,
        to the merged hits: a budget is the whole answer's.

        Raises
        ------
        PathError
            ``path`` outside the served roots, or naming nothing served.
        QueryError, NotIndexedError
            From the repository (NotIndexedError only when no selected root is ready).
        """
        from codesearch.globs import escape_glob, scope_globs
        from codesearch.search.snippets import fit, shape, with_context
        from codesearch.types import result_document

        request = query if isinstance(query, SearchRequest) else SearchRequest.of(
            query, k, mode=mode, language=lang, glob=glob, files_only=files_only, **options
        )
        if request.k > MAX_K:
            raise QueryError(f"k={request.k} is more than this server returns (pass k <= {MAX_K})")
        selected = self.repos.select(path, repo)
        several = len(self.repos.repos) > 1
        results: list[tuple[str, SearchResult]] = []
        not_ready: list[NotIndexedError] = []
        for served, sub in selected:
            scoped = scope_globs(sub, request.globs)
            if sub is not None and (served.root / sub).is_file():
                if request.globs:
                    raise QueryError(f"path {path!r} is a file; a glob applies to folders (drop one of them)")
                # The file itself: anchored at the root (a bare "setup.py" would match one at
                # any depth) and escaped (a name with "[" or "{" is not a pattern).
                scoped = ("/" + escape_glob(sub),)
            try:
                result = served.query(request, path_rules=scoped)
            except NotIndexedError as exc:
                if len(selected) == 1:
                    raise
                not_ready.append(exc)  # search the roots that are ready, and say so
                continue
            if not several:
                return result_document(shape(result, request, served.root, index_dir=served.index_dir))
            widened = with_context(result, served.root, request.context, index_dir=served.index_dir)
            results.append((served.name, widened))
        if not results:
            raise not_ready[0]
        merged, names = _merge(request.query, request.k, results, [str(exc) for exc in not_ready])
        shaped = fit(merged, request)
        doc = result_document(shaped)
        for hit_doc, hit in zip(doc["results"], shaped.hits):
            hit_doc["repo"] = names[hit.chunk_id]
        return doc

    async def search(self, **request: object) -> JSONDict:
        """`search_sync` on the pool, bounded and timed out; ``request`` is its arguments,
        checked there (a `SearchRequest` is built in the pool, not on the event loop).

        Raises
        ------
        ServerBusyError
            Too many searches running or waiting (HTTP 503).
        SearchTimeoutError
            The search ran past ``limits.timeout_s`` (HTTP 504).
        """
        loop = asyncio.get_running_loop()
        # The filter's deadline comes just after the request's, so that the client always
        # sees the 504, never the filter's own error.
        deadline = Deadline(time.monotonic() + self.limits.timeout_s + 0.25)
        stopped = loop.create_future()
        with self._pending_lock:
            if self._stopping:
                raise ServerStoppingError(_STOPPING)
            if self._pending >= self.limits.max_pending:
                raise ServerBusyError(
                    f"{self._pending} searches are already queued (limit {self.limits.max_pending}); retry shortly"
                )
            self._pending += 1
            self._in_flight[deadline] = (loop, stopped)
        try:
            future = self._pool.submit(lambda: self._search_by(deadline, request))
        except BaseException:
            self._release_slot(deadline)
            raise
        # The slot is released when the thread is done, not when the client gives up:
        # a timed-out search still occupies a worker until it returns.
        future.add_done_callback(lambda _f: self._release_slot(deadline))
        search = asyncio.wrap_future(future, loop=loop)
        done, _ = await asyncio.wait({search, stopped}, timeout=self.limits.timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        # (A search that failed because the server stopped it is answered as stopped.)
        if search in done and not search.cancelled() and not (self._stopping and search.exception()):
            return search.result()
        search.cancel()  # (a search still queued never runs)
        if self._stopping:
            raise ServerStoppingError(_STOPPING)
        raise SearchTimeoutError(
            f"search took longer than {self.limits.timeout_s:g}s (narrow it with k, lang or glob, "
            "or start the server with a larger --search-timeout)"
        )

    def _search_by(self, deadline: Deadline, request: dict[str, object]) -> JSONDict:
        """`search_sync` in a pool thread; its glob filter gives up at ``deadline``, when the
        request has been answered 504 (the rest of a search is bounded by the request's
        limits, the filter by the clock)."""
        from codesearch.globs import glob_deadline

        with glob_deadline(deadline):
            return self.search_sync(**request)

    def _release_slot(self, deadline: Deadline) -> None:
        with self._pending_lock:
            self._pending -= 1
            self._in_flight.pop(deadline, None)

    # -- index, status, health -------------------------------------------------------------

    def index(self, path: str | None = None, *, rebuild: bool = False) -> JSONDict:
        """Queue an index run for the root of ``path`` (every root without one); returns at
        once. ``root`` and ``indexing`` describe the first root queued, ``roots`` lists all."""
        repos = [repo for repo, _ in self.repos.select(path)]
        states = [repo.request_index(rebuild=rebuild) for repo in repos]
        return {
            "root": str(repos[0].root),
            "roots": [str(r.root) for r in repos],
            "accepted": True,
            "rebuild": rebuild,
            "indexing": states[0].to_dict(),
        }

    def status(self, path: str | None = None) -> JSONDict:
        """Every root's index, indexer and watcher (or only the roots ``path`` selects)."""
        repos = [repo for repo, _ in self.repos.select(path)]
        return {
            "schema_version": SCHEMA_VERSION,
            "version": __version__,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started_at, 3),
            "search": {
                "workers": self.limits.workers,
                "max_pending": self.limits.max_pending,
                "timeout_s": self.limits.timeout_s,
                "pending": self._pending,
                "query_batching": batching_stats(),
            },
            "roots": [repo.status() for repo in repos],
        }

    def health(self) -> JSONDict:
        """Cheap liveness answer: no disk access, no lock."""
        return {
            "status": "ok",
            "version": __version__,
            "pid": os.getpid(),
            "roots": self.repos.roots,
            "repos": self.repos.names,
        }


def _settle(stopped: asyncio.Future) -> None:
    if not stopped.done():
        stopped.set_result(None)


def _merge(
    query: str, k: int, results: list[tuple[str, SearchResult]], not_ready: list[str]
) -> tuple[SearchResult, list[str]]:
    """One `SearchResult` from several roots' results: the best ``k`` hits by score, indexes
    used and notices from every root (a notice says which root), and each hit's root name.

    Chunk ids are per root, so a merged hit carries its position in ``names`` instead; the
    JSON document has no chunk id, and the caller turns the position into ``repo``.
    """
    import dataclasses


    # Stable: equal scores keep the served order of the roots.
    ranked = sorted(((hit, name) for name, result in results for hit in result.hits), key=lambda hn: -hn[0].score)[:k]
    names = [name for _, name in ranked]
    hits = [dataclasses.replace(hit, chunk_id=i) for i, (hit, _) in enumerate(ranked)]
    indexes = tuple(dict.fromkeys(index for _, result in results for index in result.indexes_used))
    notices = [*not_ready, *(f"{name}: {notice}" for name, result in results for notice in result.notices)]
    first = results[0][1]
    return SearchResult(query=query, mode=first.mode, hits=hits, indexes_used=indexes, notices=notices), names
