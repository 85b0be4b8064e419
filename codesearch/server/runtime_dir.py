"""The per-user runtime folder of the daemon and the files in it: where the daemon listens
(``daemon.json``, with its token), its log, and the locks that make it one per user.

The folder is ``$CODESEARCH_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/codesearch``, else
``~/.cache/codesearch/run``; it is made mode 0700 and every file in it 0600. Each codesearch
version's daemon has a sub-folder of its own there (`daemon_dir`), holding its files. Why the token
may be written here when ``serve``'s per-repository ``server.json`` must not hold one: this
folder is the user's own (checked: owned by this uid, no access for group or others),
while an index folder is readable by whoever can read the repository. A folder or file
that fails the check is not believed: the client treats it as no daemon, and the start
path says how to fix it.

Only the standard library: the CLI's lean query path reads this before any other import.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections import namedtuple
from pathlib import Path

from codesearch.errors import ServerError

RUNTIME_ENV = "CODESEARCH_RUNTIME_DIR"
INFO_NAME = "daemon.json"
LOG_NAME = "daemon.log"
#: Held (``flock``) by the running daemon for its whole life: a second one cannot start.
DAEMON_LOCK = "daemon.lock"
#: Held by a client while it starts a daemon: racing clients start one between them.
START_LOCK = "start.lock"
#: The daemon's HTTP protocol, bumped whenever a route or a document changes shape; a
#: client never speaks to a daemon of another protocol or package version.
PROTOCOL = 1


def daemon_dir(base: Path | None = None, *, version: str | None = None, protocol: int = PROTOCOL) -> Path:
    """The folder of one codesearch version's daemon inside the runtime folder ``base``:
    ``<version>-p<protocol>``. Why one per version: two installed versions (a project's venv
    and a global one) would otherwise each find the other's daemon, stop it as of another
    version and start their own, taking turns for ever; in folders of their own both run.
    """
    if version is None:
        from codesearch import __version__ as version
    base = runtime_dir() if base is None else base
    return base / (re.sub(r"[^A-Za-z0-9.+_-]", "_", str(version)) + f"-p{protocol}")


class RuntimeDirError(ServerError):
    """The runtime folder is not this user's alone (another owner, or open to others)."""


def runtime_dir(environ: dict[str, str] | None = None) -> Path:
    """The runtime folder to use (not created): see the module docstring for the order."""
    env = os.environ if environ is None else environ
    if env.get(RUNTIME_ENV):
        return Path(env[RUNTIME_ENV]).expanduser().absolute()
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "codesearch"
    return Path.home() / ".cache" / "codesearch" / "run"


def private(path: Path, *, folder: bool) -> bool:
    """Whether ``path`` is this user's alone: owned by this uid, no group/other access, and
    (not a symlink) of the expected kind."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind = stat.S_ISDIR if folder else stat.S_ISREG
    return kind(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def ensure_runtime_dir(path: Path | None = None) -> Path:
    """Create the runtime folder (0700) or check the one there; return it.

    A folder of ours with a lax mode is tightened (``chmod 0700``).

    Raises
    ------
    RuntimeDirError
        The folder belongs to another user, is a symlink or not a folder.
    """
    folder = runtime_dir() if path is None else path
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        owner = "a symlink or not a folder" if not stat.S_ISDIR(st.st_mode) else f"owned by uid {st.st_uid}"
        raise RuntimeDirError(
            f"the daemon's runtime folder {str(folder)!r} is {owner}, not yours alone "
            f"(set {RUNTIME_ENV} to a folder of your own, or pass --no-daemon)"
        )
    if st.st_mode & 0o077:
        os.chmod(folder, 0o700)
    return folder


class DaemonInfo(namedtuple("DaemonInfo", "host port pid token version protocol started_at idle_timeout_s")):
    """What ``daemon.json`` says: where the daemon listens and how to prove who we are.

    A named tuple, not a frozen dataclass as elsewhere: every agent session's relay process
    and every warm query read it, and `dataclasses` (with `inspect`, `ast`, `dis`) would be
    the biggest import of that thin client (~8 ms and ~2 MiB per process).

    Attributes
    ----------
    host, port, pid:
        The loopback address and the daemon's process.
    token:
        Every request carries it (``Authorization: Bearer``); random per daemon start.
    version, protocol:
        The package version and `PROTOCOL` of the daemon; a client of another one restarts it.
    started_at:
        Unix time the daemon began to listen.
    idle_timeout_s:
        Seconds without a request (and without an attached agent session) before it exits.
    """

    __slots__ = ()
    host: str
    port: int
    pid: int
    token: str
    version: str
    protocol: int
    started_at: float
    idle_timeout_s: float

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def to_dict(self) -> dict:
        return dict(self._asdict())


def info_path(folder: Path) -> Path:
    return folder / INFO_NAME


def write_info(folder: Path, info: DaemonInfo) -> Path:
    """Write ``daemon.json`` atomically, 0600 from its creation (``O_EXCL`` temp name)."""
    path = info_path(folder)
    tmp = folder / f".{INFO_NAME}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(info.to_dict(), fh)
    os.replace(tmp, path)
    return path


def read_info(folder: Path) -> DaemonInfo | None:
    """``daemon.json`` when the folder and the file are this user's alone and it parses;
    else None (never raises: a bad file only costs the daemon, never the command)."""
    path = info_path(folder)
    if not private(folder, folder=True) or not private(path, folder=False):
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return DaemonInfo(
            host=str(raw["host"]), port=int(raw["port"]), pid=int(raw["pid"]), token=str(raw["token"]),
            version=str(raw["version"]), protocol=int(raw["protocol"]),
            started_at=float(raw.get("started_at", time.time())),
            idle_timeout_s=float(raw.get("idle_timeout_s", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_info(folder: Path, pid: int) -> None:
    """Remove ``daemon.json`` if it still names ``pid`` (a newer daemon's file stays)."""
    path = info_path(folder)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if int(raw.get("pid", -1)) != pid:
            return
        path.unlink()
    except (OSError, ValueError, TypeError):
        pass


def open_private(path: Path, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """Open (creating 0600) a file of the runtime folder; a lock or the log."""
    fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o600)
    if os.fstat(fd).st_mode & 0o077:
        os.fchmod(fd, 0o600)
    return fd
