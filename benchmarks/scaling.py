"""What an index costs against the repository's size: whole `codesearch` processes on
samples of one tree, from a few hundred files to all of it.

For each size N the script hard-links a seeded random sample of N files of the tree's git
checkout (so every size has the same file-size mix and language) into a fresh folder and
times, each as its own process, as a user would from a shell:

* ``first index``: ``codesearch index DIR --model none --multi-model none --no-daemon -q``
  with an empty user cache, as on a new machine (lexical only: vectors cost the encoder's
  tokens/s times the tokens, see BENCHMARKS.md, 'Per 1,000 files on a CPU');
* ``no-op index``: the same command again, nothing changed;
* ``cold query``: ``codesearch query ... --mode lexical --no-daemon --no-refresh`` (a fresh
  process opens the index and answers one query).

Each row gives wall seconds, CPU seconds (user + sys of the process and its chunking
workers, from ``wait4``) and peak RSS (the largest of the process and its workers), the
index's size on disk and the 1-minute load average around the run: on a shared machine
compare CPU seconds, which the load does not move much. Nothing here asserts.

Usage::

    python benchmarks/scaling.py                                   # /work/data/spring, 6 sizes
    python benchmarks/scaling.py --tree PATH --sizes 250,1000,4000 --json out.json
    python benchmarks/plots.py                                     # the plot from the JSON

The samples are hard links: the indexer writes only ``DIR/.codesearch``, never a source file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "scaling.json"
QUERY = "how are bean definitions registered from annotated classes"


def _exe() -> list[str]:
    script = shutil.which("codesearch")
    return [script] if script else [sys.executable, "-m", "codesearch.cli"]


def cpu_name() -> str:
    """The CPU as lscpu names it, with its cores (the figures mean little without it)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        name = fields.get("Model name", "").strip()
        model = fields.get("Model", "").strip()
        return f"{name} (family {fields.get('CPU family', '?').strip()} model {model}), {os.cpu_count()} cores"
    except (OSError, subprocess.CalledProcessError):
        return f"{platform.processor() or 'unknown CPU'}, {os.cpu_count()} cores"


def tracked_files(tree: Path) -> list[str]:
    """The tree's files as git lists them (what a checkout holds), else every file."""
    try:
        out = subprocess.run(["git", "-C", str(tree), "ls-files", "-z"], capture_output=True, check=True).stdout
        return sorted(p for p in out.decode("utf-8", "surrogateescape").split("\0") if p)
    except (OSError, subprocess.CalledProcessError):
        return sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file() and ".git" not in p.parts)


def sample(tree: Path, files: list[str], n: int, dest: Path, seed: int) -> None:
    """Hard-link a seeded random sample of ``n`` of ``files`` into ``dest`` (same layout)."""
    chosen = files if n >= len(files) else random.Random(seed).sample(files, n)
    for rel in chosen:
        src, dst = tree / rel, dest / rel
        if not src.is_file() or src.is_symlink():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:  # another file system: a copy costs disk, not correctness
            shutil.copy2(src, dst)


def run_measured(cmd: list[str], env: dict[str, str]) -> dict:
    """Run one process to its end: wall, CPU seconds and peak RSS of it and its workers.

    ``wait4`` gives the rusage of that child alone, its waited-for workers included
    (CPU summed, RSS the largest of them), unlike RUSAGE_CHILDREN's running totals.
    """
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.read().decode()[-2000:]}")
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # KiB on Linux
        "load": round((load0 + os.getloadavg()[0]) / 2, 2),
    }


def dir_mib(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, default=Path("/work/data/spring"), help="a git checkout to sample")
    ap.add_argument("--sizes", default="250,500,1000,2000,4000,0", help="file counts; 0 = the whole tree")
    ap.add_argument("--work", type=Path, default=None, help="where the samples go (default: .cache/scaling)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = ap.parse_args(argv)

    work = args.work or Path.cwd() / ".cache" / "scaling"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "CODESEARCH_RUNTIME_DIR": str(work / "run"), "CODESEARCH_CACHE_DIR": str(work / "cache"),
           "XDG_CACHE_HOME": str(work / "xdg")}
    files = tracked_files(args.tree)
    exe = _exe()
    sizes = [int(s) or len(files) for s in args.sizes.split(",") if s]
    rows = []
    print("| files | MB | chunks | first index: wall s / CPU-s / peak RSS MiB | no-op index: wall / CPU-s "
          "| cold lexical query: wall / CPU-s / peak RSS MiB | index MiB | load |")
    print("|---:|---:|---:|---|---|---|---:|---:|")
    for n in sizes:
        dest = work / f"n{n}"
        shutil.rmtree(dest, ignore_errors=True)
        sample(args.tree, files, n, dest, args.seed)
        source = [p for p in dest.rglob("*") if p.is_file()]
        # An empty user cache for each size: the samples overlap, and chunks cached for the
        # files of a smaller sample would make a larger sample's first index look cheaper.
        shutil.rmtree(work / "cache", ignore_errors=True)
        index = [*exe, "index", str(dest), "--model", "none", "--multi-model", "none", "--no-daemon", "-q"]
        first = run_measured(index, env)
        noop = run_measured(index, env)
        query = run_measured([*exe, "query", QUERY, "--path", str(dest), "--mode", "lexical", "--no-daemon",
                              "--no-refresh", "-k", "10", "--json"], env)
        status = json.loads(subprocess.run([*exe, "status", str(dest), "--json"], env=env, capture_output=True,
                                           text=True, check=True).stdout)
        row = {
            "files": n,
            "source_mb": round(sum(p.stat().st_size for p in source) / 1e6, 1),
            "chunks": _chunks(status),
            "indexed_files": _indexed_files(status),
            "first_index": first,
            "noop_index": noop,
            "cold_query": query,
            "index_mib": dir_mib(dest / ".codesearch"),
        }
        rows.append(row)
        print(f"| {n:,} | {row['source_mb']} | {row['chunks']:,} | {first['wall_s']:.1f} / {first['cpu_s']:.1f} / "
              f"{first['peak_rss_mib']:.0f} | {noop['wall_s']:.2f} / {noop['cpu_s']:.2f} | {query['wall_s']:.2f} / "
              f"{query['cpu_s']:.2f} / {query['peak_rss_mib']:.0f} | {row['index_mib']} | {first['load']:.1f} |",
              flush=True)
        shutil.rmtree(dest, ignore_errors=True)
    out = {
        "what": "lexical-only codesearch index / no-op index / cold lexical query against repository size",
        "tree": str(args.tree),
        "cpu": cpu_name(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "commit": _commit(),
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _chunks(status: dict) -> int:
    idx = status.get("index", status)
    return int(idx.get("chunks", idx.get("chunks_total", 0)) or 0)


def _indexed_files(status: dict) -> int:
    idx = status.get("index", status)
    return int(idx.get("files", idx.get("files_indexed", 0)) or 0)


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
