"""The served repositories: one writer and a swappable reader per root.

Why two `CodeSearch` objects per root instead of one: `CodeSearch` makes an index run wait
for running searches and block new ones until it is done (a read/write lock), which is
right for a script but would stall every request of a server for the whole run (seconds
when a model encodes). Here the *writer* only indexes, and searches go to a *reader* that
holds the last committed generation in memory. After each run a fresh reader is opened and
warmed on the new generation and swapped in under a lock; requests already running finish
on the old reader, which is closed when its last request returns. A search therefore sees
one committed generation or the next, never a half-written one, and never waits for a run.

Encoders are loaded once and handed to each new reader, so a swap costs opening the
indexes, not loading a model; roots share a model when they name the same one or when their
indexes record the same one (same identity), and a reader's pair of encoders is composed
from models already loaded for each role.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codesearch.api import DEFAULT
from codesearch.errors import CodeSearchError, IndexLockedError, NotIndexedError, PathError

log = logging.getLogger("codesearch.server")

LOCKED_RETRY_S = 1.0  # another process holds the index lock: try the run again after this


@dataclass(frozen=True, slots=True)
class RepoOptions:
    """How each served root's `CodeSearch` is configured (the `codesearch index` options).

    ``model``/``multi_model`` use `codesearch.api.DEFAULT` for "what the index records".
    """

    model: Any = DEFAULT  # hub id or folder; DEFAULT: what the index records; None: no dense
    multi_model: Any = DEFAULT  # same, for the ColBERT model
    device: str = "auto"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    index_dir: Path | None = None

    def kwargs(self) -> dict[str, Any]:
        return {
            "index_dir": self.index_dir,
            "model": self.model,
            "multi_model": self.multi_model,
            "device": self.device,
            "include": self.include,
            "exclude": self.exclude,
        }


@dataclass(slots=True)
class IndexRunState:
    """What the background indexer of one root is doing; ``GET /status`` shows it.

    ``state`` is ``idle``, ``queued`` (a run was asked for and starts as soon as the
    current one ends) or ``running``.
    """

    state: str = "idle"
    runs: int = 0  # finished runs (success or failure)
    generation: int = 0  # reader swaps; bumps when new results become searchable
    started_at: float | None = None
    finished_at: float | None = None
    progress: dict[str, Any] | None = None
    last_summary: dict[str, Any] | None = None
    last_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _Cancelled(BaseException):
    """Raised from the progress callback to stop a run at shutdown.

    A BaseException so that no ``except Exception`` inside the pipeline swallows it; the
    pipeline's own cleanup (lock release, uncommitted transaction dropped) still runs.
    """


@dataclass(eq=False)
class _Reader:
    """One generation's `CodeSearch` and its searcher, opened and warmed up front.

    Why hold the searchers rather than call ``cs.query``: `CodeSearch.query` first checks
    that ``store.sqlite`` exists on disk, and a rebuild deletes it for the length of the
    run; the searchers already hold this generation in memory and go on answering.
    """

    cs: Any  # codesearch.api.CodeSearch
    # "lexical" | "full" -> (Searcher, notices): one Searcher, with the notices of each kind
    searchers: dict[str, tuple[Any, list[str]]] | None = None
    users: int = 0
    retired: bool = False

    def query(self, query: str, k: int, **options: Any) -> Any:
        if self.searchers is None:
            return self.cs.query(query, k, refresh=False, **options)
        searcher, notices = self.searchers["lexical" if options.get("mode") == "lexical" else "full"]
        result = searcher.search(query, k, **options)
        if notices:
            result = dataclasses.replace(result, notices=[*notices, *result.notices])
        return result


class ServedRepo:
    """One served root: its reader, its writer, its background indexer thread.

    Parameters
    ----------
    root:
        The repository folder.
    options:
        Model and file options, as for `codesearch index`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        options: RepoOptions,
        *,
        shared_encoders: dict | None = None,
        by_identity: dict | None = None,
        run_lock: Any = None,
        query_batching: bool = True,
    ):
        from codesearch.api import CodeSearch

        self.options = options
        self._writer = CodeSearch(root, **options.kwargs())
        self.root: Path = self._writer.root
        self.index_dir: Path = self._writer.index_dir
        # Status reads get their own object: the writer's status() waits for its runs.
        self._statuser = CodeSearch(root, **options.kwargs())
        self._encoders: dict[Any, Any] = {}  # (model, multi_model) -> loaded encoders, this root's
        # Models named explicitly are the same models for every root, so roots share them;
        # DEFAULT resolves to whatever each index records, so those stay per root.
        self._shared = shared_encoders if shared_encoders is not None else {}
        # Every loaded encoder by identity (name + hash of config and weights), across roots:
        # roots whose indexes record the same model (DEFAULT) share it through this.
        self._by_identity = by_identity if by_identity is not None else {}
        # One index run at a time across roots: they would only compete for the same cores,
        # and the second run finds the models the first one loaded.
        self._run_lock = run_lock if run_lock is not None else threading.Lock()
        self._query_batching = query_batching
        self._ref_lock = threading.Lock()
        self._reader: _Reader | None = None
        self._cond = threading.Condition()
        self._requested = False
        self._rebuild = False
        self._stopping = False
        self.run_state = IndexRunState()
        self.watcher: Any = None  # RepoWatcher, set by start()
        self.watch_error: str | None = None
        self._thread = threading.Thread(target=self._index_loop, name=f"codesearch-index-{self.root.name}", daemon=True)

    # -- life cycle --------------------------------------------------------------------

    def start(self, *, index_now: bool, watch: bool, quiet_s: float | None = None) -> None:
        """Open the reader on the current index (loading its models), start the indexer.

        Parameters
        ----------
        index_now:
            Run one incremental index at once (catches up with edits made while no server
            ran; builds the index of a root that has none).
        watch:
            Re-index on file changes (debounced).
        """
        if self.indexed:
            self._swap_reader()
        self._thread.start()
        if index_now or not self.indexed:
            self.request_index()
        if watch:
            from codesearch.server.watch import QUIET_S, RepoWatcher

            watcher = RepoWatcher(self.root, self.index_dir, self.request_index, quiet_s=quiet_s or QUIET_S)
            try:
                watcher.start()
            except OSError as exc:
                # Typically the inotify watch limit on a huge tree: serve without watching
                # (POST /index still works) rather than not at all.
                watcher.stop()
                self.watch_error = (
                    f"cannot watch {self.root} ({exc}); changes are picked up by POST /index "
                    "(or raise fs.inotify.max_user_watches)"
                )
                log.warning("%s", self.watch_error)
            else:
                self.watcher = watcher

    def close(self, timeout: float = 30.0) -> None:
        """Stop watching, stop the indexer (a running run is cancelled), close everything.

        A cancelled run leaves the previous index (the pipeline commits in one transaction
        and replaces derived files atomically).
        """
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        with self._ref_lock:
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.cs.close()
        self._statuser.close()
        self._writer.close()

    @property
    def indexed(self) -> bool:
        """True when the root has a committed index."""
        return (self.index_dir / "store.sqlite").is_file()

    # -- searching ---------------------------------------------------------------------

    def query(
        self,
        query: str,
        k: int = 10,
        *,
        mode: str = "hybrid",
        language: str | None = None,
        glob: str | None = None,
        files_only: bool = False,
    ) -> Any:
        """Search the last committed generation; returns the `SearchResult`.

        Raises
        ------
        NotIndexedError
            When the first index run has not finished yet.
        QueryError
            Invalid query or options (from `CodeSearch.query`).
        """
        reader = self._lease()
        try:
            return reader.query(query, k, mode=mode, language=language, glob=glob, files_only=files_only)
        finally:
            self._unlease(reader)

    def _lease(self) -> _Reader:
        with self._ref_lock:
            reader = self._reader
            if reader is None:
                what = "is being indexed" if self.run_state.state != "idle" else "has no index"
                raise NotIndexedError(
                    f"{str(self.root)!r} {what} (wait for GET /status to show a finished run, "
                    "or POST /index to build it)"
                )
            reader.users += 1
            return reader

    def _unlease(self, reader: _Reader) -> None:
        with self._ref_lock:
            reader.users -= 1
            close = reader.retired and reader.users == 0
        if close:
            reader.cs.close()

    def _swap_reader(self) -> None:
        """Open a reader on the current generation, warm it, and make it the current one."""
        from codesearch.api import CodeSearch

        cs = CodeSearch(self.root, **self.options.kwargs())
        self._share_encoders(cs)
        # Open the searcher (lexical, then with the query encoders attached) and run one
        # query of each kind before the swap, so the first request after it pays nothing.
        get_searcher = getattr(cs, "_get_searcher", None)
        searchers = None
        if callable(get_searcher):
            searchers = {"lexical": get_searcher(lexical=True), "full": get_searcher(lexical=False)}
            # Both entries are usually one Searcher: pin and wrap each object once.
            for searcher in {id(s): s for s, _ in searchers.values()}.values():
                _pin_snapshot(searcher)
                if self._query_batching:
                    _batch_queries(searcher)
        reader = _Reader(cs, searchers)
        reader.query("warm up", 1, mode="lexical")
        reader.query("warm up", 1, mode="hybrid")
        self._collect_encoders(cs)
        with self._ref_lock:
            old, self._reader = self._reader, reader
            if old is not None:
                old.retired = True
                close_old = old.users == 0
            else:
                close_old = False
            self.run_state.generation += 1
        if close_old and old is not None:
            old.cs.close()

    # Why reach into `CodeSearch._encoders`: `CodeSearch` loads its encoders lazily per
    # object, and a reader per generation would otherwise load the models again on every
    # swap. The dict maps the (model, multi_model) arguments to (encoders, notices); the
    # same arguments on the same root resolve to the same models.
    def _share_encoders(self, cs: Any) -> None:
        pool = getattr(cs, "_encoders", None)
        if not isinstance(pool, dict):
            return
        for key, value in [*self._shared.items(), *self._encoders.items()]:
            pool.setdefault(key, value)
        # The writer asks for (model, multi_model); a reader asks for what the index holds,
        # e.g. (DEFAULT, None) for a dense-only index. Compose such a pair from encoders
        # already loaded for each role, so a model is never loaded a second time.
        wanted = [(cs.model, cs.multi_model)]
        search_models = getattr(cs, "_search_models", None)
        if callable(search_models):
            with contextlib.suppress(CodeSearchError, OSError):
                wanted.append(tuple(search_models()))
        for key in wanted:
            if key not in pool and (composed := self._compose(key)) is not None:
                pool[key] = composed

    def _compose(self, key: tuple[Any, Any]) -> tuple[Any, list[str]] | None:
        """Encoders for ``key`` from the ones loaded for each role, loading only the
        roles that are missing; None when no role is loaded yet (the caller loads all)."""
        from codesearch.indexer.pipeline import resolve_encoders

        found: dict[str, Any] = {}
        missing: dict[str, Any] = {}
        for role, arg in zip(("dense", "multi"), key):
            if arg is None:
                found[role] = None
                continue
            for (dense_arg, multi_arg), (encoders, _notices) in [*self._encoders.items(), *self._shared.items()]:
                if (dense_arg if role == "dense" else multi_arg) == arg and getattr(encoders, role, None) is not None:
                    found[role] = getattr(encoders, role)
                    break
            else:
                recorded = self._recorded_identities().get(role) if arg == DEFAULT else None
                if recorded is not None and recorded in self._by_identity:
                    found[role] = self._by_identity[recorded]
                else:
                    missing[role] = arg
        if missing and not any(found.values()):
            return None
        # resolve_encoders loads only the missing roles and records the roles switched off
        # ('none', or off in the index's models.disabled): the run must write them again.
        return resolve_encoders(
            key[0], key[1], device=self.options.device, index_dir=self.index_dir,
            loaded={role: enc for role, enc in found.items() if enc is not None},
        )

    def _recorded_identities(self) -> dict[str, str]:
        """Role (``dense`` | ``multi``) -> identity of the model this root's index records."""
        from codesearch.indexer.store import Store

        path = self.index_dir / "store.sqlite"
        if not path.is_file():
            return {}
        try:
            with Store(path, readonly=True) as store:
                records = store.models()
        except (CodeSearchError, OSError, sqlite3.Error):
            return {}
        roles = {"dense": "dense", "colbert": "multi"}
        return {roles[role]: rec.identity for role, rec in records.items() if role in roles}

    def _collect_encoders(self, cs: Any) -> None:
        pool = getattr(cs, "_encoders", None)
        if isinstance(pool, dict):
            for key, value in list(pool.items()):
                self._encoders.setdefault(key, value)
                if isinstance(key, tuple) and DEFAULT not in key:
                    self._shared.setdefault(key, value)
                for role in ("dense", "multi"):
                    encoder = getattr(value[0], role, None)
                    identity = getattr(encoder, "identity", None)
                    if identity is not None:
                        self._by_identity.setdefault(identity, encoder)

    # -- indexing ----------------------------------------------------------------------

    def request_index(self, rebuild: bool = False) -> IndexRunState:
        """Ask for an incremental run (or a rebuild); returns at once.

        Requests that arrive while a run is going coalesce into one more run after it:
        a burst of saves, or a thousand-file checkout, costs at most two runs.
        """
        with self._cond:
            self._requested = True
            self._rebuild = self._rebuild or rebuild
            if self.run_state.state == "idle":
                self.run_state.state = "queued"
            self._cond.notify_all()
            return dataclasses.replace(self.run_state)

    def wait_idle(self, timeout: float) -> bool:
        """Block until no run is running or queued (tests and benchmarks)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._requested or self.run_state.state != "idle":
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _index_loop(self) -> None:
        while True:
            with self._cond:
                while not self._requested and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                rebuild, self._requested, self._rebuild = self._rebuild, False, False
                self.run_state.state = "running"
                self.run_state.started_at = time.time()
                self.run_state.progress = None
            retry = False
            try:
                with self._run_lock:
                    if self._stopping:
                        return
                    self._share_encoders(self._writer)
                    summary = self._writer.index(rebuild=rebuild, progress=self._on_progress)
                    self._collect_encoders(self._writer)
                    self._swap_reader()
                self.run_state.last_summary = summary.to_dict()
                self.run_state.last_error = None
            except _Cancelled:
                return
            except IndexLockedError as exc:
                # Another process (a `codesearch index` in a terminal) is writing: our
                # turn comes after it, the run is only postponed.
                self.run_state.last_error = str(exc)
                retry = True
            except CodeSearchError as exc:
                self.run_state.last_error = str(exc)
                log.warning("index run failed for %s: %s", self.root, exc)
            except Exception as exc:  # a bug: keep serving the last good generation
                self.run_state.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("index run failed for %s", self.root)
            with self._cond:
                self.run_state.runs += 1
                self.run_state.finished_at = time.time()
                self.run_state.state = "queued" if self._requested else "idle"
                self._cond.notify_all()
            if retry and not self._stopping:
                timer = threading.Timer(LOCKED_RETRY_S, self.request_index, kwargs={"rebuild": rebuild})
                timer.daemon = True  # never holds up shutdown
                timer.start()

    def _on_progress(self, event: Any) -> None:
        if self._stopping:
            raise _Cancelled()
        self.run_state.progress = dataclasses.asdict(event) if dataclasses.is_dataclass(event) else {"event": str(event)}

    # -- status ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """This root's part of ``GET /status``: the index, the indexer, the watcher."""
        try:
            index: dict[str, Any] | None = self._statuser.status().to_dict()
            error = None
        except CodeSearchError as exc:  # e.g. read while a rebuild recreates the store
            index, error = None, str(exc)
        except (OSError, sqlite3.Error) as exc:
            # A rebuild deletes and recreates files while status walks and sizes them;
            # the next poll sees the new index. Status must not fail for that.
            index, error = None, f"index is being rewritten ({type(exc).__name__}: {exc}); ask again"
        with self._ref_lock:
            ready = self._reader is not None
        return {
            "root": str(self.root),
            "index_dir": str(self.index_dir),
            "ready": ready,
            "watching": self.watcher is not None,
            "watch_error": self.watch_error,
            "indexing": self.run_state.to_dict(),
            "index": index,
            "error": error,
        }


def _batch_queries(searcher: Any) -> None:
    """Route the searcher's query encodings through the process's `QueryBatcher` s.

    Why here and not in the pool of encoders: the writer shares that pool and must encode
    documents unwrapped; the searcher is the only place that encodes queries.
    """
    from codesearch.server.batching import batched_encoders

    encoders = getattr(searcher, "_encoders", None)
    if encoders is not None:
        searcher._encoders = batched_encoders(encoders)


def _pin_snapshot(searcher: Any) -> None:
    """Hold a read transaction open on the searcher's store connection.

    Why: a `Searcher` keeps its ranking indexes in memory but reads each hit's record
    (path, lines, text) from SQLite when it answers. Between the writer's commit of the
    next generation and the swap to a reader on it, an unpinned old reader would rank with
    generation N and print records of generation N+1 (moved lines, dropped chunks). In WAL
    mode an open read transaction keeps seeing the snapshot it started on, so the old
    reader stays wholly on generation N until it is closed. Best effort: a store without a
    ``conn`` (another implementation) is left as it is.
    """
    conn = getattr(getattr(searcher, "_store", None), "conn", None)
    if conn is None or getattr(conn, "in_transaction", True):
        return
    try:
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM chunks").fetchone()  # the snapshot starts at the first read
    except Exception:  # noqa: BLE001 - pinning is an optimisation of consistency, never a failure
        with contextlib.suppress(Exception):
            conn.execute("ROLLBACK")


class RepoSet:
    """Every served root, and the mapping from a request's ``path`` to one of them.

    Parameters
    ----------
    roots:
        The folders to serve (duplicates are dropped; the first is the default).
    options:
        Passed to each `ServedRepo`; ``index_dir`` only makes sense with one root.
    """

    def __init__(
        self, roots: Sequence[str | os.PathLike[str]], options: RepoOptions, *, query_batching: bool = True
    ):
        if not roots:
            roots = ["."]
        if options.index_dir is not None and len(roots) > 1:
            raise PathError("--index-dir names one index folder; serve one PATH with it (or drop --index-dir)")
        self.repos: list[ServedRepo] = []
        shared: dict[Any, Any] = {}
        by_identity: dict[str, Any] = {}
        run_lock = threading.Lock()
        seen: set[Path] = set()
        try:
            for root in roots:
                resolved = Path(root).expanduser().resolve()
                if resolved in seen:
                    continue
                seen.add(resolved)
                self.repos.append(ServedRepo(
                        root, options, shared_encoders=shared, by_identity=by_identity, run_lock=run_lock,
                        query_batching=query_batching,
                    ))
        except BaseException:
            for repo in self.repos:
                repo.close()
            raise

    @property
    def roots(self) -> list[str]:
        return [str(r.root) for r in self.repos]

    def start(self, *, index_now: bool, watch: bool, quiet_s: float | None = None) -> None:
        for repo in self.repos:
            repo.start(index_now=index_now, watch=watch, quiet_s=quiet_s)

    def close(self) -> None:
        for repo in self.repos:
            repo.close()

    def resolve(self, path: str | None) -> tuple[ServedRepo, str | None]:
        """The served repo a request's ``path`` is in, and the sub-folder (relative, posix).

        ``None`` means the first root. A relative path is taken inside the first root.
        Symlinks are resolved first, so a link that leads outside is outside.

        Raises
        ------
        PathError
            A path outside every served root.
        """
        if path is None or path == "":
            return self.repos[0], None
        try:
            candidate = Path(path).expanduser()
            if not candidate.is_absolute():
                candidate = self.repos[0].root / candidate
            resolved = candidate.resolve()
        except (OSError, ValueError, RuntimeError):
            resolved = None
        if resolved is not None:
            # The deepest root wins when served roots nest.
            for repo in sorted(self.repos, key=lambda r: len(r.root.parts), reverse=True):
                if resolved == repo.root:
                    return repo, None
                if repo.root in resolved.parents:
                    return repo, resolved.relative_to(repo.root).as_posix()
        roots = ", ".join(self.roots)
        raise PathError(f"path {path!r} is outside the served roots ({roots}); pass one of them or a folder inside")

    def by_root(self) -> dict[str, ServedRepo]:
        return {str(r.root): r for r in self.repos}


def scoped_glob(subdir: str | None, glob: str | None) -> str | None:
    """Combine a request's sub-folder with its glob (gitignore-style patterns).

    ``src`` + None -> ``src/**``; ``src`` + ``*.py`` -> ``src/**/*.py`` (a slash-free
    pattern matches at any depth, so it stays so under the folder); ``src`` + ``io/*.go``
    -> ``src/io/*.go``.
    """
    if not subdir:
        return glob
    if not glob:
        return f"{subdir}/**"
    g = glob.lstrip("/")
    return f"{subdir}/**/{g}" if "/" not in g.rstrip("/") else f"{subdir}/{g}"
