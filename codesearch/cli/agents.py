"""`codesearch agents`: the MCP set-up of coding agents and editors, printed or written.

Each client keeps its MCP servers in its own file and format; this command knows five of
them and writes (or prints) the one entry they need, ``codesearch serve . --mcp stdio``,
merged into what the file already holds. It also prints a snippet for AGENTS.md or
CLAUDE.md that tells an agent when semantic search beats grep.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from codesearch.errors import CodeSearchError

SERVER_NAME = "codesearch"


class Client(str, Enum):
    claude_code = "claude-code"
    cursor = "cursor"
    codex = "codex"
    vscode = "vscode"
    zed = "zed"


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Where one client reads its MCP servers and how an entry looks there."""

    title: str
    file: Path  # relative to the project, or absolute (Codex: a user-level file)
    key: str  # the table of servers in that file
    root: str  # how the served folder is written: Cursor and VS Code expand ${workspaceFolder}
    fmt: str = "json"  # or "toml"
    head: tuple[tuple[str, str], ...] = ()  # fields before command/args (VS Code: type; Zed: source)
    env: bool = False  # Zed's entries carry an env table

    def entry(self, command: list[str]) -> dict[str, Any]:
        """The server's entry in this client's format, for ``command`` (the program and
        the arguments that start ``codesearch serve``)."""
        program, *args = command
        entry: dict[str, Any] = {**dict(self.head), "command": program, "args": [*args, self.root, "--mcp", "stdio"]}
        if self.env:
            entry["env"] = {}
        return entry


def _codex_home() -> Path:
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")


CLIENTS: dict[Client, ClientConfig] = {
    Client.claude_code: ClientConfig("Claude Code", Path(".mcp.json"), "mcpServers", "."),
    Client.cursor: ClientConfig("Cursor", Path(".cursor/mcp.json"), "mcpServers", "${workspaceFolder}"),
    # Codex reads MCP servers from its user config; "." is the folder Codex runs in.
    Client.codex: ClientConfig("Codex", Path("config.toml"), "mcp_servers", ".", fmt="toml"),
    Client.vscode: ClientConfig("VS Code", Path(".vscode/mcp.json"), "servers", "${workspaceFolder}",
                                head=(("type", "stdio"),)),
    Client.zed: ClientConfig("Zed", Path(".zed/settings.json"), "context_servers", ".",
                             head=(("source", "custom"),), env=True),
}

AGENTS_SNIPPET = """\
## Code search

This repository is indexed for semantic code search (codesearch; MCP tool `search_code`).

- Use `search_code` to find code by what it does or means ("where are failed requests
  retried", "parse the config file"), when you do not know the identifier, or to find the
  right file to start from. Hits carry path, line range, score and the code.
- Use grep / ripgrep for an exact string, every use of a known identifier, or a regex.
- Narrow with `path` (a folder or file), `lang`, `glob` ("src/**/*.py"); `files_only: true`
  lists files; `mode: "lexical"` is fastest for identifiers; `k` sets how many hits.
- `index_status` says what is indexed; the server re-indexes files as they are saved.
- Without MCP: `codesearch query "what you look for" -k 5 --json`.
"""


def _command() -> list[str]:
    """How clients start the server, by absolute path: an editor started from a desktop
    does not inherit the shell's PATH or an activated virtual environment, where a bare
    ``codesearch`` names no program, or another install's.

    The running console script (``~/.local/bin/codesearch`` for pipx, not resolved, so it
    survives upgrades), else the one beside this Python, else the one on PATH, else this
    Python with ``-m codesearch.server``.
    """
    running = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    beside = Path(sys.executable).with_name("codesearch")
    on_path = shutil.which("codesearch")
    for script in (running, beside, Path(on_path) if on_path else None):
        if script is not None and script.name == "codesearch" and script.is_file() and os.access(script, os.X_OK):
            return [os.path.abspath(script), "serve"]
    return [sys.executable, "-m", "codesearch.server"]


def _path_for(client: Client, project: Path) -> Path:
    config = CLIENTS[client]
    return _codex_home() / config.file if client is Client.codex else project / config.file


def _render(client: Client, entry: dict[str, Any]) -> str:
    config = CLIENTS[client]
    if config.fmt == "toml":
        return _toml_table(f"{config.key}.{SERVER_NAME}", entry)
    return json.dumps({config.key: {SERVER_NAME: entry}}, indent=2) + "\n"


def _toml_table(name: str, entry: dict[str, Any]) -> str:
    # JSON strings are valid TOML basic strings, and entries hold only strings and lists.
    lines = [f"[{name}]"] + [f"{key} = {json.dumps(value)}" for key, value in entry.items()]
    return "\n".join(lines) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def merge_json(path: Path, key: str, entry: dict[str, Any], *, client: str) -> bool:
    """Put ``entry`` under ``key`` -> ``codesearch`` in the JSON file ``path``, keeping
    everything else, comments and trailing commas included (Zed's and VS Code's files are
    JSONC); returns False when it was already there as is.

    Raises
    ------
    CodeSearchError
        The file is not JSON (comments allowed), not an object, or ``key`` is no object.
    """
    from codesearch.cli import jsonc

    text = path.read_text(encoding="utf-8") if path.exists() else ""
    try:
        data = jsonc.loads(text) if text.strip() else {}
        servers = data.get(key) if isinstance(data, dict) else None
        if isinstance(servers, dict) and servers.get(SERVER_NAME) == entry:
            return False
        new = jsonc.set_member(text, (key, SERVER_NAME), entry)
    except jsonc.JSONCError as exc:
        raise CodeSearchError(
            f"cannot merge into {path}: {exc} "
            f"(fix the file, or add the entry printed by 'codesearch agents {client}' by hand)"
        ) from None
    _write_atomic(path, new)
    return True


def merge_toml(path: Path, key: str, entry: dict[str, Any]) -> bool:
    """Put ``[key.codesearch]`` into the TOML file ``path``, keeping the rest of the text
    (comments included); returns False when it was already there as is.

    Works on the text (the standard library reads TOML but does not write it): an existing
    ``[key.codesearch]`` table is replaced where it stands, else the table is appended.

    Raises
    ------
    CodeSearchError
        The file is not valid TOML (checked where the standard library can read it).
    """
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    _check_toml(path, text)
    table = _toml_table(f"{key}.{SERVER_NAME}", entry)
    header = table.split("\n", 1)[0]
    # TOML's lines end at \n only: splitlines() would also cut inside a string value at a
    # U+2028 or a form feed, and a piece starting with "[" would pass for a table.
    pieces = text.split("\n")
    lines = [line + "\n" for line in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
    start = next((i for i, line in enumerate(lines) if line.strip() == header), None)
    if start is None:
        kept = text.rstrip("\n")
        new = (kept + "\n\n" if kept else "") + table
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
        if "".join(lines[start:end]).strip() == table.strip():
            return False
        new = "".join(lines[:start]) + table + ("\n" + "".join(lines[end:]) if end < len(lines) else "")
    _check_toml(path, new)
    _write_atomic(path, new)
    return True


def _check_toml(path: Path, text: str) -> None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: written unchecked
        return
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CodeSearchError(
            f"cannot merge into {path}: not valid TOML after the merge ({exc}) "
            "(fix the file, or add the table printed by 'codesearch agents codex' by hand)"
        ) from None


def agents(
    clients: Annotated[
        list[Client] | None,
        typer.Argument(
            help="Which clients (default: all five).",
            show_default=False,
            metavar="CLIENT",
        ),
    ] = None,
    path: Annotated[
        Path, typer.Option("--path", "-p", help="The project folder, where project config files go.")
    ] = Path("."),
    write: Annotated[
        bool,
        typer.Option(
            "--write", help="Write or merge the config files instead of printing them (Codex: $CODEX_HOME/config.toml)."
        ),
    ] = False,
) -> None:
    """Set up coding agents and editors (Claude Code, Cursor, Codex, VS Code, Zed) to use
    codesearch over MCP, and print a snippet for AGENTS.md / CLAUDE.md."""
    project = path.expanduser()
    if not project.is_dir():
        raise CodeSearchError(f"path {str(path)!r} is not a folder (pass the project folder with --path)")
    command = _command()
    for client in clients or list(Client):
        config = CLIENTS[client]
        target = _path_for(client, project)
        entry = config.entry(command)
        if write:
            if config.fmt == "toml":
                changed = merge_toml(target, config.key, entry)
            else:
                changed = merge_json(target, config.key, entry, client=client.value)
            typer.echo(f"{config.title}: {'wrote' if changed else 'already set up in'} {target}", err=True)
        else:
            typer.echo(f"# {config.title}: {target}")
            typer.echo(_render(client, entry))
    typer.echo("# For AGENTS.md or CLAUDE.md:")
    typer.echo(AGENTS_SNIPPET, nl=False)


EPILOG = "Example: codesearch agents claude-code cursor --write   (prints all five set-ups without --write)"


def register(app: typer.Typer) -> None:
    """Add the ``agents`` command to ``app``."""
    app.command("agents", epilog=EPILOG)(agents)
