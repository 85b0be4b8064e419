"""``git ls-files`` run beside the caller: the listing a walk starts from, and a no-op check
compares (`codesearch.indexing.walk`).

Light on purpose (no numpy, no store): the command line starts the listing of the root it
searches before it imports what a search needs (`prefetch`), so git's pass over the tree
(0.5 s on a 114k-file monorepo, most of a no-op check) runs while this process imports and
reads its store, not after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

__all__ = ["GIT_CHANGES", "GIT_ENTRIES", "GIT_LS", "Listing", "drop", "index_stat", "prefetch", "take"]

GIT_LS = ("ls-files", "-co", "--exclude-standard", "-z")
#: git's full comparison of a file's stat with its index entry, whatever the repository's
#: config says (ctime and inode compared, no file system monitor trusted in its place).
_FULL_STAT = ("-c", "core.trustctime=true", "-c", "core.checkStat=default", "-c", "core.fsmonitor=false")
#: The tracked files whose stat differs from git's index (git's own stat cache): one
#: ``lstat`` a tracked file, in C (0.09 s for 114k files on a Xeon); submodules' files are
#: not its to vouch for (no ``git status`` run in each).
GIT_CHANGES = (*_FULL_STAT, "diff-files", "--ignore-submodules=all", "--name-only", "-z")
#: git's index entries with the stat each records (`codesearch.indexing.gitstat`).
GIT_ENTRIES = (*_FULL_STAT, "ls-files", "-s", "-v", "--debug", "-z")


def git_env() -> dict[str, str]:
    # A caller running inside a git hook has GIT_DIR set; it would point git at the wrong repo.
    return {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}


def index_stat(folder: str | os.PathLike[str]) -> tuple[int, int, int, int] | None:
    """(size, mtime_ns, ctime_ns, inode) of ``folder/.git/index``, None where there is
    none: git writes its index whole and renames it into place, so the same stat is the
    same index."""
    try:
        st = os.lstat(os.path.join(folder, ".git", "index"))
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


class Listing:
    """``git ls-files -co --exclude-standard -z`` (or the git command ``args``) in a
    folder, started now, its output read on a thread of its own: git blocks once the pipe
    is full (64 KiB of an 11 MB listing), and would only run while the caller waits for it.

    ``git_index``: `index_stat` of the folder just before git started (what git read is
    that index if the stat is the same after).
    """

    def __init__(self, folder: str | os.PathLike[str], args: tuple[str, ...] = GIT_LS) -> None:
        self.started = time.monotonic()
        self.git_index = index_stat(folder)
        self._out: bytes | None = None
        self._proc: subprocess.Popen | None = None
        git = shutil.which("git")
        if git is not None:
            try:
                self._proc = subprocess.Popen([git, "-C", os.fspath(folder), *args], stdout=subprocess.PIPE,
                                              stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=git_env())
            except (OSError, subprocess.SubprocessError):
                self._proc = None
        self._reader = threading.Thread(target=self._read, name="codesearch-git-listing", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            out, _ = proc.communicate(timeout=300)
        except (OSError, ValueError, subprocess.SubprocessError):
            proc.kill()
            proc.wait()
            return
        self._out = out if proc.returncode == 0 else None

    def output(self) -> bytes | None:
        """What git printed, or None when it failed (no git, outside a work tree)."""
        self._reader.join()
        return self._out

    def stop(self) -> None:
        """End git now if it still runs (a caller that no longer needs the listing)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        self._reader.join()


_prefetched: dict[tuple[str, tuple[str, ...]], Listing] = {}
_lock = threading.Lock()
#: A prefetched listing older than this is not used (a long-lived caller whose check stopped
#: before it took its listing must not compare an old one later).
FRESH_S = 5.0


def prefetch(folder: str | os.PathLike[str], args: tuple[str, ...] = GIT_LS) -> None:
    """Start the listing of ``folder`` (a git work tree) for a `take` soon after, in this
    process: a command about to check that folder's index."""
    real = os.path.realpath(folder)
    if not os.path.exists(os.path.join(real, ".git")):
        return
    with _lock:
        if (real, args) not in _prefetched:
            _prefetched[real, args] = Listing(real, args)


def take(folder: str | os.PathLike[str], args: tuple[str, ...] = GIT_LS) -> Listing:
    """The listing `prefetch` started for ``folder`` (once), else one started now."""
    with _lock:
        found = _prefetched.pop((os.path.realpath(folder), args), None)
    if found is not None and time.monotonic() - found.started <= FRESH_S:
        return found
    if found is not None:
        found.stop()
    return Listing(folder, args)


def drop(folder: str | os.PathLike[str], args: tuple[str, ...]) -> None:
    """End the listing `prefetch` started for ``folder``, if any: a check that found it
    need not read it."""
    with _lock:
        found = _prefetched.pop((os.path.realpath(folder), args), None)
    if found is not None:
        found.stop()
