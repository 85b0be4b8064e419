"""One ranking contract through every front end: the API, the CLI (in process and through
the server's fast path), HTTP and MCP give the same hits, the hits for k are the first k of
the hits for any larger k, and a language filter means the same for one root and for many
(a language a root lacks filters it to nothing; only a name that is no language is an error)."""

from __future__ import annotations

import itertools
import json

import anyio
import pytest
from mcp import Client
from serverkit import LEXICAL, start_server
from typer.testing import CliRunner

from codesearch.api import CodeSearch
from codesearch.cli.app import app

KS = (1, 3, 5, 10, 20, 40)
QUERY = "walk parallel directory"


def _big_rust_file() -> str:
    # One large file whose many chunks all match: it used to fill the candidate pool, so
    # k=5 returned 3 hits and missed better ones from other files that k=10 found.
    fns = [
        f"/// Walks part {i} of the tree in parallel.\n"
        f"pub fn walk_parallel_part_{i}(dir: &Path) -> usize {{\n"
        + "".join(f"    let step_{j} = dir.join(\"walk_{i}_{j}\");\n" for j in range(12))
        + "    0\n}\n"
        for i in range(60)
    ]
    return "use std::path::Path;\n\n" + "\n".join(fns)


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("contract")
    rs, py = base / "rs", base / "py"
    (rs / "src").mkdir(parents=True)
    (rs / "src" / "walk.rs").write_text(_big_rust_file())
    for name in ("dir", "parallel", "visit"):
        (rs / "src" / f"{name}.rs").write_text(
            f"/// {name}: walk a directory in parallel.\npub fn {name}_walk_parallel_directory() {{}}\n"
        )
    (py / "pkg").mkdir(parents=True)
    (py / "pkg" / "tree.py").write_text("def walk_directory(path):\n    '''Walk a directory tree.'''\n    return []\n")
    for root in (rs, py):
        with CodeSearch(root, model=None, multi_model=None) as cs:
            cs.index()
    return rs, py


@pytest.fixture(scope="module")
def server(roots, tmp_path_factory):
    srv = start_server([*map(str, roots), *LEXICAL, "--no-watch"], tmp_path_factory.mktemp("logs"))
    try:
        srv.wait_idle()
        yield srv
    finally:
        srv.stop()


def _locs(results) -> list[tuple[str, int, int]]:
    return [(r["path"], r["start_line"], r["end_line"]) for r in results]


def _api(root, k: int, **kw) -> list[tuple[str, int, int]]:
    with CodeSearch(root, model=None, multi_model=None) as cs:
        return [(h.path, h.start_line, h.end_line) for h in cs.search(QUERY, k, mode="lexical", **kw)]


def _cli(root, k: int, *extra: str) -> list[tuple[str, int, int]]:
    out = CliRunner().invoke(
        app, ["query", QUERY, "-p", str(root), "--mode", "lexical", "-k", str(k), "--json", *extra]
    )
    assert out.exit_code == 0, out.stderr
    return _locs(json.loads(out.stdout)["results"])


def _http(server, root, k: int, **body) -> list[tuple[str, int, int]]:
    with server.client() as http:
        resp = http.post("/search", json={"query": QUERY, "k": k, "mode": "lexical", "path": str(root), **body})
    assert resp.status_code == 200, resp.text
    return _locs(resp.json()["results"])


def _mcp(server, root, **args) -> dict[int, list[tuple[str, int, int]]]:
    async def main():
        out = {}
        with anyio.fail_after(120):
            async with Client(server.url + "/mcp") as client:
                for k in KS:
                    res = await client.call_tool(
                        "search_code", {"query": QUERY, "k": k, "mode": "lexical", "path": str(root), **args}
                    )
                    assert not res.is_error, res.content
                    out[k] = _locs(res.structured_content["results"])
        return out

    return anyio.run(main)


def test_top_k_is_a_prefix_of_every_larger_k_in_every_front_end(roots, server):
    rs, _ = roots
    api = {k: _api(rs, k) for k in KS}
    with CodeSearch(rs, model=None, multi_model=None) as cs:  # every chunk matches "walk"
        eligible = cs.status().chunks
    assert eligible > 20
    for small, large in itertools.pairwise(KS):
        assert api[small] == api[large][:small]
    for k in KS:
        assert len(api[k]) == min(k, eligible)  # k hits whenever k eligible chunks exist
    # The small files' definitions outscore walk.rs's second and later chunks (decay), so
    # they are in the top 5, not pushed out by the big file.
    assert {p for p, _, _ in api[5]} == {"src/walk.rs", "src/dir.rs", "src/parallel.rs", "src/visit.rs"}
    mcp = _mcp(server, rs)
    for k in KS:
        assert _cli(rs, k, "--no-server") == api[k]
        assert _cli(rs, k) == api[k]  # through the running server's fast path
        assert _http(server, rs, k) == api[k]
        assert mcp[k] == api[k]


#: Matches 12 of walk.rs's functions and visit.rs's one: fewer chunks than the larger ks.
REGEX = r"walk_parallel_part_\d*[05]\(|^pub fn visit_"


def test_regex_top_k_is_exact_and_the_same_in_every_front_end(roots, server):
    # --regex keeps the chunks whose text matches, then ranks them; k hits
    # whenever k chunks match, a prefix of any larger k, one answer through every front end
    import re

    from codesearch.store import Store

    rs, _ = roots
    with Store(rs / ".codesearch" / "store.sqlite", readonly=True) as store:
        want = {(r.chunk.path, r.chunk.start_line, r.chunk.end_line) for r in store.iter_chunk_records()
                if re.search(REGEX, r.chunk.text, re.M)}
    assert 10 < len(want) < max(KS)
    full = _api(rs, 1000, regex=REGEX)
    assert set(full) == want
    api = {k: _api(rs, k, regex=REGEX) for k in KS}
    for k in KS:
        assert api[k] == full[:k] and len(api[k]) == min(k, len(want))
    mcp = _mcp(server, rs, regex=REGEX)
    for k in KS:
        assert _cli(rs, k, "--regex", REGEX, "--no-server") == api[k]
        assert _cli(rs, k, "--regex", REGEX) == api[k]  # through the running server's fast path
        assert _http(server, rs, k, regex=REGEX) == api[k]
        assert mcp[k] == api[k]


def test_a_language_one_root_lacks_filters_it_to_nothing(roots, server):
    _, py = roots
    with server.client() as http:
        rust = http.post("/search", json={"query": "walk directory", "k": 5, "lang": "rust", "mode": "lexical"})
        python = http.post("/search", json={"query": "walk directory", "k": 5, "lang": ["py"], "mode": "lexical"})
        absent = http.post("/search", json={"query": "walk directory", "k": 5, "lang": "haskell", "mode": "lexical"})
        bogus = http.post("/search", json={"query": "walk directory", "k": 5, "lang": "cobolx", "mode": "lexical"})
    assert rust.status_code == 200 and rust.json()["results"]
    assert {r["repo"] for r in rust.json()["results"]} == {"rs"}
    assert {r["repo"] for r in python.json()["results"]} == {"py"}
    assert absent.status_code == 200 and absent.json()["results"] == []
    assert bogus.status_code == 400 and "unknown language 'cobolx'" in bogus.text

    async def main():
        with anyio.fail_after(120):
            async with Client(server.url + "/mcp") as client:
                ok = await client.call_tool(
                    "search_code", {"query": "walk directory", "lang": "rust", "mode": "lexical"}
                )
                bad = await client.call_tool("search_code", {"query": "walk directory", "lang": "cobolx"})
        assert not ok.is_error and {r["repo"] for r in ok.structured_content["results"]} == {"rs"}
        assert bad.is_error and "unknown language 'cobolx'" in bad.content[0].text

    anyio.run(main)
    # The Python API: a valid language the repository lacks gives no results, not a traceback.
    assert _api(py, 3, language="javascript") == []
