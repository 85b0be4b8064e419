"""git's own stat cache as the witness of a no-op check: where git's index records, for a
tracked file, the very stat the store records, and git still finds that file clean, the
file is the one the index holds, and no ``lstat`` of it is made in Python.

A no-op check (`codesearch.indexing.walk.unchanged_since`) otherwise stats every kept file
in Python: 113k ``lstat`` calls, 0.26 s of a 0.52 s no-op ``codesearch index`` on a
114k-file monorepo (Xeon), and the store's 113k stats read to compare them with, 0.15 s.
``git diff-files`` makes the same ``lstat`` s in C, against git's index.

The argument, for a kept file P that `record` vouches for (at the end of the index run
that wrote the stamp):

1. git's index entry E(P) holds the size and the mtime (to the nanosecond) the store
   records for P, P is a regular file at stage 0 with no assume-unchanged or
   skip-worktree bit, and ``git diff-files`` then did not list P: P's stat was E(P)'s
   after the run had read it;
2. E(P)'s mtime and ctime are in a second before the run's walk began, less a margin for
   the coarse clock file times come from (`VOUCH_MARGIN_S`): a later write of P
   (after the walk looked at P) gets a ctime, and normally an mtime, in a later second,
   which git's comparison sees even where it compares whole seconds (git built without
   ``USE_NSEC``); a write in the same second as E(P)'s is git's "racy" case, which git
   settles by reading the file;
3. at the check, git's index is the same (the same file by `gitlist.index_stat`, or the
   same entries, hash of ``git ls-files --debug``) and ``git diff-files`` prints what it
   printed then: P is not listed, so P's stat is still E(P)'s, the store's.

The files git does not vouch for (untracked, symlinks, in a nested repository, listed by
``diff-files`` at the run's end, or written too recently) are stat'ed as before: `GitVouch.own`.
At any doubt (another index, other changes) `Witness.holds` says False and the caller stats
every file, as without a vouch.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import xxhash

from codesearch.indexing import gitlist

__all__ = ["VOUCH_MARGIN_S", "GitVouch", "Witness", "prefetch", "record"]

#: A file written this close to the walk's start (or after it) is not vouched for: file
#: times come from a coarse clock, a few ms behind ``time.time()`` (seconds behind on a
#: network file system whose server's clock is off).
VOUCH_MARGIN_S = 1.0

#: One entry of ``git ls-files -s -v --debug -z``: tag, mode, stage, path, ctime, mtime,
#: size (the format of git's ``ls-files.c``, unchanged since 2008).
_ENTRY = re.compile(
    rb"(.) ([0-7]+) [0-9a-f]+ ([0-3])\t([^\0]*)\0"
    rb"  ctime: (\d+):\d+\n  mtime: (\d+):(\d+)\n  dev: \d+\tino: \d+\n  uid: \d+\tgid: \d+\n"
    rb"  size: (\d+)\tflags: [0-9a-f]+\n")
_REGULAR = (b"100644", b"100755")


@dataclass(frozen=True)
class GitVouch:
    """What a `Witness` compares, recorded with a walk stamp.

    Attributes
    ----------
    index : (int, int, int, int)
        `gitlist.index_stat` of git's index when recorded.
    entries : str
        xxh3_128 of ``git ls-files -s -v --debug -z`` then (git's entries with their stats).
    changes : str
        xxh3_128 of ``git diff-files --name-only -z`` then.
    own : dict of str to (int, int)
        Kept files git does not vouch for: path -> (size, mtime_ns) as the store records it.
    """

    index: tuple[int, int, int, int]
    entries: str
    changes: str
    own: dict[str, tuple[int, int]]

    def to_obj(self) -> dict:
        return {"index": list(self.index), "entries": self.entries, "changes": self.changes,
                "own": [[p, *st] for p, st in sorted(self.own.items())]}

    @classmethod
    def from_obj(cls, obj: object) -> GitVouch | None:
        """The vouch `to_obj` made; None for anything else (the caller stats every file)."""
        try:
            assert isinstance(obj, dict)
            size, mtime, ctime, ino = (int(x) for x in obj["index"])
            own = {str(p): (int(s), int(m)) for p, s, m in obj["own"]}
            return cls((size, mtime, ctime, ino), str(obj["entries"]), str(obj["changes"]), own)
        except (AssertionError, ValueError, TypeError, KeyError, ArithmeticError):
            return None


def _digest(raw: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(raw)


def _entries(raw: bytes) -> dict[str, tuple[int, int, int]] | None:
    """Path -> (size, mtime_ns, newest of mtime and ctime in seconds) of each entry git
    would vouch for (a regular file at stage 0, tag ``H``), from ``git ls-files -s -v
    --debug -z``; None when the output is not in that form."""
    out: dict[str, tuple[int, int, int]] = {}
    pos = 0
    for m in _ENTRY.finditer(raw):
        if m.start() != pos:
            return None
        pos = m.end()
        tag, mode, stage, path, ctime, mtime, mtime_ns, size = m.groups()
        name = path.decode("utf-8", "surrogateescape")
        if tag != b"H" or mode not in _REGULAR or stage != b"0" or name in out:
            out[name] = (-1, -1, -1)  # (none git vouches for; a path at several stages: a merge conflict)
            continue
        out[name] = (int(size), int(mtime) * 1_000_000_000 + int(mtime_ns), max(int(ctime), int(mtime)))
    return out if pos == len(raw) else None


def record(root: str | os.PathLike[str], kept: Callable[[], Iterable[tuple[str, int, int]]],
           walk_started: float) -> GitVouch | None:
    """What git vouches for at the end of an index run of ``root`` (a git work tree's top
    folder, the stamp's first listing), whose walk began at ``walk_started``
    (``time.time()``); ``kept()``: ``(path, size, mtime_ns)`` of every file the store now
    holds. None where git vouches for too little to be worth a record (fewer than half the
    files: a repository with little committed), or cannot be read."""
    root = os.fspath(root)
    if not os.path.isdir(os.path.join(root, ".git")):
        return None  # (a worktree's or submodule's .git is a file: its index is elsewhere)
    changes = gitlist.Listing(root, gitlist.GIT_CHANGES)
    entries = gitlist.Listing(root, gitlist.GIT_ENTRIES)
    try:
        files = list(kept())
        raw_changes, raw_entries = changes.output(), entries.output()
    finally:
        changes.stop()
        entries.stop()
    index = gitlist.index_stat(root)
    if raw_changes is None or raw_entries is None or index is None or not (
            changes.git_index == entries.git_index == index):
        return None
    vouched = _entries(raw_entries)
    if vouched is None:
        return None
    for name in raw_changes.split(b"\0"):
        vouched.pop(name.decode("utf-8", "surrogateescape"), None)
    # (a file's times come from a coarse clock, behind time.time(): the margin a watcher's
    # word allows too)
    before = math.floor(walk_started - VOUCH_MARGIN_S)
    own: dict[str, tuple[int, int]] = {}
    for path, size, mtime_ns in files:
        entry = vouched.get(path)
        if entry is None or entry[0] != size & 0xFFFFFFFF or entry[1] != mtime_ns or entry[2] >= before:
            own[path] = (size, mtime_ns)
    if 2 * len(own) > len(files):
        return None
    return GitVouch(index, _digest(raw_entries), _digest(raw_changes), own)


def prefetch(root: str | os.PathLike[str], vouch: GitVouch) -> None:
    """Start the git commands a `Witness` will read (`gitlist.prefetch`)."""
    gitlist.prefetch(root, gitlist.GIT_CHANGES)
    if gitlist.index_stat(root) != vouch.index:
        gitlist.prefetch(root, gitlist.GIT_ENTRIES)


class Witness:
    """git's word on the kept files `record` vouched for in ``root``, its commands taken
    (from `prefetch`) or started now; `stop` ends them."""

    def __init__(self, root: str | os.PathLike[str], vouch: GitVouch) -> None:
        self.root, self.vouch = os.fspath(root), vouch
        self.changes = gitlist.take(self.root, gitlist.GIT_CHANGES)
        # (git's entries: only where its index is not the one recorded)
        if self.changes.git_index == vouch.index:
            gitlist.drop(self.root, gitlist.GIT_ENTRIES)
            self.entries = None
        else:
            self.entries = gitlist.take(self.root, gitlist.GIT_ENTRIES)

    def holds(self) -> bool:
        """Whether git still vouches for every kept file `record` vouched for: git's index
        has the same entries and ``git diff-files`` prints what it printed then. False
        means "cannot say" (a file may have changed, or git's index did): the caller stats
        every kept file. The files in ``vouch.own`` are the caller's to stat either way."""
        changes, entries = self.changes, self.entries
        raw = changes.output()
        if raw is None or _digest(raw) != self.vouch.changes:
            return False
        if entries is not None:
            listed = entries.output()
            if listed is None or entries.git_index != changes.git_index or _digest(listed) != self.vouch.entries:
                return False
        # (git read one index throughout: not written while it ran)
        return changes.git_index is not None and gitlist.index_stat(self.root) == changes.git_index

    def stop(self) -> None:
        self.changes.stop()
        if self.entries is not None:
            self.entries.stop()
