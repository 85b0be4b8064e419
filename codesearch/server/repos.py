"""The served repositories: an index writer and a pinned live searcher per root.

Why not `CodeSearch.query`: `CodeSearch` makes an index run wait for running searches and
block new ones until it is done (a read/write lock), which is right for a script but would
stall every request of a server for the whole run (seconds when a model encodes). Here the
*writer* only indexes, and searches go to a pinned `codesearch.search.live.LiveSearcher`
(`CodeSearch.live_searcher`) that holds the last committed generation in memory. After each
stage of a run a fresh generation is opened and warmed and swapped in (for a root searched in
the last minute; else by the next search, if one comes before the run ends); requests already
running finish on the old one, which is closed when its last request returns. A search
therefore sees one committed generation or the next, never a half-written one, and never
waits for a run. It is the same live searcher `CodeSearch` searches through, with the
other policy: swapped when told, not following the store.

The live searcher loads its query encoders through the writer's models, so a swap costs
opening the indexes, not loading a model. Every root's writer loads through one
`EncoderPool`, so roots that name the same model, or whose indexes record the same one, load
it once. Only public API of `codesearch.api` is used here.

With several roots, a request without ``path`` searches all of them and merges the hits by
score (each hit then names its ``repo``); ``path`` or ``repo`` selects one (see
`RepoSet.select`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from codesearch.api import DEFAULT, CodeSearch, EncoderPool
from codesearch.api.snapshot import with_notices
from codesearch.errors import CodeSearchError, IndexLockedError, NotIndexedError, PathError
from codesearch.store import Store
from codesearch.types import (
    DEFAULT_MAX_FILE_BYTES,
    STORE_FILE,
    JSONDict,
    Mode,
    ProgressEvent,
    SearchRequest,
    SearchResult,
)

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.indexing.status import Staleness
    from codesearch.server.memory import Meter
    from codesearch.server.watch import RepoWatcher

log = logging.getLogger("codesearch.server")

#: How long a search waits for the watcher to show it has every event queued so far
#: (milliseconds when the machine is not overloaded); past it, the files are looked at.
WATCH_CATCH_UP_S = 0.5
#: A root's watch starts once its first search is answered, or this long after it was added.
WATCH_DEFER_S = 2.0
LOCKED_RETRY_S = 1.0  # another process holds the index lock: try the run again after this
#: A root searched this recently gets each generation a run commits as it comes (opened on the
#: run's thread); for one not searched since, its next search opens it, if one comes mid-run.
ACTIVE_S = 60.0
#: ``run_state.last_error`` of a run ended by `ServedRepo.cancel` (Ctrl-C of a ``codesearch index``
#: that the daemon ran).
CANCELLED = "the index run was cancelled; the index keeps what it had committed (run 'codesearch index' to resume)"


class UnknownPathError(PathError):
    """A ``path`` or ``repo`` that names nothing the server serves (HTTP 404)."""


class AmbiguousPathError(PathError):
    """A relative ``path`` found in several served roots (HTTP 400)."""


class InvalidPathError(PathError):
    """A ``path`` or ``repo`` that no file system could hold: a NUL byte, past PATH_MAX (HTTP 400)."""


MAX_PATH_CHARS = 4096  # Linux's PATH_MAX: no longer path names anything


def _check_path_text(value: str, what: str) -> None:
    """Refuse what cannot be a path before it reaches the file system (which would answer
    ``ValueError: embedded null byte``, read as "outside the served roots")."""
    if "\x00" in value or len(value) > MAX_PATH_CHARS:
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise InvalidPathError(
            f"invalid {what} {shown!r}: " + ("it holds a NUL byte" if "\x00" in value else
                                             f"longer than {MAX_PATH_CHARS} characters")
            + " (pass a folder or file path, or leave it out)"
        )


@dataclass(frozen=True, slots=True)
class RepoOptions:
    """How each served root's `CodeSearch` is configured (the `codesearch index` options).

    ``model``/``multi_model`` use `codesearch.api.DEFAULT` for "what the index records".
    """

    model: str | None = DEFAULT  # hub id or folder; DEFAULT: what the index records; None: no dense
    multi_model: str | None = DEFAULT  # same, for the ColBERT model
    device: str = "auto"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    index_dir: Path | None = None
    max_file_bytes: int = 1_000_000

    def kwargs(self) -> dict[str, str | Path | tuple[str, ...] | int | None]:
        return {
            "index_dir": self.index_dir,
            "model": self.model,
            "multi_model": self.multi_model,
            "device": self.device,
            "include": self.include,
            "exclude": self.exclude,
            "max_file_bytes": self.max_file_bytes,
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
    progress: JSONDict | None = None
    last_summary: JSONDict | None = None
    last_error: str | None = None

    def to_dict(self) -> JSONDict:
        return dataclasses.asdict(self)


class _Cancelled(BaseException):
    """Raised from the progress callback to stop a run at shutdown.

    A BaseException so that no ``except Exception`` inside the pipeline swallows it; the
    pipeline's own cleanup (lock release, uncommitted transaction dropped) still runs.
    """


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
        encoder_pool: EncoderPool | None = None,
        run_lock: threading.Lock | None = None,
        query_batching: bool = True,
        name: str | None = None,
        meter: Meter | None = None,
        after_run: Callable[[ServedRepo], None] | None = None,
    ):
        self.options = options
        self._writer = CodeSearch(root, **options.kwargs(), encoder_pool=encoder_pool)
        self._pool = encoder_pool
        self._pool_dropped = encoder_pool.dropped if encoder_pool is not None else 0
        self.root: Path = self._writer.root
        self.index_dir: Path = self._writer.index_dir
        self.name = name or self.root.name  # how requests and hits name this root
        # Status reads get their own object: the writer's status() waits for its runs.
        self._statuser = CodeSearch(root, **options.kwargs())
        # Searches: swapped to each new generation from inside the writer's runs (an index
        # run commits in stages: lexical first, then vectors as they come).
        wrap = None
        if query_batching:
            from codesearch.server.batching import batcher_for

            wrap = batcher_for  # only the searches' query encoders: the writer encodes documents
        self._live = self._writer.live_searcher(wrap_encoder=wrap, missing=self._not_ready)
        # One index run at a time across roots: they would only compete for the same cores,
        # and the second run finds the models the first one loaded.
        self._run_lock = run_lock if run_lock is not None else threading.Lock()
        self._cond = threading.Condition()
        self._swap_lock = threading.Lock()
        self._requested = False
        self._rebuild = False
        self._stopping = False
        self._cancel_run = False  # `cancel`: end the run going now, keep serving
        self._newer = False  # a run committed a generation mid-way that no search has opened yet
        self._searched_at = float("-inf")  # (monotonic) the last search of this root
        self._searched = threading.Event()  # set once a search of this root is answered
        self._watch_lock = threading.Lock()
        self.run_state = IndexRunState()
        self.watcher: RepoWatcher | None = None  # set by start()
        self.watch_error: str | None = None
        #: The watcher's event count read before the last check that found the index current
        #: (`Registry.refresh`), or before the last run that saw no event while it ran: while
        #: it has seen no event since, nothing needs a stat walk.
        self.current_at_events: int | None = None
        #: When (``time.time()``) that check began.
        self.current_since: float | None = None
        self._meter = meter
        self.heap_bytes = 0  # what this root's opens added to the heap (see codesearch.server.memory)
        self._after_run = after_run
        self._thread = threading.Thread(target=self._index_loop, name=f"codesearch-index-{self.root.name}", daemon=True)

    # -- life cycle --------------------------------------------------------------------

    def start(self, *, index_now: bool, watch: bool, quiet_s: float | None = None, defer_watch: bool = False) -> None:
        """Open the reader on the current index (loading its models), start the indexer.

        Parameters
        ----------
        index_now:
            Run one incremental index at once (catches up with edits made while no server
            ran; builds the index of a root that has none).
        watch:
            Re-index on file changes (debounced).
        defer_watch:
            Start watching once the root's first search is answered (a root a search adds:
            that search does not wait for the watch; see `_watch`).
        """
        if self.indexed:
            self._swap_reader()
        self._thread.start()
        if index_now or not self.indexed:
            self.request_index()
        if watch and defer_watch:
            threading.Thread(target=self._watch, args=(quiet_s, True), name=f"codesearch-watch-{self.root.name}",
                             daemon=True).start()
        elif watch:
            self._watch(quiet_s)

    def _watch(self, quiet_s: float | None, deferred: bool = False) -> None:
        """Start watching the root; ``deferred``, once its first search is answered (or
        `WATCH_DEFER_S` has passed): a watch is one inotify watch per folder, added in Python
        (1.6-1.9 s for the 28k folders of a 114k-file monorepo), which the first query of a
        root it adds then does not wait for. Until the watcher runs, `events_seen` is None,
        so every search and no-op index checks the files as a process without a daemon does;
        once it runs, the check a search would make next is made here (`_catch_up`)."""
        from codesearch.server.watch import QUIET_S, RepoWatcher

        if deferred:
            self._searched.wait(WATCH_DEFER_S)
        watcher = RepoWatcher(self.root, self.index_dir, self.request_index, quiet_s=quiet_s or QUIET_S)
        with self._watch_lock:  # (`close` takes it: a watch it does not see is never started)
            if self._stopping:
                return
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
                return
            self.watcher = watcher
        if deferred:
            self._catch_up()

    def _catch_up(self) -> None:
        """The check of every file the next search would make (`Registry.refresh`), made
        beside the searches once a deferred watch runs: what changed before the watch began
        is indexed now, or, when nothing did, the watcher's word starts (the next search and
        no-op index look at no file)."""
        seen, since = self.events_seen(), time.time()
        stale = self.check_files()
        if stale is None:
            return
        if stale.stale:
            self.request_index()
        elif seen is not None and self.events_seen() == seen and self.run_state.state == "idle":
            self.current_at_events, self.current_since = seen, since

    def close(self, timeout: float = 30.0) -> bool:
        """Stop watching, stop the indexer (a running run is cancelled), close everything.

        A cancelled run leaves the previous index (the pipeline commits in one transaction
        and replaces derived files atomically), so a run that has not noticed the cancel
        within ``timeout`` (it checks between batches) is left to the process's exit rather
        than waited for: its store and encoders stay open, as it is using them.

        Returns
        -------
        bool
            False when the index run was still going after ``timeout``.
        """
        with self._watch_lock:  # (a watch being started ends first, and none starts after)
            with self._cond:
                self._stopping = True
                self._cond.notify_all()
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the index run of %s did not stop within %gs; exiting without it "
                            "(the index keeps its last committed generation)", self.root, timeout)
                return False
        self._live.close()
        self._statuser.close()
        self._writer.close()
        return True

    @property
    def indexed(self) -> bool:
        """True when the root has a committed index."""
        return self._writer.indexed

    @property
    def ready(self) -> bool:
        """True when a search can be answered: a generation is open, or a run committed one
        that the search will open."""
        return self._live.ready or self._newer

    # -- searching ---------------------------------------------------------------------

    def query(
        self,
        query: str | SearchRequest,
        k: int = 10,
        *,
        mode: str = "hybrid",
        language: str | None = None,
        glob: str | None = None,
        files_only: bool = False,
        path_rules: Sequence[str] | None = None,
    ) -> SearchResult:
        """Search the last committed generation; same arguments as `Snapshot.search`.

        Raises
        ------
        NotIndexedError
            When the first index run has not finished yet.
        QueryError
            Invalid query or options.
        """
        request = query if isinstance(query, SearchRequest) else SearchRequest.of(
            query, k, mode=mode, language=language, glob=glob, files_only=files_only
        )
        self._searched_at = time.monotonic()
        self._follow_replaced()
        self._follow_newer()
        try:
            with self._live.lease(lexical=request.mode is Mode.lexical) as (searcher, notices):
                result = searcher.search(request, path_rules=path_rules)
        finally:
            self._searched.set()
        return with_notices(result, notices)

    def _not_ready(self) -> NotIndexedError:
        what = "is being indexed" if self.run_state.state != "idle" else "has no index"
        return NotIndexedError(
            f"{str(self.root)!r} {what} (wait for GET /status to show a finished run, or POST /index to build it)"
        )

    def _swap_reader(self, *, warm: bool = True) -> None:
        """Open the generation committed now, warm it (unless ``warm`` is False: a search is
        waiting for it), and make it the one searches use.

        One swap at a time per root: of two swaps (a run's, and `catch_up`'s), the second
        opens a generation at least as new as the first, so an older one is never installed
        last."""
        with self._swap_lock:
            newer, self._newer = self._newer, False  # (this opens what is committed now)
            try:
                if self._meter is None:
                    self._live.swap(warm=warm)
                else:
                    with self._meter.measure() as grown:
                        self._live.swap(warm=warm)
                    self.heap_bytes = max(0, self.heap_bytes + (grown[0] if grown else 0))
            except BaseException:
                self._newer = self._newer or newer  # (a run may have flagged a newer one meanwhile)
                raise
            self.run_state.generation += 1

    def _follow_newer(self) -> None:
        """Open the generation a run committed mid-way (see `_on_progress`) for the search
        about to run; should it not open, the search answers from the one open."""
        if not self._newer:
            return
        try:
            self._swap_reader(warm=False)  # (the search is its warm-up)
        except CodeSearchError as exc:
            log.warning("could not open the new generation of %s yet: %s", self.root, exc)

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

    def schedule(self, rebuild: bool = False, *, just_started: bool = False) -> int:
        """`request_index`, returning the count of finished runs (``run_state.runs``) at which
        the run that covers this request has finished: the next one, or the one after the
        run going now (it may have walked the files before the change this asks for).

        ``just_started``: this request added the root, so a run going now is the one its start
        began, after the request came: it covers it (a second run would only report every
        file of a new worktree as unchanged)."""
        with self._cond:
            going = self.run_state.state in ("running", "queued")
            if just_started and going and not rebuild:
                return self.run_state.runs + 1
            target = self.run_state.runs + (2 if self.run_state.state == "running" else 1)
            self.request_index(rebuild)
            return target

    def cancel(self) -> bool:
        """Stop the run going now (at its next progress report) and drop a queued one; the
        root stays served. What the run committed stays (lexical first, then vector batches),
        as after Ctrl-C of ``codesearch index``. True when a run was going or queued."""
        with self._cond:
            going = self.run_state.state != "idle"
            self._requested = self._rebuild = False
            if self.run_state.state == "running":
                self._cancel_run = True
            elif self.run_state.state == "queued":
                self.run_state.state = "idle"
                self._cond.notify_all()
            return going

    def wait_runs(self, target: int, timeout: float) -> bool:
        """Block until ``run_state.runs >= target`` (see `schedule`); False after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.run_state.runs < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def catch_up(self) -> bool:
        """Move searches to a generation another process committed (a ``codesearch index
        --no-daemon``, a script) or to a store that replaced the served one (``codesearch
        import --force``, whose generation may equal the old one's): the pinned searcher
        would not see either. Only between runs of this root; True when it swapped."""
        if self.run_state.state != "idle" or not self.indexed:
            return False
        pinned, committed = self._live.generation, self._committed()
        if committed is None or (pinned is not None and committed == pinned and not self._live.replaced):
            return False
        self._swap_reader()
        return True

    def _committed(self) -> int | None:
        """The generation the store holds now (None when it cannot be read)."""
        try:
            with Store(self.index_dir / STORE_FILE, readonly=True) as store:
                return store.generation
        except CodeSearchError:
            return None

    def follow_committed(self) -> bool:
        """Move searches to the generation committed now, if they are behind it: a run of
        this root commits a stage (the lexical one first) and then opens it for searches,
        which takes a moment (its indexes are read, then warmed up); a search in between, or
        one of a root nobody searched lately (opened by the next search), would answer from
        the generation before, without a word. Waits for a swap going on; True when it swapped."""
        with self._swap_lock:
            pinned, committed = self._live.generation, self._committed()
            if committed is None or (pinned is not None and committed <= pinned):
                return False
        try:
            self._swap_reader(warm=False)  # (the search about to run is its warm-up)
        except CodeSearchError as exc:
            log.warning("could not open the new generation of %s yet: %s", self.root, exc)
            return False
        return True

    def follow_models(self) -> bool:
        """Let go of models whose folder moved or changed since they were loaded, and open
        the index again with what its models are now (loaded anew, or left out with the
        notice a fresh process gives): a search must not answer from a model folder that is
        gone. True when it swapped."""
        if self._pool is None or not self.indexed:
            return False
        dropped = self._pool.sweep()
        if dropped == self._pool_dropped:
            return False
        self._pool_dropped = dropped
        try:
            self._swap_reader(warm=False)
        except CodeSearchError as exc:
            log.warning("could not open %s with its models as they are now: %s", self.root, exc)
            return False
        return True

    def check_files(self) -> Staleness | None:
        """The files added, changed and removed since the last run, by a stat of every file
        under the walk options that run recorded (`codesearch.api.refresh.stale_files`);
        None when the index cannot be read (the search that follows says why)."""
        from codesearch.api.refresh import Recorded, stale_files

        try:
            return stale_files(self.root, self.index_dir, Recorded.read(self.index_dir, DEFAULT_MAX_FILE_BYTES))
        except (CodeSearchError, OSError):
            return None

    def watcher_vouches(self) -> bool:
        """Whether the watcher vouches that no file of the work tree changed since a check
        found the index current (`current_since`): it has seen no event since then and has
        handled every event queued until now, and none arrived meanwhile."""
        seen = self.events_seen()
        return (seen is not None and seen == self.current_at_events and self.watch_caught_up()
                and self.events_seen() == seen)

    def watch_caught_up(self) -> bool:
        """Whether the watcher has handled every file event queued until now (see
        `RepoWatcher.caught_up`); False when not watching or not known in time."""
        watcher = self.watcher
        return watcher is not None and watcher.caught_up(WATCH_CATCH_UP_S)

    def events_seen(self) -> int | None:
        """Relevant file events the watcher has seen so far; None when nothing watches the
        root (any change can then have happened)."""
        watcher = self.watcher
        return watcher.events_seen if watcher is not None and watcher.alive else None

    def _follow_replaced(self) -> None:
        """Swap to the store that replaced the served one (``codesearch import --force``
        renames a new index folder into place; one ``stat`` per search tells). Between runs
        only: a run of this root swaps when it ends. Should the new store not open (yet),
        the old one goes on answering and the next search tries again."""
        if self.run_state.state != "idle" or not self._live.replaced:
            return
        try:
            with self._swap_lock:
                if self._live.replaced:  # not swapped by a search that asked first
                    self._live.swap()
                    self.run_state.generation += 1
        except CodeSearchError as exc:
            log.warning("could not open the replaced index of %s yet: %s", self.root, exc)

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
                self._cancel_run = False
                self.run_state.state = "running"
                self.run_state.started_at = time.time()
                self.run_state.progress = None
            retry = False
            # The watcher's count and the time before the run's walk: a run that saw no event
            # while it ran left the index current as of then, as a search's check would find it.
            seen, since = self.events_seen(), time.time()
            try:
                with self._run_lock:
                    if self._stopping:
                        return
                    summary = self._writer.index(rebuild=rebuild, progress=self._on_progress)
                    self._swap_reader()
                self.run_state.last_summary = summary.to_dict()
                self.run_state.last_error = None
                if seen is not None and self.events_seen() == seen:
                    self.current_at_events, self.current_since = seen, since
            except _Cancelled:
                if self._stopping:
                    return
                self.run_state.last_error = CANCELLED
                log.info("index run of %s cancelled", self.root)
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
            if self._after_run is not None:
                self._after_run(self)
            if retry and not self._stopping:
                timer = threading.Timer(LOCKED_RETRY_S, self.request_index, kwargs={"rebuild": rebuild})
                timer.daemon = True  # never holds up shutdown
                timer.start()

    def _on_progress(self, event: ProgressEvent) -> None:
        if self._stopping or self._cancel_run:
            raise _Cancelled()
        self.run_state.progress = dataclasses.asdict(event)
        if event.stage in ("searchable", "published"):
            # Lexical first: the files are committed (or more vectors are in) while the run
            # goes on embedding; searches move to that generation now, not at the run's end.
            # Opened here for a root in use; else by the next search, if one comes before
            # the run's end opens the last one: each open reads the indexes (~0.35 CPU-s
            # for 1,000 files, with its warm-up queries), and a run of a new worktree that
            # nobody searches yet would open three generations where one serves.
            if time.monotonic() - self._searched_at >= ACTIVE_S:
                self._newer = True
                return
            try:
                self._swap_reader()
            except CodeSearchError as exc:
                self._newer = True  # the next search tries again
                log.warning("could not open the new generation of %s yet: %s", self.root, exc)

    # -- status ------------------------------------------------------------------------

    def status(self) -> JSONDict:
        """This root's part of ``GET /status``: the index, the indexer, the watcher."""
        try:
            index: JSONDict | None = self._statuser.status().to_dict()
            error = None
        except CodeSearchError as exc:  # e.g. read while a rebuild recreates the store
            index, error = None, str(exc)
        except (OSError, sqlite3.Error) as exc:
            # A rebuild deletes and recreates files while status walks and sizes them;
            # the next poll sees the new index. Status must not fail for that.
            index, error = None, f"index is being rewritten ({type(exc).__name__}: {exc}); ask again"
        ready = self.ready
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


class RepoSet:
    """Every served root, and the mapping from a request's ``path``/``repo`` to them.

    Parameters
    ----------
    roots:
        The folders to serve (duplicates are dropped).
    options:
        Passed to each `ServedRepo`; ``index_dir`` only makes sense with one root.
    """

    def __init__(self, roots: Sequence[str | os.PathLike[str]], options: RepoOptions, *, query_batching: bool = True):
        if not roots:
            roots = ["."]
        if options.index_dir is not None and len(roots) > 1:
            raise PathError("--index-dir names one index folder; serve one PATH with it (or drop --index-dir)")
        self.repos: list[ServedRepo] = []
        self.encoder_pool = EncoderPool()
        run_lock = threading.Lock()
        unique: list[Path] = []
        for root in roots:
            resolved = Path(root).expanduser().resolve()
            if resolved not in unique:
                unique.append(resolved)
        names = _labels(unique)
        try:
            for root, name in zip(unique, names):
                self.repos.append(
                    ServedRepo(
                        root,
                        options,
                        encoder_pool=self.encoder_pool,
                        run_lock=run_lock,
                        query_batching=query_batching,
                        name=name,
                    )
                )
        except BaseException:
            for repo in self.repos:
                repo.close()
            raise

    @classmethod
    def of(cls, repos: list[ServedRepo], encoder_pool: EncoderPool) -> RepoSet:
        """A set over roots served elsewhere (the daemon's: each request's view of the roots
        it is about). ``repos`` is used as it is, not copied: the daemon's set of every root
        grows as roots are added. Closing it closes them."""
        view = cls.__new__(cls)
        view.repos = repos
        view.encoder_pool = encoder_pool
        return view

    @property
    def roots(self) -> list[str]:
        return [str(r.root) for r in self.repos]

    @property
    def names(self) -> list[str]:
        """Each root's name as requests and hits use it (its folder name, made unique)."""
        return [r.name for r in self.repos]

    def start(self, *, index_now: bool, watch: bool, quiet_s: float | None = None) -> None:
        for repo in self.repos:
            repo.start(index_now=index_now, watch=watch, quiet_s=quiet_s)

    def close(self, timeout: float = 30.0) -> None:
        """Close every root (see `ServedRepo.close`; ``timeout`` per root)."""
        for repo in self.repos:
            repo.close(timeout)

    def served(self) -> str:
        """The served roots for an error message: ``name (path), ...``."""
        return ", ".join(f"{r.name} ({r.root})" for r in self.repos)

    def select(self, path: str | None = None, repo: str | None = None) -> list[tuple[ServedRepo, str | None]]:
        """The served roots a request covers, each with the sub-path to keep (or None).

        The contract, the same for HTTP and MCP:

        - neither ``path`` nor ``repo``: every root;
        - ``repo``: one root, by its name (folder name, see `names`) or its path;
        - an absolute ``path``: the root it lies in (the deepest, when roots nest);
        - a relative ``path``: inside the ``repo`` when one is given; with one root
          served, inside it (or, when no such path exists there, a path that starts
          with the root's name); with several, a path that starts with a root's name
          (``"fd"``, ``"./fd/src"``) is in that root, else in the one root that has it.

        A sub-path is a folder or a file, relative and posix. Symlinks are resolved first,
        so a link that leads outside a root is outside.

        Raises
        ------
        PathError
            A path outside every served root (HTTP 403).
        InvalidPathError
            A path or repo with a NUL byte, or longer than any path (HTTP 400).
        UnknownPathError
            A ``repo`` that is not served, or a ``path`` that does not exist (HTTP 404).
        AmbiguousPathError
            A relative path found in several roots (HTTP 400).
        """
        for value, what in ((path, "path"), (repo, "repo")):
            if value:
                _check_path_text(value, what)
        chosen = self._by_repo(repo) if repo else None
        text = (path or "").strip()
        if text in ("", "."):
            return [(chosen, None)] if chosen else [(r, None) for r in self.repos]
        candidate = Path(text).expanduser()
        if candidate.is_absolute():
            found = self._containing(candidate)
            if found is None or (chosen is not None and found[0] is not chosen):
                where = f"repository {chosen.name} ({chosen.root})" if chosen else f"the served roots ({self.served()})"
                raise PathError(f"path {path!r} is outside {where}; pass one of them or a path inside")
            return [self._existing(found, path)]
        if chosen is not None:
            return [self._existing(self._inside(chosen, candidate, path), path)]
        posix = PurePosixPath(candidate.as_posix()).as_posix()  # "./fd/" -> "fd"
        if len(self.repos) == 1:
            # A folder of the root wins over the root's own name: "uvicorn" in uvicorn's
            # clone is its package folder.
            only = self.repos[0]
            found = self._inside(only, candidate, path)
            if found[1] is None or (only.root / found[1]).exists():
                return [found]
        for r in sorted(self.repos, key=lambda r: len(r.name), reverse=True):
            if posix == r.name:
                return [(r, None)]
            if posix.startswith(r.name + "/"):
                return [self._existing(self._inside(r, Path(posix[len(r.name) + 1 :]), path), path)]
        if len(self.repos) == 1:
            return [self._existing(self._inside(self.repos[0], candidate, path), path)]
        having = [
            found
            for r in self.repos
            if (found := self._inside(r, candidate, path))[1] is None or (r.root / found[1]).exists()
        ]
        if len(having) == 1:
            return having
        if having:
            names = ", ".join(f"{r.name}/{candidate.as_posix()}" for r, _ in having)
            raise AmbiguousPathError(f"path {path!r} is in several served repositories (pass one of: {names})")
        raise UnknownPathError(
            f"path {path!r} is in none of the served repositories ({self.served()}); "
            "start it with a repository name, or pass an absolute path"
        )

    def resolve(self, path: str | None) -> tuple[ServedRepo, str | None]:
        """The one root of ``path`` (None: the first root) and the sub-path; for ``/index``
        and ``/status`` with a path. Same rules and errors as `select`."""
        if not path:
            return self.repos[0], None
        selected = self.select(path)
        if len(selected) != 1:  # "." with several roots
            raise AmbiguousPathError(
                f"path {path!r} names every served repository (pass one of: {', '.join(self.names)})"
            )
        return selected[0]

    def by_root(self) -> dict[str, ServedRepo]:
        return {str(r.root): r for r in self.repos}

    def _by_repo(self, repo: str) -> ServedRepo:
        for r in self.repos:
            if repo in (r.name, str(r.root)):
                return r
        found = self._containing(Path(repo).expanduser()) if Path(repo).expanduser().is_absolute() else None
        if found is not None and found[1] is None:
            return found[0]
        raise UnknownPathError(f"repo {repo!r} is not served (pass one of: {self.served()})")

    def _containing(self, candidate: Path) -> tuple[ServedRepo, str | None] | None:
        try:
            resolved = candidate.resolve()
        except (OSError, ValueError, RuntimeError):
            return None
        # The deepest root wins when served roots nest.
        for repo in sorted(self.repos, key=lambda r: len(r.root.parts), reverse=True):
            if resolved == repo.root:
                return repo, None
            if repo.root in resolved.parents:
                return repo, resolved.relative_to(repo.root).as_posix()
        return None

    def _inside(self, repo: ServedRepo, relative: Path, path: str) -> tuple[ServedRepo, str | None]:
        found = self._containing(repo.root / relative)
        if found is None or found[0] is not repo:
            # "..": outside this root, whether or not another root lies there.
            raise PathError(f"path {path!r} is outside the served roots ({self.served()}); pass a path inside one")
        return found

    def _existing(self, found: tuple[ServedRepo, str | None], path: str) -> tuple[ServedRepo, str | None]:
        repo, sub = found
        if sub is not None and not (repo.root / sub).exists():
            raise UnknownPathError(
                f"path {path!r} does not exist in {repo.name} ({repo.root}); served: {self.served()}"
            )
        return found


def _labels(roots: list[Path]) -> list[str]:
    """Unique short names: the folder name, with parent folders added where two clash."""
    depth = {root: 1 for root in roots}
    while True:
        names = {root: "/".join(root.parts[-depth[root] :]) for root in roots}
        clashes = [r for r in roots if list(names.values()).count(names[r]) > 1 and depth[r] < len(r.parts)]
        if not clashes:
            return [names[r] or str(r) for r in roots]
        for root in clashes:
            depth[root] += 1
