"""SearchRequest: one request shape for the API, CLI, HTTP and MCP, normalised and checked
when it is made (one-line QueryErrors), and one Mode read by every front end."""

from __future__ import annotations

import pytest

from codesearch.errors import QueryError
from codesearch.types import MODES, Mode, SearchRequest


def test_one_mode_list_for_every_front_end():
    from codesearch import api
    from codesearch.cli import app as cli
    from codesearch.search import searcher as search
    from codesearch.server import app as http
    from codesearch.server import mcp_tools as mcp

    assert MODES == ("hybrid", "lexical", "dense", "colbert")
    # The searcher takes the one request type (it holds the mode), so it needs no list of its own.
    assert search.SearchRequest is SearchRequest and api.MODES is MODES
    assert cli.Mode is Mode and http.Mode is Mode and mcp.Mode is Mode


def test_values_are_normalised():
    req = SearchRequest("  open db ", 3, "lexical", languages="Python", globs="src/**")
    assert req.mode is Mode.lexical and req.languages == ("python",) and req.globs == ("src/**",)
    req = SearchRequest.of("q", language="go", languages=["rust", "go"], glob=["*.rs", "*.rs"], budget=100)
    assert req.languages == ("rust", "go") and req.globs == ("*.rs",) and req.budget == 100
    assert SearchRequest.from_dict(req.to_dict()) == req
    assert req.to_dict()["mode"] == "hybrid"
    assert not SearchRequest("q").shapes_output and SearchRequest("q", max_lines=3).shapes_output
    assert SearchRequest("q", k=4, max_lines=3, budget=9).without_output() == SearchRequest("q", k=4)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"query": "  "}, "the query is empty"),
        ({"query": "q", "mode": "fuzzy"}, "unknown mode 'fuzzy'"),
        ({"query": "q", "k": 0}, "k must be at least 1"),
        ({"query": "q", "globs": ["*.{rs,md"]}, "invalid glob"),
        ({"query": "q", "max_lines": 0}, "max_lines must be at least 1"),
        ({"query": "q", "budget": 0}, "budget must be at least 1"),
        ({"query": "q", "context": -1}, "context must be at least 0"),
        ({"query": "q", "min_score": float("nan")}, "min_score must be a number"),
        ({"query": "q", "languages": [3]}, "must be text"),
        ({"query": "q", "colour": "red"}, "unknown search option"),
    ],
)
def test_bad_values_are_one_line_query_errors(kwargs, needle):
    with pytest.raises(QueryError) as exc:
        SearchRequest.of(**kwargs)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_importing_the_request_stays_light():
    import subprocess
    import sys

    code = "import sys, codesearch.types; print(sorted({'numpy', 'torch', 'pathspec'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
