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
from codesearch.errors import NotIndexedError, QueryError, ServerError
from codesearch.types import SearchRequest
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
        repo: str | None = None,
        **options: Any,
    ) -> dict[str, Any]:
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
        from codesearch.api import fit_result, scope_globs, shape_result, widen_result
        from codesearch.types import result_document

        request = query if isinstance(query, SearchRequest) else SearchRequest.of(
            query, k, mode=mode, language=lang, glob=glob, files_only=files_only, **options
        )
        if request.k > MAX_K:
            raise QueryError(f"k={request.k} is more than this server returns (pass k <= {MAX_K})")
        selected = self.repos.select(path, repo)
        several = len(self.repos.repos) > 1
        results: list[tuple[str, Any]] = []
        not_ready: list[NotIndexedError] = []
        for served, sub in selected:
            scoped = scope_globs(sub, request.globs)
            if sub is not None and (served.root / sub).is_file():
                if request.globs:
                    raise QueryError(f"path {path!r} is a file; a glob applies to folders (drop one of them)")
                scoped = (sub,)
            try:
                result = served.query(
                    request.query, request.k, mode=request.mode.value, language=request.languages, glob=scoped,
                    files_only=request.files_only,
                )
            except NotIndexedError as exc:
                if len(selected) == 1:
                    raise
                not_ready.append(exc)  # search the roots that are ready, and say so
                continue
            if not several:
                return result_document(shape_result(result, request, served.root, index_dir=served.index_dir))
            results.append((served.name, widen_result(result, served.root, request.context, index_dir=served.index_dir)))
        if not results:
            raise not_ready[0]
        merged, names = _merge(request.query, request.k, results, [str(exc) for exc in not_ready])
        shaped = fit_result(merged, request)
        doc = result_document(shaped)
        for hit_doc, hit in zip(doc["results"], shaped.hits):
            hit_doc["repo"] = names[hit.chunk_id]
        return doc

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
        """Queue an index run for the root of ``path`` (every root without one); returns at
        once. ``root`` and ``indexing`` describe the first root queued, ``roots`` lists all."""
        repos = [repo for repo, _ in self.repos.select(path)]
        states = [repo.request_index(rebuild=rebuild) for repo in repos]
        return {"root": str(repos[0].root), "roots": [str(r.root) for r in repos], "accepted": True,
                "rebuild": rebuild, "indexing": states[0].to_dict()}

    def status(self, path: str | None = None) -> dict[str, Any]:
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

    def health(self) -> dict[str, Any]:
        """Cheap liveness answer: no disk access, no lock."""
        return {"status": "ok", "version": __version__, "pid": os.getpid(), "roots": self.repos.roots,
                "repos": self.repos.names}


def _merge(query: str, k: int, results: list[tuple[str, Any]], not_ready: list[str]) -> tuple[Any, list[str]]:
    """One `SearchResult` from several roots' results: the best ``k`` hits by score, indexes
    used and notices from every root (a notice says which root), and each hit's root name.

    Chunk ids are per root, so a merged hit carries its position in ``names`` instead; the
    JSON document has no chunk id, and the caller turns the position into ``repo``.
    """
    import dataclasses

    from codesearch.types import SearchResult

    # Stable: equal scores keep the served order of the roots.
    ranked = sorted(((hit, name) for name, result in results for hit in result.hits), key=lambda hn: -hn[0].score)[:k]
    names = [name for _, name in ranked]
    hits = [dataclasses.replace(hit, chunk_id=i) for i, (hit, _) in enumerate(ranked)]
    indexes = tuple(dict.fromkeys(index for _, result in results for index in result.indexes_used))
    notices = [*not_ready, *(f"{name}: {notice}" for name, result in results for notice in result.notices)]
    first = results[0][1]
    return SearchResult(query=query, mode=first.mode, hits=hits, indexes_used=indexes, notices=notices), names
