"""The server with real (tiny) encoders: hybrid, dense and ColBERT results equal the
library's, and the models are loaded once, then shared by every reader swap."""

from __future__ import annotations

import pytest
from fixtures.sample_repo import write_sample_repo
from serverkit import start_server

from codesearch.api import CodeSearch
from codesearch.types import result_document


@pytest.fixture(scope="module")
def model_server(tmp_path_factory, single_vector_dir, colbert_dir):
    root = write_sample_repo(tmp_path_factory.mktemp("models") / "repo")
    with CodeSearch(root, model=str(single_vector_dir), multi_model=str(colbert_dir)) as cs:
        cs.index()
    server = start_server(
        [str(root), "--model", str(single_vector_dir), "--multi-model", str(colbert_dir), "--no-watch",
         "--device", "cpu"],
        tmp_path_factory.mktemp("logs"),
    )
    try:
        server.wait_idle(min_runs=1)
        yield root, server, single_vector_dir, colbert_dir
    finally:
        server.stop()


@pytest.mark.parametrize("mode", ["hybrid", "dense", "colbert"])
@pytest.mark.parametrize("query", ["retry failed requests with backoff", "open the database connection"])
def test_model_modes_equal_the_library(model_server, mode, query):
    root, server, dense_dir, multi_dir = model_server
    with server.client() as http:
        response = http.post("/search", json={"query": query, "k": 5, "mode": mode})
    assert response.status_code == 200, response.text
    doc = response.json()
    with CodeSearch(root, model=str(dense_dir), multi_model=str(multi_dir), device="cpu") as cs:
        expected = result_document(cs.query(query, 5, mode=mode))
    assert [(r["path"], r["start_line"], r["end_line"]) for r in doc["results"]] == [
        (r["path"], r["start_line"], r["end_line"]) for r in expected["results"]
    ]
    assert [r["score"] for r in doc["results"]] == pytest.approx([r["score"] for r in expected["results"]], rel=1e-4)
    assert doc["indexes_used"] == expected["indexes_used"]
    if mode == "hybrid":
        assert {"lexical", "dense", "colbert"} <= set(doc["indexes_used"])


def test_a_reader_swap_keeps_the_loaded_models(model_server):
    _root, server, *_ = model_server
    with server.client() as http:
        runs = http.get("/status").json()["roots"][0]["indexing"]["runs"]
        assert http.post("/index", json={}).status_code == 202
    status = server.wait_idle(min_runs=runs + 1)
    assert status["roots"][0]["indexing"]["last_error"] is None
    with server.client() as http:
        doc = http.post("/search", json={"query": "parseConfigFile", "mode": "hybrid"}).json()
    assert doc["results"][0]["path"] == "src/config.js"


def test_encoders_are_loaded_once_per_root_across_swaps(tmp_path, single_vector_dir, colbert_dir):
    from codesearch.server.repos import RepoOptions, RepoSet

    root = write_sample_repo(tmp_path / "repo")
    repos = RepoSet([root], RepoOptions(model=str(single_vector_dir), multi_model=str(colbert_dir), device="cpu"))
    try:
        repos.start(index_now=True, watch=False)
        (repo,) = repos.repos
        assert repo.wait_idle(120)
        loaded = [id(encoder) for encoder in repos.encoder_pool.loaded()]
        assert len(loaded) == 2  # the first run loaded the dense and the ColBERT model
        generation = repo.run_state.generation
        (root / "src" / "extra.py").write_text("def extra_helper():\n    return 1\n")
        repo.request_index()
        assert repo.wait_idle(120)
        assert repo.run_state.generation > generation  # swapped to the new generation
        assert [id(encoder) for encoder in repos.encoder_pool.loaded()] == loaded
        hits = repo.query("extra_helper", 3, mode="hybrid").hits
        assert hits[0].path == "src/extra.py"
    finally:
        repos.close()


def test_two_roots_share_explicitly_named_models(tmp_path, single_vector_dir):
    from codesearch.server.repos import RepoOptions, RepoSet

    roots = [write_sample_repo(tmp_path / name) for name in ("one", "two")]
    repos = RepoSet(roots, RepoOptions(model=str(single_vector_dir), multi_model=None, device="cpu"))
    try:
        repos.start(index_now=True, watch=False)
        assert all(repo.wait_idle(120) for repo in repos.repos)
        assert len(repos.encoder_pool.loaded()) == 1
        for repo in repos.repos:
            assert repo.query("parseConfigFile", 1, mode="dense").hits
    finally:
        repos.close()


def test_served_query_encodings_go_through_the_batcher(model_server):
    import threading

    _, server, *_ = model_server
    with server.client() as http:
        before = {b["encoder"]: b["queries"] for b in http.get("/status").json()["search"]["query_batching"]}

    def one(i: int) -> None:
        with server.client() as http:
            assert http.post("/search", json={"query": f"retry number {i}", "mode": "hybrid"}).status_code == 200

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with server.client() as http:
        stats = http.get("/status").json()["search"]["query_batching"]
    # Both encoders (dense, ColBERT) encoded the 8 queries through their batchers.
    assert len(stats) == 2
    assert all(b["queries"] - before.get(b["encoder"], 0) == 8 for b in stats)


def test_a_dense_only_index_loads_its_model_once(tmp_path, single_vector_dir, monkeypatch):
    # The writer asks for (DEFAULT, DEFAULT), the reader for (DEFAULT, None): two keys,
    # one dense model.
    from codesearch.server.repos import RepoOptions, RepoSet

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=str(single_vector_dir), multi_model=None) as cs:
        cs.index()
    repos = RepoSet([root], RepoOptions(device="cpu"))
    try:
        repos.start(index_now=True, watch=False)
        (repo,) = repos.repos
        assert repo.wait_idle(120)
        assert repo.run_state.last_error is None
        assert len(repos.encoder_pool.loaded()) == 1
        assert repo.query("parseConfigFile", 1, mode="dense").hits
    finally:
        repos.close()


def test_a_model_switched_off_stays_off_through_server_runs(tmp_path, single_vector_dir, monkeypatch):
    # Regression: the server composed the writer's encoders from the reader's and dropped the
    # roles switched off with 'none'; its run then recorded none, and the next plain
    # 'index' (or server start) warned that the default ColBERT model is not cached.
    from codesearch.server.repos import RepoOptions, RepoSet
    from codesearch.store import Store

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=str(single_vector_dir), multi_model=None) as cs:
        cs.index()
    repos = RepoSet([root], RepoOptions(device="cpu"))
    try:
        repos.start(index_now=True, watch=False)
        (repo,) = repos.repos
        (root / "src" / "extra.py").write_text("def extra_thing():\n    return 1\n")
        repo.request_index()
        assert repo.wait_idle(120)
        assert repo.run_state.last_summary["notices"] == [] and repo.run_state.last_error is None
    finally:
        repos.close()
    with Store(root / ".codesearch" / "store.sqlite", readonly=True) as store:
        assert store.get_meta("models.disabled") == '["colbert"]'
    with CodeSearch(root, device="cpu") as cs:
        assert cs.index().notices == []


def test_roots_whose_indexes_record_the_same_model_share_it(tmp_path, single_vector_dir, monkeypatch):
    from codesearch.server.repos import RepoOptions, RepoSet

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    roots = [write_sample_repo(tmp_path / name) for name in ("one", "two")]
    for root in roots:
        with CodeSearch(root, model=str(single_vector_dir), multi_model=None) as cs:
            cs.index()
    repos = RepoSet(roots, RepoOptions(device="cpu"))  # DEFAULT: whatever each index records
    try:
        repos.start(index_now=True, watch=False)
        assert all(repo.wait_idle(120) for repo in repos.repos)
        assert len(repos.encoder_pool.loaded()) == 1
        for repo in repos.repos:
            assert repo.run_state.last_error is None
            assert repo.query("parseConfigFile", 1, mode="dense").hits
    finally:
        repos.close()


def test_searches_move_to_the_lexical_generation_before_the_vectors(tmp_path, single_vector_dir):
    from codesearch.server.repos import RepoOptions, RepoSet

    root = write_sample_repo(tmp_path / "repo")
    repos = RepoSet([root], RepoOptions(model=str(single_vector_dir), multi_model=None, device="cpu"))
    try:
        (repo,) = repos.repos
        seen: list[tuple[str, int]] = []
        on_progress = repo._on_progress

        def record(event):  # the run's own callback, observed (a swap happens inside it)
            on_progress(event)
            if event.stage == "searchable":  # a search before any vector is encoded
                seen.append(("lexical hits", len(repo.query("parseConfigFile", 3, mode="lexical").hits)))
            if event.stage in ("searchable", "published", "encode"):
                seen.append((event.stage, repo.run_state.generation))

        repo._on_progress = record
        repos.start(index_now=True, watch=False)
        assert repo.wait_idle(120)
        stages = [stage for stage, _ in seen]
        # The search made when the run became searchable, before any vector was encoded, was
        # answered from that generation; the root, searched now, was swapped again when the
        # vectors were published: two swaps inside the run, one at its end.
        assert seen[0][0] == "lexical hits" and seen[0][1] > 0, seen
        assert stages[1] == "searchable" and seen[1][1] == 1 and "published" in stages
        assert repo.run_state.generation >= 3
        assert repo.query("parseConfigFile", 3, mode="hybrid").hits
    finally:
        repos.close()


def test_a_run_that_no_search_asks_about_opens_one_generation_at_its_end(tmp_path, single_vector_dir):
    # A new worktree indexed through the daemon: nobody searches it until the run ends, so the
    # generations committed mid-way (lexical, then the vectors) are not opened one by one.
    from codesearch.server.repos import RepoOptions, RepoSet

    root = write_sample_repo(tmp_path / "repo")
    repos = RepoSet([root], RepoOptions(model=str(single_vector_dir), multi_model=None, device="cpu"))
    try:
        (repo,) = repos.repos
        stages: list[str] = []
        on_progress = repo._on_progress

        def record(event):
            on_progress(event)
            stages.append(event.stage)

        repo._on_progress = record
        repos.start(index_now=True, watch=False)
        assert repo.wait_idle(120) and repo.run_state.last_error is None
        assert "searchable" in stages and "published" in stages
        assert repo.run_state.generation == 1  # the run's end only (three opens before)
        assert repo.ready and repo.query("parseConfigFile", 3, mode="hybrid").hits
    finally:
        repos.close()
