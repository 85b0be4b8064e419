"""Duplicated code (copied trees, examples that repeat the package) is encoded once per text.

Vectors are cached by (model identity, kind, text hash) and the pipeline collects the texts
to encode in a dict keyed by that hash, so a second copy of a chunk or of a whole file finds
its vector already there (or already queued in the same run). The counting encoder records
every text that reaches the real tiny models.
"""

from __future__ import annotations

import shutil

import pytest
from fixtures.pipeline_helpers import check_consistent, make_repo

from codesearch.indexing import run as pipeline
from codesearch.indexing.run import build_index
from codesearch.store import Store
from codesearch.types import STORE_FILE


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo", n_files=3, n_functions=2, lines=5)


def _hashes(repo, prefix: str) -> list[str]:
    """Sorted chunk text hashes of the files under ``prefix``, as the store records them."""
    with Store(pipeline.default_index_dir(repo) / STORE_FILE) as s:
        rows = s.conn.execute(
            "SELECT c.text_hash FROM chunks c JOIN files f ON f.id = c.file_id WHERE f.path LIKE ?",
            (prefix + "%",),
        ).fetchall()
    return sorted(r[0] for r in rows)


def _distinct(repo) -> tuple[int, int]:
    """(distinct chunk texts, distinct file contents) in the store."""
    with Store(pipeline.default_index_dir(repo) / STORE_FILE) as s:
        return s.conn.execute(
            "SELECT (SELECT COUNT(DISTINCT text_hash) FROM chunks), (SELECT COUNT(DISTINCT hash) FROM files)"
        ).fetchone()


def test_a_duplicated_tree_is_encoded_once(repo, counting):
    shutil.copytree(repo / "pkg", repo / "examples" / "pkg")
    summary = build_index(repo, encoders=counting)
    original = _hashes(repo, "pkg/")
    assert original and _hashes(repo, "examples/pkg/") == original  # the copy chunks the same
    n_texts, n_files = _distinct(repo)
    assert summary.chunks_total == n_texts + len(original)  # the copies add chunks, not texts
    assert len(counting.multi.texts) == n_texts
    assert len(counting.dense.texts) == n_texts + n_files  # chunks, then whole files
    assert summary.chunks_encoded == 2 * n_texts + n_files
    check_consistent(pipeline.default_index_dir(repo))  # and every copy has its vectors


def test_a_copied_tree_added_later_encodes_nothing(repo, counting):
    build_index(repo, encoders=counting)
    counting.dense.texts.clear(), counting.multi.texts.clear()
    shutil.copytree(repo / "pkg", repo / "legacy" / "pkg")
    summary = build_index(repo, encoders=counting)
    assert summary.files_indexed == 3
    assert summary.chunks_encoded == 0
    assert counting.dense.texts == [] and counting.multi.texts == []
    check_consistent(pipeline.default_index_dir(repo))
