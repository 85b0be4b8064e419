"""The locks of an index: `IndexLock`, one writer per index folder across processes, and
`ReadWriteLock`, searches against index runs inside one process."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from codesearch.errors import IndexLockedError
from codesearch.types import LOCK_FILE

__all__ = ["IndexLock", "ReadWriteLock"]


def _read_holder(fd: int) -> tuple[str, str]:
    """(pid, role) written by the lock's holder, or ("", "") when none is written."""
    parts = os.pread(fd, 64, 0).decode(errors="replace").split()
    if not parts:
        return "", ""
    return parts[0], parts[1] if len(parts) > 1 else "writer"


def _live_writer(index_dir: str | os.PathLike[str]) -> str | None:
    """The pid of the index run holding the lock now, else None.

    Reads the holder line (``"<pid> <role>"``); the holder clears it on release, and a
    holder killed with -9 leaves a pid that no longer runs.
    """
    try:
        with open(Path(index_dir) / LOCK_FILE, "rb") as fh:
            pid, role = _read_holder(fh.fileno())
    except OSError:
        return None
    if not pid or role != "writer":
        return None
    return pid if _alive(pid) else None


def _zombie(pid: str) -> bool:
    """Whether ``pid`` has died and waits for its parent to reap it (``kill(pid, 0)`` still
    succeeds then). A daemon killed with -9 stays one while the CLI that started it runs:
    its lock was released with its files, and the CLI's fallback, indexing in its own
    process, was refused as if the dead daemon still wrote (Linux: ``/proc``; elsewhere
    a live pid is taken as live)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            stat = fh.read()
    except (OSError, ValueError):
        return False
    # "pid (comm) state ...": the name may hold spaces and parentheses, the state follows the last ")".
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")


#: Descriptors of the locks this process holds. A child made by ``fork`` (a chunking
#: worker) shares each one's lock; closed in the child at once, so that the lock goes with
#: its holder: a daemon killed with -9 left its workers holding its index's lock.
_HELD: set[int] = set()


def _close_held_in_child() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)  # (not LOCK_UN: that would release the parent's lock too)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_in_child)

#: Seconds a writer waits for a lock whose holder is dead (its exit still under way).
_DEAD_HOLDER_WAIT_S = 2.0


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True
    return not _zombie(pid)


def _locked(index_dir: Path, pid: str) -> IndexLockedError:
    return IndexLockedError(
        f"Index at {index_dir} is being written by another codesearch process "
        f"(pid {pid or 'unknown'}); wait for it to finish or stop it, then run again"
    )


class IndexLock:
    """The one-writer lock of an index folder: ``fcntl.flock`` on ``<index_dir>/lock``.

    Non-blocking: a second writer fails at once with :class:`IndexLockedError` naming the
    pid that holds it. The kernel drops the lock when the holder dies, even by kill -9, so
    a stale lock file never blocks anyone.

    Example
    -------
    >>> with IndexLock(index_dir):                   # doctest: +SKIP
    ...     ...  # write the index
    """

    def __init__(self, index_dir: str | os.PathLike[str]):
        self.path = Path(index_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self, *, role: str = "writer", wait_for_readers: float = 0.0) -> IndexLock:
        """Take the lock or raise :class:`IndexLockedError` at once.

        Parameters
        ----------
        role
            ``"writer"`` (an index run) or ``"reader"`` (a searcher saving an index it had
            to rebuild: it holds the lock for a file write or two).
        wait_for_readers
            Seconds to wait when the holder is a reader; a writer never waits for a writer.
        """

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_for_readers
        dead_since = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pid, holder_role = _read_holder(fd)
                # No holder line yet (or already cleared): the lock is changing hands.
                if holder_role in ("reader", "") and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                # A holder that is dead and still holds it is exiting (its files close last).
                if pid and not _alive(pid):
                    dead_since = dead_since or time.monotonic()
                    if time.monotonic() - dead_since < _DEAD_HOLDER_WAIT_S:
                        time.sleep(0.05)
                        continue
                os.close(fd)
                raise _locked(self.path.parent, pid) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {role}\n".encode(), 0)
        except OSError:
            # A full disk: without its holder line the lock would say nothing of who holds
            # it, and a long-lived process would hold it for good. Let go of it at once.
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise
        self._fd = fd
        _HELD.add(fd)
        return self

    @staticmethod
    def writer_active(index_dir: str | os.PathLike[str]) -> bool:
        """Whether an index run holds the lock now, without touching the lock."""
        return _live_writer(index_dir) is not None

    @staticmethod
    def check_free(index_dir: str | os.PathLike[str]) -> None:
        """Raise :class:`IndexLockedError` when another index run writes ``index_dir`` now.

        Why, when `acquire` raises the same: a run loads its models (seconds) before it
        takes the lock; asking first means a second run fails at once, not after the load.
        Never touches the lock, so it cannot make a starting writer fail.
        """
        pid = _live_writer(index_dir)
        if pid is not None:
            raise _locked(Path(index_dir), pid)

    def release(self) -> None:
        if self._fd is not None:
            _HELD.discard(self._fd)
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> IndexLock:
        return self if self.held else self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class ReadWriteLock:
    """Many readers (searches) or one writer (an index run); writers are not starved."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    class _Ctx:
        def __init__(self, enter: Callable[[], None], exit_: Callable[[], None]) -> None:
            self._enter, self._exit = enter, exit_

        def __enter__(self) -> None:
            self._enter()

        def __exit__(self, *exc: object) -> None:
            self._exit()

    def reading(self) -> ReadWriteLock._Ctx:
        return self._Ctx(self._acquire_read, self._release_read)

    def writing(self) -> ReadWriteLock._Ctx:
        return self._Ctx(self._acquire_write, self._release_write)

    def _acquire_read(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._writer and not self._waiting_writers)
            self._readers += 1

    def _release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            self._cond.notify_all()

    def _acquire_write(self) -> None:
        with self._cond:
            self._waiting_writers += 1
            self._cond.wait_for(lambda: not self._writer and not self._readers)
            self._waiting_writers -= 1
            self._writer = True

    def _release_write(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()
