"""``codesearch daemon start | status | stop | logs``: the per-user daemon, by hand.

The CLI starts the daemon by itself when a command needs a model (`codesearch.cli.lean`);
these commands show what it serves and stop it. They speak to the daemon of the runtime
folder (`codesearch.server.runtime_dir`), ``$CODESEARCH_RUNTIME_DIR`` first.
"""

from __future__ import annotations

import http.client
import json
from collections import deque
from typing import Annotated

import typer

from codesearch.errors import ServerError

daemon_app = typer.Typer(
    rich_markup_mode=None,
    help="The per-user daemon that keeps models loaded for every CLI call and agent session.",
    epilog="Example: codesearch daemon status",
    no_args_is_help=True,
)


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.0f} MiB"


@daemon_app.command("status", epilog="Example: codesearch daemon status --json")
def status(json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False) -> None:
    """Which repositories the daemon serves, its models, memory and the run state of each root."""
    from codesearch.server import daemon_client
    from codesearch.server.runtime_dir import daemon_dir

    folder = daemon_dir()
    others = [{"version": o.version, "pid": o.pid, "folder": str(path)} for path, o in daemon_client.others()]
    info = daemon_client.find_any()
    if info is None:
        if json_out:
            typer.echo(json.dumps({"running": False, "runtime_dir": str(folder), "others": others}))
        else:
            typer.echo(f"no codesearch daemon runs for this version (folder {folder})")
            _say_others(others)
        return
    if not daemon_client.compatible(info):
        raise ServerError(f"the daemon (pid {info.pid}) is codesearch {info.version}, protocol {info.protocol}; "
                          "this is another version (run 'codesearch daemon stop'; the next command starts a new one)")
    try:
        daemon_client.probe(info)
        code, doc = daemon_client.call(info, "GET", "/daemon/info", timeout=10.0)
    except daemon_client.DaemonError:
        raise
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise ServerError(f"the daemon (pid {info.pid}) did not answer: {exc} "
                          "(see 'codesearch daemon logs'; 'codesearch daemon stop' ends it)") from None
    if code != 200:
        raise ServerError(f"the daemon (pid {info.pid}) answered {code}: {doc.get('detail', '')} "
                          "(see 'codesearch daemon logs')")
    if json_out:
        typer.echo(json.dumps({"running": True, "runtime_dir": str(folder), "others": others, **doc}, indent=2))
        return
    from codesearch.pathnames import escape_controls

    typer.echo(f"codesearch daemon {doc['version']} (pid {doc['pid']}) at {info.url}, up {doc['uptime_s']:.0f}s, "
               f"idle {doc['idle_s']:.0f}s of {doc['idle_timeout_s']:.0f}s, memory {_mib(doc.get('rss_bytes'))}")
    models = doc.get("models") or []
    typer.echo("models: " + (", ".join(f"{escape_controls(m['name'])} ({_mib(m.get('heap_bytes'))})" for m in models)
                             if models else "none loaded"))
    roots = doc.get("roots") or []
    typer.echo(f"roots: {len(roots)}" + ("" if roots else " (none yet)"))
    for r in roots:
        typer.echo(f"  {escape_controls(r['root'])}: {escape_controls(root_line(r))}")
    sessions = doc.get("sessions") or []
    if sessions:
        typer.echo(f"agent sessions: {len(sessions)}")
    _say_others(others)


#: The unit of ``done``/``total`` in each stage's progress (see `codesearch.types.ProgressEvent`).
_UNITS = {"walk": "files", "chunk": "files", "write": "files", "sync": "indexes", "encode": "texts"}


def progress_text(progress: dict) -> str:
    """A run's progress for people, as the index progress shows it:
    ``encode 77/200 texts, 1,234 files, 5,678 chunks, 2,552 tok/s``."""
    stage, done, total = progress.get("stage", "?"), int(progress.get("done") or 0), int(progress.get("total") or 0)
    unit = _UNITS.get(stage, "")
    parts = [f"{stage} {done:,}/{total:,} {unit}".rstrip() if total else f"{stage} {done:,} {unit}".rstrip()]
    for key in ("files", "chunks"):
        if progress.get(key):
            parts.append(f"{int(progress[key]):,} {key}")
    message = str(progress.get("message") or "")
    if message.startswith("ray "):
        parts.append(message)
    elif progress.get("tokens_per_s"):
        parts.append(f"{float(progress['tokens_per_s']):,.0f} tok/s")
    return ", ".join(parts)


def root_line(root: dict) -> str:
    """One served root for people: its run state, runs, watcher, memory, last error."""
    state = root["state"]
    if root.get("progress") and state != "idle":
        state += f" ({progress_text(root['progress'])})"
    runs = root.get("runs", 0)
    bits = [state, f"{runs} run{'' if runs == 1 else 's'}", "watching" if root.get("watching") else "not watching"]
    memory = root.get("memory") or {}
    heap, mapped = memory.get("heap_bytes"), memory.get("mapped_bytes")
    if heap is not None or mapped is not None:
        total = (heap or 0) + (mapped or 0)
        bits.append(f"memory {_mib(total)} (heap {_mib(heap)}, mapped index files {_mib(mapped)})")
    line = ", ".join(bits)
    if root.get("last_error"):
        line += f"; last error: {root['last_error']}"
    return line


def _say_others(others: list[dict], *, err: bool = False) -> None:
    """A line per daemon of another codesearch version (this one's commands leave it alone)."""
    for other in others:
        typer.echo(f"also running: the daemon of codesearch {other['version']} (pid {other['pid']}, "
                   f"{other['folder']}); that version's 'codesearch daemon stop' stops it", err=err)


@daemon_app.command("stop", epilog="Example: codesearch daemon stop")
def stop() -> None:
    """Stop the daemon (it finishes what it writes first)."""
    from codesearch.server import daemon_client

    info = daemon_client.stop()
    if info is None:
        typer.echo("no codesearch daemon was running (of this version)", err=True)
    else:
        typer.echo(f"stopped the codesearch daemon (pid {info.pid})", err=True)
    _say_others([{"version": o.version, "pid": o.pid, "folder": str(path)} for path, o in daemon_client.others()],
                err=True)


@daemon_app.command("start", epilog="Example: codesearch daemon start --idle-timeout 1h")
def start(
    idle_timeout: Annotated[
        str | None,
        typer.Option("--idle-timeout", help="Exit after this long without work: 1200, 90s, 20m, 1h; 0 never "
                     "(default: CODESEARCH_DAEMON_IDLE, else 20m)."),
    ] = None,
) -> None:
    """Start the daemon now (commands start it by themselves when they need a model)."""
    from codesearch.server import daemon_client

    idle = None
    if idle_timeout is not None:
        try:
            idle = daemon_client.parse_seconds(idle_timeout)
        except ValueError:
            raise typer.BadParameter(f"{idle_timeout!r} is not a time (use 1200, 90s, 20m or 1h)") from None
    running = daemon_client.find()
    if running is not None:
        typer.echo(f"the codesearch daemon runs already (pid {running.pid})", err=True)
        return
    daemon_client.ensure(start=True, say=lambda line: typer.echo(line, err=True), idle_s=idle)


@daemon_app.command("logs", epilog="Example: codesearch daemon logs -n 20")
def logs(
    lines: Annotated[int, typer.Option("--lines", "-n", min=1, help="How many of the last lines.")] = 50,
) -> None:
    """The last lines of the daemon's log (model loads, roots added, runs, errors)."""
    from codesearch.server.runtime_dir import LOG_NAME, daemon_dir

    path = daemon_dir() / LOG_NAME
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            tail = deque(fh, maxlen=lines)
    except FileNotFoundError:
        typer.echo(f"no daemon log yet ({path})", err=True)
        return
    typer.echo("".join(tail), nl=False)


def register(app: typer.Typer) -> None:
    """Add the ``daemon`` command group to ``app``."""
    app.add_typer(daemon_app, name="daemon")
