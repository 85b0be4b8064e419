"""The HTTP JSON API against the real server process: results equal the library's, errors
are one line with the right status, the OpenAPI schema lists every route."""

from __future__ import annotations

import json
import os

import pytest
from fixtures.sample_repo import EXPECTED

from codesearch.api import CodeSearch
from codesearch.types import result_document


def library(root, query, k=10, **kwargs):
    with CodeSearch(root, model=None, multi_model=None) as cs:
        return result_document(cs.query(query, k, **kwargs))


@pytest.mark.parametrize("query", sorted(EXPECTED))
def test_search_equals_the_library(lexical_server, sample_repo, query):
    with lexical_server.client() as http:
        response = http.post("/search", json={"query": query, "k": 5, "mode": "lexical"})
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc == library(sample_repo, query, 5, mode="lexical")
    assert doc["results"][0]["path"] == EXPECTED[query]
    assert set(doc["results"][0]) == {"path", "start_line", "end_line", "score", "language", "symbol", "kind", "text"}


@pytest.mark.parametrize(
    "body,kwargs",
    [
        ({"lang": "go"}, {"language": "go"}),
        ({"glob": "src/**"}, {"glob": "src/**"}),
        ({"files_only": True, "k": 3}, {"files_only": True}),
        ({"mode": "hybrid"}, {"mode": "hybrid"}),
        # Several languages or globs, ripgrep-style globs, output controls
        ({"lang": ["go", "javascript"]}, {"language": ["go", "javascript"]}),
        ({"glob": ["*.{go,js}", "!server/**"]}, {"glob": ["*.{go,js}", "!server/**"]}),
        ({"glob": "!src/**", "max_lines": 2}, {"glob": "!src/**", "max_lines": 2}),
        ({"no_snippet": True, "context": 2}, {"no_snippet": True, "context": 2}),
        ({"budget": 80, "min_score": 0.1}, {"budget": 80, "min_score": 0.1}),
    ],
)
def test_filters_and_modes_equal_the_library(lexical_server, sample_repo, body, kwargs):
    request = {"query": "open database connection config", "k": 3, "mode": "lexical", **body}
    with lexical_server.client() as http:
        doc = http.post("/search", json=request).json()
    expected = library(sample_repo, request["query"], request["k"],
                       **{"mode": request["mode"], **{k: v for k, v in kwargs.items() if k != "mode"}})
    assert doc == expected
    if "language" in kwargs:
        wanted = {kwargs["language"]} if isinstance(kwargs["language"], str) else set(kwargs["language"])
        assert doc["results"] and {r["language"] for r in doc["results"]} == wanted


def test_files_only_ships_no_text_and_a_cut_snippet_is_exact(lexical_server, sample_repo):
    # Regression: files_only results carried 500-700 characters of text each;
    # max_lines left end_line at the chunk's end and put a marker in the text
    with lexical_server.client() as http:
        names = http.post("/search", json={"query": "config database server", "k": 5, "mode": "lexical",
                                           "files_only": True}).json()
        cut = http.post("/search", json={"query": "config database server", "k": 5, "mode": "lexical",
                                         "max_lines": 2}).json()
    assert len(names["results"]) > 1 and {r["text"] for r in names["results"]} == {""}
    assert any(r.get("more_lines") for r in cut["results"])
    for hit in cut["results"]:
        lines = (sample_repo / hit["path"]).read_text(encoding="utf-8").split("\n")
        assert hit["text"] == "\n".join(lines[hit["start_line"] - 1 : hit["end_line"]])


def test_default_path_is_the_root_and_a_subfolder_scopes_the_search(lexical_server, sample_repo):
    with lexical_server.client() as http:
        default = http.post("/search", json={"query": "parseConfigFile", "mode": "lexical"}).json()
        by_root = http.post("/search", json={"query": "parseConfigFile", "mode": "lexical",
                                             "path": str(sample_repo)}).json()
        scoped = http.post("/search", json={"query": "server http database config", "mode": "lexical",
                                            "path": str(sample_repo / "server")}).json()
        relative = http.post("/search", json={"query": "server http database config", "mode": "lexical",
                                              "path": "server"}).json()
    assert default == by_root
    assert scoped["results"] and {r["path"] for r in scoped["results"]} == {"server/main.go"}
    assert relative == scoped


@pytest.mark.parametrize("path", ["/etc", "..", "../..", "/", "server/../../elsewhere"])
def test_paths_outside_the_served_roots_are_refused(lexical_server, path):
    with lexical_server.client() as http:
        search = http.post("/search", json={"query": "x", "path": path})
        index = http.post("/index", json={"path": path})
        status = http.get("/status", params={"path": path})
    for response in (search, index, status):
        assert response.status_code == 403, response.text
        body = response.json()
        assert body["error"] == "PathError"
        assert "outside the served roots" in body["detail"] and "\n" not in body["detail"]


def test_a_symlink_that_leads_outside_is_outside(lexical_server, sample_repo, tmp_path):
    link = sample_repo / "escape"
    os.symlink(tmp_path, link)
    try:
        with lexical_server.client() as http:
            response = http.post("/search", json={"query": "x", "path": str(link)})
        assert response.status_code == 403
    finally:
        link.unlink()


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"query": ""}, "query"),
        ({"query": "   "}, "empty"),
        ({"query": "x", "k": 0}, "k"),
        ({"query": "x", "mode": "fuzzy"}, "mode"),
        ({"query": "x", "colour": "red"}, "colour"),
        ({"k": 3}, "query"),
        ({"query": "x", "lang": "cobol"}, "cobol"),
        ({"query": "x", "glob": ["*.py", "*.{rs,md"]}, "invalid glob '*.{rs,md'"),
        ({"query": "x", "budget": 0}, "budget"),
        ({"query": "x", "max_lines": 0}, "max_lines"),
    ],
)
def test_bad_requests_get_400_with_one_line(lexical_server, body, needle):
    with lexical_server.client() as http:
        response = http.post("/search", json=body)
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert needle in detail and "\n" not in detail


def test_health_status_and_openapi(lexical_server, sample_repo):
    with lexical_server.client() as http:
        health = http.get("/health").json()
        status = http.get("/status").json()
        openapi = http.get("/openapi.json").json()
    assert health["status"] == "ok" and health["roots"] == [str(sample_repo)]
    assert health["pid"] == lexical_server.info["pid"]
    (root,) = status["roots"]
    assert root["root"] == str(sample_repo) and root["ready"] and not root["watching"]
    assert root["index"]["indexed"] and root["index"]["files"] == 5
    assert root["indexing"]["state"] == "idle"
    assert {"/search", "/status", "/index", "/health"} <= set(openapi["paths"])
    assert set(openapi["paths"]["/search"]["post"]["responses"]) >= {"200", "400", "403", "503", "504"}


def test_post_index_returns_202_at_once_and_status_shows_the_run(lexical_server):
    before = lexical_server.wait_idle()["roots"][0]["indexing"]["runs"]
    with lexical_server.client() as http:
        response = http.post("/index", json={})
    assert response.status_code == 202
    assert response.json()["accepted"] is True
    status = lexical_server.wait_idle(min_runs=before + 1)
    run = status["roots"][0]["indexing"]
    assert run["last_error"] is None
    assert run["last_summary"]["files_unchanged"] == 5


def test_discovery_file_names_the_bound_port_and_no_token(lexical_server, sample_repo):
    info = json.loads((sample_repo / ".codesearch" / "server.json").read_text())
    assert info["port"] == lexical_server.info["port"] != 0
    assert info["host"] == "127.0.0.1" and info["pid"] == lexical_server.info["pid"]
    assert info["token_required"] is False and "token" not in info
    assert info["root"] == str(sample_repo)


@pytest.mark.parametrize("path", ["no_such_folder", "src/nope.py", "./missing/"])
def test_a_path_that_does_not_exist_is_404_naming_the_root(lexical_server, sample_repo, path):
    # Once answered 200 with no results, as if nothing matched.
    with lexical_server.client() as http:
        response = http.post("/search", json={"query": "parseConfigFile", "mode": "lexical", "path": path})
    assert response.status_code == 404, response.text
    body = response.json()
    assert body["error"] == "UnknownPathError" and str(sample_repo) in body["detail"] and "\n" not in body["detail"]


@pytest.mark.parametrize("path", ["src/config.js", "./src/config.js"])
def test_a_file_path_searches_that_file(lexical_server, path):
    with lexical_server.client() as http:
        doc = http.post("/search", json={"query": "config database", "mode": "lexical", "path": path}).json()
    assert doc["results"] and {r["path"] for r in doc["results"]} == {"src/config.js"}
    assert "repo" not in doc["results"][0]  # one root served: the CLI's --json document, unchanged


def test_the_budget_says_how_many_hits_were_left_out(lexical_server):
    body = {"query": "open database connection config server retry", "k": 5, "mode": "lexical"}
    with lexical_server.client() as http:
        full = http.post("/search", json=body).json()
        fitted = http.post("/search", json={**body, "budget": 60}).json()
    assert "left_out" not in full
    assert fitted["left_out"] == len(full["results"]) - len(fitted["results"]) > 0
    assert any("token budget" in notice for notice in fitted["notices"])


def test_a_subfolder_scopes_negated_globs_too(lexical_server, sample_repo):
    with lexical_server.client() as http:
        doc = http.post("/search", json={"query": "server http database config retry", "mode": "lexical", "k": 20,
                                         "path": "src", "glob": "!*.js"}).json()
    paths = {r["path"] for r in doc["results"]}
    assert paths and all(p.startswith("src/") and not p.endswith(".js") for p in paths)
