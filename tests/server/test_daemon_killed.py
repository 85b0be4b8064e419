"""``kill -9`` of the daemon in the middle of the index run it makes for the CLI: the CLI
says so in one line, indexes in its own process, and the index equals a clean build.

The dead daemon must not count as a live writer: the CLI started it, so until it reaps it
the daemon is its zombie, whose pid still answers ``kill(pid, 0)``; and a worker the
daemon forked held its lock (`tests/store/test_lock_dead_holder.py` has both, alone).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time

from daemonkit import cli_argv, daemon_env, daemon_pids
from fixtures.pipeline_helpers import check_consistent, chunk_set, make_repo

from codesearch.api import CodeSearch
from codesearch.types import LOCK_FILE, STORE_FILE


def _holder(index_dir) -> str:
    try:
        return (index_dir / LOCK_FILE).read_text().split(" ")[0]
    except OSError:
        return ""


def _encoding(index_dir) -> bool:
    """The run has committed the files and is encoding (vectors are coming in)."""
    try:
        store = sqlite3.connect(f"file:{index_dir / STORE_FILE}?mode=ro", uri=True, timeout=0.1)
        try:
            return store.execute("SELECT count(*) FROM vectors").fetchone()[0] > 0
        finally:
            store.close()
    except sqlite3.Error:
        return False


def test_kill_9_of_the_daemon_mid_index_is_finished_by_the_cli(tmp_path, single_vector_dir, runtime):
    root = make_repo(tmp_path / "repo", n_files=12, lines=40)
    env = daemon_env(runtime)
    cli = subprocess.Popen([*cli_argv(), "index", str(root), "--model", str(single_vector_dir), "--multi-model",
                            "none"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        killed = None
        while killed is None and time.monotonic() < deadline and cli.poll() is None:
            pids = daemon_pids(runtime)
            # The daemon writes the index, in the middle of its run: encoding.
            if pids and _holder(root / ".codesearch") == str(pids[0]) and _encoding(root / ".codesearch"):
                os.kill(pids[0], signal.SIGKILL)
                killed = pids[0]
            time.sleep(0.01)
        assert killed is not None, "the daemon never took the index run"
        _, err = cli.communicate(timeout=240)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 0, err[-2000:]
    assert "indexing in this process" in err and "Traceback" not in err
    check_consistent(root / ".codesearch")
    clean = tmp_path / "clean"
    make_repo(clean, n_files=12, lines=40)
    with CodeSearch(clean, model=str(single_vector_dir), multi_model=None) as cs:
        cs.index()
    assert chunk_set(root / ".codesearch") == chunk_set(clean / ".codesearch")
