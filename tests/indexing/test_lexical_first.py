"""Lexical first: an index run is searchable before its vectors, embeds the most useful
files first, publishes vectors as they come, and a killed run resumes where it stopped.

Real walk, tree-sitter, SQLite, FAISS and PLAID; the tiny random checkpoints encode.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fixtures.pipeline_helpers import CountingEncoder, check_consistent, module_source

from codesearch.api import CodeSearch
from codesearch.encoder.base import Encoders
from codesearch.errors import IndexLockedError
from codesearch.indexing import encode, publish
from codesearch.indexing.run import build_index
from codesearch.search.ranking import _impute
from codesearch.search.searcher import Searcher
from codesearch.store import IndexLock, Store
from codesearch.types import STORE_FILE, Mode, SearchRequest, default_index_dir, path_kind


@pytest.fixture(scope="module")
def dense_encoder(single_vector_dir):
    from codesearch.encoder import load

    return load(str(single_vector_dir))


def _repo(root: Path) -> Path:
    """Source, tests and docs, so the embedding order has something to order."""
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "docs").mkdir()
    (root / "pkg" / "engine.py").write_text(module_source("engine", 2, 5))
    (root / "pkg" / "planner.py").write_text(module_source("planner", 2, 5))
    (root / "tests" / "test_engine.py").write_text(module_source("test_engine", 2, 5))
    (root / "docs" / "guide.md").write_text("# Guide\n\nHow the engine plans a query.\n")
    return root


class _StopAfter(CountingEncoder):
    """The real encoder, which raises (like a Ctrl-C) once it has encoded ``n`` batches."""

    def __init__(self, inner, n: int):
        super().__init__(inner)
        self.n = n
        self.calls = 0

    def encode(self, texts, kind="document", batch_tokens=None):
        self.calls += 1
        if self.calls > self.n:
            raise KeyboardInterrupt
        return super().encode(texts, kind=kind, batch_tokens=batch_tokens)


def test_searchable_before_the_vectors(tmp_path, dense_encoder):
    repo = _repo(tmp_path / "repo")
    idir = default_index_dir(repo)
    seen: dict[str, object] = {}

    def progress(event):
        # At the "searchable" event no vector is encoded yet: a searcher opened now must
        # answer from the lexical index, and say the vectors are partial.
        if event.stage == "searchable":
            with Store(idir / STORE_FILE, readonly=True) as s:
                seen["vectors"] = s.count_with_vectors("dense")
            with Searcher(idir, encoders=Encoders(dense=dense_encoder)) as s:
                seen["lexical"] = s.search("engine plans query", 3, mode="lexical").hits
                seen["hybrid"] = s.search("engine plans query", 3, mode="hybrid")

    build_index(repo, encoders=Encoders(dense=CountingEncoder(dense_encoder)), progress=progress)
    assert seen["vectors"] == 0
    assert seen["lexical"], "the lexical index answers before any vector exists"
    hybrid = seen["hybrid"]
    assert hybrid.hits and any("semantic vectors for 0% of chunks" in n for n in hybrid.notices)
    check_consistent(idir, complete=True)


def test_source_is_embedded_before_tests_and_docs(tmp_path, dense_encoder):
    repo = _repo(tmp_path / "repo")
    enc = CountingEncoder(dense_encoder)
    build_index(repo, encoders=Encoders(dense=enc))
    # Every encoded text starts with its path (chunk header or whole-file text).
    kinds = [path_kind(t.split("\n", 1)[0].split(" > ")[0]) for t in enc.texts]
    assert kinds == sorted(kinds), kinds
    assert kinds[0] == 0 and kinds[-1] > 0


def test_a_killed_run_is_searchable_and_the_next_run_completes_it(tmp_path, dense_encoder, monkeypatch):
    repo = _repo(tmp_path / "repo")
    idir = default_index_dir(repo)
    monkeypatch.setattr(encode, "ENCODE_BATCH", 2)  # several committed batches
    with pytest.raises(KeyboardInterrupt):
        build_index(repo, encoders=Encoders(dense=_StopAfter(dense_encoder, 2)))
    with Store(idir / STORE_FILE, readonly=True) as s:
        partial = s.count_with_vectors("dense")
        assert 0 < partial < s.count("chunks")  # the finished batches were kept
    with Searcher(idir) as s:  # searchable as it is: files and chunks were committed first
        assert s.search("planner", 3, mode="lexical").hits
    again = CountingEncoder(dense_encoder)
    summary = build_index(repo, encoders=Encoders(dense=again))
    assert summary.files_indexed == 0  # nothing re-read or re-chunked
    assert 0 < len(again.texts)
    check_consistent(idir, complete=True)


def test_vectors_are_published_while_encoding(tmp_path, dense_encoder, monkeypatch):
    repo = _repo(tmp_path / "repo")
    idir = default_index_dir(repo)
    monkeypatch.setattr(encode, "ENCODE_BATCH", 2)
    monkeypatch.setattr(publish, "PUBLISH_EVERY_S", 0.0)
    gens: list[int] = []

    def progress(event):
        if event.stage == "encode":
            with Store(idir / STORE_FILE, readonly=True) as s:
                gens.append(s.generation)

    build_index(repo, encoders=Encoders(dense=dense_encoder), progress=progress)
    assert len(set(gens)) > 1, "each publication is a new generation a searcher can open"
    check_consistent(idir, complete=True)


def test_a_search_during_a_run_uses_the_published_vectors_and_rebuilds_nothing(tmp_path, dense_encoder, monkeypatch):
    from codesearch.indexes import registry

    repo = _repo(tmp_path / "repo")
    idir = default_index_dir(repo)
    monkeypatch.setattr(encode, "ENCODE_BATCH", 2)
    monkeypatch.setattr(publish, "PUBLISH_EVERY_S", 1e9)  # no publication until the end
    real, rebuilt = registry._rebuild_index, []
    seen: list[tuple[int, int, int, list[str]]] = []

    def progress(event):
        # Committed batches the run has not published yet: a searcher must not rebuild the
        # vector indexes in memory to take them in (for PLAID at millions of tokens that is
        # k-means inside a search); it answers from what the run published.
        if event.stage == "encode" and 0 < event.done < event.total:
            monkeypatch.setattr(registry, "_rebuild_index", lambda n, s: rebuilt.append(n) or real(n, s))
            try:
                with Store(idir / STORE_FILE, readonly=True) as st:
                    committed = st.count_with_vectors("dense")
                with Searcher(idir, encoders=Encoders(dense=dense_encoder)) as s:
                    result = s.search("engine plans query", 3, mode="hybrid")
                    seen.append((committed, len(s._indexes["dense_chunks"]), len(result.hits), result.notices))
            finally:
                monkeypatch.setattr(registry, "_rebuild_index", real)

    build_index(repo, encoders=Encoders(dense=dense_encoder), progress=progress)
    assert seen and rebuilt == []
    assert any(committed > 0 for committed, *_ in seen)
    for _committed, published, hits, notices in seen:
        assert published == 0 < hits  # what the "searchable" sync published: no vectors yet
        assert any("semantic vectors for 0% of chunks" in n for n in notices)
    check_consistent(idir, complete=True)


def test_a_chunk_without_a_vector_keeps_its_lexical_place():
    # Rows 0-3 are lexical candidates; rows 0 and 1 have vectors and row 0 was a vector hit.
    norm = np.array([1.0, 0.0, 0.0, 0.0, 0.0], np.float32)
    covered = np.array([True, True, False, False, True])
    lexical = np.array([3.0, 2.0, 2.0, 1.0, 0.0], np.float32)
    out = _impute(norm, covered, lexical)
    # Covered rows keep their score; uncovered lexical candidates get what covered ones get
    # on average (0.5), not the 0 that would sink them; no lexical score, no fill.
    np.testing.assert_allclose(out, [1.0, 0.0, 0.5, 0.5, 0.0])
    assert _impute(norm, np.ones(5, bool), lexical) is norm  # complete: untouched


def test_a_second_index_run_fails_before_loading_a_model(tmp_path, single_vector_dir, monkeypatch):
    import codesearch.api.models as api_mod

    repo = _repo(tmp_path / "repo")
    with CodeSearch(repo, model=None, multi_model=None) as cs:
        cs.index()
    loads = []
    monkeypatch.setattr(api_mod, "resolve_encoders", lambda *a, **k: loads.append(a) or (Encoders(), []))
    lock = IndexLock(default_index_dir(repo)).acquire()
    try:
        with CodeSearch(repo, model=str(single_vector_dir), multi_model=None) as cs, pytest.raises(IndexLockedError):
            cs.index()
    finally:
        lock.release()
    assert loads == []


def test_a_lexical_search_refresh_loads_no_model(tmp_path, single_vector_dir, monkeypatch):
    import codesearch.api.models as api_mod

    repo = _repo(tmp_path / "repo")
    with CodeSearch(repo, model=str(single_vector_dir), multi_model=None) as cs:
        cs.index()
    (repo / "pkg" / "engine.py").write_text(module_source("engine", 3, 5))
    real, loads = api_mod.resolve_encoders, []
    monkeypatch.setattr(api_mod, "resolve_encoders", lambda *a, **k: loads.append(a) or real(*a, **k))
    with CodeSearch(repo) as cs:
        # As the CLI asks: a SearchRequest whose mode is lexical.
        result = cs.query(SearchRequest("engine_fn2", 3, Mode.lexical), refresh=True)
        assert result.hits and result.hits[0].path == "pkg/engine.py"
        assert loads == []
        assert any("no dense vectors yet" in n for n in result.notices)
        status = cs.status()
        assert 0 < status.vectors["dense"] < 1
        # The next search that uses the vectors adds the ones the lexical refresh left out.
        hybrid = cs.query("engine_fn2", 3, refresh=True)
        assert hybrid.hits and not any("semantic vectors for" in n for n in hybrid.notices)
        assert cs.status().vectors == {"dense": 1.0, "file": 1.0}


def test_index_then_search_load_a_model_once(tmp_path, single_vector_dir):
    repo = _repo(tmp_path / "repo")
    with CodeSearch(repo, model=str(single_vector_dir), multi_model=None) as cs:
        cs.index()
        assert cs.query("engine plans query", 3, mode="hybrid").hits
        assert len(cs.encoder_pool.loaded()) == 1


def test_a_lexical_only_index_run_never_imports_torch(tmp_path):
    import subprocess
    import sys

    repo = _repo(tmp_path / "repo")
    with CodeSearch(repo, model=None, multi_model=None) as cs:
        cs.index()
    code = (
        "import sys; from codesearch.api import CodeSearch; "
        f"cs = CodeSearch({str(repo)!r}); cs.index(); cs.close(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_an_open_codesearch_follows_another_process_s_commits(tmp_path):
    # A long-lived object (a notebook, a retriever) must not stay on the generation it
    # first opened while another process's lexical-first run publishes newer ones.
    from codesearch.indexing.run import build_index as run

    repo = _repo(tmp_path / "repo")
    with CodeSearch(repo, model=None, multi_model=None) as cs:
        cs.index()
        assert not cs.search("brand_new_function", 3, mode="lexical")
        (repo / "pkg" / "fresh.py").write_text("def brand_new_function():\n    return 1\n")
        run(repo)  # the "other process": a separate run on the same folder
        hits = cs.search("brand_new_function", 3, mode="lexical")
        assert hits and hits[0].path == "pkg/fresh.py"


def test_a_query_during_the_first_walk_says_nothing_is_searchable_yet(tmp_path):
    # Once waited 30 s for the writer and printed "No results." with exit 0.
    from codesearch.errors import NotIndexedError

    idir = tmp_path / "repo" / ".codesearch"
    idir.mkdir(parents=True)
    Store(idir / STORE_FILE).close()  # what a first run has written before its commit
    lock = IndexLock(idir).acquire()
    try:
        with pytest.raises(NotIndexedError, match=r"still reading the files.*try again in a few seconds"):
            Searcher(idir)
    finally:
        lock.release()
