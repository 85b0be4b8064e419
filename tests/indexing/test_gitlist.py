"""The git listing a command starts early (`gitlist.prefetch`) is used once, only while
fresh, and a query's refresh through it still sees what changed before the command."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from codesearch.indexing import gitlist
from codesearch.indexing import run as pipeline
from codesearch.indexing.status import staleness


def _repo(path: Path) -> Path:
    path.mkdir()
    (path / "a.py").write_text("def alpha():\n    return 1\n")
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
    return path


def test_a_prefetched_listing_is_taken_once(tmp_path):
    root = _repo(tmp_path / "r")
    gitlist.prefetch(root)
    first = gitlist.take(root)
    second = gitlist.take(root)
    assert first is not second
    assert first.output() == second.output() == b"a.py\0"


def test_an_old_prefetched_listing_is_not_used(tmp_path, monkeypatch):
    root = _repo(tmp_path / "r")
    gitlist.prefetch(root)
    gitlist.take(root).output()  # (the same folder again, below: a fresh entry)
    gitlist.prefetch(root)
    (root / "b.py").write_text("x = 1\n")
    monkeypatch.setattr(gitlist, "FRESH_S", -1.0)
    assert gitlist.take(root).output() == b"b.py\0a.py\0"  # (untracked first, as git prints)


def test_no_prefetch_outside_a_work_tree(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    gitlist.prefetch(folder)
    assert gitlist._prefetched == {}
    assert gitlist.take(folder).output() is None


@pytest.mark.parametrize("change", ["add", "edit", "remove"])
def test_a_check_through_a_prefetched_listing_sees_what_changed_before(tmp_path, change):
    root = _repo(tmp_path / "r")
    (root / "b.py").write_text("def beta():\n    return 2\n")
    pipeline.build_index(root)
    assert staleness(root).added == staleness(root).changed == []
    if change == "add":
        (root / "c.py").write_text("def gamma():\n    return 3\n")
    elif change == "edit":
        (root / "b.py").write_text("def beta():\n    return 22\n")
    else:
        (root / "b.py").unlink()
    gitlist.prefetch(root)
    got = staleness(root)
    assert gitlist._prefetched == {}  # the check took it
    assert {"add": got.added, "edit": got.changed, "remove": got.removed}[change] == [
        {"add": "c.py", "edit": "b.py", "remove": "b.py"}[change]]
