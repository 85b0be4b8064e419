"""Monorepo scale: one tree copied N times into a single git repository, indexed lexical-only,
then searched and indexed again from fresh processes, as a user would.

Prints one line per figure, each with the load average at its end, for a report to quote:

- the machine (CPU model, cores) and the repository (files, source bytes);
- first ``codesearch index`` (no daemon, an empty user cache): wall, CPU-s (the run and its
  chunking workers), peak RSS (the largest process), the seconds by stage, the index on disk;
- cold ``codesearch query`` (no daemon, a fresh process per query): wall, CPU-s, peak RSS;
- warm query p50 / p90 from a `CodeSearch` object in this process (lexical);
- no-op ``codesearch index`` (nothing changed): without a daemon, then with a daemon that
  serves and watches the root (started for the measurement, stopped after), with the warm
  daemon's query latency as a CLI call sees it.

The tree is built once under ``--out`` (git-ignored ``.cache/monorepo`` by default): each copy
is ``svcI/`` holding the source's files as hard links (nothing is copied, and the indexer
writes only its ``.codesearch/`` folder), committed once. The CLI runs with its runtime
folder and user cache under ``--out`` too.

Usage::

    python benchmarks/monorepo.py --source /work/data/spring --copies 10   # 114k files
    python benchmarks/monorepo.py --source /work/data/spring --copies 1
    python benchmarks/monorepo.py --source semble --copies 50              # the semble dev trees
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
SEMBLE = Path("/work/shared/bench/semble/trees.tar.gz")
QUERIES = (
    "parse the configuration file",
    "roll back the transaction on an exception",
    "map an http request to a handler method",
    "evict entries from the cache",
    "convert a string to a date",
)
LEXICAL = ("--model", "none", "--multi-model", "none")


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


# -- the tree ----------------------------------------------------------------------------------


def _source_files(source: Path) -> list[str]:
    """The source's files: what git tracks, or every file outside .git."""
    if (source / ".git").exists():
        out = subprocess.run(["git", "-C", str(source), "ls-files", "-z"], capture_output=True, check=True).stdout
        return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]
    files = []
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".codesearch")]
        rel = os.path.relpath(dirpath, source)
        files += [name if rel == "." else f"{rel}/{name}" for name in filenames]
    return sorted(files)


def _semble_trees(out: Path) -> Path:
    trees = out / "semble-trees"
    if not trees.is_dir():
        tmp = Path(tempfile.mkdtemp(dir=out))
        with tarfile.open(SEMBLE) as tar:
            tar.extractall(tmp, filter="data")
        tmp.rename(trees)
    return trees


def build_tree(source: Path, copies: int, dest: Path) -> tuple[int, int]:
    """``dest`` holding ``copies`` copies of ``source`` under ``svcI/``, one git commit;
    (files, bytes). Reused when a build of the same source and count is there."""
    marker = dest.with_name(dest.name + ".json")
    want = {"source": str(source), "copies": copies}
    if marker.is_file() and dest.is_dir():
        done = json.loads(marker.read_text())
        if {k: done.get(k) for k in want} == want:
            return done["files"], done["bytes"]
    shutil.rmtree(dest, ignore_errors=True)
    marker.unlink(missing_ok=True)
    files = _source_files(source)
    size = 0
    for i in range(copies):
        for rel in files:
            src, dst = source / rel, dest / f"svc{i}" / rel
            if not src.is_file() or src.is_symlink():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
            size += dst.stat().st_size
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@example.com", GIT_COMMITTER_NAME="bench",
               GIT_COMMITTER_EMAIL="bench@example.com")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", f"{source.name} x{copies}"]):
        subprocess.run(["git", "-C", str(dest), *args], check=True, env=env, capture_output=True)
    n = len(subprocess.run(["git", "-C", str(dest), "ls-files", "-z"], capture_output=True, check=True,
                           env=env).stdout.split(b"\0")) - 1
    marker.write_text(json.dumps({**want, "files": n, "bytes": size}))
    return n, size


# -- measured processes ------------------------------------------------------------------------


@dataclass
class Measured:
    wall: float
    cpu: float  # the process and every child it waited for (the chunking workers)
    rss_mb: float  # the largest of them
    rc: int
    stdout: str
    stderr: str


#: Runs its command in a fork of itself and reports that process's wall, CPU and peak RSS.
#: Why a wrapper: a child's peak RSS counts the memory of the process it was forked from (Linux
#: keeps it across exec), and this process holds an index once the warm figures are taken.
_WRAP = """
import json, os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, ru = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"wall": time.perf_counter() - t0, "cpu": ru.ru_utime + ru.ru_stime, "rss_kb": ru.ru_maxrss,
               "rc": os.waitstatus_to_exitcode(status)}, f)
"""


def measure(cmd: list[str], env: dict[str, str], timeout: float = 3600) -> Measured:
    """Run ``cmd`` in a fresh process: its wall time, its CPU (with every child it waited for:
    the chunking workers) and the peak RSS of the largest of them."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "usage.json"
        done = subprocess.run([sys.executable, "-c", _WRAP, str(report), *cmd], capture_output=True, env=env,
                              timeout=timeout)
        usage = json.loads(report.read_text()) if report.is_file() else {"wall": 0, "cpu": 0, "rss_kb": 0,
                                                                          "rc": done.returncode}
    return Measured(usage["wall"], usage["cpu"], usage["rss_kb"] / 1024, usage["rc"],
                    done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "codesearch.cli", *args]


def check(m: Measured, what: str) -> Measured:
    if m.rc != 0:
        raise SystemExit(f"{what} failed (exit {m.rc}):\n{m.stderr[-2000:]}")
    return m


def du_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 2**20
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def stages(stderr: str) -> str:
    for line in stderr.splitlines():
        if line.startswith("time by stage (s):"):
            return line.split(":", 1)[1].strip()
    return "?"


# -- the figures -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default="/work/data/spring",
                    help="the tree to copy: a folder (a git repository: its tracked files), or 'semble'")
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--out", type=Path, default=PROJECT / ".cache" / "monorepo")
    ap.add_argument("--query", action="append", help="a cold/warm query (repeatable; default: five)")
    ap.add_argument("--warm-repeats", type=int, default=5, help="rounds of the queries for the warm p50")
    ap.add_argument("--noop-runs", type=int, default=3)
    ap.add_argument("--skip-index", action="store_true", help="keep the index there (no first-index figure)")
    ap.add_argument("--skip-daemon", action="store_true")
    args = ap.parse_args(argv)
    queries = tuple(args.query or QUERIES)

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    source = _semble_trees(out) if args.source == "semble" else Path(args.source).resolve()
    root = out / f"{source.name}-x{args.copies}"
    env_dir = out / "env"
    env = {**os.environ, "CODESEARCH_RUNTIME_DIR": str(env_dir / "runtime"),
           "CODESEARCH_CACHE_DIR": str(env_dir / "cache"), "XDG_CACHE_HOME": str(env_dir / "xdg"),
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(PROJECT)}
    alone = {**env, "CODESEARCH_NO_DAEMON": "1"}

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; python {sys.version.split()[0]}; {load()}")
    t0 = time.perf_counter()
    files, size = build_tree(source, args.copies, root)
    print(f"repository: {source.name} x{args.copies} = {files:,} files, {size / 2**20:,.0f} MB of source, "
          f"one git commit ({root}; built or found in {time.perf_counter() - t0:.0f} s)")

    # First index: nothing in the user cache (no chunk or vector to reuse), no daemon.
    if not args.skip_index or not (root / ".codesearch").is_dir():
        shutil.rmtree(root / ".codesearch", ignore_errors=True)
        shutil.rmtree(env_dir / "cache", ignore_errors=True)
        m = check(measure(cli("index", str(root), *LEXICAL), alone), "first index")
        parts = {p.name: du_mb(p) for p in sorted((root / ".codesearch").iterdir())}
        big = ", ".join(f"{name} {mb:,.0f}" for name, mb in parts.items() if mb >= 1)
        print(f"first index: wall {m.wall:.1f} s, {m.cpu:.1f} CPU-s, peak RSS {m.rss_mb:,.0f} MB, index "
              f"{sum(parts.values()):,.0f} MB ({big}); stages (s): {stages(m.stderr)}; {load()}")

    # Cold queries: a fresh process each, searched in it (no daemon), as `codesearch query` does.
    cold = []
    for q in queries:
        m = check(measure(cli("query", q, "-p", str(root), "-k", "5", "--json", "--mode", "lexical"), alone),
                  f"query {q!r}")
        hits = len(json.loads(m.stdout)["results"])
        cold.append(m)
        print(f"cold query {q!r}: wall {m.wall:.2f} s, {m.cpu:.2f} CPU-s, peak RSS {m.rss_mb:,.0f} MB, "
              f"{hits} hits; {load()}")
    walls = sorted(m.wall for m in cold)
    print(f"cold query: median wall {statistics.median(walls):.2f} s (max {walls[-1]:.2f}), "
          f"max peak RSS {max(m.rss_mb for m in cold):,.0f} MB over {len(cold)} queries; {load()}")

    # No-op index: nothing changed since the first index.
    def noop(run_env: dict[str, str], what: str) -> None:
        runs = [check(measure(cli("index", str(root), *LEXICAL), run_env), what) for _ in range(args.noop_runs)]
        said = [m for m in runs if "files indexed: 0\n" in m.stderr + m.stdout]
        walls = sorted(m.wall for m in runs)
        print(f"no-op index ({what}): median wall {statistics.median(walls):.2f} s (min {walls[0]:.2f}, max "
              f"{walls[-1]:.2f}), median {statistics.median(m.cpu for m in runs):.2f} CPU-s, peak RSS "
              f"{max(m.rss_mb for m in runs):,.0f} MB, {len(said)}/{len(runs)} said unchanged; {load()}")

    noop(alone, "no daemon")
    if not args.skip_daemon:
        daemon = {**env, "CODESEARCH_DAEMON": "1"}
        check(measure(cli("daemon", "start"), daemon), "daemon start")
        try:
            # The daemon serves (and watches) the root once a query goes through it.
            first_q = check(measure(cli("query", queries[0], "-p", str(root), "-k", "5", "--json", "--mode",
                                        "lexical"), daemon), "query through the daemon")
            warm = sorted(check(measure(cli("query", q, "-p", str(root), "-k", "5", "--json", "--mode", "lexical"),
                                        daemon), "query through the daemon").wall for q in queries)
            print(f"daemon query (CLI call, warm daemon): median wall {statistics.median(warm):.2f} s "
                  f"(its first, which opens the root: {first_q.wall:.2f} s); {load()}")
            noop(daemon, "daemon running")
            status = measure(cli("daemon", "status"), daemon)
            for line in status.stdout.splitlines():
                if "rss" in line.lower() or "memory" in line.lower():
                    print(f"daemon status: {line.strip()}")
        finally:
            measure(cli("daemon", "stop"), daemon)

    # Warm, last (this process then holds the index): one CodeSearch object, its first query
    # not counted.
    for key in ("CODESEARCH_RUNTIME_DIR", "CODESEARCH_CACHE_DIR", "XDG_CACHE_HOME", "CODESEARCH_NO_DAEMON"):
        os.environ[key] = alone[key]
    from codesearch import CodeSearch

    with CodeSearch(root, model=None, multi_model=None) as cs:
        t = time.perf_counter()
        cs.search(queries[0], k=5, mode="lexical")
        first = time.perf_counter() - t
        times = []
        for _ in range(args.warm_repeats):
            for q in queries:
                t = time.perf_counter()
                cs.search(q, k=5, mode="lexical")
                times.append(time.perf_counter() - t)
    times.sort()
    print(f"warm query (CodeSearch, lexical): p50 {1000 * statistics.median(times):.0f} ms, "
          f"p90 {1000 * times[int(0.9 * (len(times) - 1))]:.0f} ms over {len(times)} queries "
          f"(the object's first query {first:.2f} s); {load()}")

    return 0


if __name__ == "__main__":
    sys.exit(main())
