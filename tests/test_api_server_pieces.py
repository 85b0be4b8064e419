"""The public pieces a long-running process builds on: `CodeSearch.snapshot()` (a searcher
held on one generation) and `EncoderPool` (models loaded once for several `CodeSearch`
objects); and the library does not import its own server."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fixtures.sample_repo import write_sample_repo

from codesearch import CodeSearch
from codesearch.api import EncoderPool, result_document
from codesearch.errors import NotIndexedError


def test_a_snapshot_stays_on_its_generation_while_runs_commit(tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
        snap = cs.snapshot()
        before = result_document(snap.search("parseConfigFile", 3, mode="lexical"))
        path = root / "src" / "config.js"
        path.write_text("// moved down\n\n\n\n" + path.read_text())
        (root / "src" / "late.py").write_text("def arrived_after_the_snapshot():\n    pass\n")
        cs.index()  # does not wait for the snapshot, and the snapshot does not see it
        assert result_document(snap.search("parseConfigFile", 3, mode="lexical")) == before
        assert "src/late.py" not in {h.path for h in snap.search("arrived_after_the_snapshot", 3, mode="lexical").hits}
        assert cs.search("arrived_after_the_snapshot", 1, mode="lexical")[0].path == "src/late.py"
        with cs.snapshot() as fresh:
            assert fresh.search("arrived_after_the_snapshot", 1, mode="lexical").hits[0].path == "src/late.py"
        snap.close()
        snap.close()  # idempotent


def test_a_snapshot_needs_an_index(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    with CodeSearch(tmp_path, model=None, multi_model=None) as cs, pytest.raises(NotIndexedError):
        cs.snapshot()


def test_a_pool_loads_a_model_once_for_every_codesearch_and_snapshot(tmp_path, single_vector_dir):
    pool = EncoderPool()
    roots = [write_sample_repo(tmp_path / name) for name in ("one", "two")]
    wrapped = []
    objects = [CodeSearch(r, model=str(single_vector_dir), multi_model=None, device="cpu", encoder_pool=pool)
               for r in roots]
    try:
        for cs in objects:
            cs.index()
            with cs.snapshot(wrap_encoder=lambda enc: wrapped.append(enc) or enc) as snap:
                assert snap.search("open the database connection", 3, mode="dense").hits
                assert snap.encoders.dense is pool.loaded()[0]
        (encoder,) = pool.loaded()
        assert wrapped == [encoder, encoder]  # only the snapshots' query encoders are wrapped
    finally:
        for cs in objects:
            cs.close()
    assert pool.loaded() == [encoder]  # the pool belongs to its caller: closing leaves it
    pool.clear()
    assert pool.loaded() == []


def test_the_library_does_not_import_its_server_or_cli():
    code = (
        "import sys, codesearch.api; "
        "print(sorted(m for m in sys.modules if m.startswith(('codesearch.server', 'codesearch.cli'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_request_is_checked_once_on_its_way_to_the_searcher(tmp_path, monkeypatch):
    """A SearchRequest is made (and so checked) once, then passes whole: the API, a
    snapshot, and the server's search pool down to the searcher make no second one."""
    from codesearch.server.repos import RepoOptions, RepoSet
    from codesearch.server.service import Service
    from codesearch.types import SearchRequest

    root = write_sample_repo(tmp_path / "repo")
    made = []
    checked = SearchRequest.__post_init__

    def counting(self):
        made.append(self.query)
        checked(self)

    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
        monkeypatch.setattr(SearchRequest, "__post_init__", counting)
        assert cs.query("parseConfigFile", 3, mode="lexical", glob="src/**", language="js").hits
        assert made == ["parseConfigFile"]
        with cs.snapshot() as snap:
            made.clear()
            assert snap.search("parseConfigFile", 3, mode="lexical", glob="src/**").hits
            assert made == ["parseConfigFile"]
    repos = RepoSet([root], RepoOptions(model=None, multi_model=None))
    repos.start(index_now=False, watch=False)
    service = Service(repos)
    try:
        made.clear()
        doc = service.search_sync("parseConfigFile", 3, mode="lexical", lang="js", path="src")
        assert doc["results"] and made == ["parseConfigFile"]
    finally:
        service.close()
