"""The vector writer's commits (commit.Commits) on a real SQLite store, watched from a
second connection as a query process would: batches in quick succession share a commit that
takes batches for a bounded time, a slow batch commits at once, a waiting group commits once
old enough, a failing batch leaves nothing, and the batches of an open group are kept when the
run ends in an error. Time is a fake clock: no test here depends on the machine's speed."""

from __future__ import annotations

import numpy as np
import pytest

from codesearch.indexing import commit
from codesearch.store import Store


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def stores(tmp_path, monkeypatch):
    monkeypatch.setattr(commit, "COMMIT_GROUP_S", 1.0)
    path = tmp_path / "store.sqlite"
    with Store(path) as writer, Store(path, readonly=True) as reader:
        yield writer, reader


def _put(store, n, start=0):
    store.put_vectors("m@0", "dense", [(f"{i:032x}", np.full(4, i, np.float32)) for i in range(start, start + n)])


def _one_committed_then_one_waiting(writer, second: int):
    """A batch of 1 vector (committed alone), then one of ``second`` 0.1 s later (waiting in
    a group)."""
    clock = Clock()
    commits = commit.Commits(writer, clock)
    with commits.batch():
        _put(writer, 1)
    clock.now += 0.1
    with commits.batch():
        _put(writer, second, 1)
    return commits, clock


def _seen(reader) -> int:
    return reader.conn.execute("SELECT count(*) FROM vectors").fetchone()[0]


def test_quick_batches_share_a_commit_and_slow_ones_commit_at_once(stores):
    writer, reader = stores
    clock = Clock()
    commits = commit.Commits(writer, clock)
    reported = []
    commits.on_commit = lambda: reported.append(_seen(reader))
    with commits.batch():
        _put(writer, 2)
    assert _seen(reader) == 2 and reported == [2]  # the first batch: nothing before it to group with
    clock.now += 0.1
    with commits.batch():
        _put(writer, 2, 2)
    assert _seen(reader) == 2 and commits.group is not None  # came quickly: waits in a group
    clock.now += 1.5
    with commits.batch():  # a slow batch: the group before it and itself commit
        _put(writer, 2, 4)
    assert _seen(reader) == 6 and reported == [2, 6]
    for key in range(100, 111):  # quick batches for longer than a group takes them
        clock.now += 0.25
        with commits.batch():
            _put(writer, 1, key)
    assert reported[2:] == [11, 16]  # 5 batches a group: the first, then 4 x 0.25 s until 1 s old
    assert _seen(reader) == 16 and commits.group is not None
    commits.commit()
    assert _seen(reader) == 17 and reported[-1] == 17 and commits.group is None
    commits.commit()  # nothing open: nothing to say
    assert len(reported) == 5


def test_a_waiting_group_commits_once_old_enough(stores):
    """What a cluster's encoder calls while it waits for the workers (commit_if_older)."""
    writer, reader = stores
    commits, clock = _one_committed_then_one_waiting(writer, second=1)
    clock.now += 0.5
    commits.commit_if_older()
    assert _seen(reader) == 1  # 0.5 s old: keeps waiting for quick batches
    clock.now += 0.5
    commits.commit_if_older()
    assert _seen(reader) == 2 and commits.group is None


def test_a_failing_batch_leaves_nothing_and_the_group_before_it_is_kept(stores):
    writer, reader = stores
    commits, clock = _one_committed_then_one_waiting(writer, second=2)
    clock.now += 0.1
    with pytest.raises(RuntimeError), commits.batch():
        _put(writer, 5, 10)
        raise RuntimeError("disk full")
    assert _seen(reader) == 1  # the group is still open
    commits.commit(report=False)  # what a run that fails does
    assert _seen(reader) == 3
    assert sorted(writer.get_vectors("m@0", "dense", [f"{i:032x}" for i in range(20)])) == [
        f"{i:032x}" for i in range(3)
    ]
