"""Symbol lookups on code the dev split does not contain: is a definition found by its name?

For each Python package given (by default, packages installed beside codesearch: code
nobody here tuned on), every class or function name defined exactly once is queried alone
(lexical mode, through the public API, as an agent looking a name up would). A query
succeeds when the hit covering the ``def``/``class`` line is first; MRR@10 says how far down
it is otherwise. Names are taken in sorted order, at most ``--per-package`` of them.

Usage::

    python benchmarks/symbol_lookup.py                           # 10 installed packages
    python benchmarks/symbol_lookup.py --packages rich,httpx --per-package 200
    python benchmarks/symbol_lookup.py --root path/to/python/repo
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import sysconfig
import tempfile
from pathlib import Path

DEFAULT = "rich,httpx,starlette,pydantic,jinja2,markdown_it,anyio,typer,click,uvicorn"
_DEF = re.compile(r"^\s*(?:async\s+def|def|class)\s+([A-Za-z_][A-Za-z0-9_]{3,})", re.MULTILINE)


def definitions(root: Path) -> dict[str, tuple[str, int]]:
    """Name -> (path, line) for names defined exactly once under ``root``."""
    found: dict[str, list[tuple[str, int]]] = {}
    for f in sorted(root.rglob("*.py")):
        if ".codesearch" in f.parts:
            continue
        text = f.read_text(errors="replace")
        for m in _DEF.finditer(text):
            line = text.count("\n", 0, m.start(1)) + 1
            found.setdefault(m.group(1), []).append((f.relative_to(root).as_posix(), line))
    return {name: places[0] for name, places in found.items() if len(places) == 1}


def measure(root: Path, limit: int) -> tuple[int, float, float]:
    from codesearch import CodeSearch

    names = definitions(root)
    asked = sorted(names)[:limit]
    top1, rr = 0, []
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
        for name in asked:
            path, line = names[name]
            hits = cs.search(name, k=10, mode="lexical")
            rank = next((i for i, h in enumerate(hits, 1) if h.path == path and h.start_line <= line <= h.end_line), 0)
            top1 += rank == 1
            rr.append(1 / rank if rank else 0.0)
    return len(asked), top1 / max(1, len(asked)), statistics.mean(rr) if rr else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packages", default=DEFAULT, help="installed packages to copy and index")
    ap.add_argument("--root", type=Path, action="append", default=[], help="a folder to use as it is (repeatable)")
    ap.add_argument("--per-package", type=int, default=400)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    work = Path(tempfile.mkdtemp(prefix="symbol-lookup-"))
    site = Path(sysconfig.get_paths()["purelib"])
    roots: list[Path] = list(args.root)
    for pkg in [p for p in args.packages.split(",") if p and not args.root]:
        if (site / pkg).is_dir():
            roots.append(Path(shutil.copytree(site / pkg, work / pkg, ignore=shutil.ignore_patterns("__pycache__"))))
        else:
            print(f"skipped {pkg}: not installed", file=sys.stderr)
    rows = []
    try:
        print("| package | names | top-1 | MRR@10 |\n|---|---:|---:|---:|")
        for root in roots:
            n, top1, mrr = measure(root, args.per_package)
            rows.append((top1, mrr))
            print(f"| {root.name} | {n} | {top1:.4f} | {mrr:.4f} |", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if rows:
        print(f"\nmean over {len(rows)}: top-1 {statistics.mean(r[0] for r in rows):.4f}, "
              f"MRR@10 {statistics.mean(r[1] for r in rows):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
