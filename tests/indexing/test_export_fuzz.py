"""500 exports mutated at random (seeded), each imported and searched: every outcome is an
import that serves only the working tree's text, or one line; never a crash, a traceback,
or a worker past 1 GB of memory. The mutations and the checks: `fixtures.fuzz`.

A fifth of the cases start from an export of the older layout, which carried the derived
files (lexical, centrality, FAISS) an import now reads and ignores; a tenth have their new
index damaged in place and searched again; one in 25 is searched with its models too.
The same engine runs 5,000 cases in ``benchmarks/fuzz_exports.py``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from fixtures.exports import derived_members, git_repo, read_export, write_export
from fixtures.fuzz import run_workers

from codesearch.api import CodeSearch

CASES = 500


@pytest.fixture(scope="module")
def fuzz_base(single_vector_dir, colbert_dir):
    """(exports, repo, work folder) on a memory file system where there is one: an import
    syncs its files, and the cases are about what is read, not about the disk."""
    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(prefix="codesearch-fuzz-", dir=shm if shm.is_dir() else None))
    try:
        repo = git_repo(base / "repo", n_files=3, n_functions=2, lines=10)
        with CodeSearch(repo, model=str(single_vector_dir), multi_model=str(colbert_dir), device="cpu") as cs:
            cs.index()
            cs.search("compute mod1_fn1 of x", k=3)  # (a centrality cache, for the older layout)
            cs.export(base / "export.tar")
        doc, members = read_export(base / "export.tar")
        older = write_export(base / "older.tar", doc, {**members, **derived_members(repo / ".codesearch")})
        exports = [base / "export.tar"] * 4 + [older]
        yield exports, repo, base / "work"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_mutated_exports_are_imported_or_refused_in_one_line(fuzz_base):
    exports, repo, work = fuzz_base
    run = run_workers(exports, repo, work, CASES, workers=2)
    assert run.exit_codes == [0, 0], (run.exit_codes, [err[-2000:] for err in run.stderr])
    assert len(run.outcomes) == CASES
    failures = [o for o in run.outcomes if o.result == "failure"]
    assert not failures, "\n\n".join(f"case {o.seed} ({o.mutation}):\n{o.detail}" for o in failures[:3])
    assert all("Traceback" not in err for err in run.stderr), run.stderr
    assert max(run.peak_rss_mb) < 1024, run.peak_rss_mb
    results = Counter(o.result for o in run.outcomes)
    assert results["imported"] and results["refused"]  # (the mutations reach both)
    print(f"{CASES} cases in {run.seconds:.1f} s ({run.cpu_seconds:.1f} CPU-s): {dict(results)}, "
          f"peak RSS {max(run.peak_rss_mb):.0f} MB")
