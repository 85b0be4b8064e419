"""The vectors cache's segment files: ColBERT arrays written once, beside the store, with
crash ordering, corruption checks, compaction and readers that outlive a compaction."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from codesearch.errors import IndexCorruptError
from codesearch.store import Store
from codesearch.store import segments as seg_mod

DIM = 8


def _arrays(seed: int, count: int, start: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"h{i}": rng.standard_normal((3 + i % 5, DIM)).astype(np.float32) for i in range(start, start + count)}


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def _store(tmp_path, **kw) -> Store:
    s = Store(tmp_path / "store.sqlite", **kw)
    if not kw.get("readonly"):
        with s.transaction():
            s.set_model("colbert", "m", "m@1", DIM)
            s.set_model("dense", "d", "d@1", DIM)
    return s


def _put(s: Store, arrays: dict[str, np.ndarray], kind: str = "colbert") -> None:
    with s.transaction():
        s.put_vectors("m@1" if kind == "colbert" else "d@1", kind, arrays.items())


def _folder(tmp_path):
    return tmp_path / "store.sqlite.vectors"


def _segment_bytes(tmp_path) -> int:
    return sum(p.stat().st_size for p in _folder(tmp_path).iterdir())


def test_colbert_arrays_go_to_a_segment_once_and_read_back_exactly(tmp_path):
    arrays = _arrays(0, 20)
    dense = {f"d{i}": v[0] for i, v in enumerate(_arrays(1, 5).values())}
    with _store(tmp_path) as s:
        _put(s, arrays)
        _put(s, dense, kind="dense")
        rows = s.conn.execute("SELECT kind, length(data), seg FROM vectors").fetchall()
        assert {(k, n == 0, seg is not None) for k, n, seg in rows} == {
            ("colbert", True, True),
            ("dense", False, False),
        }
        got = s.get_vectors("m@1", "colbert", list(arrays))
        for h, v in arrays.items():
            np.testing.assert_array_equal(got[h], _f16(v))
        np.testing.assert_array_equal(s.get_vectors("d@1", "dense", ["d0"])["d0"], _f16(dense["d0"])[None])
    # The segment holds each array's float16 bytes once, back to back.
    assert _segment_bytes(tmp_path) == sum(v.size * 2 for v in arrays.values())
    with Store(tmp_path / "store.sqlite", readonly=True) as reader:  # another process's view
        got = reader.get_vectors("m@1", "colbert", list(arrays))
        assert all(np.array_equal(got[h], _f16(v)) for h, v in arrays.items())


def test_the_segment_reaches_the_disk_before_the_commit(tmp_path, monkeypatch):
    """A commit that survives a power loss must not point at bytes that did not: the segment
    is fdatasync'ed before SQLite's COMMIT (the real calls, recorded in order)."""
    events: list[str] = []
    real_sync = os.fdatasync

    def recording_sync(fd):
        events.append("fdatasync")
        return real_sync(fd)

    with _store(tmp_path) as s:
        monkeypatch.setattr(seg_mod.os, "fdatasync", recording_sync)
        s.conn.set_trace_callback(lambda sql: events.append(sql.split()[0].upper()))
        _put(s, _arrays(0, 3))
        s.conn.set_trace_callback(None)
    assert events.index("fdatasync") < events.index("COMMIT")
    assert events.count("fdatasync") == 1  # one per commit, not per array


def test_a_rolled_back_batch_leaves_dead_bytes_that_nothing_reads(tmp_path):
    with _store(tmp_path) as s:
        _put(s, _arrays(0, 4))
        before = _segment_bytes(tmp_path)
        with pytest.raises(RuntimeError), s.transaction():
            s.put_vectors("m@1", "colbert", _arrays(1, 4, start=100).items())
            raise RuntimeError("the batch failed")
        assert _segment_bytes(tmp_path) > before  # written, never referenced
        assert s.count("vectors") == 4
        later = _arrays(2, 3, start=200)
        _put(s, later)  # appended past the dead bytes, not over them
        got = s.get_vectors("m@1", "colbert", [*later, "h0"])
        assert all(np.array_equal(got[h], _f16(v)) for h, v in later.items())
        np.testing.assert_array_equal(got["h0"], _f16(_arrays(0, 4)["h0"]))


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from codesearch.store import Store
    s = Store(sys.argv[1])
    rng = np.random.default_rng(7)
    with s.transaction():
        s.put_vectors("m@1", "colbert", [(f"k{i}", rng.standard_normal((5, 8)).astype(np.float32)) for i in range(6)])
    with s.transaction():
        s.put_vectors("m@1", "colbert", [(f"x{i}", rng.standard_normal((5, 8)).astype(np.float32)) for i in range(12)])
        os.kill(os.getpid(), signal.SIGKILL)  # appended, not committed
    """
)


def test_a_writer_killed_between_append_and_commit_keeps_every_committed_array(tmp_path):
    _store(tmp_path).close()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "store.sqlite")], capture_output=True, check=False
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    with Store(tmp_path / "store.sqlite") as s:
        assert sorted(s.cached_hashes("m@1", "colbert")) == [f"k{i}" for i in range(6)]
        assert _segment_bytes(tmp_path) == 18 * 5 * DIM * 2  # the killed batch's bytes are dead space
        rng = np.random.default_rng(7)
        first = {f"k{i}": rng.standard_normal((5, 8)).astype(np.float32) for i in range(6)}
        got = s.get_vectors("m@1", "colbert", list(first))
        assert all(np.array_equal(got[h], _f16(v)) for h, v in first.items())
        _put(s, {"after": np.ones((2, DIM), np.float32)})
        assert s.get_vectors("m@1", "colbert", ["after"])["after"].shape == (2, DIM)
        s.prune_vectors(keep_unreferenced=100)  # more than half the segment is dead: compacted
        assert _segment_bytes(tmp_path) == (6 * 5 + 2) * DIM * 2


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "delete the folder"])
def test_damaged_segments_are_a_one_line_error_and_a_rebuild_drops_just_those(tmp_path, damage):
    arrays = _arrays(0, 10)
    with _store(tmp_path) as s:
        _put(s, arrays)
        off = s.conn.execute("SELECT off FROM vectors WHERE text_hash = 'h4'").fetchone()[0]
    path = next(_folder(tmp_path).iterdir())
    if damage == "flip a byte":
        with open(path, "r+b") as fh:
            fh.seek(off + 3)
            byte = fh.read(1)
            fh.seek(off + 3)
            fh.write(bytes([byte[0] ^ 0x40]))
    elif damage == "truncate":
        os.truncate(path, off + 5)
    else:
        path.unlink()
        _folder(tmp_path).rmdir()
    with Store(tmp_path / "store.sqlite", readonly=True) as reader, pytest.raises(IndexCorruptError) as err:
        reader.get_vectors("m@1", "colbert", list(arrays))
    message = str(err.value)
    assert "\n" not in message and "vectors segment 000001.f16" in message
    assert "run 'codesearch index --rebuild'" in message
    with Store(tmp_path / "store.sqlite") as s:
        lost = {"flip a byte": {"h4"}, "truncate": {f"h{i}" for i in range(4, 10)}, "delete the folder": set(arrays)}
        assert s.drop_damaged_vectors() == len(lost[damage])
        assert s.cached_hashes("m@1", "colbert") == set(arrays) - lost[damage]
        kept = s.get_vectors("m@1", "colbert", list(arrays))  # the rest reads as before
        assert all(np.array_equal(kept[h], _f16(arrays[h])) for h in kept)


def test_compaction_reclaims_dead_space_and_never_reuses_a_number(tmp_path):
    first, second = _arrays(0, 30), _arrays(1, 10, start=100)
    with _store(tmp_path) as s:
        _put(s, first)
        _put(s, second)
        full = _segment_bytes(tmp_path)
        with s.transaction():  # most of the segment's arrays lose their last reference
            s.conn.execute(f"DELETE FROM vectors WHERE text_hash IN ({','.join('?' * 30)})", list(first))
        freed = s.compact_segments()
        live = sum(v.size * 2 for v in second.values())
        assert freed == full - live and _segment_bytes(tmp_path) == live
        assert s.segments.numbers() == [2]  # the copies went to a new segment, the old one is gone
        got = s.get_vectors("m@1", "colbert", list(second))
        assert all(np.array_equal(got[h], _f16(v)) for h, v in second.items())
        assert s.compact_segments() == 0  # nothing dead: nothing moves
        with s.transaction():
            s.conn.execute("DELETE FROM vectors")
        s.compact_segments()
        _put(s, {"new": np.ones((2, DIM), np.float32)})
        assert s.segments.numbers() == [3]  # above every number used before


def _with_chunks(tmp_path, chunks: dict[str, np.ndarray], split: int) -> Store:
    """A store whose chunk i (id i + 1) has array ``chunks[h_i]``: the first ``split`` in
    segment 1, the rest in segment 2."""
    s = _store(tmp_path)
    with s.transaction():
        for i, h in enumerate(chunks):
            fid = s.upsert_file(f"f{i}.py", hash=f"file{i}", size=1, mtime_ns=1, language="python", n_lines=1)
            s.conn.execute(
                "INSERT INTO chunks(file_id, start_line, end_line, start_byte, end_byte, language, kind,"
                " header, text, text_hash) VALUES (?, 1, 1, 0, 1, 'python', 'function', '', '', ?)",
                (fid, h),
            )
    items = list(chunks.items())
    _put(s, dict(items[:split]))
    s.segments.rotate()
    _put(s, dict(items[split:]))
    assert s.segments.numbers() == [1, 2]
    return s


def _drop_chunks_above(s: Store, last_id: int) -> None:
    with s.transaction():
        s.conn.execute("DELETE FROM chunks WHERE id > ?", (last_id,))
        s.conn.execute("DELETE FROM files WHERE id > ?", (last_id,))


def _deleted_segments_open() -> list[str]:
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return [link for link in links if ".vectors/" in link and link.endswith("(deleted)")]


def test_a_reader_keeps_its_snapshot_while_a_compaction_unlinks_a_segment_it_had_not_read_yet(tmp_path):
    """A searcher rebuilding PLAID in memory reads every ColBERT array in one cursor while
    an index run may prune and compact: the segment its snapshot has not reached yet is
    unlinked under it, and still reads (it was opened before the snapshot began)."""
    chunks = _arrays(0, 12)
    writer = _with_chunks(tmp_path, chunks, split=4)
    reader = Store(tmp_path / "store.sqlite", readonly=True)
    try:
        batches = reader.iter_vectors("colbert", batch=4)
        first_ids, first = next(batches)  # ids 1-4: segment 1 only; the cursor's snapshot is open
        _drop_chunks_above(writer, 4)
        writer.prune_vectors()  # the 8 arrays of segment 2 lose their chunks: it is unlinked
        assert 2 not in writer.segments.numbers()
        rest = list(batches)
        got = np.concatenate([first_ids, *[ids for ids, _ in rest]])
        arrays = first + [a for _, arrs in rest for a in arrs]
        assert got.tolist() == list(range(1, 13))  # the whole old generation, read whole
        for i, a in zip(got.tolist(), arrays, strict=True):
            np.testing.assert_array_equal(a, _f16(chunks[f"h{i - 1}"]))
        # Nothing reads now: the next read closes the unlinked segment (its space comes back).
        assert reader.vectors_for([1], "colbert")[0].tolist() == [1]
        assert _deleted_segments_open() == []
    finally:
        reader.close()
        writer.close()


def test_a_pinned_reader_keeps_its_snapshot_across_a_compaction(tmp_path):
    """A pinned searcher (`Store.begin_read`) holds one snapshot for many reads."""
    chunks = _arrays(0, 8)
    writer = _with_chunks(tmp_path, chunks, split=4)
    reader = Store(tmp_path / "store.sqlite", readonly=True)
    try:
        reader.begin_read()
        gen = reader.generation  # the snapshot starts here
        _drop_chunks_above(writer, 4)
        writer.prune_vectors()
        assert 2 not in writer.segments.numbers()
        ids, arrays = reader.vectors_for(range(1, 9), "colbert")
        assert ids.tolist() == list(range(1, 9)) and reader.generation == gen
        for i, a in zip(ids.tolist(), arrays, strict=True):
            np.testing.assert_array_equal(a, _f16(chunks[f"h{i - 1}"]))
        reader.conn.execute("ROLLBACK")
        assert reader.vectors_for(range(1, 9), "colbert")[0].tolist() == [1, 2, 3, 4]
    finally:
        reader.close()
        writer.close()


def test_compaction_makes_its_commits_durable_before_it_unlinks(tmp_path, monkeypatch):
    """With synchronous=NORMAL a commit is durable once the WAL is synced; a power loss
    must never keep an unlink and lose the commit that emptied the file (the real calls,
    recorded in order)."""
    writer = _with_chunks(tmp_path, _arrays(0, 8), split=4)
    events: list[str] = []
    real_fsync, real_unlink = os.fsync, os.unlink

    def fsync(fd):
        events.append("fsync " + os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1])
        return real_fsync(fd)

    def unlink(path, *a, **kw):
        events.append("unlink " + os.fspath(path).rsplit("/", 1)[-1])
        return real_unlink(path, *a, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "unlink", unlink)
    try:
        _drop_chunks_above(writer, 4)
        writer.prune_vectors()
    finally:
        monkeypatch.undo()
        writer.close()
    assert "unlink 000002.f16" in events
    assert events.index("fsync store.sqlite-wal") < events.index("unlink 000002.f16")


def test_compaction_of_a_lower_segment_makes_no_new_file(tmp_path):
    writer = _with_chunks(tmp_path, _arrays(0, 8), split=4)
    with writer, writer.transaction():
        writer.conn.execute("DELETE FROM vectors WHERE seg = 1")
    with Store(tmp_path / "store.sqlite") as s:
        s.compact_segments()
        assert s.segments.numbers() == [2]


def test_a_store_kept_open_follows_a_segment_folder_made_anew(tmp_path):
    """The folder deleted (by hand, or a rebuild of an unreadable store) and numbers start
    again at 1: a store kept open must neither read the new 000001 through its descriptor
    of the old one nor append to the old one."""
    kept = _store(tmp_path)
    try:
        _put(kept, _arrays(0, 3))
        kept.get_vectors("m@1", "colbert", ["h0"])  # holds a descriptor of the first 000001
        for p in _folder(tmp_path).iterdir():
            p.unlink()
        _folder(tmp_path).rmdir()
        with kept.transaction():
            kept.conn.execute("DELETE FROM vectors")
        with Store(tmp_path / "store.sqlite") as other:
            _put(other, _arrays(1, 3, start=10))  # a new 000001
        got = kept.get_vectors("m@1", "colbert", ["h10"])
        np.testing.assert_array_equal(got["h10"], _f16(_arrays(1, 3, start=10)["h10"]))
        _put(kept, {"later": np.ones((2, DIM), np.float32)})
    finally:
        kept.close()
    with Store(tmp_path / "store.sqlite", readonly=True) as reader:
        assert reader.get_vectors("m@1", "colbert", ["later"])["later"].shape == (2, DIM)


def test_a_segment_that_cannot_be_read_is_a_one_line_error_and_a_rebuild_drops_it(tmp_path):
    with _store(tmp_path) as s:
        _put(s, _arrays(0, 3))
    (path,) = _folder(tmp_path).iterdir()
    path.unlink()
    path.mkdir()  # stands for an unreadable file (EISDIR here; EIO, EACCES elsewhere)
    with Store(tmp_path / "store.sqlite", readonly=True) as reader, pytest.raises(IndexCorruptError) as err:
        reader.get_vectors("m@1", "colbert", ["h0"])
    assert "\n" not in str(err.value) and "cannot be read" in str(err.value) and "--rebuild" in str(err.value)
    with Store(tmp_path / "store.sqlite") as s:
        assert s.drop_damaged_vectors() == 3 and s.count("vectors") == 0


def test_an_in_memory_store_keeps_arrays_in_rows(tmp_path):
    s = Store(":memory:")
    with s.transaction():
        s.set_model("colbert", "m", "m@1", DIM)
        s.put_vectors("m@1", "colbert", _arrays(0, 3).items())
    assert s.conn.execute("SELECT count(*) FROM vectors WHERE seg IS NULL AND length(data) > 0").fetchone()[0] == 3
    assert not list(tmp_path.iterdir())


def test_two_stores_in_one_folder_never_share_segments(tmp_path):
    a, b = Store(tmp_path / "a.sqlite"), Store(tmp_path / "b.sqlite")
    try:
        for s, seed in ((a, 0), (b, 1)):
            with s.transaction():
                s.put_vectors("m@1", "colbert", _arrays(seed, 4).items())
        for s, seed in ((a, 0), (b, 1)):
            got = s.get_vectors("m@1", "colbert", list(_arrays(seed, 4)))
            assert all(np.array_equal(got[h], _f16(v)) for h, v in _arrays(seed, 4).items())
        assert {p.name for p in tmp_path.iterdir() if p.is_dir()} == {"a.sqlite.vectors", "b.sqlite.vectors"}
    finally:
        a.close()
        b.close()


def test_schema_3_columns_exist_after_migration(tmp_path):
    with _store(tmp_path):
        pass
    cols = {r[1] for r in sqlite3.connect(tmp_path / "store.sqlite").execute("PRAGMA table_info(vectors)")}
    assert {"seg", "off", "crc"} <= cols


def test_a_store_kept_open_never_appends_to_a_segment_another_writer_compacted_away(tmp_path):
    """A long-lived process (a server) keeps its store open across index runs; a run in
    another process compacts the segment that store was appending to. The next append must
    go to a file on disk, not to the unlinked one."""
    with _store(tmp_path) as kept:
        _put(kept, _arrays(0, 6))
        with Store(tmp_path / "store.sqlite") as other:
            with other.transaction():
                other.conn.execute("DELETE FROM vectors")
            other.compact_segments()
        later = _arrays(1, 3, start=50)
        _put(kept, later)
    with Store(tmp_path / "store.sqlite", readonly=True) as reader:
        got = reader.get_vectors("m@1", "colbert", list(later))
        assert all(np.array_equal(got[h], _f16(v)) for h, v in later.items())
