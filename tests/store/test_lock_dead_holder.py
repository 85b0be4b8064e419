"""A writer that died is no live writer, even while its parent has not reaped it.

A daemon killed with -9 mid-index stays a zombie as long as the CLI that started it runs
(``kill(pid, 0)`` succeeds on a zombie), while the kernel released its lock with its files.
The CLI's fallback, indexing in its own process, was then refused: "Index ... is being
written by another codesearch process (pid <the dead daemon>)".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from codesearch.store import IndexLock


def _holder(index_dir) -> subprocess.Popen:
    """A child process holding the index's write lock (started here, so it is our zombie
    once killed, until we reap it)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from codesearch.store import IndexLock; "
         f"IndexLock({str(index_dir)!r}).acquire(); print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_killed_writer_not_yet_reaped_is_not_a_live_writer(tmp_path):
    proc = _holder(tmp_path)
    try:
        assert IndexLock.writer_active(tmp_path)
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # dead, and not reaped: a zombie of this process
            with open(f"/proc/{proc.pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.02)
        assert not IndexLock.writer_active(tmp_path)
        IndexLock.check_free(tmp_path)  # the fallback's first question
        with IndexLock(tmp_path):
            pass
    finally:
        proc.kill()
        proc.wait()


def test_a_live_writer_is_still_one(tmp_path):
    proc = _holder(tmp_path)
    try:
        assert IndexLock.writer_active(tmp_path)
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_writers_forked_children_do_not_keep_its_lock(tmp_path):
    """A worker the writer forked (the chunking pool forks when the process has one thread)
    shared its lock: once the writer was killed, the lock stayed held by the orphan, under
    the dead writer's pid, until the worker exited."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import os, time; from codesearch.store import IndexLock; "
         f"IndexLock({str(tmp_path)!r}).acquire()\n"
         "if os.fork() == 0:\n    time.sleep(600)\n"
         "print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        orphan = next(int(p) for p in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        try:
            with IndexLock(tmp_path):
                pass
        finally:
            os.kill(orphan, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
