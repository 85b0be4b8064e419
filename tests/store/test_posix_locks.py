"""A second open of a store file in one process keeps the first connection's locks.

SQLite locks its files with POSIX advisory locks, and POSIX drops every lock a process
holds on a file when the process closes *any* descriptor of it. A connection of a WAL
store holds a shared lock on the database file for its whole life: it is what tells
another process's closing connection that it is not the last one, and what stops it from
taking the file out of WAL mode (and deleting the WAL, with the commits in it) under us.
These tests hold a real connection in this process, open the same file again the way the
code does (a read-only `Store` of a publication, the user cache opened twice), then ask
a real second process for the exclusive lock.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from codesearch.errors import IndexCorruptError
from codesearch.store import Store
from codesearch.store.cache import CACHE_FILE, UserCache

_LEAVE_WAL = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
try:
    print(conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0])
except sqlite3.OperationalError as exc:
    print(exc)
conn.close()
"""

_META = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
print(sorted(k for (k,) in conn.execute("SELECT key FROM meta")))
conn.close()
"""


def _other_process(script: str, path: Path) -> str:
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_read_only_open_keeps_the_writers_lock(tmp_path):
    path = tmp_path / "store.sqlite"
    with Store(path) as writer:
        writer.set_meta("a", "1")
        with Store(path, readonly=True) as reader:  # as a background publication opens it
            assert reader.get_meta("a") == "1"
        # Before the fix the reader's header check closed a descriptor of the file, which
        # dropped the writer's shared lock: this switched the store to a rollback journal
        # and deleted the WAL under the writer.
        assert _other_process(_LEAVE_WAL, path) == "database is locked"
        with writer.transaction():
            writer.set_meta("b", "2")
            with Store(path, readonly=True):  # during a write transaction, too
                pass
            assert _other_process(_LEAVE_WAL, path) == "database is locked"
        writer.set_meta("c", "3")
        # Every commit of the writer reaches the file another process reads.
        assert _other_process(_META, path) == "['a', 'b', 'c']"


def test_a_second_writable_open_keeps_the_first_ones_lock(tmp_path):
    path = tmp_path / "store.sqlite"
    first = Store(path)
    try:
        first.set_meta("a", "1")
        Store(path).close()
        assert _other_process(_LEAVE_WAL, path) == "database is locked"
    finally:
        first.close()
    # With every connection closed the lock is free again (nothing is left registered).
    assert _other_process(_LEAVE_WAL, path) == "delete"


def test_the_user_cache_opened_twice_keeps_its_lock(tmp_path):
    first = UserCache.open(tmp_path)
    assert first is not None
    try:
        second = UserCache.open(tmp_path)
        assert second is not None
        second.close()
        assert _other_process(_LEAVE_WAL, tmp_path / CACHE_FILE) == "database is locked"
    finally:
        first.close()


def test_opens_from_threads_keep_each_others_locks(tmp_path):
    path = tmp_path / "store.sqlite"
    Store(path).close()
    stores: list[Store] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            stores.append(Store(path, readonly=True))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors
        stores[0].get_meta("a")
        assert _other_process(_LEAVE_WAL, path) == "database is locked"
    finally:
        for s in stores:
            s.close()


def test_a_damaged_file_is_still_refused_while_another_store_is_open(tmp_path):
    path = tmp_path / "store.sqlite"
    other = tmp_path / "other.sqlite"
    other.write_bytes(b"not a database at all" * 10)
    with Store(path), pytest.raises(IndexCorruptError, match="not an SQLite database"):
        Store(other, readonly=True)


def test_a_store_nobody_closed_no_longer_counts_once_collected(tmp_path):
    path = tmp_path / "store.sqlite"
    store = Store(path)
    store.set_meta("a", "1")
    del store
    gc.collect()
    path.write_bytes(b"not a database at all" * 10)
    # The header check runs again (SQLite's own error would say "file is not a database").
    with pytest.raises(IndexCorruptError, match="not an SQLite database"):
        Store(path, readonly=True)
