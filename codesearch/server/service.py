"""What the HTTP routes and the MCP tools both call: search, index, status, health.

Searches run on a thread pool of bounded size, never on the event loop, with a per-request
timeout and a bounded number of waiting requests: a flood of slow queries gets quick 503s
instead of an ever-growing queue, and one slow search cannot stall the others.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from codesearch import __version__
from codesearch.errors import QueryError, ServerError
from codesearch.request import SearchRequest
from codesearch.server.batching import batching_stats
from codesearch.server.repos import RepoSet

SCHEMA_VERSION = 1
MAX_K = 1000  # results per search; bounds the work and the response size of one request


class ServerBusyError(ServerError):
    """More searches are waiting than the server queues; retry shortly."""


class SearchTimeoutError(ServerError):
    """A search took longer than the server's per-request timeout."""


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
        in the background and its slot frees then).
    """

    workers: int = 8
    max_pending: int = 64
    timeout_s: float = 10.0


class Service:
    """The served repositories plus the bounded search pool.

    Parameters
    ----------
    repos:
        The roots being served.
    limits:
        Thread pool size, queue bound and timeout for searches.
    """

    def __init__(self, repos: RepoSet, limits: Limits = Limits()):
        self.repos = repos
        self.limits = limits
        self.started_at = time.time()
        self._executor = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="codesearch-search")
        self._pending = 0  # searches running or waiting
        self._pending_lock = threading.Lock()

    def close(self) -> None:
        """Stop the search pool (waits for running searches) and close the repositories."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.repos.close()

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
        **options: Any,
    ) -> dict[str, Any]:
        """Run one search in the calling thread; returns the CLI's ``--json`` document.

        ``query`` is a `SearchRequest` (the routes build one), or the query text with the
        request's fields as keywords (``lang``/``glob`` for ``languages``/``globs``).

        Raises
        ------
        PathError
            ``path`` outside the served roots.
        QueryError, NotIndexedError
            From the repository.
        """
        from codesearch.api import result_document
        from codesearch.globs import scope_globs
        from codesearch.snippets import shape

        request = query if isinstance(query, SearchRequest) else SearchRequest.of(
            query, k, mode=mode, language=lang, glob=glob, files_only=files_only, **options
        )
        if request.k > MAX_K:
            raise QueryError(f"k={request.k} is more than this server returns (pass k <= {MAX_K})")
        repo, subdir = self.repos.resolve(path)
        result = repo.query(
            request.query, request.k, mode=request.mode.value, language=request.languages,
            glob=scope_globs(subdir, request.globs), files_only=request.files_only,
        )
        return result_document(shape(result, request, repo.root))

    async def search(self, **request: Any) -> dict[str, Any]:
        """`search_sync` on the pool, bounded and timed out.

        Raises
        ------
        ServerBusyError
            Too many searches running or waiting (HTTP 503).
        SearchTimeoutError
            The search ran past ``limits.timeout_s`` (HTTP 504).
        """
        with self._pending_lock:
            if self._pending >= self.limits.max_pending:
                raise ServerBusyError(
                    f"{self._pending} searches are already queued (limit {self.limits.max_pending}); retry shortly"
                )
            self._pending += 1
        loop = asyncio.get_running_loop()
        try:
            future = self._executor.submit(lambda: self.search_sync(**request))
        except BaseException:
            self._release_slot()
            raise
        # The slot is released when the thread is done, not when the client gives up:
        # a timed-out search still occupies a worker until it returns.
        future.add_done_callback(lambda _f: self._release_slot())
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future, loop=loop), self.limits.timeout_s)
        except asyncio.TimeoutError:
            raise SearchTimeoutError(
                f"search took longer than {self.limits.timeout_s:g}s (narrow it with k, lang or glob, "
                "or start the server with a larger --search-timeout)"
            ) from None

    def _release_slot(self) -> None:
        with self._pending_lock:
            self._pending -= 1

    # -- index, status, health -------------------------------------------------------------

    def index(self, path: str | None = None, *, rebuild: bool = False) -> dict[str, Any]:
        """Queue an index run for the root of ``path``; returns at once."""
        repo, _ = self.repos.resolve(path)
        state = repo.request_index(rebuild=rebuild)
        return {"root": str(repo.root), "accepted": True, "rebuild": rebuild, "indexing": state.to_dict()}

    def status(self, path: str | None = None) -> dict[str, Any]:
        """Every root's index, indexer and watcher (or only the root of ``path``)."""
        repos = [self.repos.resolve(path)[0]] if path else self.repos.repos
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

    def health(self) -> dict[str, Any]:
        """Cheap liveness answer: no disk access, no lock."""
        return {"status": "ok", "version": __version__, "pid": os.getpid(), "roots": self.repos.roots}
