"""Watch mode: file-system events on a served root become debounced incremental index runs.

One save should be searchable within about a second, and a ``git checkout`` that touches
thousands of files should cost one incremental run, not thousands. Both come from the same
rule: wait for a quiet period (no event for ``quiet_s``) and then run once for everything
that happened. A cap (``max_delay_s``) keeps a file that is rewritten forever from
postponing the run indefinitely.

The watcher never decides *what* to re-index: the pipeline's own walk with content hashes
does that, so a missed or spurious event costs at most one cheap run, never a wrong index.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("codesearch.server")

QUIET_S = 0.25
MAX_DELAY_S = 5.0

# Events that cannot change file contents: reads (our own indexer opens every file) and
# attribute changes. The observer is asked for the other kinds only (`_WANTED`), so on
# Linux inotify never reports these; the check stays for observers that ignore the filter.
_IGNORED_EVENT_TYPES = frozenset({"opened", "closed_no_write", "attrib"})
_IGNORED_PARTS = frozenset({".git", "__pycache__", ".hg", ".svn"})
_IGNORED_SUFFIXES = (".pyc", ".swp", ".swx", "~", ".tmp")
#: The name `RepoWatcher.caught_up` gives its marker files (then the pid and a number).
_MARK = ".watch-mark-"


def _wanted() -> list[type]:
    """The event kinds that can change what is indexed: the observer drops the rest before
    they reach Python (inotify is not even asked for opens and reads: an index run opens
    every file of the root, and each open was an event handled here and thrown away)."""
    from watchdog.events import (
        DirCreatedEvent,
        DirDeletedEvent,
        DirMovedEvent,
        FileClosedEvent,
        FileCreatedEvent,
        FileDeletedEvent,
        FileModifiedEvent,
        FileMovedEvent,
    )

    return [FileCreatedEvent, FileDeletedEvent, FileModifiedEvent, FileMovedEvent, FileClosedEvent,
            DirCreatedEvent, DirDeletedEvent, DirMovedEvent]


class Debouncer:
    """Calls ``callback`` once after a burst of ``poke()`` calls has gone quiet.

    Parameters
    ----------
    callback:
        Called on the debouncer's own thread, never concurrently with itself.
    quiet_s:
        Seconds without a poke before the callback fires.
    max_delay_s:
        Upper bound between the first poke of a burst and the callback.
    """

    def __init__(self, callback: Callable[[], None], *, quiet_s: float = QUIET_S, max_delay_s: float = MAX_DELAY_S):
        self._callback = callback
        self._quiet_s = quiet_s
        self._max_delay_s = max_delay_s
        self._cond = threading.Condition()
        self._first: float | None = None
        self._last: float | None = None
        self._stopped = False
        self.fired = 0  # how many times the callback ran (tests and /status read it)
        self._thread = threading.Thread(target=self._loop, name="codesearch-debounce", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Record one event; the callback fires once the events stop for ``quiet_s``."""
        with self._cond:
            now = time.monotonic()
            if self._first is None:
                self._first = now
            self._last = now
            self._cond.notify()

    def stop(self) -> None:
        """Stop the thread; a pending burst is dropped."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        with self._cond:
            while not self._stopped:
                if self._first is None or self._last is None:
                    self._cond.wait()
                    continue
                due = min(self._last + self._quiet_s, self._first + self._max_delay_s)
                now = time.monotonic()
                if now < due:
                    self._cond.wait(due - now)
                    continue
                self._first = self._last = None
                self.fired += 1
                self._cond.release()
                try:
                    self._callback()
                except Exception:  # a failed run must not kill the watcher
                    log.exception("watch: index run failed")
                finally:
                    self._cond.acquire()


class RepoWatcher:
    """Watches one root recursively and pokes a :class:`Debouncer` on relevant changes.

    Parameters
    ----------
    root:
        The served repository root.
    index_dir:
        The index folder; its own writes must not trigger runs (that would loop forever).
    on_change:
        Called (debounced) after a burst of relevant events.
    """

    def __init__(
        self,
        root: Path,
        index_dir: Path,
        on_change: Callable[[], None],
        *,
        quiet_s: float = QUIET_S,
        max_delay_s: float = MAX_DELAY_S,
    ):
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        self.root = Path(root).resolve()
        self.index_dir = Path(index_dir).resolve()
        # `codesearch import` unpacks into `.codesearch.import-PID` beside the index folder,
        # and a replaced index waits in `.codesearch.replaced-PID`: neither is the repository.
        self._beside = re.compile(rf"^\.{re.escape(self.index_dir.name.lstrip('.'))}\.(import|replaced)-\d+$")
        self.debouncer = Debouncer(on_change, quiet_s=quiet_s, max_delay_s=max_delay_s)
        self.events_seen = 0  # relevant events (each pokes the debouncer)
        self.events_delivered = 0  # every event the observer handed to this process's handler
        self._marks = threading.Condition()
        self._marks_sent = 0
        self._marks_seen = 0
        watcher = self

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event) -> None:  # event: watchdog's FileSystemEvent
                watcher.events_delivered += 1
                if watcher._mark_seen(event.src_path):
                    return
                if event.event_type in _IGNORED_EVENT_TYPES:
                    return
                if event.is_directory and event.event_type == "modified":
                    return  # a parent's mtime; the file's own event follows
                paths = [event.src_path, getattr(event, "dest_path", "") or ""]
                if any(p and watcher.relevant(p) for p in paths):
                    watcher.events_seen += 1
                    watcher.debouncer.poke()

        self._observer = Observer()
        self._observer.daemon = True
        try:
            self._observer.schedule(_Handler(), str(self.root), recursive=True, event_filter=_wanted())
        except TypeError:  # a watchdog before `event_filter`: the handler drops them instead
            self._observer.schedule(_Handler(), str(self.root), recursive=True)

    def relevant(self, path: str | bytes) -> bool:
        """False for events inside the index folder, VCS folders, caches and editor temp files."""
        p = Path(os.fsdecode(path))  # (a name that is not UTF-8 keeps its bytes as surrogate escapes)
        if p == self.index_dir or self.index_dir in p.parents:
            return False
        with_parent = p.relative_to(self.index_dir.parent).parts if p.is_relative_to(self.index_dir.parent) else ()
        if with_parent and self._beside.match(with_parent[0]):
            return False
        try:
            rel = p.relative_to(self.root)
        except ValueError:
            return False
        if any(part in _IGNORED_PARTS for part in rel.parts):
            return False
        return not p.name.endswith(_IGNORED_SUFFIXES)

    def start(self) -> None:
        """Start watching (inotify on Linux)."""
        self._observer.start()

    def caught_up(self, timeout: float) -> bool:
        """Return True once every file event the operating system queued before this call
        has reached this watcher (and `events_seen` counts the relevant ones); False when
        that cannot be known within ``timeout`` (then anything may have changed).

        How: a marker file is created in the index folder and this waits for its own event.
        The kernel queues a watch's events in order, so the events of every change made
        before it have been handled when it arrives. Only for an index folder inside the
        watched root (a marker elsewhere would be a file in the user's repository)."""
        if self.root not in self.index_dir.parents or not self.alive:
            return False
        with self._marks:
            self._marks_sent += 1
            number = self._marks_sent
        marker = self.index_dir / f"{_MARK}{os.getpid()}-{number}"
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except OSError:
            return False
        os.close(fd)
        try:
            with self._marks:
                return self._marks.wait_for(lambda: self._marks_seen >= number, timeout)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(marker)

    def _mark_seen(self, path: str | bytes) -> bool:
        """Whether ``path`` is one of `caught_up`'s markers (noted as arrived)."""
        name = os.path.basename(os.fsdecode(path))
        if not name.startswith(f"{_MARK}{os.getpid()}-"):
            return False
        try:
            number = int(name.rsplit("-", 1)[1])
        except ValueError:
            return True
        with self._marks:
            if number > self._marks_seen:
                self._marks_seen = number
                self._marks.notify_all()
        return True

    @property
    def alive(self) -> bool:
        """Whether events still come: the observer thread runs (it ends when the watched
        folder itself is deleted, or on an error of the operating system's watch)."""
        return self._observer.is_alive()

    def stop(self) -> None:
        """Stop watching and drop any pending burst."""
        if self._observer.is_alive():
            self._observer.stop()
            self._observer.join(timeout=5)
        self.debouncer.stop()
