"""The per-user daemon process: ``python -m codesearch.server.daemon --runtime-dir DIR``.

Started by the CLI (`daemon_client.ensure`) when a command needs a model and none runs, or by
``codesearch daemon start``. One per user and codesearch version: it holds ``daemon.lock`` in
its version's sub-folder of the runtime folder (`runtime_dir.daemon_dir`) for its whole
life, so a second one started by hand exits at once (status 3), while another version's
runs beside it. It works in that folder, not its starter's. It listens on a
free loopback port, writes ``daemon.json`` (0600) with the port and a fresh token, and
exits on ``POST /daemon/stop``, SIGTERM, or after ``--idle-timeout`` seconds in which no
request came, no index run went and no agent session was attached. Its log (stdout and
stderr) is ``daemon.log`` beside it (``codesearch daemon logs``).
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import secrets
import sys
import threading
import time
from pathlib import Path

from codesearch import __version__
from codesearch.server.daemon_client import DEFAULT_IDLE_S, parse_seconds
from codesearch.server.runtime_dir import (
    DAEMON_LOCK,
    PROTOCOL,
    DaemonInfo,
    daemon_dir,
    ensure_runtime_dir,
    open_private,
    remove_info,
    write_info,
)
from codesearch.workers import trim_heap

log = logging.getLogger("codesearch.daemon")

HOST = "127.0.0.1"
EXIT_LOCKED = 3  # another daemon holds the lock


def _hold_lock(folder: Path) -> int | None:
    """Take ``daemon.lock`` for the life of the process; None when another daemon has it."""
    fd = open_private(folder / DAEMON_LOCK)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        print(f"codesearch daemon: another daemon (pid {holder or '?'}) runs for this user; exiting",
              file=sys.stderr, flush=True)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


#: Quiet seconds after which the daemon hands its freed heap back to the system (once per
#: quiet spell): a query or an index run frees most of what it allocated, but glibc keeps
#: the pages, and eight agent sessions' memory is mostly the daemon's.
TRIM_AFTER_S = 2.0


#: Give freed heap pages back to the system (glibc's ``malloc_trim``; nothing elsewhere).
#: Why: after a burst of queries or an index run, tens of MiB of freed memory stay resident
#: in glibc's arenas; the daemon lives for hours, so it returns them when it goes quiet.
_trim_heap = trim_heap


def _watch_idle(server, registry, idle_timeout_s: float) -> None:
    """Stop the server once it has been idle for ``idle_timeout_s`` (0: never); trim the
    heap once per quiet spell of `TRIM_AFTER_S`."""
    tick = max(0.2, min(1.0, idle_timeout_s / 4)) if idle_timeout_s > 0 else 1.0
    trimmed_at = None
    while not server.should_exit:
        time.sleep(tick)
        if registry.busy():
            registry.last_activity = time.monotonic()
            continue
        quiet = time.monotonic() - registry.last_activity
        if quiet >= TRIM_AFTER_S and trimmed_at != registry.last_activity:
            trimmed_at = registry.last_activity
            _trim_heap()
        if idle_timeout_s > 0 and quiet >= idle_timeout_s:
            log.info("idle for %.0fs: exiting", idle_timeout_s)
            server.should_exit = True


def run(folder: Path, idle_timeout_s: float, *, watch: bool = True) -> int:
    """Serve until stopped; returns the exit status. ``folder``: the runtime folder (the
    daemon's files go to its version's sub-folder, `daemon_dir`)."""
    import uvicorn

    from codesearch.server.daemon_app import Registry, build_app
    from codesearch.server.network import bind_socket

    folder = ensure_runtime_dir(daemon_dir(ensure_runtime_dir(folder.absolute())))
    os.chdir(folder)  # started by hand: not the starter's folder either (see daemon_client._spawn)
    lock = _hold_lock(folder)
    if lock is None:
        return EXIT_LOCKED
    sock = bind_socket(HOST, 0)
    port = sock.getsockname()[1]
    token = secrets.token_urlsafe(32)
    registry = Registry(watch=watch, host=HOST)
    server: uvicorn.Server | None = None

    def stop() -> None:
        if server is not None:
            server.should_exit = True

    app = build_app(registry, token=token, idle_timeout_s=idle_timeout_s, on_stop=stop)
    config = uvicorn.Config(app, log_level="warning", access_log=False, limit_concurrency=512,
                            timeout_keep_alive=5, timeout_graceful_shutdown=1.0, lifespan="on")
    server = uvicorn.Server(config)
    info = DaemonInfo(host=HOST, port=port, pid=os.getpid(), token=token, version=__version__, protocol=PROTOCOL,
                      started_at=time.time(), idle_timeout_s=idle_timeout_s)
    threading.Thread(target=_watch_idle, args=(server, registry, idle_timeout_s), name="codesearch-idle",
                     daemon=True).start()
    try:
        write_info(folder, info)  # clients may connect now: the socket listens, its backlog holds them
        log.info("codesearch daemon %s (pid %d) listening on %s; exits after %.0fs idle", __version__, os.getpid(),
                 info.url, idle_timeout_s)
        server.run(sockets=[sock])
    finally:
        remove_info(folder, os.getpid())
        registry.close(5.0)
        sock.close()
        log.info("stopped")
        os.close(lock)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codesearch.server.daemon", description=__doc__.splitlines()[0])
    parser.add_argument("--runtime-dir", type=Path, required=True, help="The user's runtime folder.")
    parser.add_argument("--idle-timeout", default=str(DEFAULT_IDLE_S),
                        help="Exit after this long without work: seconds, or 90s, 20m, 1h (0: never).")
    parser.add_argument("--no-watch", action="store_true", help="Do not watch the served roots.")
    args = parser.parse_args(argv)
    try:
        idle = parse_seconds(args.idle_timeout)
    except ValueError:
        parser.error(f"--idle-timeout {args.idle_timeout!r} is not a time (use 1200, 90s, 20m or 1h)")
    # What a user reads in `codesearch daemon logs`: codesearch's own lines (models loaded,
    # roots served, runs, errors) and other libraries' warnings, not their start-up chatter
    # (faiss lists each CPU build it tried, with a ModuleNotFoundError for each it lacks).
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("codesearch").setLevel(logging.INFO)
    from codesearch.errors import CodeSearchError

    try:
        return run(args.runtime_dir, idle, watch=not args.no_watch)
    except CodeSearchError as exc:
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
