"""Server test fixtures: the real server in a subprocess on an ephemeral loopback port.

Servers are module-scoped where tests only read, because each start imports FastAPI,
uvicorn and the MCP SDK (a couple of seconds on 2 busy cores).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from daemonkit import daemon_pids, stop_all
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


@pytest.fixture(scope="module")
def repo(tmp_path_factory, single_vector_dir) -> Path:
    """The sample repository with lexical and dense vectors of a tiny model (the daemon tests')."""
    from codesearch.api import CodeSearch

    root = write_sample_repo(tmp_path_factory.mktemp("vectors") / "repo")
    with CodeSearch(root, model=str(single_vector_dir), multi_model=None) as cs:
        cs.index()
    return root


@pytest.fixture
def runtime(tmp_path):
    """A test's private runtime folder; every daemon started there is stopped after it (a
    SIGSTOPped one continued first, so that it can hear the stop)."""
    folder = tmp_path / "run"
    try:
        yield folder
    finally:
        for pid in daemon_pids(folder):
            os.kill(pid, signal.SIGCONT)
        stop_all(folder)
        assert daemon_pids(folder) == [], "a daemon outlived its test"
