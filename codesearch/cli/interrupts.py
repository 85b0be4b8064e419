"""Ctrl-C and SIGTERM end a `codesearch` command within 2 s: one line on stderr, no
traceback, exit status 130 (SIGINT) or 143 (SIGTERM).

Why 143 for SIGTERM: it is what a shell, ``timeout`` and process supervisors report for a
process that SIGTERM ended (128 + 15), so a script can tell "stopped by the user" (130) from
"stopped by the system" (143). Both leave the same resumable index.

A plain ``KeyboardInterrupt`` is not enough, and each of these failures was seen:

* it can be lost: raised inside a finalizer (``__del__``, a weakref callback, a generator
  closed by the garbage collector) Python prints "Exception ignored" and carries on, and a
  library's bare ``except:`` swallows it; the run then goes on for minutes;
* the run can wait without bound after it: for the publication thread building PLAID, for a
  pool to shut down, for an ``atexit`` join;
* pool workers in the terminal's process group get the signal too and print their own
  ``KeyboardInterrupt`` tracebacks.

So the console script arms a guard before it imports anything heavy (:func:`install`): the
first signal raises ``KeyboardInterrupt`` in the main thread (the command's own clean-up runs:
the open batch is committed, the writer lock released), except inside an import, where it
is deferred (a half-imported module; torch aborts on one) and raised again 50 ms later;
one swallowed by a finalizer is raised again too (:func:`_unraisable`); and a watchdog
thread, woken by the signal itself
through ``signal.set_wakeup_fd`` (so even while the main thread sits in C code), ends the
process with the one line if it is still there `GRACE_S` after the first signal, or at a
second signal. Ending the process then is safe for the index: every write is committed
whole or not at all, which the kill -9 tests check (tests/indexing/test_pipeline_crash.py).
Chunking workers ignore both signals (`codesearch.indexing.chunking.parallel`): the
parent stops them. Servers (`UNGUARDED`) keep their own graceful shutdown, and a signal
ignored from the start (a background job) stays ignored, as Python keeps it.

The line is claimed and written under one lock (:func:`_say`), and nothing ends the process
between the two. The command's clean-up and the watchdog's deadline can end together (a
clean-up as long as the grace: an interrupt deferred until an import ends, a C call that
returns late); the thread that had claimed the line could lose the CPU before writing it
(``isatty`` and the write give up the GIL), and the other, finding it claimed, ended the
process: exit 130 with an empty stderr, which the random-moment test met once on a quiet
Zen 4. Once the line is being said, the handler raises nothing in the main thread, so no
interrupt cuts it. An index run's line says what the run kept (:func:`noting`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["GRACE_S", "exit_status", "finished", "install", "noting", "say_and_exit", "signalled"]

#: Seconds from the first signal to a forced end (the clean path is given this long).
GRACE_S = 0.8

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_RERAISE = b"\0"  # on the wake-up pipe: raise the swallowed interrupt again (no signal is 0)
_START = b"\1"  # on the wake-up pipe: a guarded signal was handled (starts the deadline; SIGHUP is not guarded)
#: Seconds the watchdog, ending the process, waits for the main thread to finish writing the
#: line it claimed (only a stderr nobody reads takes longer).
SAY_WAIT_S = 1.0

_say_lock = threading.Lock()  # only `_say` takes it; never the signal handler (it runs in the main thread)
# signum: the first signal as the main thread's handler saw it; woken_by: as the watchdog saw
# it (the handler may never run: a main thread in C code); ending: the line is being said.
_state: dict[str, object] = {"signum": None, "woken_by": None, "said": False, "reraise": False, "armed": False,
                             "ending": False, "wake": -1}
# What an index run of this process has kept so far, from its progress events (`noting`):
# committed: None (not begun), "begun" or "done" (the files' one transaction).
_run: dict[str, object] = {"index": False, "committed": None, "vectors": None}


def exit_status(signum: int | None = None) -> int:
    """130 for SIGINT (and when no signal was recorded: a KeyboardInterrupt), 143 for SIGTERM."""
    signum = signum if signum is not None else _signum()
    return 128 + int(signum) if signum in (signal.SIGTERM, signal.SIGINT) else 130


def _signum() -> object:
    return _state["signum"] if _state["signum"] is not None else _state["woken_by"]


def signalled() -> bool:
    """True once a guarded signal has arrived."""
    return _state["signum"] is not None


def noting(progress: Callable[[Any], None]) -> Callable[[Any], None]:
    """``progress`` (an index run's callback), which first notes what the run has kept, so
    that an interrupted run's line says it. Each report follows what it reports, so the line
    says what was kept at least (a signal between a commit and its report finds one more)."""

    _run["index"] = True

    def note(event: Any) -> None:
        stage, done, total = event.stage, event.done, event.total
        if stage in ("searchable", "encode", "published") or (stage == "write" and total and done >= total):
            _run["committed"] = "done"
        elif stage == "write" and _run["committed"] is None:
            _run["committed"] = "begun"
        if stage == "encode":
            _run["vectors"] = (done, total)  # reported after each commit
        progress(event)

    return note


def _kept() -> str:
    if not _run["index"]:
        return "the index is intact"
    if _run["committed"] is None:
        return "nothing of this run was kept: the index is as it was"
    if _run["committed"] == "begun":
        return "kept: this run's files if their commit had ended, else the index as it was"
    if _run["vectors"] is None:
        return "kept: the files and their lexical index"
    done, total = _run["vectors"]  # type: ignore[misc]
    return f"kept: the files and vectors for at least {done:,} of {total:,} texts"


def message(signum: int | None = None) -> str:
    signum = signum if signum is not None else _signum()
    what = "Terminated" if signum == signal.SIGTERM else "Interrupted"
    return f"{what} ({_kept()}; run the command again to resume)"


def _say(*, raw: bool, text: str | None = None) -> None:
    """Write the one line, once, whichever thread gets here first: ``raw`` (the watchdog)
    straight to fd 2, as the main thread may hold ``sys.stderr``'s lock; else to
    ``sys.stderr`` (which a test runner may have replaced). Claimed and written under
    `_say_lock`, so that a thread that finds the line claimed (and then ends the process)
    finds it written: between the two, the writer can give up the GIL (``isatty``, the
    write itself) to the other thread, which ended the process in silence."""
    if not _say_lock.acquire(timeout=SAY_WAIT_S if raw else -1):
        return  # the main thread is stuck writing it (a stderr nobody reads): end anyway
    try:
        if _state["said"]:
            return
        _state["said"] = True
        # On a terminal the line starts after the echoed ^C; in a log it is one line.
        line = ("\n" if _isatty(2) else "") + (text or message()) + "\n"
        try:
            if raw:
                os.write(2, line.encode())
            else:
                sys.stderr.write(line)
                sys.stderr.flush()
        except (OSError, ValueError):
            pass
    finally:
        _say_lock.release()


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def finished() -> None:
    """The command ran to its end: a signal from now on finds nothing left to stop. It is
    ignored, not left to the interpreter's teardown, which puts the default action back (the
    process then died of the signal, with no line, after printing its summary)."""
    if not _state["armed"]:
        return
    for signum in _SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signum, signal.SIG_IGN)


def say_and_exit(line: str | None = None) -> int:
    """For the command's ``except KeyboardInterrupt``: the line (once; ``line`` instead of the
    usual one, when the command knows better what was left), then the exit status."""
    _state["ending"] = True  # from here on the handler raises nothing: the line is not cut
    if _state["signum"] is None:  # a KeyboardInterrupt the guard did not raise (or not yet)
        _state["signum"] = _state["woken_by"] if _state["woken_by"] is not None else signal.SIGINT
    _say(raw=False, text=line)
    return exit_status()


def _on_signal(signum: int, frame: object) -> None:
    # Runs in the main thread only, between two bytecodes of whatever it was running: it
    # takes no lock (the main thread may hold it) and raises nothing once the line is being said.
    if _state["ending"]:
        return  # a later signal: the watchdog, which counts it, ends the process
    first = _state["signum"] is None
    if first:
        _state["signum"] = signum
        _wake(_START)  # the deadline starts now even if the signal's own byte never came
    again = bool(_state["reraise"])
    _state["reraise"] = False
    if first or again:
        if _importing(frame):
            # Not in the middle of an import: it would leave a half-imported module, and torch
            # turns an exception raised in its import into a C++ abort (SIGABRT, seen in the
            # benchmark). The watchdog tries again in a moment.
            _ask_again()
            return
        raise KeyboardInterrupt
    # A later signal: the watchdog ends the process now (no second exception in clean-up).


def _importing(frame: object) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):  # type: ignore[attr-defined]
            return True
        frame = frame.f_back  # type: ignore[attr-defined]
    return False


def _ask_again() -> None:
    """Have the watchdog raise the interrupt again in the main thread shortly."""
    _state["reraise"] = True
    _wake(_RERAISE)


def _wake(byte: bytes) -> None:
    try:
        os.write(int(_state["wake"]), byte)
    except OSError:
        pass  # a full pipe holds bytes enough to wake the watchdog


def _unraisable(unraisable: object, *, _previous=sys.unraisablehook) -> None:
    """An interrupt raised inside a finalizer is "ignored" by Python: ask the watchdog to
    raise it again in the main thread (not from here: it would be raised inside this hook,
    and ignored too), instead of printing a traceback and running on."""
    exc = getattr(unraisable, "exc_value", None)
    if isinstance(exc, KeyboardInterrupt) and signalled() and _state["armed"] and not _state["ending"]:
        _ask_again()
        return
    _previous(unraisable)


def _kill_children() -> None:
    """Pool workers of this process (they ignore the signals) go with it."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return
    try:
        children = mp.active_children()
    except Exception:  # noqa: BLE001 - best effort on the way out
        return
    for child in children:
        try:
            child.kill()
        except Exception:  # noqa: BLE001
            pass


def hard_exit() -> None:
    """The line (once), the pool workers killed, and the process gone without clean-up:
    what a kill -9 leaves, which every index write survives."""
    _state["ending"] = True
    _say(raw=True)
    _kill_children()
    os._exit(exit_status())


def _watch(fd: int) -> None:
    deadline = None
    seen = synthetic = 0
    started = False
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            hard_exit()
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            if signum == _RERAISE[0]:
                if _state["reraise"] and not _state["ending"]:
                    import _thread

                    time.sleep(0.05)  # out of the finalizer or import, likely; if not, it asks again
                    synthetic += 1  # interrupt_main writes the signal's byte too: not a second signal
                    _thread.interrupt_main(int(_state["signum"]))  # runs _on_signal in the main thread
                continue
            if signum == _START[0]:
                started = True
                continue
            if synthetic and signum == _state["signum"]:
                synthetic -= 1
                continue
            # Another handler in charge (`serve` installs its own): not ours to end.
            if signum in _SIGNALS and signal.getsignal(signum) is _on_signal:
                seen += 1
                if _state["woken_by"] is None:  # the status and word, should the handler never run
                    _state["woken_by"] = signum
        if (seen or started) and deadline is None:
            deadline = time.monotonic() + GRACE_S
        if seen >= 2:
            hard_exit()


#: Commands that own their signals: a server shuts down gracefully (it drains searches and
#: waits for its indexer, `codesearch.server.runner`), on its own clock.
UNGUARDED = frozenset({"serve", "daemon"})


def install(argv: list[str] | None = None) -> None:
    """Arm the guard for this process (the console script, in its main thread, first thing),
    unless the command (the first word of ``argv``, default ``sys.argv[1:]``) is a server."""
    args = sys.argv[1:] if argv is None else argv
    command = next((a for a in args if not a.startswith("-")), None)
    if command in UNGUARDED:
        return
    if threading.current_thread() is not threading.main_thread() or _state["armed"]:
        return
    r, w = os.pipe()
    os.set_blocking(w, False)  # set_wakeup_fd needs it; the C handler never blocks
    # The watchdog and its pipe first, the handlers last: a Ctrl-C that came before (Python
    # runs a pending signal's handler at its next check, whichever is installed by then)
    # finds everything in place. The benchmark lost one that way.
    _state["wake"] = w
    sys.unraisablehook = _unraisable
    watchdog = threading.Thread(target=_watch, args=(r,), name="codesearch-interrupt-watchdog", daemon=True)
    # It holds no lock a forked child could inherit locked: chunking may still fork.
    watchdog.fork_safe = True  # type: ignore[attr-defined]
    watchdog.start()
    _state["armed"] = True
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    for signum in _SIGNALS:
        # A signal ignored from the start stays ignored (a background job of a script, nohup):
        # the Unix convention, which Python keeps for SIGINT too.
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, _on_signal)
