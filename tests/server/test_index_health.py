"""Index health an agent can check and repair: ``status --json`` and the
MCP ``index_status`` tool say complete / stale / incomplete / building / damaged /
not_indexed with the next action, and the MCP ``repair_index`` tool does it."""

from __future__ import annotations

import json
import shutil
import sys
import time

import anyio
from fixtures.sample_repo import write_sample_repo
from mcp import Client, StdioServerParameters
from serverkit import LEXICAL, server_env
from typer.testing import CliRunner

from codesearch.cli.app import app
from codesearch.store import IndexLock


def _health(path) -> dict:
    result = CliRunner().invoke(app, ["status", str(path), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["health"]


def test_status_json_says_the_state_and_the_next_action(tmp_path):
    repo = write_sample_repo(tmp_path / "repo")
    health = _health(repo)
    assert health["state"] == "not_indexed" and f"codesearch index {repo}" in health["next_action"]

    assert CliRunner().invoke(app, ["index", str(repo), *LEXICAL, "-q"]).exit_code == 0
    assert _health(repo) == {"state": "complete", "problems": [], "next_action": "none"}

    shutil.rmtree(repo / ".codesearch" / "lexical")  # a derived index lost
    health = _health(repo)
    assert health["state"] == "damaged" and "lexical is missing" in health["problems"][0]
    assert f"codesearch index {repo}" in health["next_action"]
    # The action it names repairs it.
    assert CliRunner().invoke(app, ["index", str(repo), *LEXICAL, "-q"]).exit_code == 0
    assert _health(repo)["state"] == "complete"

    with IndexLock(repo / ".codesearch"):  # an index run in progress
        assert _health(repo)["state"] == "building"

    (repo / "server" / "main.go").write_text("package main\n\nfunc edited() {}\n")
    health = _health(repo)
    assert health["state"] == "stale" and health["next_action"] == f"codesearch index {repo}"


def _interrupted_index(repo, single_vector_dir):
    """An index whose run took Ctrl-C after its first committed batch of vectors."""
    import codesearch.encoder as E
    from codesearch.encoder.base import Encoders
    from codesearch.indexing import encode
    from codesearch.indexing.run import build_index

    encoders = Encoders(E.load(single_vector_dir), None)

    def stop_after_a_batch(event) -> None:
        if event.stage == "encode" and event.done > 0:
            raise KeyboardInterrupt

    batch = encode.ENCODE_BATCH
    encode.ENCODE_BATCH = 2
    try:
        try:
            build_index(repo, encoders=encoders, progress=stop_after_a_batch)
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the run was not interrupted")
    finally:
        encode.ENCODE_BATCH = batch
    return encoders


def test_an_interrupted_run_reads_incomplete_until_the_next_run_resumes_it(tmp_path, single_vector_dir):
    from codesearch.indexing.run import build_index

    repo = write_sample_repo(tmp_path / "repo")
    encoders = _interrupted_index(repo, single_vector_dir)
    health = _health(repo)
    assert health["state"] == "incomplete" and any("dense vectors" in p for p in health["problems"]), health
    assert "resumes the vectors" in health["next_action"]
    build_index(repo, encoders=encoders)
    assert _health(repo)["state"] == "complete"


def test_the_mcp_repair_tool_resumes_what_index_status_reports(tmp_path, single_vector_dir):
    """A real server over stdio: index_status says incomplete (a run was interrupted), and
    repair_index resumes the vectors until index_status says complete."""
    repo = write_sample_repo(tmp_path / "repo")
    _interrupted_index(repo, single_vector_dir)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "codesearch.server", str(repo), "--mcp", "stdio", "--no-watch", "--no-index-on-start",
              "--model", str(single_vector_dir), "--multi-model", "none"],
        env=server_env(),
    )

    async def main() -> None:
        with anyio.fail_after(180):
            async with Client(params) as client:
                tools = {tool.name for tool in (await client.list_tools()).tools}
                assert "repair_index" in tools
                (root,) = (await client.call_tool("index_status", {})).structured_content["roots"]
                assert root["index"]["health"]["state"] == "incomplete", root
                repaired = await client.call_tool("repair_index", {})
                assert not repaired.is_error, repaired.content
                doc = repaired.structured_content
                assert doc["accepted"] and doc["health_before"][str(repo)]["state"] == "incomplete"
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    (root,) = (await client.call_tool("index_status", {})).structured_content["roots"]
                    if root["index"] and root["index"]["health"]["state"] == "complete":
                        break
                    await anyio.sleep(0.2)
                assert root["index"]["health"]["state"] == "complete", root
                assert root["index"]["vectors"]["dense"] == 1.0

    anyio.run(main)
