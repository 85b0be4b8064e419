"""Several repositories served at once: a search without ``path``/``repo`` covers all of
them and merges by score, hits name their ``repo``, a relative path resolves to a root by
name, and anything that names nothing served is a 4xx naming the served roots (never an
empty 200). The same through HTTP and MCP."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client
from serverkit import LEXICAL, start_server

from codesearch.server.repos import _labels


@pytest.fixture(scope="module")
def two_roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("multi")
    roots = {}
    for name, ident, own in (("one", "alpha_only_in_one", "docs"), ("two", "beta_only_in_two", "lib")):
        root = roots[name] = base / name
        (root / "src").mkdir(parents=True)
        (root / "src" / "mod.py").write_text(f"def {ident}():\n    return 'shared_marker'\n")
        (root / own).mkdir()
        (root / own / "extra.py").write_text(f"def {own}_helper():\n    return 'shared_marker'\n")
    server = start_server([str(roots["one"]), str(roots["two"]), *LEXICAL, "--no-watch"], base / "logs")
    try:
        server.wait_idle(min_runs=1)
        yield server, roots
    finally:
        assert server.stop() == 0
        for root in roots.values():
            assert not (root / ".codesearch" / "server.json").exists()


def search(server, **body):
    with server.client() as http:
        return http.post("/search", json={"mode": "lexical", **body})


def test_no_path_searches_every_root_and_hits_name_their_repo(two_roots):
    server, _ = two_roots
    doc = search(server, query="shared_marker", k=10).json()
    assert {(r["repo"], r["path"]) for r in doc["results"]} == {
        ("one", "src/mod.py"), ("one", "docs/extra.py"), ("two", "src/mod.py"), ("two", "lib/extra.py")
    }
    scores = [r["score"] for r in doc["results"]]
    assert scores == sorted(scores, reverse=True)
    assert search(server, query="beta_only_in_two").json()["results"][0]["repo"] == "two"
    assert len(search(server, query="shared_marker", k=3).json()["results"]) == 3


def test_a_budget_is_the_whole_answers_across_roots(two_roots):
    # Once applied per root, so N roots could return N budgets and left_out counted one root.
    server, _ = two_roots
    full = search(server, query="shared_marker", k=10).json()
    fitted = search(server, query="shared_marker", k=10, budget=40).json()
    assert 0 < len(fitted["results"]) < len(full["results"]) == 4
    assert fitted["left_out"] == len(full["results"]) - len(fitted["results"])
    assert [(r["repo"], r["path"]) for r in fitted["results"]] == [(r["repo"], r["path"]) for r in full["results"]][
        : len(fitted["results"])
    ]


@pytest.mark.parametrize("body,repos,paths", [
    ({"repo": "two"}, {"two"}, {"src/mod.py", "lib/extra.py"}),
    ({"path": "two"}, {"two"}, {"src/mod.py", "lib/extra.py"}),
    ({"path": "./two/"}, {"two"}, {"src/mod.py", "lib/extra.py"}),
    ({"path": "two/src"}, {"two"}, {"src/mod.py"}),
    ({"path": "lib"}, {"two"}, {"lib/extra.py"}),  # a folder only one root has
    ({"repo": "one", "path": "src"}, {"one"}, {"src/mod.py"}),
    ({"path": "one/src/mod.py"}, {"one"}, {"src/mod.py"}),
])
def test_path_and_repo_pick_a_root(two_roots, body, repos, paths):
    server, _ = two_roots
    response = search(server, query="shared_marker", **body)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert {r["repo"] for r in results} == repos and {r["path"] for r in results} == paths


def test_absolute_paths_and_repo_paths_pick_a_root(two_roots):
    server, roots = two_roots
    for body in ({"path": str(roots["two"])}, {"repo": str(roots["two"])}, {"path": str(roots["two"] / "lib")}):
        results = search(server, query="shared_marker", **body).json()["results"]
        assert results and {r["repo"] for r in results} == {"two"}, body


@pytest.mark.parametrize("body,status,needle", [
    ({"path": "src"}, 400, "one/src"),  # both roots have it
    ({"path": "nowhere"}, 404, "one ("),
    ({"path": "two/nowhere"}, 404, "two ("),
    ({"repo": "three"}, 404, "one ("),
    ({"repo": "one", "path": "lib"}, 404, "one ("),
    ({"path": "/etc"}, 403, "one ("),
    ({"path": "two/../../.."}, 403, "outside"),
])
def test_what_names_nothing_served_is_a_4xx_naming_the_roots(two_roots, body, status, needle):
    server, roots = two_roots
    response = search(server, query="shared_marker", **body)
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert needle in detail and "\n" not in detail
    if status == 404 and "repo" not in body:
        assert str(roots["one"]) in detail and str(roots["two"]) in detail


def test_status_index_and_health_name_the_roots(two_roots):
    server, roots = two_roots
    with server.client() as http:
        only_two = http.get("/status", params={"path": "two"}).json()
        health = http.get("/health").json()
        runs = [r["indexing"]["runs"] for r in http.get("/status").json()["roots"]]
        accepted = http.post("/index", json={})
    assert [r["root"] for r in only_two["roots"]] == [str(roots["two"])]
    assert health["roots"] == [str(roots["one"]), str(roots["two"])] and health["repos"] == ["one", "two"]
    assert accepted.status_code == 202 and accepted.json()["roots"] == health["roots"]  # every root queued
    status = server.wait_idle(min_runs=max(runs) + 1)
    assert all(r["indexing"]["runs"] > n for r, n in zip(status["roots"], runs))


def test_the_cli_fast_path_still_finds_each_root(two_roots):
    from codesearch.server.client import try_server_search

    _, roots = two_roots
    for name, ident in (("one", "alpha_only_in_one"), ("two", "beta_only_in_two")):
        doc = try_server_search(roots[name], {"query": ident, "mode": "lexical"})
        assert doc is not None and ident in doc["results"][0]["text"]
        assert {r["repo"] for r in doc["results"]} == {name}


def test_mcp_search_code_follows_the_same_contract(two_roots):
    server, roots = two_roots

    async def main() -> None:
        with anyio.fail_after(120):
            async with Client(server.url + "/mcp") as client:
                every = await client.call_tool("search_code", {"query": "shared_marker", "mode": "lexical"})
                picked = await client.call_tool("search_code", {"query": "shared_marker", "mode": "lexical",
                                                                "path": "two"})
                by_repo = await client.call_tool("search_code", {"query": "shared_marker", "mode": "lexical",
                                                                 "repo": "one"})
                unknown = await client.call_tool("search_code", {"query": "shared_marker", "path": "fd"})
                status = await client.call_tool("index_status", {"path": "one"})
        assert {r["repo"] for r in every.structured_content["results"]} == {"one", "two"}
        assert {r["repo"] for r in picked.structured_content["results"]} == {"two"}
        assert {r["repo"] for r in by_repo.structured_content["results"]} == {"one"}
        assert unknown.is_error
        text = unknown.content[0].text
        assert "'fd'" in text and str(roots["one"]) in text and str(roots["two"]) in text
        assert [r["root"] for r in status.structured_content["roots"]] == [str(roots["one"])]

    anyio.run(main)


@pytest.mark.parametrize("roots,names", [
    (["/a/uvicorn", "/b/fd"], ["uvicorn", "fd"]),
    (["/a/src", "/b/src"], ["a/src", "b/src"]),
    (["/x/a/src", "/y/a/src", "/z/b"], ["x/a/src", "y/a/src", "b"]),
])
def test_root_names_are_folder_names_made_unique(roots, names):
    from pathlib import Path

    assert _labels([Path(r) for r in roots]) == names
