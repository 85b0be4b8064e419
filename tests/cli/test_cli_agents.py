"""`codesearch agents`: each client's MCP config, in its own file and format, merged into
what the file holds; printed without --write; the AGENTS.md snippet; and the written entry
really starts a server an MCP client can search through."""

from __future__ import annotations

import json
import os
import sys

import anyio
import pytest
from fixtures.console import SCRIPT, cli
from fixtures.sample_repo import write_sample_repo
from typer.testing import CliRunner

from codesearch.cli.app import app

# client -> (file under the project, or under CODEX_HOME for codex), table of servers, the served folder
FILES = {
    "claude-code": (".mcp.json", "mcpServers", "."),
    "cursor": (".cursor/mcp.json", "mcpServers", "${workspaceFolder}"),
    "vscode": (".vscode/mcp.json", "servers", "${workspaceFolder}"),
    "zed": (".zed/settings.json", "context_servers", "."),
    "codex": ("config.toml", "mcp_servers", "."),
}


def run(*args: str, env: dict[str, str]):
    result = CliRunner().invoke(app, ["agents", *args], env=env)
    assert result.exit_code == 0, result.output
    return result


def read(path):
    if path.suffix == ".toml":
        return pytest.importorskip("tomllib").loads(path.read_text())  # Python 3.11+
    return json.loads(path.read_text())


def check_entry(entry: dict, root: str, client: str) -> None:
    assert entry["args"][-3:] == [root, "--mcp", "stdio"]
    assert (entry["command"].endswith("codesearch") and entry["args"][0] == "serve") or \
        entry["args"][:2] == ["-m", "codesearch.server"]
    if client == "vscode":
        assert entry["type"] == "stdio"
    if client == "zed":
        assert entry["source"] == "custom" and entry["env"] == {}


@pytest.mark.parametrize("client", sorted(FILES))
def test_write_creates_each_clients_file(tmp_path, client):
    project, home = tmp_path / "project", tmp_path / "codex-home"
    project.mkdir()
    run(client, "--write", "--path", str(project), env={"CODEX_HOME": str(home)})
    name, key, root = FILES[client]
    path = (home if client == "codex" else project) / name
    check_entry(read(path)[key]["codesearch"], root, client)
    # Only the named client's file is written.
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert written == {path.relative_to(tmp_path).as_posix()}


EXISTING_JSON = {"mcpServers": {"other": {"command": "other-server"}}, "servers": {"other": {"command": "x"}},
                 "context_servers": {"other": {"command": "y"}}, "theme": "One Dark", "nested": {"keep": [1, 2]}}
EXISTING_TOML = (
    'model = "o3"  # a comment that must survive\n\n[mcp_servers.other]\ncommand = "other-server"\n\n'
    '[profiles.fast]\nmodel = "mini"\n'
)


@pytest.mark.parametrize("client", sorted(FILES))
def test_write_merges_without_losing_keys_and_is_idempotent(tmp_path, client):
    project, home = tmp_path / "project", tmp_path / "codex-home"
    name, key, root = FILES[client]
    path = (home if client == "codex" else project) / name
    project.mkdir()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(EXISTING_TOML if client == "codex" else json.dumps(EXISTING_JSON, indent=4))
    env = {"CODEX_HOME": str(home)}
    first = run(client, "--write", "--path", str(project), env=env)
    assert "wrote" in first.stderr
    merged = read(path)
    check_entry(merged[key]["codesearch"], root, client)
    if client == "codex":
        assert merged["model"] == "o3" and merged["profiles"] == {"fast": {"model": "mini"}}
        assert merged["mcp_servers"]["other"] == {"command": "other-server"}
        assert "a comment that must survive" in path.read_text()
    else:
        assert merged[key]["other"] == EXISTING_JSON[key]["other"]
        assert {k: v for k, v in merged.items() if k != key} == {k: v for k, v in EXISTING_JSON.items() if k != key}
    text = path.read_text()
    second = run(client, "--write", "--path", str(project), env=env)
    assert "already set up" in second.stderr and path.read_text() == text


def test_an_old_codex_entry_is_replaced_in_place(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[mcp_servers.codesearch]\ncommand = "old"\nargs = []\n\n[other]\nx = 1\n')
    run("codex", "--write", "--path", str(tmp_path), env={"CODEX_HOME": str(home)})
    data = read(home / "config.toml")
    assert data["other"] == {"x": 1} and data["mcp_servers"]["codesearch"]["command"] != "old"


def test_a_line_separator_inside_a_toml_string_is_not_a_line(tmp_path):
    # TOML lines end at \n: a U+2028 inside a string, then "[", is no table header (splitlines
    # cut there, and the entry was replaced up to it, leaving half a string behind).
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(
        '[mcp_servers.codesearch]\ncommand = "old"\nnote = "a\u2028[b]"\n\n[other]\nx = "c\u2028d"\n', encoding="utf-8"
    )
    run("codex", "--write", "--path", str(tmp_path), env={"CODEX_HOME": str(home)})
    data = read(home / "config.toml")
    assert data["other"] == {"x": "c\u2028d"} and data["mcp_servers"]["codesearch"]["command"] != "old"
    assert "note" not in data["mcp_servers"]["codesearch"]


def test_a_broken_config_is_refused_with_one_line(tmp_path):
    (tmp_path / ".zed").mkdir()
    broken = '// Zed settings\n{"theme": "x",, }\n'
    (tmp_path / ".zed" / "settings.json").write_text(broken)
    result = CliRunner().invoke(app, ["agents", "zed", "--write", "--path", str(tmp_path)])
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Error: cannot merge into") and "line 2" in line and "codesearch agents zed" in line
    assert (tmp_path / ".zed" / "settings.json").read_text() == broken


ZED_SETTINGS = """\
// Zed settings
//
// For information on how to configure Zed, see the Zed documentation.
{
  /* the look */
  "theme": "One Dark", // dark, always
  "vim_mode": true,
  "context_servers": {
    "other": {"source": "custom", "command": "y", "args": []}, // another server
  },
}
"""


def test_zed_settings_as_jsonc_are_merged_and_keep_their_comments(tmp_path):
    from codesearch.cli import jsonc

    settings = tmp_path / ".zed" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(ZED_SETTINGS)
    result = run("zed", "--write", "--path", str(tmp_path), env={})
    assert "Zed: wrote" in result.stderr
    text = settings.read_text()
    for line in ZED_SETTINGS.splitlines():
        if "//" in line or "/*" in line:
            assert line in text  # every comment, on its own line as before
    data = jsonc.loads(text)
    check_entry(data["context_servers"]["codesearch"], ".", "zed")
    assert data["context_servers"]["other"]["command"] == "y"
    assert data["theme"] == "One Dark" and data["vim_mode"] is True
    assert "already set up in" in run("zed", "--write", "--path", str(tmp_path), env={}).stderr
    assert settings.read_text() == text


def test_the_entry_names_the_running_console_script_by_absolute_path(tmp_path):
    # An editor started from a desktop has neither the shell's PATH nor its virtual
    # environment: a bare "codesearch" would name no program there.
    done = cli("agents", "claude-code", "--write", "--path", tmp_path, cwd=tmp_path,
               env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    entry = read(tmp_path / ".mcp.json")["mcpServers"]["codesearch"]
    assert entry["command"] == str(SCRIPT) and os.path.isabs(entry["command"])
    assert entry["args"][0] == "serve"


def test_without_write_it_prints_every_client_and_the_snippet(tmp_path):
    result = run("--path", str(tmp_path), env={"CODEX_HOME": str(tmp_path / "h")})
    for title in ("Claude Code", "Cursor", "Codex", "VS Code", "Zed"):
        assert f"# {title}: " in result.stdout
    assert "[mcp_servers.codesearch]" in result.stdout and '"mcpServers"' in result.stdout
    assert "## Code search" in result.stdout and "search_code" in result.stdout and "grep" in result.stdout
    assert not any(tmp_path.iterdir())  # nothing written


def test_the_written_entry_starts_a_server_an_agent_can_search(tmp_path):
    from mcp import Client, StdioServerParameters

    from codesearch.api import CodeSearch

    project = write_sample_repo(tmp_path / "repo")
    with CodeSearch(project, model=None, multi_model=None) as cs:
        cs.index()
    run("claude-code", "--write", "--path", str(project), env={})
    entry = read(project / ".mcp.json")["mcpServers"]["codesearch"]
    command, args = entry["command"], entry["args"]
    if command.endswith("codesearch") and args[0] == "serve":  # the console script of another install
        command, args = sys.executable, ["-m", "codesearch.server", *args[1:]]
    env = {k: v for k, v in os.environ.items() if k != "CODESEARCH_TOKEN"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # the default models: none here, lexical only
    params = StdioServerParameters(command=command, args=[*args, "--no-watch"], env=env, cwd=str(project))

    async def main() -> None:
        with anyio.fail_after(120):
            async with Client(params) as client:
                result = await client.call_tool("search_code", {"query": "parseConfigFile", "mode": "lexical"})
        assert not result.is_error and result.structured_content["results"][0]["path"] == "src/config.js"

    anyio.run(main)
