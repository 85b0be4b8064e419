"""The vector writer's commits (pipeline._Commits) on a real SQLite store, watched from a
second connection as a query process would: batches in quick succession share a commit of
bounded age, a slow batch commits at once, a failing batch leaves nothing, and the batches of
an open group are kept when the run ends in an error."""

from __future__ import annotations

import time

import numpy as np
import pytest

from codesearch.build import pipeline
from codesearch.store import Store


@pytest.fixture
def stores(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "COMMIT_GROUP_S", 0.3)
    path = tmp_path / "store.sqlite"
    with Store(path) as writer:
        with Store(path, readonly=True) as reader:
            yield writer, reader


def _put(store, n, start=0):
    store.put_vectors("m@0", "dense", [(f"{i:032x}", np.full(4, i, np.float32)) for i in range(start, start + n)])


def _seen(reader) -> int:
    return reader.conn.execute("SELECT count(*) FROM vectors").fetchone()[0]


def test_quick_batches_share_a_commit_and_slow_ones_commit_at_once(stores):
    writer, reader = stores
    commits = pipeline._Commits(writer)
    reported = []
    commits.on_commit = lambda: reported.append(_seen(reader))
    with commits.batch():
        _put(writer, 2)
    assert _seen(reader) == 2 and reported == [2]  # the first batch: nothing before it to group with
    with commits.batch():
        _put(writer, 2, 2)
    assert _seen(reader) == 2  # came at once: waits in a group
    time.sleep(0.35)
    with commits.batch():  # a slow batch: the group before it and itself commit
        _put(writer, 2, 4)
    assert _seen(reader) == 6 and reported == [2, 6]
    deadline, key = time.monotonic() + 0.3, 100
    while time.monotonic() < deadline:  # quick batches for longer than a group may last
        with commits.batch():
            _put(writer, 1, key)
        key += 1
    assert len(reported) >= 3  # a group never outlives COMMIT_GROUP_S while batches come
    commits.commit()
    assert commits.group is None


def test_a_failing_batch_leaves_nothing_and_the_group_before_it_is_kept(stores):
    writer, reader = stores
    commits = pipeline._Commits(writer)
    with commits.batch():
        _put(writer, 1)
    with commits.batch():
        _put(writer, 2, 1)
    with pytest.raises(RuntimeError), commits.batch():
        _put(writer, 5, 10)
        raise RuntimeError("disk full")
    assert _seen(reader) == 1  # the group is still open
    commits.commit(report=False)  # what a run that fails does
    assert _seen(reader) == 3
    assert sorted(writer.get_vectors("m@0", "dense", [f"{i:032x}" for i in range(20)])) == [
        f"{i:032x}" for i in range(3)
    ]
