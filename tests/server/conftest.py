"""Server test fixtures: the real server in a subprocess on an ephemeral loopback port.

Servers are module-scoped where tests only read, because each start imports FastAPI,
uvicorn and the MCP SDK (a couple of seconds on 2 busy cores).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.sample_repo import write_sample_repo
from serverkit import LEXICAL, start_server


@pytest.fixture(scope="module")
def sample_repo(tmp_path_factory) -> Path:
    """The shared sample repository, indexed lexical-only by the library."""
    from codesearch.api import CodeSearch

    root = write_sample_repo(tmp_path_factory.mktemp("served") / "repo")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    return root


@pytest.fixture(scope="module")
def lexical_server(sample_repo, tmp_path_factory):
    """A server on the sample repo: lexical-only, no watcher (read-only tests share it)."""
    server = start_server([str(sample_repo), *LEXICAL, "--no-watch"], tmp_path_factory.mktemp("logs"))
    try:
        server.wait_idle()
        yield server
    finally:
        server.stop()
