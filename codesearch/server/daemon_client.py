"""The client side of the per-user daemon: find the live one, start one (one, however many
clients race), restart one of another version, and call it.

Only the standard library (and the stdlib-only `runtime_dir` and `discovery` helpers): the
CLI's lean query path runs this before typer, rich, numpy or torch are imported, which is
what lets a warm query cost a process start and a round trip.

Whom a client believes: ``daemon.json`` in the user's private runtime folder (see
`runtime_dir`), naming a live pid whose process owns the listening loopback socket (where
``/proc`` tells), of this package version and protocol. Anything else is a daemon that is
gone (``kill -9``: the file stays) or of another version: the first is replaced, the
second stopped and replaced, never spoken to.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from codesearch import __version__
from codesearch.errors import ServerError
from codesearch.server.discovery import listener_belongs_to, pid_alive
from codesearch.server.runtime_dir import (
    LOG_NAME,
    PROTOCOL,
    START_LOCK,
    DaemonInfo,
    daemon_dir,
    ensure_runtime_dir,
    open_private,
    private,
    read_info,
    remove_info,
    runtime_dir,
)
from codesearch.server.wire import exchange

NO_DAEMON_ENV = "CODESEARCH_NO_DAEMON"
DAEMON_ENV = "CODESEARCH_DAEMON"
IDLE_ENV = "CODESEARCH_DAEMON_IDLE"
DEFAULT_IDLE_S = 20 * 60.0
START_TIMEOUT_S = 90.0  # importing the server on 2 busy cores takes seconds, not minutes
STOP_TIMEOUT_S = 15.0
#: How long a found daemon gets to send the first byte of ``GET /health``. Its event loop
#: answers that in milliseconds even while an index run embeds (the run is in threads); a
#: stopped (``SIGSTOP``) or wedged daemon accepts connections (the kernel does) and never
#: answers, which would cost a client its whole request timeout (120 s) in silence.
PROBE_S = 3.0
STUCK = ("the codesearch daemon (pid {pid}) accepts connections but did not answer within {s:g}s "
         "('codesearch daemon stop' ends it)")
STARTED = "started the codesearch daemon (pid {pid}) to keep models loaded; `codesearch daemon stop` stops it"

OFF, USE, START = "off", "use", "start"

#: What a server (the daemon, ``codesearch serve``) imports beyond the core: the ``server`` extra.
SERVER_MODULES = ("fastapi", "uvicorn", "mcp", "watchdog")


def missing_server_module() -> str | None:
    """The first module of the ``server`` extra this Python lacks, or None (found, not imported)."""
    import importlib.util

    for name in SERVER_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):  # a finder that refuses it; a module stubbed out as None
            return name
    return None


class DaemonError(ServerError):
    """The daemon could not be started, reached or stopped (the message says why and how on)."""


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


def policy(no_daemon: bool = False, environ: dict[str, str] | None = None) -> str:
    """What a command may do with the daemon: `OFF` (never use it), `USE` (a running one, but
    start none) or `START` (start one when none runs).

    ``--no-daemon`` or ``CODESEARCH_NO_DAEMON=1``: off. ``CODESEARCH_DAEMON=1``: start, also
    under CI (``=0``: off). With ``CI`` set a daemon is used but never started (a CI job
    must not leave a process behind); anywhere else, terminal or not (agents run the CLI
    without one), one is started.
    """
    env = os.environ if environ is None else environ
    if no_daemon or _truthy(env.get(NO_DAEMON_ENV)):
        return OFF
    asked = env.get(DAEMON_ENV)
    if asked is not None and asked.strip():
        return START if _truthy(asked) else OFF
    return USE if _truthy(env.get("CI")) else START


def parse_seconds(text: str) -> float:
    """``"1200"``, ``"90s"``, ``"20m"``, ``"1h"`` -> seconds.

    Raises
    ------
    ValueError
        Anything else, or a negative time.
    """
    value = text.strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(value[-1:], None)
    number = float(value[:-1] if scale else value)
    if number < 0:
        raise ValueError(text)
    return number * (scale or 1)


def idle_timeout(environ: dict[str, str] | None = None) -> float:
    """``$CODESEARCH_DAEMON_IDLE`` (seconds, or 90s / 20m / 1h), else 20 minutes."""
    env = os.environ if environ is None else environ
    try:
        return parse_seconds(env[IDLE_ENV]) if env.get(IDLE_ENV) else DEFAULT_IDLE_S
    except ValueError:
        return DEFAULT_IDLE_S


# -- finding one ---------------------------------------------------------------------------


def _serving(info: DaemonInfo) -> bool:
    """The named process is alive and (where /proc says) owns the listening socket."""
    return pid_alive(info.pid) and listener_belongs_to(info.port, info.pid) is not False


def compatible(info: DaemonInfo) -> bool:
    return info.version == __version__ and info.protocol == PROTOCOL


def _here(folder: Path | None) -> Path:
    """This version's daemon folder in the runtime folder ``folder`` (None: the user's)."""
    return daemon_dir(runtime_dir() if folder is None else folder)


def _read(folder: Path | None) -> DaemonInfo | None:
    """This version's ``daemon.json``, believed only when the runtime folder above it is the
    user's alone too (`read_info` checks the sub-folder and the file)."""
    base = runtime_dir() if folder is None else folder
    return read_info(daemon_dir(base)) if private(base, folder=True) else None


def find(folder: Path | None = None) -> DaemonInfo | None:
    """The live daemon of this version, or None (none, gone, or another version).

    ``folder`` (here and below) is the runtime folder; each version's daemon lives in a
    sub-folder of it (`daemon_dir`)."""
    info = _read(folder)
    if info is None or not compatible(info) or not _serving(info):
        return None
    return info


def find_any(folder: Path | None = None) -> DaemonInfo | None:
    """The live daemon of this version's folder, whatever its file says its version is."""
    info = _read(folder)
    return info if info is not None and _serving(info) else None


def others(folder: Path | None = None) -> list[tuple[Path, DaemonInfo]]:
    """The live daemons of other codesearch versions in the runtime folder (each in its own
    sub-folder, or, from before versions had one, in the folder itself): ``daemon status``
    and ``stop`` name them and leave them alone."""
    base = runtime_dir() if folder is None else folder
    here = daemon_dir(base)
    try:
        candidates = [base, *sorted(p for p in base.iterdir() if p.is_dir() and p != here)]
    except OSError:
        return []
    found = []
    for candidate in candidates:
        info = read_info(candidate)
        if info is not None and _serving(info):
            found.append((candidate, info))
    return found


# -- calling it ----------------------------------------------------------------------------


def call(
    info: DaemonInfo, method: str, path: str, body: object = None, *, timeout: float = 60.0,
) -> tuple[int, dict]:
    """One request; returns (status, JSON document). Raises OSError (no connection, a
    timeout, a broken exchange) or ValueError (not JSON).

    Over a plain socket (`codesearch.server.wire`), not `http.client`: its imports cost a
    tenth of a warm query."""
    headers = {"Accept": "application/json", "Authorization": f"Bearer {info.token}"}
    data = None
    if body is not None:
        data = json.dumps(body).encode("utf-8")
        headers["Content-Type"] = "application/json"
    status, payload = exchange(info.host, info.port, method, path, body=data, headers=headers, timeout=timeout)
    doc = json.loads(payload) if payload else {}
    return status, doc if isinstance(doc, dict) else {"value": doc}


def responsive(info: DaemonInfo, timeout: float = PROBE_S) -> bool:
    """Whether the daemon answers at all: the first byte of a ``GET /health`` within
    ``timeout`` (connect included). Any answer counts; a refused connection does not."""
    import socket

    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((info.host, info.port), timeout=timeout) as sock:
            sock.sendall(f"GET /health HTTP/1.1\r\nHost: {info.host}:{info.port}\r\n"
                         "Connection: close\r\n\r\n".encode("ascii"))
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            return bool(sock.recv(1))
    except OSError:
        return False


def probe(info: DaemonInfo, timeout: float = PROBE_S) -> DaemonInfo:
    """``info`` when the daemon answers (`responsive`).

    Raises
    ------
    DaemonError
        It is alive but does not answer (stopped, wedged): the message says how to end it.
    """
    if not responsive(info, timeout):
        raise DaemonError(STUCK.format(pid=info.pid, s=timeout))
    return info


# -- starting, replacing, stopping --------------------------------------------------------


@contextlib.contextmanager
def _start_lock(folder: Path, timeout: float) -> Iterator[None]:
    """Hold ``start.lock``: of several clients starting a daemon at once, one starts it and
    the others then find it. The kernel drops the lock if its holder dies."""
    fd = open_private(folder / START_LOCK)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DaemonError(
                        f"another codesearch process has been starting the daemon for {timeout:.0f}s "
                        f"(see {folder / LOG_NAME}; or pass --no-daemon)"
                    ) from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # our own child (tests, a daemon this process started)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def retire(info: DaemonInfo, folder: Path, *, timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop a daemon without speaking to it (another version's protocol may differ): SIGTERM
    to its pid, once that pid is shown to be the listener of its port and ours; SIGKILL if
    it has not exited within ``timeout``. Its discovery file goes."""
    if listener_belongs_to(info.port, info.pid) is not False and pid_alive(info.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, signal.SIGTERM)
            os.kill(info.pid, signal.SIGCONT)  # a stopped daemon handles SIGTERM only once it runs
        if not _wait_gone(info.pid, timeout):
            with contextlib.suppress(ProcessLookupError):
                os.kill(info.pid, signal.SIGKILL)
            _wait_gone(info.pid, 5.0)
    remove_info(folder, info.pid)


#: What the daemon keeps of its starter's environment: what finds Python and the package,
#: the models (hub cache, offline switches, tokens, proxies), the threads and devices, the
#: locale, and codesearch's own settings. Not the rest: the daemon outlives the shell that
#: started it and serves every later client, so one shell's CI, editor or credentials
#: must not become every command's.
KEPT_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV",
    "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM", "SENTENCE_TRANSFORMERS_HOME", "CUDA_VISIBLE_DEVICES",
})
KEPT_PREFIXES = ("CODESEARCH_", "MALLOC_", "LC_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH_", "PYTORCH_",
                 "MKL_", "OPENBLAS_", "KMP_", "CUDA_", "XDG_")
DROPPED_ENV = frozenset({"CODESEARCH_TOKEN", "CODESEARCH_NO_DAEMON", "CODESEARCH_DAEMON"})


def daemon_environ(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a started daemon gets (see `KEPT_ENV`)."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items()
            if (k in KEPT_ENV or k.startswith(KEPT_PREFIXES)) and k not in DROPPED_ENV}


def _spawn(base: Path, folder: Path, idle_s: float) -> int:
    """Start the daemon of runtime folder ``base``; ``folder``: its version's (the log's)."""
    import subprocess

    folder = folder.absolute()
    log = open_private(folder / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "codesearch.server.daemon", "--runtime-dir", str(base.absolute()),
             "--idle-timeout", repr(idle_s)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True,
            start_new_session=True,  # not in the terminal's process group: Ctrl-C of a query leaves it
            # Not the starter's folder (it would keep it busy, e.g. an unmount, and a relative
            # path would mean it): requests carry absolute paths (`daemon_app._absolute`).
            # Two malloc arenas, not eight per core: the daemon's thread pools otherwise keep
            # ~18 MiB of arenas resident (the user's own MALLOC_ARENA_MAX wins).
            cwd=folder, env={"MALLOC_ARENA_MAX": "2", **daemon_environ()},
        )
    finally:
        os.close(log)
    _CHILDREN.append(proc)  # kept, so that the Popen is not collected (and reaped) early
    return proc.pid


_CHILDREN: list = []


def _last_log_line(folder: Path) -> str:
    try:
        lines = (folder / LOG_NAME).read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def ensure(*, start: bool, say: Callable[[str], None] | None = None, folder: Path | None = None,
           idle_s: float | None = None) -> DaemonInfo | None:
    """The live daemon; started (``start``) when none runs, once among racing clients.

    A daemon of another version is stopped and replaced only when ``start``; a stale
    discovery file (a daemon killed with -9) is replaced. ``say`` gets the one line that
    announces a start.

    Raises
    ------
    DaemonError
        A daemon could not be started (the last line of its log says why), or the one
        running does not answer (`probe`).
    RuntimeDirError
        The runtime folder is not this user's alone.
    """
    info = find(folder)
    if info is not None:
        return probe(info)
    if not start:
        return None
    missing = missing_server_module()
    if missing is not None:
        from codesearch.errors import install_line

        raise DaemonError(f"the codesearch daemon needs {missing!r}, which is not installed "
                          f"({install_line('server')}, or pass --no-daemon)")
    base = ensure_runtime_dir(runtime_dir() if folder is None else folder)
    folder = ensure_runtime_dir(daemon_dir(base))
    with _start_lock(folder, START_TIMEOUT_S):
        current = read_info(folder)
        if current is not None and _serving(current):
            if compatible(current):
                return current
            retire(current, folder)
        elif current is not None:
            remove_info(folder, current.pid)  # killed with -9: its file stayed
        pid = _spawn(base, folder, idle_timeout() if idle_s is None else idle_s)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            info = read_info(folder)
            if info is not None and info.pid == pid and _serving(info):
                break
            exited = not pid_alive(pid) or _reaped(pid)
            if exited or time.monotonic() > deadline:
                other = find(base)
                if other is not None:  # one started by hand in between (it holds the daemon lock)
                    return other
                why = _last_log_line(folder) or ("it exited" if exited else f"no answer in {START_TIMEOUT_S:.0f}s")
                raise DaemonError(f"could not start the codesearch daemon: {why} "
                                  f"(see {folder / LOG_NAME}; or pass --no-daemon)")
            time.sleep(0.02)
    if say is not None:
        say(STARTED.format(pid=info.pid))
    return info


def _reaped(pid: int) -> bool:
    for proc in _CHILDREN:
        if proc.pid == pid:
            return proc.poll() is not None
    return False


def stop(folder: Path | None = None, *, timeout: float = STOP_TIMEOUT_S) -> DaemonInfo | None:
    """Stop this version's daemon; returns what it was, None when none ran.

    It is asked (``POST /daemon/stop``: it finishes what it writes); one that does not answer,
    or whose file names another version, gets SIGTERM. Either way the call returns once the
    process is gone. Other versions' daemons (`others`) are left alone.
    """
    info = find_any(folder)
    folder = _here(folder)
    if info is None:
        stale = read_info(folder)
        if stale is not None:
            remove_info(folder, stale.pid)
        return None
    asked = False
    if compatible(info) and responsive(info):
        with contextlib.suppress(OSError, ValueError):
            status, _ = call(info, "POST", "/daemon/stop", {}, timeout=5.0)
            asked = status == 200
    if not asked or not _wait_gone(info.pid, timeout):
        retire(info, folder, timeout=timeout)
    return info
