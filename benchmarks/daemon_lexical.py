"""A lexical query from a shell: searched in the CLI's own process, or answered by the warm
daemon that keeps the index open (what ``codesearch query --mode lexical`` does for an index
of `LEXICAL_DAEMON_CHUNKS` chunks or more).

For each indexed folder given: its chunk count; then ``--repeat`` fresh ``codesearch query
... --mode lexical --json`` processes of each kind, timed from the shell (wall seconds) with
the CLI process's peak RSS (GNU ``time``'s %M); and, from ``daemon status``, the
memory the daemon gives the root. The daemon runs in a private runtime folder, started by
the first daemon query (its start and first open are reported apart), stopped at the end.

Usage: python benchmarks/daemon_lexical.py FOLDER [FOLDER ...] [--repeat 5] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUERIES = ["open a connection to the database", "parse the configuration file", "retry a failed request",
           "convert a string to a number", "handle an error and log it"]


def _cli() -> list[str]:
    script = shutil.which("codesearch")
    return [script] if script else [sys.executable, "-m", "codesearch.cli"]


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, int, subprocess.CompletedProcess]:
    """Wall seconds and peak RSS (bytes, from GNU time's %M) of one child process."""
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", *argv], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    *rest, last = done.stderr.rstrip("\n").rsplit("\n", 1) if "\n" in done.stderr.rstrip("\n") else ("", done.stderr)
    try:
        peak = int(last.strip()) * 1024
    except ValueError:
        peak = -1
    return wall, peak, subprocess.CompletedProcess(done.args, done.returncode, done.stdout, "".join(rest))


def _chunks(root: Path) -> int:
    conn = sqlite3.connect(f"file:{root / '.codesearch' / 'store.sqlite'}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    runtime = Path(tempfile.mkdtemp(prefix="codesearch-daemon-lexical-"))
    base = {**os.environ, "CODESEARCH_RUNTIME_DIR": str(runtime), "HF_HUB_OFFLINE": "1"}
    base.pop("CODESEARCH_NO_DAEMON", None)
    here = {**base, "CODESEARCH_NO_DAEMON": "1"}
    daemon = {**base, "CODESEARCH_LEXICAL_DAEMON_CHUNKS": "1", "CODESEARCH_DAEMON": "1"}
    rows = []
    try:
        for folder in args.folders:
            root = folder.resolve()
            row: dict = {"root": str(root), "chunks": _chunks(root), "load_before": os.getloadavg()[0]}
            for name, env in (("in_process", here), ("daemon", daemon)):
                walls, peaks = [], []
                first = None
                for i in range(args.repeat + (1 if name == "daemon" else 0)):
                    q = QUERIES[i % len(QUERIES)]
                    wall, peak, done = _timed([*_cli(), "query", q, "-p", str(root), "--mode", "lexical", "--json",
                                               "-k", "5"], env)
                    if done.returncode != 0 or not json.loads(done.stdout)["results"]:
                        raise SystemExit(f"{name} query failed: {done.stderr[-2000:]}")
                    if name == "daemon" and first is None:
                        first = wall  # the daemon's start and its first open of the index
                        continue
                    walls.append(wall)
                    if peak > 0:
                        peaks.append(peak)
                row[name] = {"p50_s": round(statistics.median(walls), 3), "max_s": round(max(walls), 3),
                             "cli_peak_rss_mib": round(max(peaks) / 2**20) if peaks else None}
                if first is not None:
                    row[name]["first_s"] = round(first, 3)
            status = json.loads(subprocess.run([*_cli(), "daemon", "status", "--json"], env=base,
                                               capture_output=True, text=True).stdout)
            served = next((r for r in status.get("roots", []) if r["root"] == str(root)), {})
            memory = served.get("memory") or {}
            row["daemon"]["root_heap_mib"] = round((memory.get("heap_bytes") or 0) / 2**20)
            row["daemon"]["daemon_rss_mib"] = round((status.get("rss_bytes") or 0) / 2**20)
            row["load_after"] = os.getloadavg()[0]
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        subprocess.run([*_cli(), "daemon", "stop"], env=base, capture_output=True)
        shutil.rmtree(runtime, ignore_errors=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
