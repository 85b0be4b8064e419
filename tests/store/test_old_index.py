"""An index written by codesearch 0.1.0 before the re-layout (commit 1b9388d, lexical-only,
over tests/fixtures/sample_repo.py) opens, searches and updates with this code, unchanged:
the on-disk format did not move with the modules."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
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


MAIN_INDEX = Path(__file__).resolve().parents[1] / "fixtures" / "index_main_19a40e4"


def test_an_index_written_before_the_package_relayout_opens_and_answers_as_it_did(tmp_path, monkeypatch,
                                                                                   single_vector_dir, colbert_dir):
    """The index of fixtures/index_main_19a40e4 (lexical, dense, whole-file, ColBERT/PLAID,
    a vectors segment), written by the code before this re-layout: its vector files load as
    they are, its lexical index (``lexical.npz``, of the format before the segmented one) is
    rebuilt from the store once, with a notice, and every mode answers what that code
    answered, with the same tiny models (built again here, from the same seeds)."""
    import json

    from codesearch.indexes import registry

    expected = json.loads((MAIN_INDEX / "expected.json").read_text())
    root = write_sample_repo(tmp_path / "repo")
    shutil.copytree(MAIN_INDEX, root / ".codesearch", ignore=shutil.ignore_patterns("*.json", "*.md"))
    rebuilt: list[str] = []
    real = registry._rebuild_index
    monkeypatch.setattr(registry, "_rebuild_index",
                        lambda name, store, **kw: rebuilt.append(name) or real(name, store, **kw))
    with CodeSearch(root, model=str(single_vector_dir), multi_model=str(colbert_dir), device="cpu") as cs:
        status = cs.status()
        assert (status.files, status.chunks, status.vectors) == (expected["files"], expected["chunks"],
                                                                 expected["vectors"])
        said = []
        for mode, hits in expected["answers"].items():
            result = cs.query("parse config file", 3, mode=mode)
            said += [n for n in result.notices if "older format" in n]
            got = result.hits
            assert [[h.path, h.start_line, h.end_line] for h in got] == [h[:3] for h in hits], mode
            # That code computed the bfloat16 test model in bfloat16; a CPU whose bf16 matmuls
            # are slow now computes it in float32: scores agree at bf16's
            # precision (measured: 0.0024 on a dense score), the order exactly.
            assert [h.score for h in got] == pytest.approx([h[3] for h in hits], abs=1e-2), mode
    assert rebuilt == ["lexical"] and len(said) == 1
    assert not (root / ".codesearch" / "lexical.npz").exists() and (root / ".codesearch" / "lexical").is_dir()
