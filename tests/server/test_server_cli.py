"""`codesearch serve` as a command: registered on the main app, and every refusal is one
line and exit 1 before anything listens."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from serverkit import LEXICAL, server_env
from typer.testing import CliRunner


def test_serve_is_a_codesearch_command_with_an_example():
    from codesearch.cli.app import app

    result = CliRunner().invoke(app, ["serve", "--help"])
    assert result.exit_code == 0
    assert "Example: codesearch serve" in result.output
    for option in ("--host", "--port", "--token", "--mcp", "--no-watch"):
        assert option in result.output


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "codesearch.server", *args], capture_output=True, text=True,
                          env=server_env(), timeout=120)


def test_a_missing_folder_is_one_line_and_exit_1(tmp_path):
    proc = _serve(str(tmp_path / "nope"), "--port", "0", *LEXICAL)
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("Error: path") and "nope" in line


def test_a_busy_port_is_one_line_and_exit_1(sample_repo):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _serve(str(sample_repo), "--port", str(port), "--no-watch", "--no-index-on-start", *LEXICAL)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"Error: cannot listen on 127.0.0.1:{port}") and "--port 0" in line
    assert not (sample_repo / ".codesearch" / "server.json").exists()


@pytest.mark.parametrize("args,needle", [(["--port", "70000"], "port"), (["--mcp", "carrier-pigeon"], "mcp")])
def test_bad_options_are_usage_errors(sample_repo, args, needle):
    proc = _serve(str(sample_repo), *args)
    assert proc.returncode == 2
    assert needle in proc.stderr.lower()


def test_index_dir_with_two_roots_is_refused(sample_repo, tmp_path):
    proc = _serve(str(sample_repo), str(tmp_path), "--index-dir", str(tmp_path / "idx"), "--port", "0", *LEXICAL)
    assert proc.returncode == 1
    assert "--index-dir" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_no_path_serves_the_indexed_folder_above(sample_repo, tmp_path):
    import json
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "codesearch.server", "--port", "0", "--no-watch",
                             "--no-index-on-start", *LEXICAL],
                            cwd=sample_repo / "src", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=server_env())
    try:
        info = json.loads(proc.stdout.readline())
        assert info["roots"] == [str(sample_repo)]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        proc.stdout.close()
