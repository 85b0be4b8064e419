"""The `codesearch query` fast path: `try_server_search` uses a live server for the same
repo and returns None (search locally) for anything doubtful."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from fixtures.sample_repo import write_sample_repo

from codesearch.api import CodeSearch
from codesearch.server.client import ANSWERED_BY, find_server, try_server_search
from codesearch.server.discovery import ServerInfo, read_discovery, remove_discovery, write_discovery
from codesearch.types import result_document


def test_fast_path_returns_the_servers_document(lexical_server, sample_repo):
    request = {"query": "retry_with_backoff exponential backoff jitter", "k": 3, "mode": "lexical",
               "lang": None, "glob": None, "files_only": False}
    doc = try_server_search(sample_repo, request)
    with CodeSearch(sample_repo, model=None, multi_model=None) as cs:
        expected = result_document(cs.query(request["query"], 3, mode="lexical"))
    assert doc == expected


def test_fast_path_from_a_subfolder_path_spelling(lexical_server, sample_repo):
    # The CLI may pass the root in another spelling (relative, with ..): it is resolved.
    spelled = sample_repo / "src" / ".."
    assert try_server_search(spelled, {"query": "parseConfigFile", "mode": "lexical"}) is not None


def test_fast_path_is_quick_once_the_server_is_warm(lexical_server, sample_repo):
    try_server_search(sample_repo, {"query": "warm", "mode": "lexical"})
    start = time.perf_counter()
    for _ in range(5):
        assert try_server_search(sample_repo, {"query": "parseConfigFile", "mode": "lexical"}) is not None
    # Not a benchmark: only that it is a round trip, not a model load (seconds).
    assert (time.perf_counter() - start) / 5 < 1.0


def test_no_discovery_file_means_none(tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    assert find_server(root) is None
    assert try_server_search(root, {"query": "x"}) is None


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_file_with_a_dead_pid_is_ignored(tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    write_discovery(root / ".codesearch", ServerInfo("127.0.0.1", 9, _dead_pid(), False, str(root), time.time()))
    assert read_discovery(root / ".codesearch") is None
    assert read_discovery(root / ".codesearch", check_alive=False) is not None
    assert try_server_search(root, {"query": "x"}) is None


def test_live_pid_but_nothing_listening_is_none_quickly(tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    write_discovery(root / ".codesearch", ServerInfo("127.0.0.1", port, os.getpid(), False, str(root), time.time()))
    start = time.perf_counter()
    assert try_server_search(root, {"query": "x"}) is None
    assert time.perf_counter() - start < 2.0


def test_a_server_for_another_root_is_not_used(lexical_server, sample_repo, tmp_path):
    other = write_sample_repo(tmp_path / "other")
    info = lexical_server.info
    # A copied discovery file naming another root, and one naming this root at a server
    # that serves only the other: both refused.
    write_discovery(other / ".codesearch",
                    ServerInfo(info["host"], info["port"], info["pid"], False, str(sample_repo), time.time()))
    assert try_server_search(other, {"query": "x"}) is None
    write_discovery(other / ".codesearch",
                    ServerInfo(info["host"], info["port"], info["pid"], False, str(other), time.time()))
    assert try_server_search(other, {"query": "x"}) is None


def test_malformed_discovery_file_is_ignored(tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    (root / ".codesearch").mkdir()
    (root / ".codesearch" / "server.json").write_text("{not json")
    assert try_server_search(root, {"query": "x"}) is None


def test_remove_discovery_leaves_another_servers_file(tmp_path):
    folder = tmp_path / "idx"
    write_discovery(folder, ServerInfo("127.0.0.1", 1, os.getpid() + 1, False, "/r", 0.0))
    remove_discovery(folder)  # ours is pid os.getpid(): not this file
    assert (folder / "server.json").exists()
    remove_discovery(folder, pid=os.getpid() + 1)
    assert not (folder / "server.json").exists()


def test_a_bad_query_falls_back_to_the_local_path(lexical_server, sample_repo):
    # The server answers 400; the CLI must then run locally and print its own error.
    assert try_server_search(sample_repo, {"query": "x", "mode": "nonsense"}) is None


def test_server_result_round_trips_to_the_same_document(lexical_server, sample_repo):
    from codesearch.server.client import try_server_result

    request = {"query": "openDatabaseConnection", "k": 4, "mode": "lexical"}
    result = try_server_result(sample_repo, request)
    assert result is not None and result.hits[0].path == "server/main.go"
    doc = try_server_search(sample_repo, request)
    assert result_document(result) == {**doc, "notices": [ANSWERED_BY, *doc["notices"]]}
