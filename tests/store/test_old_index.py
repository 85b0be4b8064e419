"""An index written by codesearch 0.1.0 before the re-layout (commit 1b9388d, lexical-only,
over tests/fixtures/sample_repo.py) opens, searches and updates with this code, unchanged:
the on-disk format did not move with the modules."""

from __future__ import annotations

import shutil
from pathlib import Path

from fixtures.sample_repo import write_sample_repo

from codesearch.api import CodeSearch

OLD_INDEX = Path(__file__).resolve().parents[1] / "fixtures" / "index_v0_1"


def test_an_index_built_before_the_relayout_opens_searches_and_updates(tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    shutil.copytree(OLD_INDEX, root / ".codesearch")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        status = cs.status()
        assert status.indexed and status.files == 5 and status.chunks == 5
        hits = cs.search("parse config file", k=3, mode="lexical")
        assert hits and hits[0].path == "src/config.js"
        summary = cs.index()
        # The chunker's version is newer than the index's: its next run re-chunks every file
        # in place (no rebuild asked for, nothing removed, the same chunks for this repo).
        assert summary.files_removed == 0 and summary.chunks_total == 5
        assert cs.index().files_indexed == 0  # and from then on it is up to date
        assert [h.path for h in cs.search("parse config file", k=3, mode="lexical")] == [h.path for h in hits]
