"""``codesearch serve ROOT --mcp stdio`` (what ``codesearch agents --write`` configures) as a
thin client of the daemon: sessions on two repositories share one daemon and one model
load, each sees its own root only, and answers match the library's."""

from __future__ import annotations

import json
import shutil

import anyio
import pytest
from daemonkit import cli_argv, daemon_env, daemon_pids, run_cli, stop_all
from fixtures.sample_repo import write_sample_repo
from mcp import Client, StdioServerParameters

from codesearch.server.runtime_dir import daemon_dir, read_info
from codesearch.types import result_document


@pytest.fixture(scope="module")
def two_repos(tmp_path_factory, single_vector_dir):
    from codesearch.api import CodeSearch

    roots = []
    for name in ("one", "two"):
        root = write_sample_repo(tmp_path_factory.mktemp(f"mcp-{name}") / name)
        with CodeSearch(root, model=str(single_vector_dir), multi_model=None) as cs:
            cs.index()
        roots.append(root)
    return roots


def library(root, query, k, **kwargs):
    from codesearch.api import CodeSearch

    with CodeSearch(root) as cs:
        return result_document(cs.query(query, k, refresh=False, **kwargs))


def test_stdio_sessions_share_one_daemon_and_one_model_load(two_repos, tmp_path):
    runtime = tmp_path / "run"
    env = daemon_env(runtime)
    exe = cli_argv()

    def params(root):
        return StdioServerParameters(command=exe[0], args=[*exe[1:], "serve", str(root), "--mcp", "stdio"], env=env)

    seen: dict[int, dict] = {}

    async def session(i: int, root) -> None:
        async with Client(params(root)) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert {"search_code", "index_status"} <= tools
            result = await client.call_tool("search_code", {"query": "greet the user", "k": 3})
            assert not result.is_error, result.content
            seen[i] = result.structured_content
            status = await client.call_tool("index_status", {})
            assert [r["root"] for r in status.structured_content["roots"]] == [str(root.resolve())]
            outside = await client.call_tool("search_code", {"query": "x", "path": str(two_repos[1 - i % 2])})
            assert outside.is_error  # a session sees its own repository, not the user's others

    async def main() -> None:
        with anyio.fail_after(300):
            # One first (it starts the daemon), then three at once on both repositories.
            await session(0, two_repos[0])
            async with anyio.create_task_group() as tg:
                for i in (1, 2, 3):
                    tg.start_soon(session, i, two_repos[i % 2])

    try:
        anyio.run(main)
        info = read_info(daemon_dir(runtime))
        assert info is not None and daemon_pids(runtime) == [info.pid]
        status = json.loads(run_cli(["daemon", "status", "--json"], env).stdout)
        assert len(status["model_loads"]) == 1, status["model_loads"]
        assert sorted(r["root"] for r in status["roots"]) == sorted(str(r.resolve()) for r in two_repos)
        assert status["sessions"] == []  # each client said goodbye
        for i, doc in seen.items():
            want = library(two_repos[i % 2], "greet the user", 3)
            assert [(h["path"], h["start_line"]) for h in doc["results"]] == [
                (h["path"], h["start_line"]) for h in want["results"]]
    finally:
        stop_all(runtime)
    assert daemon_pids(runtime) == []


def test_no_daemon_serves_in_process(two_repos, tmp_path):
    runtime = tmp_path / "run"
    env = daemon_env(runtime, CODESEARCH_NO_DAEMON="1")
    exe = cli_argv()
    params = StdioServerParameters(command=exe[0], args=[*exe[1:], "serve", str(two_repos[0]), "--mcp", "stdio",
                                                         "--no-watch", "--no-index-on-start"], env=env)

    async def main() -> None:
        with anyio.fail_after(180):
            async with Client(params) as client:
                result = await client.call_tool("search_code", {"query": "greet", "k": 2, "mode": "lexical"})
                assert not result.is_error

    anyio.run(main)
    assert daemon_pids(runtime) == [] and not (daemon_dir(runtime) / "daemon.json").exists()
    shutil.rmtree(runtime, ignore_errors=True)
