"""The fuzz test of prebuilt-index imports at scale: N exports mutated at random (seeded),
each imported and searched (`tests/fixtures/fuzz.py`), in W worker processes at once.

Prints one JSON line: cases, outcomes (imported, refused, failure), crashes (workers that did
not exit 0), tracebacks, peak RSS per worker, seconds, cases per mutation kind, the most
frequent refusals, and the first failures in full. Nothing is asserted: the suite's test
(``tests/indexing/test_export_fuzz.py``, 500 cases) asserts; this runs more of them once.

Usage::

    python benchmarks/fuzz_exports.py                  # 5,000 cases, 2 workers
    python benchmarks/fuzz_exports.py --cases 500 --first 100000 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--first", type=int, default=0, help="the first seed")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--vectors-every", type=int, default=25)
    ap.add_argument("--damage-every", type=int, default=10)
    args = ap.parse_args(argv)

    from fixtures import models
    from fixtures.exports import derived_members, git_repo, read_export, write_export
    from fixtures.fuzz import run_workers

    from codesearch.api import CodeSearch

    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(prefix="codesearch-fuzz-", dir=shm if shm.is_dir() else None))
    os.environ.setdefault("CODESEARCH_CACHE_DIR", str(base / "cache"))
    os.environ.setdefault("CODESEARCH_NO_DAEMON", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        dense, colbert = models.make_single_vector(base / "dense"), models.make_colbert(base / "colbert")
        repo = git_repo(base / "repo", n_files=3, n_functions=2, lines=10)
        with CodeSearch(repo, model=str(dense), multi_model=str(colbert), device="cpu") as cs:
            cs.index()
            cs.search("compute mod1_fn1 of x", k=3)
            cs.export(base / "export.tar")
        doc, members = read_export(base / "export.tar")
        older = write_export(base / "older.tar", doc, {**members, **derived_members(repo / ".codesearch")})
        run = run_workers([base / "export.tar"] * 4 + [older], repo, base / "work", args.cases,
                          workers=args.workers, first=args.first, vectors_every=args.vectors_every,
                          damage_every=args.damage_every)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    results = Counter(o.result for o in run.outcomes)
    kinds = Counter(o.mutation.split(":")[0].split(" ")[0] for o in run.outcomes)
    refusals = Counter(o.detail.split(": ", 2)[-1][:80] for o in run.outcomes if o.result == "refused")
    failures = [o for o in run.outcomes if o.result == "failure"]
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "?")
    print(json.dumps({
        "cases": len(run.outcomes), "first_seed": args.first, "workers": args.workers,
        "outcomes": dict(results), "crashes": sum(code != 0 for code in run.exit_codes),
        "tracebacks": sum("Traceback" in err for err in run.stderr) + len(failures),
        "peak_rss_mb": run.peak_rss_mb, "seconds": round(run.seconds, 1),
        "cpu_seconds": round(run.cpu_seconds, 1), "by_mutation": dict(kinds),
        "top_refusals": refusals.most_common(8),
        "failures": [{"seed": o.seed, "mutation": o.mutation, "detail": o.detail} for o in failures[:5]],
        "cpu": cpu, "load": os.getloadavg()[0],
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
