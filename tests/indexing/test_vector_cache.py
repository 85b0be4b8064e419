"""Indexes share vectors through the user's vector cache (`codesearch.store.cache`).

A second copy of a repository (a worktree, a branch, a clone) takes every vector its text
already has from the cache and encodes only what is new; the index it builds is whole
without the cache (deleting it breaks no search) and answers as the first copy's does.
The counting encoder records every text that reaches the real tiny models.
"""

from __future__ import annotations

import shutil

import pytest
from fixtures import models
from fixtures.pipeline_helpers import CountingEncoder, check_consistent, make_repo, module_source

from codesearch.api import CodeSearch
from codesearch.cli import render
from codesearch.encoder.base import Encoders
from codesearch.indexing import run as pipeline
from codesearch.indexing.run import build_index
from codesearch.store import Store
from codesearch.store.cache import UserCache, cache_folder
from codesearch.types import STORE_FILE

QUERIES = ["retry the request", "mod1_fn0 helper value", "fixture repository"]


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "main", n_files=4, n_functions=2, lines=5)


def _copy(repo, where):
    """A second checkout of the same commit: the files, not the index."""
    return shutil.copytree(repo, where, ignore=shutil.ignore_patterns(".codesearch"))


def _hits(root, single_vector_dir, colbert_dir, mode):
    with CodeSearch(root, model=str(single_vector_dir), multi_model=str(colbert_dir), device="cpu") as cs:
        return [
            [(h.path, h.start_line, h.end_line, round(h.score, 4)) for h in cs.search(q, k=5, mode=mode)]
            for q in QUERIES
        ]


def _texts(counting) -> int:
    return len(counting.dense.texts) + len(counting.multi.texts)


def test_a_second_copy_encodes_nothing_and_answers_the_same(repo, tmp_path, counting, single_vector_dir, colbert_dir):
    first = build_index(repo, encoders=counting)
    assert first.chunks_encoded > 0 and first.texts_reused == 0
    counting.dense.texts.clear(), counting.multi.texts.clear()

    second = _copy(repo, tmp_path / "worktree")
    summary = build_index(second, encoders=counting)
    assert _texts(counting) == 0
    assert summary.chunks_encoded == 0
    assert summary.texts_reused == first.chunks_encoded
    check_consistent(pipeline.default_index_dir(second))
    for mode in ("hybrid", "dense", "colbert"):
        assert _hits(second, single_vector_dir, colbert_dir, mode) == _hits(repo, single_vector_dir, colbert_dir, mode)


def test_a_copy_with_one_file_changed_encodes_only_that_files_text(repo, tmp_path, counting):
    build_index(repo, encoders=counting)
    counting.dense.texts.clear(), counting.multi.texts.clear()
    branch = _copy(repo, tmp_path / "branch")
    (branch / "pkg/new.py").write_text(module_source("brand_new", 2, lines=5))

    summary = build_index(branch, encoders=counting)
    assert counting.multi.texts and all("brand_new" in t for t in counting.multi.texts)
    assert all("brand_new" in t for t in counting.dense.texts)  # its chunks and the file itself
    assert summary.chunks_encoded == _texts(counting)
    check_consistent(pipeline.default_index_dir(branch))


def test_deleting_the_cache_never_breaks_a_search(repo, tmp_path, counting, single_vector_dir, colbert_dir):
    build_index(repo, encoders=counting)
    second = _copy(repo, tmp_path / "clone")
    build_index(second, encoders=counting)
    before = _hits(second, single_vector_dir, colbert_dir, "hybrid")
    shutil.rmtree(cache_folder())

    assert _hits(second, single_vector_dir, colbert_dir, "hybrid") == before
    (second / "pkg/mod0.py").write_text(module_source("changed", 2, lines=5))
    counting.dense.texts.clear(), counting.multi.texts.clear()
    build_index(second, encoders=counting)  # the cache is made again, and the run encodes
    assert _texts(counting) > 0
    check_consistent(pipeline.default_index_dir(second))
    with UserCache.open() as cache:
        assert cache.count() == _texts(counting)


def test_another_model_reuses_nothing(repo, tmp_path, counting, tiny_encoders):
    build_index(repo, encoders=counting)
    from codesearch.encoder import load

    # The same architecture and tokenizer, other weights: another identity, other vectors.
    other = CountingEncoder(load(str(models.make_single_vector(tmp_path / "other_model", seed=7))))
    second = _copy(repo, tmp_path / "other")
    summary = build_index(second, encoders=Encoders(dense=other, multi=counting.multi))
    assert other.texts and summary.texts_reused == len(counting.multi.texts)  # the ColBERT ones only
    with Store(pipeline.default_index_dir(second) / STORE_FILE) as s:
        assert s.count_with_vectors("dense") == s.count("chunks")


def test_with_the_cache_off_every_copy_encodes(repo, tmp_path, counting, monkeypatch):
    monkeypatch.setenv("CODESEARCH_CACHE_SIZE", "0")
    first = build_index(repo, encoders=counting)
    summary = build_index(_copy(repo, tmp_path / "again"), encoders=counting)
    assert summary.chunks_encoded == first.chunks_encoded and summary.texts_reused == 0
    assert not any(cache_folder().iterdir())  # nothing written there


def test_a_cache_that_cannot_be_made_is_no_error(repo, tmp_path, counting, monkeypatch):
    (tmp_path / "a_file").write_text("not a folder")
    monkeypatch.setenv("CODESEARCH_CACHE_DIR", str(tmp_path / "a_file" / "cache"))
    summary = build_index(repo, encoders=counting)
    assert summary.chunks_encoded > 0 and not summary.notices
    check_consistent(pipeline.default_index_dir(repo))


def test_the_summary_says_how_much_came_from_the_cache(repo, tmp_path, counting, capsys):
    build_index(repo, encoders=counting)
    summary = build_index(_copy(repo, tmp_path / "wt"), encoders=counting)
    render.index_summary(summary)
    err = " ".join(capsys.readouterr().err.split())
    # Piped (as here): one "label: value" line per row; a terminal gets the table.
    assert f"reused from the cache: {summary.texts_reused:,} of {summary.texts_reused:,} texts" in err
