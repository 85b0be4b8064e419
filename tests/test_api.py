"""CodeSearch end to end on a real sample repository: real walk, chunking, SQLite, BM25,
FAISS, PLAID and the tiny random checkpoints from the fixtures."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fixtures.sample_repo import EXPECTED, write_sample_repo

from codesearch import CodeSearch
from codesearch.api import IndexStatus, find_index_root
from codesearch.errors import (
    CodeSearchError,
    IndexCorruptError,
    IndexLockedError,
    ModelUnavailableError,
    NothingToIndexError,
    NotIndexedError,
    PathError,
    QueryError,
)
from codesearch.types import hit_document, result_document


@pytest.fixture(scope="module")
def lexical_repo(tmp_path_factory):
    """The sample repo with a lexical-only index (no model)."""
    root = write_sample_repo(tmp_path_factory.mktemp("lexical_repo"))
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    return root


@pytest.fixture(scope="module")
def model_repo(tmp_path_factory, single_vector_dir, colbert_dir):
    """The sample repo indexed with the tiny dense and ColBERT checkpoints."""
    root = write_sample_repo(tmp_path_factory.mktemp("model_repo"))
    with CodeSearch(root, model=str(single_vector_dir), multi_model=str(colbert_dir), device="cpu") as cs:
        summary = cs.index()
    return root, summary


@pytest.fixture(scope="module")
def model_search(model_repo):
    """One CodeSearch with the index's own (default-resolved) models, shared: the encoders
    load once, as they would in a long-lived app."""
    root, _ = model_repo
    with CodeSearch(root, device="cpu") as cs:
        yield cs


@pytest.mark.parametrize("query,path", sorted(EXPECTED.items()))
def test_lexical_search_ranks_the_distinctive_chunk_first(lexical_repo, query, path):
    with CodeSearch(lexical_repo) as cs:
        hits = cs.search(query, k=3, mode="lexical")
    assert hits and hits[0].path == path
    top = hits[0]
    source = (lexical_repo / path).read_text().splitlines(keepends=True)
    # The exact source of those lines (the chunker may leave out the last line's newline).
    assert top.text.rstrip("\n") == "".join(source[top.start_line - 1 : top.end_line]).rstrip("\n")


def test_index_summary_counts_the_sample(model_repo):
    _, summary = model_repo
    d = summary.to_dict()
    assert d["files_indexed"] == 5
    assert d["chunks_total"] >= 5
    assert "binary" in d["skipped"]  # assets/logo.png


@pytest.mark.parametrize("query,path", sorted(EXPECTED.items()))
def test_hybrid_search_with_tiny_models_keeps_the_chunk_in_the_top_results(model_search, query, path):
    result = model_search.query(query, k=5)
    assert result.mode == "hybrid"
    assert {"lexical", "dense", "colbert"} <= set(result.indexes_used)
    assert path in [h.path for h in result.hits[:3]]


@pytest.mark.parametrize("mode", ["dense", "colbert"])
def test_single_index_modes_run_with_tiny_models(model_search, mode):
    result = model_search.query("retry failed requests", k=4, mode=mode)
    assert result.indexes_used and mode in result.indexes_used[0]
    assert 1 <= len(result.hits) <= 4
    assert all(h.start_line <= h.end_line for h in result.hits)


def test_filters_and_files_only(lexical_repo):
    with CodeSearch(lexical_repo) as cs:
        go = cs.search("server database", k=10, mode="lexical", language="go")
        assert go and {h.language for h in go} == {"go"}
        src = cs.search("config retry", k=10, mode="lexical", glob="src/**")
        assert src and all(h.path.startswith("src/") for h in src)
        files = cs.search("the", k=10, mode="lexical", files_only=True)
        assert len({h.path for h in files}) == len(files)


def test_lexical_search_never_imports_torch(model_repo):
    # An index built with models, searched lexically through the default settings.
    root, _ = model_repo
    code = (
        "import sys, json\n"
        "from codesearch import CodeSearch\n"
        f"cs = CodeSearch({str(root)!r})\n"
        "hits = cs.search('parseConfigFile', k=2, mode='lexical', refresh=True)\n"
        "print(json.dumps([hits[0].path, 'torch' in sys.modules, 'transformers' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["src/config.js", False, False]


def test_lexical_and_hybrid_searches_share_one_searcher(model_repo):
    """Every mode reads one copy of the index; the encoders join it on the first search
    that needs them, and a lexical search before that loads no model."""
    root, _ = model_repo
    with CodeSearch(root) as cs:
        lexical = cs.query("parseConfigFile", k=2, mode="lexical")
        with cs._live.lease(lexical=True) as (searcher, _):
            assert searcher._encoders is None and not cs._models.loaded(cs._models.for_search())
        hybrid = cs.query("parseConfigFile", k=2)
        with cs._live.lease(lexical=False) as (again, _):
            assert again is searcher
        assert searcher._encoders is not None and "dense" in hybrid.indexes_used
        assert cs.query("parseConfigFile", k=2, mode="lexical").hits == lexical.hits


def test_status_reports_counts_models_staleness_and_size(tmp_path, single_vector_dir):
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=str(single_vector_dir), multi_model=None, device="cpu") as cs:
        assert cs.status().indexed is False
        cs.index()
        st = cs.status()
        assert isinstance(st, IndexStatus)
        assert (st.indexed, st.files, st.is_stale) == (True, 5, False)
        assert st.chunks >= 5
        assert st.languages["python"] == 1 and st.languages["go"] == 1
        assert st.models["dense"] and st.models["multi"] is None
        assert st.disk_bytes["store.sqlite"] > 0 and st.disk_bytes["total"] >= st.disk_bytes["store.sqlite"]
        (root / "src" / "config.js").write_text("// changed\n")
        (root / "src" / "new.py").write_text("def brand_new():\n    return 1\n")
        (root / "db" / "schema.sql").unlink()
        st = cs.status()
        assert st.stale == {"added": 1, "changed": 1, "removed": 1} and st.is_stale
        doc = json.loads(json.dumps(st.to_dict()))
        assert doc["schema_version"] == 1 and doc["is_stale"] is True


def test_refresh_indexes_changed_files_before_searching(tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
        (root / "src" / "payments.py").write_text("def refund_invoice_zq17(invoice):\n    return invoice\n")
        stale = cs.query("refund_invoice_zq17", k=1, mode="lexical")
        assert not stale.hits or stale.hits[0].path != "src/payments.py"
        fresh = cs.query("refund_invoice_zq17", k=1, mode="lexical", refresh=True)
        assert fresh.hits[0].path == "src/payments.py"
        assert any("refreshed" in n for n in fresh.notices)
        again = cs.query("refund_invoice_zq17", k=1, mode="lexical", refresh=True)
        assert not any("refreshed" in n for n in again.notices)



def test_a_vanished_model_degrades_to_lexical_and_each_notice_shows_once(tmp_path, single_vector_dir):
    import shutil

    model = Path(shutil.copytree(single_vector_dir, tmp_path / "model"))
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=str(model), multi_model=None, device="cpu") as cs:
        cs.index()
    shutil.rmtree(model)
    (root / "src" / "payments.py").write_text("def refund_invoice_zq17(invoice):\n    return invoice\n")
    with CodeSearch(root, device="cpu") as cs:
        result = cs.query("refund_invoice_zq17", k=1, refresh=True)
    assert result.hits[0].path == "src/payments.py" and result.indexes_used == ("lexical",)
    assert any("refreshed" in n for n in result.notices)
    assert any(str(model) in n and "--rebuild --model" in n for n in result.notices)
    assert len(result.notices) == len(set(result.notices)), result.notices

def in_threads(work, n: int) -> list:
    """Run ``work()`` in `n` threads at once and concatenate the lists they return (an
    exception in any thread is raised here)."""
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(work) for _ in range(n)]
        return [item for f in futures for item in f.result()]

def test_concurrent_searches_agree(lexical_repo):
    with CodeSearch(lexical_repo) as cs:
        expected = {q: cs.search(q, k=3, mode="lexical")[0].path for q in EXPECTED}
        seen = in_threads(lambda: [(q, cs.search(q, k=3, mode="lexical")[0].path) for q in list(EXPECTED) * 5], 4)
    assert len(seen) == 4 * 5 * len(EXPECTED)
    assert all(expected[q] == p for q, p in seen)


def test_with_context_widens_hits_from_the_file(lexical_repo):
    with CodeSearch(lexical_repo) as cs:
        result = cs.query("openDatabaseConnection", k=1, mode="lexical")
        wide = cs.with_context(result, 2)
    hit, whit = result.hits[0], wide.hits[0]
    assert whit.start_line == max(1, hit.start_line - 2)
    lines = (lexical_repo / hit.path).read_text().splitlines(keepends=True)
    assert whit.end_line == min(len(lines), hit.end_line + 2)
    assert whit.text.rstrip("\n") == "".join(lines[whit.start_line - 1 : whit.end_line]).rstrip("\n")


def test_json_documents_follow_the_schema(lexical_repo):
    with CodeSearch(lexical_repo) as cs:
        result = cs.query("HttpClient", k=2, mode="lexical")
    doc = json.loads(json.dumps(result_document(result)))
    assert list(doc) == ["schema_version", "query", "mode", "indexes_used", "notices", "results"]
    assert doc["schema_version"] == 1 and doc["query"] == "HttpClient" and doc["mode"] == "lexical"
    assert list(doc["results"][0]) == ["path", "start_line", "end_line", "score", "language", "symbol", "kind", "text"]
    assert doc["results"][0] == hit_document(result.hits[0])


def test_find_index_root_walks_up(lexical_repo):
    assert find_index_root(lexical_repo / "src") == lexical_repo.resolve()
    assert find_index_root(lexical_repo) == lexical_repo.resolve()


def test_find_index_root_fails_outside_an_index(tmp_path):
    with pytest.raises(NotIndexedError, match="codesearch index"):
        find_index_root(tmp_path)


# -- errors: each a CodeSearchError with a one-line message that says what to do ----------


def _one_line(exc: pytest.ExceptionInfo[CodeSearchError]) -> str:
    message = str(exc.value)
    assert message and "\n" not in message
    return message


def test_missing_path(tmp_path):
    with pytest.raises(PathError) as exc:
        CodeSearch(tmp_path / "nope")
    assert "nope" in _one_line(exc)


def test_not_indexed(tmp_path):
    write_sample_repo(tmp_path)
    with CodeSearch(tmp_path) as cs, pytest.raises(NotIndexedError) as exc:
        cs.search("anything")
    assert "codesearch index" in _one_line(exc)


@pytest.mark.parametrize("query", ["", "   \n"])
def test_empty_query(lexical_repo, query):
    with CodeSearch(lexical_repo) as cs, pytest.raises(QueryError) as exc:
        cs.search(query)
    assert "empty" in _one_line(exc)


def test_nothing_to_index(tmp_path):
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x01")
    with CodeSearch(tmp_path, model=None, multi_model=None) as cs, pytest.raises(NothingToIndexError) as exc:
        cs.index()
    _one_line(exc)


def test_model_unavailable_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    write_sample_repo(tmp_path / "repo")
    with CodeSearch(tmp_path / "repo", model="nobody/no-such-model", multi_model=None) as cs:
        with pytest.raises(ModelUnavailableError) as exc:
            cs.index()
    assert "nobody/no-such-model" in _one_line(exc) and "--model" in str(exc.value)


def test_index_locked_by_another_indexer(tmp_path):
    from codesearch.store import IndexLock

    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
        with IndexLock(cs.index_dir), pytest.raises(IndexLockedError) as exc:
            cs.index()
    _one_line(exc)


def test_corrupt_index(tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    (root / ".codesearch" / "store.sqlite").write_bytes(b"this is not a database" * 100)
    for name in ("store.sqlite-wal", "store.sqlite-shm"):
        (root / ".codesearch" / name).unlink(missing_ok=True)
    with CodeSearch(root) as cs, pytest.raises(IndexCorruptError) as exc:
        cs.search("HttpClient", mode="lexical")
    assert "--rebuild" in _one_line(exc)


def test_closed_instance_refuses_work(lexical_repo):
    cs = CodeSearch(lexical_repo)
    cs.close()
    cs.close()  # idempotent
    with pytest.raises(CodeSearchError, match="closed"):
        cs.search("HttpClient", mode="lexical")


def test_refresh_while_another_process_indexes_searches_the_current_index(tmp_path):
    from codesearch.store import IndexLock

    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
        (root / "src" / "late.py").write_text("def arrived_late_zz9():\n    pass\n")
        with IndexLock(cs.index_dir):
            result = cs.query("parseConfigFile", k=1, mode="lexical", refresh=True)
        assert result.hits[0].path == "src/config.js"
        assert any("another process" in n for n in result.notices)


def test_encoders_load_once_and_are_shared_by_index_and_search(tmp_path, monkeypatch, single_vector_dir, colbert_dir):
    import codesearch.api.models as api_mod

    calls: list[tuple[object, object]] = []
    real = api_mod.resolve_encoders

    def counting(dense, multi, **kwargs):
        calls.append((dense, multi))
        return real(dense, multi, **kwargs)

    monkeypatch.setattr(api_mod, "resolve_encoders", counting)
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=str(single_vector_dir), multi_model=str(colbert_dir), device="cpu") as cs:
        assert calls == []  # nothing loads at construction
        cs.index()
        cs.search("retry", k=2)
        cs.search("retry", k=2, mode="dense")
        cs.search("retry", k=2, mode="lexical")
        (root / "src" / "config.js").write_text("function parseConfigFile() { return 1 }\n")
        cs.search("parseConfigFile", k=2, refresh=True)  # re-embeds with the same encoders
    assert calls == [(str(single_vector_dir), str(colbert_dir))]


def test_a_first_index_is_searchable_before_its_model_loads(tmp_path, colbert_dir):
    """Loading a model costs seconds on a CPU (torch, weights): with a model that chunks by
    the byte estimate (a wide-window ColBERT model, the CPU default), a first index commits
    the lexical index, says so once, and only then loads the model and encodes, in one run."""
    from fixtures.models import make_colbert

    from codesearch.api import EncoderPool

    wide = make_colbert(tmp_path / "wide", document_length=2048, max_position_embeddings=2048)

    events: list[str] = []

    class Recording(EncoderPool):
        def load(self, name, *, device="auto"):
            events.append("load")
            return super().load(name, device=device)

    def progress(event):
        if event.stage in ("searchable", "walk") and (not events or events[-1] != event.stage):
            events.append(event.stage)
        if event.stage == "searchable":  # and a query answers from the lexical index now
            with CodeSearch(root, index_dir=index_dir) as reader:
                assert reader.search("retry", k=3, mode="lexical", refresh=False)

    root = write_sample_repo(tmp_path / "repo")
    index_dir = root / ".codesearch"
    with CodeSearch(root, model=None, multi_model=str(wide), device="cpu", encoder_pool=Recording()) as cs:
        summary = cs.index(progress=progress)
        assert events == ["walk", "searchable", "load"]  # the second walk is not shown
        assert summary.files_indexed == cs.status().files and summary.files_unchanged == 0
        assert summary.files_read == summary.files_indexed  # the second run re-read nothing
        assert summary.chunks_encoded == summary.chunks_total > 0
        assert cs.status().models["multi"] == str(wide)
        events.clear()
        cs.index(progress=progress)  # loaded now: one run, nothing to encode
        assert events == ["walk", "searchable"]
    # A model that sizes chunks in its own tokens (this one reads 256) loads first: a lexical
    # pass would be chunked again, under new ids, once it is loaded.
    events.clear()
    other = write_sample_repo(tmp_path / "other")
    root, index_dir = other, other / ".codesearch"
    with CodeSearch(other, model=None, multi_model=str(colbert_dir), device="cpu", encoder_pool=Recording()) as cs:
        cs.index(progress=progress)
    assert events == ["load", "walk", "searchable"]


def test_concurrent_hybrid_searches_share_the_encoders(model_search):
    queries = sorted(EXPECTED)
    expected = {q: [h.path for h in model_search.search(q, k=3)] for q in queries}
    results = in_threads(lambda: [(q, [h.path for h in model_search.search(q, k=3)]) for q in queries], 3)
    assert len(results) == 3 * len(queries)
    assert all(paths == expected[q] for q, paths in results)


# -- one request shape, output controls, switched-off models ------------------------------------


def test_query_takes_a_search_request_or_its_fields(lexical_repo):
    from codesearch.types import SearchRequest

    request = SearchRequest("parseConfigFile database", 5, "lexical", languages=("javascript", "go"),
                            globs=("!server/**",), max_lines=2)
    with CodeSearch(lexical_repo) as cs:
        by_request = cs.query(request)
        by_fields = cs.query("parseConfigFile database", 5, mode="lexical", language=["javascript", "go"],
                             glob="!server/**", max_lines=2)
        single = cs.search("parseConfigFile", 5, mode="lexical", language="javascript", glob="src/*")
    assert by_request == by_fields and by_request.hits
    assert {h.language for h in by_request.hits} <= {"javascript", "go"}
    assert not any(h.path.startswith("server/") for h in by_request.hits)
    assert all(len(h.text.splitlines()) <= 3 for h in by_request.hits)
    assert single and all(h.path.startswith("src/") and h.language == "javascript" for h in single)


def test_budget_is_reported_in_the_json_document(lexical_repo):
    with CodeSearch(lexical_repo) as cs:
        doc = result_document(cs.query("the config database server retry", 5, mode="lexical", budget=60))
        plain = result_document(cs.query("the config database server retry", 5, mode="lexical"))
    assert "left_out" not in plain
    assert doc["left_out"] == len(plain["results"]) - len(doc["results"]) > 0


def test_a_refresh_keeps_the_record_of_models_switched_off(tmp_path, single_vector_dir, monkeypatch):
    # The default ColBERT model is missing (offline), not switched off: a refresh, which
    # loads only the dense model the index has, must not record ColBERT as switched off,
    # or a later 'index' online would never add its vectors.
    from codesearch.store import Store

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=str(single_vector_dir), device="cpu") as cs:
        assert any("not cached" in n for n in cs.index().notices)
    (root / "src" / "more.py").write_text("def more_code():\n    return 2\n")
    with CodeSearch(root, device="cpu") as cs:
        result = cs.query("more_code", 3, mode="lexical", refresh=True)
    assert any("refreshed" in n for n in result.notices)
    with Store(root / ".codesearch" / "store.sqlite", readonly=True) as store:
        assert store.get_meta("models.disabled") in (None, "[]")  # nothing switched off


def test_lexical_only_index_loads_no_model_and_switches_none_off(tmp_path, monkeypatch):
    from codesearch.store import Store

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root) as cs:
        assert not cs.indexed
        summary = cs.index(lexical_only=True)
        assert cs.indexed and summary.notices == [] and summary.models == {}
    with Store(root / ".codesearch" / "store.sqlite", readonly=True) as store:
        assert store.get_meta("models.disabled") in (None, "[]")  # nothing switched off
    with CodeSearch(root) as cs:  # the default models are tried again (and found missing)
        assert any("not cached" in n for n in cs.index().notices)
