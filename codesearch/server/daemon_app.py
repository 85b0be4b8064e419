"""What the per-user daemon serves: every repository any client asks about, added on its
first request, with one model load shared by all of them.

The daemon is the server (`repos`, `service`, `app`, `mcp_tools`) with a registry of roots
that grows instead of a list fixed at start. Each request sees a view of the roots it is
about (`Registry.service`): the CLI's query one root, an agent session the roots its
``serve ... --mcp stdio`` named. Views share the served roots, the search threads and the
encoder pool, so N agent sessions on one repository are one model load, one watcher and
one index writer.

Routes under ``/daemon/`` (bearer token, loopback, as every route):

- ``POST /daemon/search``: one root's search (the CLI's ``query``), after a refresh of
  what changed on disk, as ``codesearch query`` does in its own process;
- ``POST /daemon/index``, ``GET /daemon/run``: queue a root's index run, follow it (and
  whether its watcher vouches that nothing changed: a no-op ``codesearch index`` then stats
  no file);
- ``POST /daemon/sessions``, ``DELETE /daemon/sessions/{id}``, ``/daemon/mcp/{id}``: an
  agent session's roots and its MCP endpoint (Streamable HTTP, stateless);
- ``GET /daemon/info``, ``POST /daemon/stop``: ``codesearch daemon status | stop``.

The JSON API and MCP of ``codesearch serve`` (``/search``, ``/status``, ``/mcp``, ...) are
there too, over every root served.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Receive, Scope, Send

from codesearch import __version__
from codesearch.api import DEFAULT, EncoderPool
from codesearch.api.refresh import Recorded
from codesearch.encoder.base import Encoder
from codesearch.errors import CodeSearchError, NotIndexedError, PathError
from codesearch.server.app import BearerAuth, BodyLimit, HostGuard, create_app, status_for
from codesearch.server.app import SearchRequest as SearchBody
from codesearch.server.discovery import pid_alive
from codesearch.server.memory import Meter, mapped_bytes, rss_bytes
from codesearch.server.repos import RepoOptions, RepoSet, ServedRepo, _labels
from codesearch.server.runtime_dir import PROTOCOL
from codesearch.server.service import DaemonPool, Limits, Service
from codesearch.store import IndexLock
from codesearch.types import DEFAULT_MAX_FILE_BYTES, JSONDict

log = logging.getLogger("codesearch.daemon")

#: How many dropped roots' last run states `Registry.dropped` keeps.
_DROPPED_KEPT = 64

#: How long a query waits for the run that indexes what changed on disk (its own refresh)
#: and, when a run was going already, for that one (it may be a first index, embedding for
#: minutes: the query then answers from what is ready).
REFRESH_WAIT_S = 30.0
REFRESH_WAIT_BUSY_S = 2.0
#: The HTTP status of a user's error that `serve` would answer 500 (see `daemon_routes`).
USER_ERROR = 422


class CountingPool(EncoderPool):
    """The encoder pool, logging each model load (``codesearch daemon logs`` shows them) and
    counting them (``daemon status``: one load per model, whoever asks), each with the heap
    it added (`codesearch.server.memory`)."""

    def __init__(self, meter: Meter | None = None) -> None:
        super().__init__()
        self.meter = meter if meter is not None else Meter()
        self.loads: list[dict[str, Any]] = []

    def load(self, name: str, *, device: str = "auto") -> Encoder:
        before = {id(e) for e in self.loaded()}
        t0 = time.perf_counter()
        with self.meter.model_load() as grown:
            encoder = super().load(name, device=device)
        if id(encoder) not in before:
            seconds = round(time.perf_counter() - t0, 3)
            heap = grown[0] if grown else None
            self.loads.append({"name": str(encoder.name), "device": device, "seconds": seconds, "heap_bytes": heap})
            log.info("loaded model %s on %s in %.1fs", encoder.name, device, seconds)
        return encoder


@dataclass
class Session:
    """An agent's ``serve ... --mcp stdio``: its roots, and the thin client's pid (while it
    lives the daemon does not exit for being idle)."""

    id: str
    roots: tuple[Path, ...]
    pid: int
    started_at: float = field(default_factory=time.time)


class McpScope:
    """The MCP server of one view of the roots, run in the daemon's event loop.

    Why one per view rather than one for the daemon: a tool call without ``path`` searches
    every root its server serves, and an agent started on one repository must not see the
    user's others; repository names (``repo``) are those of its own roots.
    """

    def __init__(self, service: Service, host: str):
        from codesearch.server.mcp_tools import build_mcp

        self.server = build_mcp(service)
        self.app = self.server.streamable_http_app(
            streamable_http_path="/mcp", stateless_http=True, json_response=True, host=host
        )
        self._started: asyncio.Event | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._started is None:
            self._started = asyncio.Event()
            self._task = asyncio.create_task(self._run())
        await self._started.wait()
        await self.app({**scope, "path": "/mcp", "raw_path": b"/mcp", "root_path": ""}, receive, send)

    async def _run(self) -> None:
        async with self.server.session_manager.run():
            assert self._started is not None
            self._started.set()
            await self._stop.wait()

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=2.0)


class Registry:
    """Every root the daemon serves, the views of them, the agent sessions, and activity.

    Parameters
    ----------
    limits:
        Search threads, queue bound and timeout (shared by every view: one pool).
    watch:
        Watch each root and re-index it on changes (the daemon does; tests may not).
    """

    def __init__(self, *, limits: Limits | None = None, watch: bool = True, debounce_s: float = 0.25,
                 query_batching: bool = True, host: str = "127.0.0.1"):
        limits = limits if limits is not None else Limits()
        self.limits = limits
        self.watch = watch
        self.debounce_s = debounce_s
        self.query_batching = query_batching
        self.host = host
        self.meter = Meter()
        self.pool = CountingPool(self.meter)
        self.search_pool = DaemonPool(limits.workers, "codesearch-search")
        self.run_lock = threading.Lock()  # one index run at a time, across every root
        self.repos: list[ServedRepo] = []  # the global view's list: it grows in place
        self.everything = Service(RepoSet.of(self.repos, self.pool), limits, pool=self.search_pool)
        self.sessions: dict[str, Session] = {}
        #: The last run state of roots no longer served because their first index run failed
        #: (an empty folder): the ``codesearch index`` that asked for the run reads it there.
        self.dropped: dict[Path, JSONDict] = {}
        self._ready: dict[Path, threading.Event] = {}
        self._views: dict[tuple[Path, ...], Service] = {}
        self._mcp: dict[tuple[Path, ...], McpScope] = {}
        self._lock = threading.RLock()
        self.started_at = time.time()
        self.last_activity = time.monotonic()
        self.in_flight = 0
        self._closed = False

    # -- roots -------------------------------------------------------------------------------

    def repo(self, root: str | os.PathLike[str], options: RepoOptions | None = None, *,
             index_dir: str | None = None, index_now: bool = False, defer_watch: bool = False) -> ServedRepo:
        """The served root at ``root``, added (and started: its reader opened, its watcher on)
        on first use. ``options`` None: the root's options as served, else as its index
        records them. Options that differ from the served ones replace the root (models
        stay loaded in the pool): an ``index --exclude ...`` changes what is indexed.

        Raises
        ------
        PathError
            ``root`` does not exist or is not a folder.
        """
        return self.repo_added(root, options, index_dir=index_dir, index_now=index_now, defer_watch=defer_watch)[0]

    def repo_added(self, root: str | os.PathLike[str], options: RepoOptions | None = None, *,
                   index_dir: str | None = None, index_now: bool = False, defer_watch: bool = False
                   ) -> tuple[ServedRepo, bool]:
        """`repo`, and whether the root was added (or replaced for new options) during this
        call, by it or by a call it waited for: the start's run then began after this call
        did, so it covers the caller's request (`ServedRepo.schedule`'s ``just_started``)."""
        path = _absolute(root)
        waited = False
        if not path.is_dir():
            raise PathError(f"path {str(root)!r} is not a folder (pass the folder of a repository)")
        wanted_dir = _absolute(index_dir) if index_dir else None
        while True:
            with self._lock:
                if self._closed:
                    raise CodeSearchError("the codesearch daemon is stopping (run the command again)")
                ready = self._ready.get(path)
                served = self._find(path)
                if ready is None or ready.is_set():
                    if served is not None and self._fits(served, options, wanted_dir):
                        return served, waited
                    ready = self._ready[path] = threading.Event()
                    break
            ready.wait()  # another request is adding this root: use what it made
            waited = True
        try:
            if options is None:
                options = self._recorded_options(path, wanted_dir)
            if served is not None:
                log.info("options of %s changed: %s", path, options)
                self._remove(served, wait=True)  # its writer must be gone before the new one runs
            added = ServedRepo(path, options, encoder_pool=self.pool, run_lock=self.run_lock,
                               query_batching=self.query_batching, name=path.name, meter=self.meter,
                               after_run=self._after_run)
            try:
                added.start(index_now=index_now, watch=self.watch, quiet_s=self.debounce_s, defer_watch=defer_watch)
            except BaseException:
                added.close(5.0)
                raise
            with self._lock:
                self.repos.append(added)
                self.dropped.pop(path, None)
                self._relabel()
            log.info("serving %s (index %s)", path, added.index_dir)
            return added, True
        finally:
            ready.set()

    def served(self, root: str | os.PathLike[str]) -> ServedRepo | None:
        """The root served at ``root`` (made absolute), or None; adds nothing."""
        path = _absolute(root)
        with self._lock:
            return self._find(path)

    def _find(self, path: Path) -> ServedRepo | None:
        return next((r for r in self.repos if r.root == path), None)

    @staticmethod
    def _fits(served: ServedRepo, options: RepoOptions | None, index_dir: Path | None) -> bool:
        if options is not None:
            return served.options == options
        return index_dir is None or served.index_dir == index_dir

    @staticmethod
    def _recorded_options(root: Path, index_dir: Path | None) -> RepoOptions:
        """A root added by a search: the walk options its index records, so that the watcher's
        runs index the files the user's ``index`` run chose (not every file)."""
        folder = index_dir or root / ".codesearch"
        try:
            recorded = Recorded.read(folder, DEFAULT_MAX_FILE_BYTES)
        except (CodeSearchError, OSError):
            return RepoOptions(index_dir=index_dir)
        return RepoOptions(include=recorded.include, exclude=recorded.exclude, index_dir=index_dir,
                           max_file_bytes=recorded.max_file_bytes)

    def _remove(self, served: ServedRepo, *, wait: bool = False) -> None:
        """Stop serving ``served``; ``wait``: return once its run (cancelled) and writer are
        closed, else close it in the background."""
        with self._lock:
            if served in self.repos:
                self.repos.remove(served)
            stale = [key for key in self._views if served.root in key]
            for key in stale:
                del self._views[key]
                self._mcp.pop(key, None)  # (its task ends with the loop; a new one is made)
        closer = threading.Thread(target=served.close, args=(30.0,), daemon=True)
        closer.start()
        if wait:
            closer.join(30.0)

    def _after_run(self, served: ServedRepo) -> None:
        """After each run of a root: one whose first run failed, leaving no index (an empty
        folder, a model that cannot load), is not served on (its watcher would run it again
        on every save, its error stay in ``daemon status`` for the daemon's life); the next
        request for it adds it again. A root of an agent session stays."""
        state = served.run_state
        if state.last_error is None or state.state != "idle" or served.indexed:
            return
        with self._lock:
            if served not in self.repos or any(served.root in s.roots for s in self.sessions.values()):
                return  # (an agent session's root stays: its watcher indexes the first files that come)
            self.dropped[served.root] = state.to_dict()
            while len(self.dropped) > _DROPPED_KEPT:
                self.dropped.pop(next(iter(self.dropped)))
        log.info("stopped serving %s: its first index run failed (%s)", served.root, state.last_error)
        self._remove(served)

    def drop_gone(self) -> list[Path]:
        """Stop serving the roots whose folder no longer exists (deleted, or moved away: a
        path is what a request names); returns them."""
        gone = [served for served in list(self.repos) if not served.root.is_dir()]
        for served in gone:
            log.info("stopped serving %s: the folder is gone", served.root)
            self._remove(served)
        return [served.root for served in gone]

    def _relabel(self) -> None:
        """Each root's name, as the global view's hits and ``repo`` use it (unique)."""
        for served, name in zip(self.repos, _labels([r.root for r in self.repos])):
            served.name = name

    # -- views -----------------------------------------------------------------------------------

    def service(self, roots: tuple[Path, ...]) -> Service:
        """The `Service` over exactly ``roots`` (served already), made once per set."""
        with self._lock:
            view = self._views.get(roots)
            if view is None:
                repos = [self._find(root) for root in roots]
                if any(r is None for r in repos):
                    raise NotIndexedError("a root of this request is no longer served (run the command again)")
                labels = _labels(list(roots))
                view_repos = [r if r.name == label else _Named(r, label) for r, label in zip(repos, labels)]
                view = self._views[roots] = Service(RepoSet.of(view_repos, self.pool), self.limits,
                                                    pool=self.search_pool)
            return view

    def mcp(self, roots: tuple[Path, ...]) -> McpScope:
        with self._lock:
            scope = self._mcp.get(roots)
            if scope is None:
                scope = self._mcp[roots] = McpScope(self.service(roots), self.host)
            return scope

    # -- refresh before a search ------------------------------------------------------------

    def known_current(self, served: ServedRepo) -> bool:
        """Whether the root's watcher vouches that no file of the work tree changed since a
        check found its index current (`ServedRepo.current_since`; what `refresh` trusts before
        a search), and no run of it is going: a ``codesearch index`` of it then needs no stat of
        every file (`GET /daemon/run`; it still checks what the watcher does not see: git's
        index and excludes, `codesearch.indexing.walk.vouched_unchanged`)."""
        return served.run_state.state == "idle" and served.watcher_vouches()

    def refresh(self, served: ServedRepo) -> list[str]:
        """What ``codesearch query`` does in its own process before searching, done by the
        writer of the root: index what changed on disk, and say so; then search the index
        as committed, never a generation behind it.

        The watcher would get there too, a quarter second after the last save; a query made
        right after an edit (an agent's, or a ``git checkout``) must not answer from before
        it. A run of another process is followed (`ServedRepo.catch_up`), not waited for.
        While the watcher has seen no event since a check that found the index current (its
        events caught up to this moment: `RepoWatcher.caught_up`), no file is looked at (a
        stat of every file costs seconds at 100,000 files); the generation committed is
        still checked (one read of the store).
        """
        served.catch_up()
        served.follow_models()
        if served.watcher_vouches():
            served.follow_committed()
            return []
        seen = served.events_seen()
        checked_at = time.time()  # (before the check looks at git's files and the work tree's)
        stale = served.check_files()
        if stale is None:
            return []
        if not stale.stale:
            # The store holds the files as they are: searches must read that generation. A
            # run may have committed it a moment ago and still be opening it for searches.
            served.follow_committed()
            served.current_at_events, served.current_since = seen, checked_at
            return []
        n = len(stale.added) + len(stale.changed) + len(stale.removed)
        busy = served.run_state.state != "idle"
        if not busy and IndexLock.writer_active(served.index_dir):
            return [f"{n} file(s) changed since the last run, but another process is updating the index; "
                    "searched the current index"]
        t0 = time.perf_counter()
        target = served.schedule()
        if not served.wait_runs(target, REFRESH_WAIT_BUSY_S if busy else REFRESH_WAIT_S):
            return [f"{n} file(s) changed since the last run; the daemon is indexing them now "
                    "('codesearch daemon status' shows it); searched what is ready"]
        error = served.run_state.last_error
        if error:
            return [f"{n} file(s) changed since the last run, but the index could not be updated ({error}); "
                    "searched the current index"]
        served.follow_committed()
        summary = served.run_state.last_summary or {}
        return [f"index refreshed: {n} file(s) added, changed or removed since the last run "
                f"({time.perf_counter() - t0:.1f}s)", *summary.get("notices", ())]

    # -- sessions, activity, status -----------------------------------------------------------

    def add_session(self, roots: tuple[Path, ...], pid: int) -> Session:
        session = Session(secrets.token_hex(8), roots, pid)
        with self._lock:
            self.sessions[session.id] = session
        log.info("agent session %s (pid %d) on %s", session.id, pid, ", ".join(map(str, roots)))
        return session

    def drop_session(self, sid: str) -> bool:
        with self._lock:
            return self.sessions.pop(sid, None) is not None

    def live_sessions(self) -> int:
        """Sessions whose thin client still runs (those of a client gone without saying so are dropped)."""
        with self._lock:
            for sid in [s.id for s in self.sessions.values() if not pid_alive(s.pid)]:
                del self.sessions[sid]
            return len(self.sessions)

    def busy(self) -> bool:
        """Anything that must keep the daemon up: a request, an index run, an agent session.
        (Asked every second by the idle watch, which is also when roots whose folder is gone
        are let go: `drop_gone`.)"""
        self.drop_gone()
        return bool(self.in_flight or self.live_sessions()
                    or any(r.run_state.state != "idle" for r in list(self.repos)))

    def info(self, idle_timeout_s: float) -> JSONDict:
        """``GET /daemon/info``: what ``codesearch daemon status`` shows."""
        self.drop_gone()
        served_now = list(self.repos)
        mapped = mapped_bytes(r.index_dir for r in served_now) or {}
        roots = []
        for served in served_now:
            state = served.run_state.to_dict()
            roots.append({
                "root": str(served.root), "index_dir": str(served.index_dir), "ready": served.ready,
                "watching": served.watcher is not None, "state": state["state"], "runs": state["runs"],
                "generation": state["generation"], "progress": state["progress"],
                "last_error": state["last_error"], "finished_at": state["finished_at"],
                "last_summary": state["last_summary"],
                # See codesearch.server.memory: the heap its opens added, the resident pages of
                # its mapped index files.
                "memory": {"heap_bytes": served.heap_bytes, "mapped_bytes": mapped.get(served.index_dir)},
            })
        return {
            "schema_version": 1,
            "version": __version__,
            "protocol": PROTOCOL,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "uptime_s": round(time.time() - self.started_at, 1),
            "idle_s": round(time.monotonic() - self.last_activity, 1),
            "idle_timeout_s": idle_timeout_s,
            "rss_bytes": rss_bytes(),
            "models": [{"name": e.name, "identity": e.identity, "dim": int(e.dim), "multivector": bool(e.multivector),
                        "heap_bytes": self._model_heap(e)}
                       for e in self.pool.loaded()],
            "model_loads": list(self.pool.loads),
            "roots": roots,
            "sessions": [{"id": s.id, "pid": s.pid, "roots": [str(r) for r in s.roots]}
                         for s in list(self.sessions.values())],
        }

    def _model_heap(self, encoder: Encoder) -> int | None:
        """The heap the load of ``encoder`` added (its last load's, by name)."""
        return next((load["heap_bytes"] for load in reversed(self.pool.loads) if load["name"] == encoder.name), None)

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._closed = True
            repos = list(self.repos)
        self.search_pool.shutdown()
        self.search_pool.wait_idle(min(timeout, 1.0))
        for served in repos:
            served.close(timeout)


def _absolute(path: str | os.PathLike[str]) -> Path:
    """``path`` resolved; it must be absolute: the daemon runs in a folder of its own, so a
    relative path would name a folder there, not the client's (clients resolve them).

    Raises
    ------
    PathError
        A relative path.
    """
    given = Path(path).expanduser()
    if not given.is_absolute():
        raise PathError(f"path {str(path)!r} is relative; the daemon needs an absolute path "
                        "(resolve it in the client, or pass --no-daemon)")
    return given.resolve()


class _Named:
    """A served root under another name in one view (two roots named ``app`` in a session)."""

    def __init__(self, repo: ServedRepo, name: str):
        self._repo = repo
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._repo, attr)


def not_ready_document(served: ServedRepo, request: SearchBody) -> JSONDict:
    """The answer to a search of a root with nothing searchable yet (its first index run is
    walking or chunking, or could not run): no hits and a notice of where the run is, at
    once. Not an error: the client would then search in its own process, loading the model
    and waiting for the index lock that the daemon's run holds (seconds, for nothing)."""
    from codesearch.types import SCHEMA_VERSION

    state = served.run_state
    progress = state.progress or {}
    if state.state != "idle":
        where = (f"{progress.get('stage')} {progress.get('done', 0)}/{progress.get('total', 0)}" if progress
                 else state.state)
        notice = (f"the first index of {served.root} is running ({where}); nothing is searchable yet, its files "
                  "are within seconds of the lexical commit ('codesearch daemon status' shows it)")
    else:
        why = f": {state.last_error}" if state.last_error else ""
        notice = f"{served.root} has no searchable index yet{why} (run 'codesearch index {served.root}')"
    mode = getattr(request.mode, "value", request.mode)
    return {"schema_version": SCHEMA_VERSION, "query": request.query, "mode": str(mode), "indexes_used": [],
            "notices": [notice], "results": []}


# -- the /daemon routes -------------------------------------------------------------------


class DaemonSearch(BaseModel):
    """``POST /daemon/search``: a root, and the ``POST /search`` body for it."""

    model_config = ConfigDict(extra="forbid")

    root: str = Field(description="The repository folder (absolute).")
    index_dir: str | None = Field(None, description="Its index folder, when not ROOT/.codesearch.")
    refresh: bool = Field(True, description="Index what changed on disk first (codesearch query's default).")
    request: SearchBody


class Options(BaseModel):
    """The ``codesearch index`` options of a root (model fields: a name, null for 'none', or
    absent for the index's own / the default)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = DEFAULT
    multi_model: str | None = DEFAULT
    device: str = "auto"
    include: list[str] = []
    exclude: list[str] = []
    index_dir: str | None = None
    max_file_bytes: int = Field(1_000_000, ge=1)

    def repo_options(self) -> RepoOptions:
        return RepoOptions(
            model=self.model, multi_model=self.multi_model, device=self.device, include=tuple(self.include),
            exclude=tuple(self.exclude), index_dir=_absolute(self.index_dir) if self.index_dir else None,
            max_file_bytes=self.max_file_bytes,
        )


class DaemonIndex(BaseModel):
    model_config = ConfigDict(extra="forbid")

    root: str
    options: Options = Options()
    rebuild: bool = False


class DaemonRoot(BaseModel):
    model_config = ConfigDict(extra="forbid")

    root: str


class DaemonSession(BaseModel):
    model_config = ConfigDict(extra="forbid")

    roots: list[str] = Field(min_length=1)
    options: Options | None = None
    pid: int
    index_on_start: bool = True


def daemon_routes(registry: Registry, *, idle_timeout_s: float, on_stop: Callable[[], None]) -> FastAPI:
    """The FastAPI app of the ``/daemon/`` routes (auth and guards are added by `build_app`)."""
    app = FastAPI(title="codesearch daemon", version=__version__, openapi_url=None, docs_url=None, redoc_url=None)

    @app.exception_handler(CodeSearchError)
    async def _codesearch_error(request: Request, exc: CodeSearchError) -> JSONResponse:
        # Every CodeSearchError is a user's one-line error with its way out (a model that
        # cannot load, a folder that is gone): the CLI prints it and exits 1, as it would
        # have in its own process. `serve` answers 500 to some, as the server's own failures
        # there; here the daemon is the user's own process.
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        status = status_for(exc)
        return JSONResponse({"error": type(exc).__name__, "detail": str(exc)},
                            status_code=USER_ERROR if status == 500 else status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg', 'invalid')}"
                 for e in exc.errors()]
        return JSONResponse({"error": "ValidationError", "detail": "; ".join(parts)}, status_code=400)

    @app.post("/daemon/search")
    async def search(body: DaemonSearch) -> JSONResponse:
        served = await anyio.to_thread.run_sync(
            lambda: registry.repo(body.root, index_dir=body.index_dir, defer_watch=True))  # (it answers first)
        if not served.ready:
            return JSONResponse(not_ready_document(served, body.request))
        notices = await anyio.to_thread.run_sync(registry.refresh, served) if body.refresh else []
        view = registry.service((served.root,))
        req = body.request
        fields = req.model_dump(exclude={"path", "repo", "lang", "glob"})
        doc = await view.search(lang=req.lang, glob=req.glob, path=req.path, repo=None, **fields)
        if notices:
            doc = {**doc, "notices": [*notices, *doc.get("notices", [])]}
        return JSONResponse(doc)

    @app.post("/daemon/index")
    async def index(body: DaemonIndex) -> dict[str, Any]:
        options = body.options.repo_options()
        served, added = await anyio.to_thread.run_sync(lambda: registry.repo_added(body.root, options))
        target = served.schedule(rebuild=body.rebuild, just_started=added)
        return {"root": str(served.root), "index_dir": str(served.index_dir), "target_runs": target,
                "indexing": served.run_state.to_dict()}

    def served_at(root: str) -> ServedRepo:
        served = registry.served(root)
        if served is None:
            raise PathError(f"{root!r} is not served by the daemon (run 'codesearch index {root}')")
        return served

    @app.get("/daemon/run")
    def run(root: str = Query(...)) -> dict[str, Any]:
        dropped = registry.dropped.get(_absolute(root)) if registry.served(root) is None else None
        if dropped is not None:  # its first run failed: the root is not served on, the run's state stays
            return {"root": str(_absolute(root)), "indexing": dropped}
        served = served_at(root)
        return {"root": str(served.root), "index_dir": str(served.index_dir), "indexing": served.run_state.to_dict(),
                "current": registry.known_current(served), "current_since": served.current_since}

    @app.post("/daemon/cancel")
    def cancel(body: DaemonRoot) -> dict[str, Any]:
        """End the root's run going now (Ctrl-C of the ``codesearch index`` that asked for it)."""
        served = served_at(body.root)
        return {"root": str(served.root), "cancelled": served.cancel(), "indexing": served.run_state.to_dict()}

    @app.post("/daemon/sessions")
    async def add_session(body: DaemonSession) -> dict[str, Any]:
        options = body.options.repo_options() if body.options is not None else None

        def add() -> tuple[Path, ...]:
            return tuple(registry.repo(root, options, index_now=body.index_on_start).root for root in body.roots)

        roots = await anyio.to_thread.run_sync(add)
        roots = tuple(dict.fromkeys(roots))
        registry.service(roots)
        session = registry.add_session(roots, body.pid)
        return {"id": session.id, "mcp": f"/daemon/mcp/{session.id}", "roots": [str(r) for r in roots]}

    @app.delete("/daemon/sessions/{sid}")
    def drop_session(sid: str) -> dict[str, Any]:
        return {"dropped": registry.drop_session(sid)}

    @app.get("/daemon/info")
    def info() -> dict[str, Any]:
        return registry.info(idle_timeout_s)

    @app.post("/daemon/stop")
    def stop() -> dict[str, Any]:
        log.info("stop requested")
        on_stop()
        return {"stopping": os.getpid()}

    return app


class _McpSessions:
    """ASGI: ``/daemon/mcp/{id}`` to the session's MCP server, anything else to ``app``."""

    PREFIX = "/daemon/mcp/"

    def __init__(self, app: ASGIApp, registry: Registry):
        self.app = app
        self.registry = registry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith(self.PREFIX):
            await self.app(scope, receive, send)
            return
        session = self.registry.sessions.get(path[len(self.PREFIX):].strip("/"))
        if session is None:
            response = JSONResponse({"error": "NotFound", "detail": "no such agent session (the daemon restarted: "
                                     "register again)"}, status_code=404)
            await response(scope, receive, send)
            return
        try:
            mcp = self.registry.mcp(session.roots)
        except CodeSearchError as exc:
            await JSONResponse({"error": type(exc).__name__, "detail": str(exc)}, status_code=409)(scope, receive,
                                                                                                   send)
            return
        await mcp.handle(scope, receive, send)


class _Activity:
    """ASGI: count requests in flight and the time of the last one (the idle exit reads both).
    Looking at the daemon (``daemon status``) is not work that keeps it up."""

    PASSIVE = frozenset({"/daemon/info", "/health"})

    def __init__(self, app: ASGIApp, registry: Registry):
        self.app = app
        self.registry = registry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.PASSIVE:
            await self.app(scope, receive, send)
            return
        self.registry.in_flight += 1
        self.registry.last_activity = time.monotonic()
        try:
            await self.app(scope, receive, send)
        finally:
            self.registry.in_flight -= 1
            self.registry.last_activity = time.monotonic()


def build_app(registry: Registry, *, token: str, idle_timeout_s: float, on_stop: Callable[[], None]) -> ASGIApp:
    """The daemon's ASGI app: ``/daemon/`` routes and agent sessions, and ``serve``'s whole
    app over every root; all behind the token and the loopback Host/Origin guard."""
    host = registry.host
    routes = _McpSessions(daemon_routes(registry, idle_timeout_s=idle_timeout_s, on_stop=on_stop), registry)
    guarded_routes = HostGuard(BearerAuth(BodyLimit(routes), token), host)
    everything = create_app(registry.everything, token=token, mcp=True, host=host)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith("/daemon/"):
            await guarded_routes(scope, receive, send)
        else:
            await everything(scope, receive, send)  # and the lifespan, which its /mcp needs

    return _Activity(app, registry)


__all__ = ["Registry", "build_app"]
