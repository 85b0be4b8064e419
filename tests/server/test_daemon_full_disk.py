"""A full disk while the daemon writes: the query that asked for the refresh says so in one
line and answers from the old index; once space is freed the next query refreshes.

On a real tmpfs of a set size (mounting needs root: elsewhere this skips)."""

from __future__ import annotations

import json
import os

from daemonkit import daemon_env, daemon_pids, run_cli, same_hits, stop_all
from fixtures.disks import fill, tmpfs
from fixtures.sample_repo import write_sample_repo

from codesearch.api import CodeSearch


def _query(repo, index_dir, env, text="greet the user"):
    return run_cli(["query", text, "-p", str(repo), "--index-dir", str(index_dir), "-k", "5", "--json"], env)


def test_a_full_disk_during_the_daemons_refresh_is_one_line_and_the_old_index_answers(
        tmp_path, single_vector_dir):
    runtime = tmp_path / "run"
    env = daemon_env(runtime)
    repo = write_sample_repo(tmp_path / "repo")
    with tmpfs(tmp_path / "disk") as disk:
        index_dir = disk / "index"  # the index on the small disk, the files beside it
        with CodeSearch(repo, index_dir=index_dir, model=str(single_vector_dir), multi_model=None) as cs:
            cs.index()
        try:
            before = _query(repo, index_dir, env)
            hits = json.loads(before.stdout)["results"]
            assert hits and daemon_pids(runtime)

            filler = fill(disk, 0)
            # Many new files: the refresh must write their chunks and vectors, and cannot.
            for i in range(40):
                (repo / f"more_{i}.py").write_text(
                    "".join(f"def extra_function_{i}_{j}(value):\n    return value * {j}\n\n" for j in range(40)))
            full = _query(repo, index_dir, env)
            notices = [line for line in full.stderr.splitlines() if line.startswith("Notice:")]
            assert len(notices) == 1 and "could not be updated" in notices[0], full.stderr
            assert "Traceback" not in full.stderr
            assert same_hits(json.loads(full.stdout)["results"], hits)  # the old index answers

            os.unlink(filler)
            freed = _query(repo, index_dir, env, "extra_function_3_7")
            assert "Traceback" not in freed.stderr
            assert any(h["path"] == "more_3.py" for h in json.loads(freed.stdout)["results"]), freed.stdout
        finally:
            stop_all(runtime)
    assert daemon_pids(runtime) == []
