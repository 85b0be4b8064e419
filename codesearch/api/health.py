"""Index health for an agent: one state, what is wrong, and the one action that fixes it.
``status --json`` and the MCP ``index_status`` tool carry it.

The states, worst first: ``not_indexed`` (no store), ``damaged`` (a derived index file is
missing or unreadable, or the store cannot be read), ``building`` (an index run holds the
writer lock now), ``incomplete`` (some chunks or files lack vectors of a recorded model: a
run was stopped, or ran offline), ``stale`` (files changed since the last run), ``complete``.
Cheap: it reads meta and stats files; it does not check every vector's bytes (``--rebuild``
does that).
"""

from __future__ import annotations

from pathlib import Path

from codesearch.types import JSONDict

__all__ = ["index_health"]


def index_health(root: Path, index_dir: Path, *, indexed: bool, vectors: dict[str, float],
                 is_stale: bool) -> JSONDict:
    """``{"state", "problems", "next_action"}`` for the index of ``root`` at ``index_dir``."""
    from codesearch.store import IndexLock

    again = f"codesearch index {root}"
    if not indexed:
        return _health("not_indexed", [], f"{again} (or a first query, which indexes lexical-only)")
    problems = _derived_problems(index_dir)
    if problems:
        if IndexLock.writer_active(index_dir):
            return _health("building", problems, "wait for the index run to finish; searches answer meanwhile")
        return _health("damaged", problems, f"repair it: {again} (or the MCP tool repair_index)")
    if IndexLock.writer_active(index_dir):
        return _health("building", [], "wait for the index run to finish; searches answer meanwhile")
    missing = {kind: share for kind, share in vectors.items() if share < 1.0}
    if missing:
        what = [f"{kind} vectors for {share:.0%} of the index" for kind, share in sorted(missing.items())]
        return _health("incomplete", what, f"{again} (resumes the vectors; searches answer meanwhile)")
    if is_stale:
        return _health("stale", ["files changed since the last index run"], again)
    return _health("complete", [], "none")


def _health(state: str, problems: list[str], action: str) -> JSONDict:
    return {"state": state, "problems": problems, "next_action": action}


def _derived_problems(index_dir: Path) -> list[str]:
    """What is wrong with the derived index files (empty when all are there, at the store's
    generation or healable from it)."""
    from codesearch.errors import CodeSearchError
    from codesearch.indexes.registry import index_path, wanted
    from codesearch.store import Store
    from codesearch.types import STORE_FILE

    try:
        with Store(index_dir / STORE_FILE, readonly=True) as store:
            names = wanted(store)
    except (CodeSearchError, OSError) as exc:
        return [f"the store cannot be read: {exc}"]
    problems = []
    for name in names:
        path = index_path(index_dir, name)
        if not path.exists():
            problems.append(f"{name} index file {path.name} is missing")
        elif path.is_file() and path.stat().st_size == 0:
            problems.append(f"{name} index file {path.name} is empty")
    return problems
