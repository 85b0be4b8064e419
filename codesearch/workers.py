"""Worker processes for an index run's CPU-bound stages (chunking, writing lexical segments):
how to start them where the caller may run threads, and how they leave signals to the parent;
and giving a process's freed heap back to the system (`trim_heap`).

Low on purpose (no codesearch import): the chunking pool (`codesearch.indexing.chunking.parallel`)
and the lexical writer (`codesearch.indexes.lexical_writer`) both start workers, and sit in
layers that may not import each other.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

__all__ = ["leave_signals_to_the_parent", "start_method", "stop_workers", "trim_heap"]


def start_method() -> str:
    """How to start workers now: ``"fork"`` when this process runs no other thread (workers
    start at once with its imports, and never re-import the caller's ``__main__``), else
    ``"forkserver"`` (a server's or watcher's thread may hold a lock that a forked child would
    inherit locked)."""
    # A thread that holds no lock a child could inherit (the CLI's interrupt watchdog, blocked
    # in a read) does not count.
    alone = sum(1 for t in threading.enumerate() if not getattr(t, "fork_safe", False)) == 1
    return "fork" if alone else "forkserver"


def leave_signals_to_the_parent() -> None:
    """A worker's initializer: Ctrl-C reaches every process of the terminal's group, and a
    worker that took it would print its own KeyboardInterrupt traceback (SIGTERM would break
    the pool, which the parent would then work around). The parent stops its workers when it
    is interrupted."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)  # a forked worker inherited the parent's (codesearch.cli.interrupts)


def stop_workers(pool: object) -> None:
    """Kill a `ProcessPoolExecutor`'s workers (it has no public way before 3.14)."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            proc.kill()


def trim_heap() -> None:
    """Give freed heap pages back to the system (glibc's ``malloc_trim``; nothing elsewhere).

    glibc keeps what a program frees for its next allocations, and past its first large
    frees it serves blocks of up to 32 MB from the heap, not from mappings of their own: a
    FAISS index whose lists were rebuilt, or a daemon that closed an index, otherwise keeps
    the memory resident. The process's own symbols are looked up (``CDLL(None)``), not libc
    by name: `ctypes.util.find_library` would run ``ldconfig`` in a subprocess each time."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        pass
