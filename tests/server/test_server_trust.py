"""Whom the CLI believes, and which token a server holds.

A ``.codesearch/server.json`` can come with a cloned repository: the client must not send
the query, let alone ``$CODESEARCH_TOKEN``, to whatever it names. A stand-in server in this
process records every request it gets, so each test can say what reached it. And a token
given with surrounding whitespace is the token without it, at both ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from fixtures.console import cli
from fixtures.sample_repo import write_sample_repo
from serverkit import LEXICAL, server_env, start_server

from codesearch.errors import ServerError
from codesearch.server.client import find_server, try_server_search
from codesearch.server.discovery import (
    CHALLENGE_HEADER,
    PROOF_HEADER,
    ServerInfo,
    listener_belongs_to,
    token_proof,
    write_discovery,
)
from codesearch.server.network import normalize_token

TOKEN = "user-token-never-to-leak"
EVIL = {"schema_version": 1, "query": "x", "mode": "lexical", "indexes_used": ["lexical"], "notices": [],
        "results": [{"path": "EVIL.md", "start_line": 1, "end_line": 1, "score": 9.9, "language": "markdown",
                     "symbol": None, "kind": "text", "text": "planted"}]}


class Impostor:
    """An HTTP server on loopback that answers like codesearch, claims any pid, proves
    nothing, and records each request's path and headers."""

    def __init__(self, root, claimed_pid: int):
        self.requests: list[tuple[str, str, dict]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, doc: dict) -> None:
                data = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header(PROOF_HEADER, "0" * 64)  # a guess at a proof
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                owner.requests.append(("GET", self.path, dict(self.headers)))
                self._answer({"status": "ok", "pid": claimed_pid, "roots": [str(root)], "repos": ["repo"]})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.requests.append(("POST", self.path, dict(self.headers)))
                self._answer(EVIL)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def plant(self, root, *, pid: int, token_required: bool, host: str = "127.0.0.1") -> None:
        write_discovery(root / ".codesearch", ServerInfo(host, self.port, pid, token_required, str(root), time.time()))

    def tokens_seen(self) -> list[str]:
        return [h.get("Authorization", "") for _, _, h in self.requests if h.get("Authorization")]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def planted(tmp_path):
    from codesearch.api import CodeSearch

    root = write_sample_repo(tmp_path / "cloned")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    impostors: list[Impostor] = []

    def make(claimed_pid: int) -> Impostor:
        impostors.append(Impostor(root, claimed_pid))
        return impostors[-1]

    yield root, make
    for impostor in impostors:
        impostor.close()


REQUEST = {"query": "parseConfigFile", "mode": "lexical", "k": 3}


@pytest.mark.skipif(listener_belongs_to(1, 1) is None, reason="needs /proc to tell a socket's process")
@pytest.mark.parametrize("token_required", [False, True])
def test_a_planted_file_naming_pid_1_gets_no_request_at_all(planted, monkeypatch, token_required):
    root, make = planted
    impostor = make(claimed_pid=1)
    impostor.plant(root, pid=1, token_required=token_required)
    monkeypatch.setenv("CODESEARCH_TOKEN", TOKEN)
    assert try_server_search(root, REQUEST) is None
    assert impostor.requests == []  # the socket is this test's, not pid 1's: nothing was sent


@pytest.mark.parametrize("claimed_pid", ["ours", 1])
def test_a_server_that_cannot_prove_the_token_never_receives_it(planted, monkeypatch, claimed_pid):
    # The file names this process, which does own the socket: only the proof can tell.
    root, make = planted
    impostor = make(claimed_pid=os.getpid() if claimed_pid == "ours" else claimed_pid)
    impostor.plant(root, pid=os.getpid(), token_required=True)
    monkeypatch.setenv("CODESEARCH_TOKEN", TOKEN)
    assert try_server_search(root, REQUEST) is None
    assert impostor.tokens_seen() == []
    assert [(method, path) for method, path, _ in impostor.requests] == [("GET", "/health")]
    assert CHALLENGE_HEADER in impostor.requests[0][2]


def test_a_server_needing_no_token_never_gets_one_and_must_report_the_files_pid(planted, monkeypatch):
    root, make = planted
    impostor = make(claimed_pid=1)  # /health says pid 1, the file says this process
    impostor.plant(root, pid=os.getpid(), token_required=False)
    monkeypatch.setenv("CODESEARCH_TOKEN", TOKEN)
    assert try_server_search(root, REQUEST) is None
    assert impostor.tokens_seen() == []
    assert [path for _, path, _ in impostor.requests] == ["/health"]  # no query sent


@pytest.mark.parametrize("host", ["10.0.0.1", "example.com", "0.0.0.0", "192.168.1.1"])
def test_a_discovery_file_naming_another_host_is_not_believed(planted, host):
    root, make = planted
    impostor = make(claimed_pid=os.getpid())
    impostor.plant(root, pid=os.getpid(), token_required=False, host=host)
    assert find_server(root) is None


def test_codesearch_query_prints_its_own_results_not_the_planted_servers(planted):
    root, make = planted
    impostor = make(claimed_pid=1)
    impostor.plant(root, pid=1, token_required=True)
    done = cli("query", "parseConfigFile", "-p", root, "--mode", "lexical", "--json",
               env={"CODESEARCH_TOKEN": TOKEN})
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["results"][0]["path"] == "src/config.js"
    assert "EVIL.md" not in done.stdout and impostor.tokens_seen() == []


def test_the_proof_binds_the_token_and_the_port():
    assert token_proof(TOKEN, 7420, "n") == token_proof(TOKEN, 7420, "n")
    assert token_proof(TOKEN, 7420, "n") != token_proof(TOKEN, 7421, "n")  # a relay proves its own port
    assert token_proof(TOKEN, 7420, "n") != token_proof(TOKEN + "x", 7420, "n")
    assert token_proof(TOKEN, 7420, "n") != token_proof(TOKEN, 7420, "m")


def test_the_real_servers_socket_is_its_pids(lexical_server):
    owned = listener_belongs_to(lexical_server.info["port"], lexical_server.info["pid"])
    assert owned in (True, None)  # None: no /proc here
    if owned:
        assert listener_belongs_to(lexical_server.info["port"], os.getpid()) is False
        assert listener_belongs_to(lexical_server.info["port"], 1) is False


# -- the token a server is started with ------------------------------------------------------


@pytest.mark.parametrize("given,expected", [(None, None), ("", None), ("t", "t"), (" padded-token ", "padded-token"),
                                            ("\tpadded token\n", "padded token")])
def test_a_token_is_stripped(given, expected):
    assert normalize_token(given) == expected


@pytest.mark.parametrize("given,needle", [("   ", "blank"), ("\t\n", "blank"), ("tök", "non-ASCII"),
                                          ("a\x00b", "control")])
def test_a_blank_or_unsendable_token_is_refused_without_showing_it(given, needle):
    with pytest.raises(ServerError) as exc:
        normalize_token(given)
    assert needle in str(exc.value) and "\n" not in str(exc.value)
    assert given.strip() == "" or given not in str(exc.value)


def test_a_padded_token_from_the_environment_is_the_token_without_the_padding(sample_repo, tmp_path):
    server = start_server([str(sample_repo), *LEXICAL, "--no-watch", "--no-index-on-start", "--host", "0.0.0.0"],
                          tmp_path, env=server_env(CODESEARCH_TOKEN=" padded-token "), token="padded-token")
    try:
        with server.client() as http:
            assert http.get("/health").status_code == 200  # was 401 to everyone
        challenge = httpx.get(server.url + "/health", headers={CHALLENGE_HEADER: "nonce"}, timeout=30)
        assert challenge.status_code == 401
        assert challenge.headers[PROOF_HEADER] == token_proof("padded-token", server.info["port"], "nonce")
    finally:
        server.stop()


@pytest.mark.parametrize("how", ["env", "flag"])
def test_a_blank_token_is_refused_at_start(sample_repo, how):
    args = [sys.executable, "-m", "codesearch.server", str(sample_repo), "--host", "0.0.0.0", "--port", "0", *LEXICAL]
    env = server_env(CODESEARCH_TOKEN="   ") if how == "env" else server_env()
    if how == "flag":
        args += ["--token", "   "]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("Error: the token is blank")
