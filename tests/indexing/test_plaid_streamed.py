"""An index run's PLAID index built into its folder a block at a time (`PlaidIndex.fill`),
and the folds of later runs written there too: the same index the store's vectors make."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.pipeline_helpers import make_repo, module_source

from codesearch.encoder.base import Encoders
from codesearch.indexes import registry
from codesearch.indexes.plaid import PlaidIndex
from codesearch.indexes.plaid import build as plaid_build
from codesearch.indexes.plaid import index as plaid_index
from codesearch.indexing import run as pipeline
from codesearch.indexing.run import build_index
from codesearch.store import Store
from codesearch.types import STORE_FILE

pytestmark = pytest.mark.usefixtures("one_faiss_thread")


@pytest.fixture(autouse=True)
def small_plaid(monkeypatch):
    # PLAID at test size, with few centroids, and every loop of the build run many times.
    monkeypatch.setitem(PlaidIndex.__init__.__kwdefaults__, "exact_threshold", 200)
    monkeypatch.setitem(PlaidIndex.__init__.__kwdefaults__, "max_centroids", 16)
    monkeypatch.setattr(plaid_build, "BLOCK_TOKENS", 500)
    monkeypatch.setattr(plaid_build, "IVF_BLOCK_TOKENS", 900)
    monkeypatch.setattr(plaid_build, "MERGE_ENTRIES", 300)
    monkeypatch.setattr(registry, "_PLAID_ADD_BATCH", 4)  # a run's additions to the tail, a few at a time


@pytest.fixture
def colbert_only(tiny_encoders):
    return Encoders(dense=None, multi=tiny_encoders[1])


@pytest.fixture
def spied(monkeypatch):
    """How the run's PLAID index was made: fills, streamed folds, in-memory builds."""
    calls = {"fill": 0, "fold": 0, "memory": 0}
    real_fill, real_fold, real_build = plaid_build.fill, plaid_build.compact, PlaidIndex._build

    def fill(*a, **kw):
        calls["fill"] += 1
        return real_fill(*a, **kw)

    def fold(*a, **kw):
        calls["fold"] += 1
        return real_fold(*a, **kw)

    def memory(*a, **kw):
        calls["memory"] += 1
        return real_build(*a, **kw)

    monkeypatch.setattr(plaid_build, "fill", fill)
    monkeypatch.setattr(plaid_build, "compact", fold)
    monkeypatch.setattr(PlaidIndex, "_build", memory)
    return calls


def _is_the_stores(root) -> PlaidIndex:
    """The root's PLAID index, checked against its store: every chunk's vectors, each coded
    as its codec codes the stored array."""
    idir = pipeline.default_index_dir(root)
    index = PlaidIndex.load(idir / "plaid")
    with Store(idir / STORE_FILE, readonly=True) as store:
        found, _ = store.vector_lengths("colbert")
        assert sorted(index.ids().tolist()) == found.tolist()
        codes = index.doc_codes(found)
        for ids, arrays in store.iter_vectors("colbert"):
            for i, a in zip(ids.tolist(), arrays):
                want_codes, want_packed = index.codec.compress(np.asarray(a, np.float32))
                np.testing.assert_array_equal(codes[i][0], want_codes)
                np.testing.assert_array_equal(codes[i][1], want_packed)
    return index


def test_a_first_index_fills_its_plaid_index_in_its_folder(tmp_path, colbert_only, spied):
    repo = make_repo(tmp_path / "repo", n_files=6, n_functions=3, lines=6)
    build_index(repo, encoders=colbert_only)
    index = _is_the_stores(repo)
    assert index.kind == "plaid" and spied["fill"] >= 1 and spied["memory"] == 0
    assert isinstance(index._codes.base, np.memmap)


def test_removals_after_a_fill_compact_into_the_folder(tmp_path, colbert_only, spied, monkeypatch):
    # (16 centroids fit test-sized edits badly: no drift rebuild, so the runs change the index)
    monkeypatch.setitem(PlaidIndex.__init__.__kwdefaults__, "rebuild_ratio", 100.0)
    repo = make_repo(tmp_path / "repo", n_files=6, n_functions=3, lines=6)
    build_index(repo, encoders=colbert_only)
    for step in range(3):
        (repo / "pkg" / f"new{step}.py").write_text(module_source(f"new{step}", 1, lines=3))
        (repo / "pkg" / f"mod{step}.py").unlink()
        build_index(repo, encoders=colbert_only)
    _is_the_stores(repo)
    assert spied["fold"] >= 1 and spied["memory"] == 0  # past a quarter removed: compacted, streamed
    leftovers = [p.name for p in (pipeline.default_index_dir(repo) / "plaid").iterdir() if ".tmp" in p.name]
    assert not leftovers


def test_an_exact_index_an_edit_takes_past_its_threshold_is_filled_from_the_store(tmp_path, colbert_only, spied,
                                                                                 monkeypatch):
    repo = make_repo(tmp_path / "repo", n_files=1, n_functions=1, lines=4)
    with monkeypatch.context() as m:
        m.setitem(PlaidIndex.__init__.__kwdefaults__, "exact_threshold", 10**9)
        build_index(repo, encoders=colbert_only)
    first = PlaidIndex.load(pipeline.default_index_dir(repo) / "plaid")
    assert first.kind == "exact"
    first.exact_threshold = first.n_tokens + 1  # (kept in its manifest: the next run loads it so)
    first.save(pipeline.default_index_dir(repo) / "plaid")
    for i in range(4):
        (repo / "pkg" / f"more{i}.py").write_text(module_source(f"more{i}", 3, lines=6))
    build_index(repo, encoders=colbert_only)
    index = _is_the_stores(repo)
    assert index.kind == "plaid" and spied["fill"] >= 1 and spied["memory"] == 0


def test_an_addition_past_a_fold_refills_the_index_under_its_codec(tmp_path, colbert_only, spied, monkeypatch):
    monkeypatch.setattr(plaid_index, "_MIN_TAIL", 50)
    monkeypatch.setitem(PlaidIndex.__init__.__kwdefaults__, "rebuild_ratio", 100.0)
    repo = make_repo(tmp_path / "repo", n_files=6, n_functions=3, lines=6)
    build_index(repo, encoders=colbert_only)
    first = PlaidIndex.load(pipeline.default_index_dir(repo) / "plaid")
    fills = spied["fill"]
    for i in range(8):  # more than an eighth of the index: the tail would fold, and fold again
        (repo / "pkg" / f"big{i}.py").write_text(module_source(f"big{i}", 3, lines=6))
    build_index(repo, encoders=colbert_only)
    index = _is_the_stores(repo)
    assert spied["fill"] == fills + 1 and spied["memory"] == 0 and spied["fold"] == 0
    assert index.codec.fingerprint == first.codec.fingerprint  # its own codec: no k-means
    assert index.build_error == first.build_error and index._added_tokens > 0  # the drift check counts on
