"""The SQLite store: schema, records, vectors cache, migrations, corruption, the writer lock."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import numpy as np
import pytest

from codesearch.errors import IndexCorruptError, IndexLockedError
from codesearch.store import IndexLock, Store, StoredChunk
from codesearch.store import schema as store_mod
from codesearch.store.vectors import encode_array
from codesearch.types import Chunk


@dataclass(frozen=True)
class FakeChunk:
    """Just the Chunk fields the store reads (the real Chunk lives in chunking.py)."""

    start_line: int
    end_line: int
    start_byte: int
    end_byte: int
    language: str = "python"
    symbol: str | None = "f"
    kind: str = "function"
    scope: str | None = None
    header: str = "a.py > def f"
    text: str = "def f(): pass"


def _file(store, path="a.py", **kw):
    args = dict(hash="h-" + path, size=10, mtime_ns=1, language="python", n_lines=3) | kw
    return store.upsert_file(path, **args)


def test_fresh_store_is_at_latest_schema():
    s = Store(":memory:")
    assert s.schema_version == store_mod.SCHEMA_VERSION >= 1
    assert s.generation == 0
    assert s.file_paths() == {}


def test_chunk_records_keep_the_order_of_ids():
    s = Store(":memory:")
    with s.transaction():
        fa, fb = _file(s, "a.py"), _file(s, "b.py")
        ids = [
            s.insert_chunk(fa, FakeChunk(1, 2, 0, 10, symbol="f"), "t1"),
            s.insert_chunk(fb, FakeChunk(3, 9, 11, 90, symbol="g", header="b.py > def g"), "t2"),
            s.insert_chunk(fa, FakeChunk(4, 5, 20, 30, symbol=None, kind="block"), "t3"),
        ]
    recs = s.chunk_records([ids[2], ids[0], 999, ids[1]])
    assert [r.id for r in recs] == [ids[2], ids[0], ids[1]]
    assert recs[2] == StoredChunk(ids[1], fb, "t2", Chunk("b.py", 3, 9, 11, 90, "python", "g", "function", None,
                                                        "def f(): pass", "b.py > def g"))
    assert recs[0].to_dict()["symbol"] is None
    assert [r.id for r in s.iter_chunk_records()] == sorted(ids)
    assert s.file_chunk_ids(fa) == [ids[0], ids[2]]
    assert s.file_paths() == {fa: "a.py", fb: "b.py"}


def test_chunk_meta_matches_the_records_without_text():
    s = Store(":memory:")
    with s.transaction():
        fa, fb = _file(s, "a.py"), _file(s, "src/b.py")
        s.insert_chunk(fb, FakeChunk(3, 9, 11, 90, symbol="g", language="go"), "t2")
        s.insert_chunk(fa, FakeChunk(4, 5, 20, 30, symbol=None, kind="block"), "t3")
    meta = list(s.iter_chunk_meta())
    assert meta == [(r.id, r.file_id, r.chunk.path, r.chunk.start_line, r.chunk.end_line, r.chunk.language,
                     r.chunk.symbol, r.chunk.kind, r.chunk.scope) for r in s.iter_chunk_records()]
    assert meta[0][2:7] == ("src/b.py", 3, 9, "go", "g") and meta[1][6] is None and meta[1][7] == "block"


def test_upsert_keeps_the_file_id_and_delete_cascades_to_chunks():
    s = Store(":memory:")
    fid = _file(s)
    s.insert_chunk(fid, FakeChunk(1, 1, 0, 5), "t")
    assert _file(s, hash="new") == fid
    assert s.files()["a.py"].hash == "new"
    s.delete_files([fid])
    assert s.count("files") == 0 and s.count("chunks") == 0


def test_failed_transaction_rolls_back_everything():
    s = Store(":memory:")
    with pytest.raises(RuntimeError), s.transaction():
        _file(s, "a.py")
        s.set_meta("generation", 5)
        raise RuntimeError("boom")
    assert s.file_paths() == {} and s.generation == 0


def test_nested_transaction_rolls_back_only_the_inner_part():
    s = Store(":memory:")
    with s.transaction():
        _file(s, "a.py")
        with pytest.raises(KeyError), s.transaction():
            _file(s, "b.py")
            raise KeyError
    assert list(s.files()) == ["a.py"]


@pytest.mark.parametrize("shape", [(8,), (1, 8), (5, 8)])
def test_vectors_round_trip_as_float16(shape):
    s = Store(":memory:")
    rng = np.random.default_rng(0)
    v = rng.standard_normal(shape).astype(np.float32)
    s.put_vectors("m@1", "colbert", [("t1", v)])
    got = s.get_vectors("m@1", "colbert", ["t1", "absent"])
    assert list(got) == ["t1"]
    np.testing.assert_allclose(got["t1"], v.reshape(-1, 8), rtol=1e-3, atol=1e-3)
    assert got["t1"].dtype == np.float32
    assert s.cached_hashes("m@1", "colbert") == {"t1"}
    assert s.cached_hashes("other", "colbert") == set()


def test_vectors_for_joins_chunks_and_files_through_the_recorded_model():
    s = Store(":memory:")
    s.set_model("dense", "tiny", "tiny@abc", 4)
    fid = _file(s, hash="filehash")
    c1 = s.insert_chunk(fid, FakeChunk(1, 1, 0, 5), "same")
    c2 = s.insert_chunk(fid, FakeChunk(2, 2, 6, 9), "same")  # identical text: one cached vector
    c3 = s.insert_chunk(fid, FakeChunk(3, 3, 10, 15), "uncached")
    s.put_vectors("tiny@abc", "dense", [("same", np.ones(4))])
    s.put_vectors("tiny@abc", "file", [("filehash", np.full(4, 2.0))])
    s.put_vectors("other@x", "dense", [("uncached", np.ones(4))])  # wrong model: ignored
    ids, arrays = s.vectors_for([c3, c2, c1], "dense")
    assert ids.tolist() == [c2, c1] and all(a.shape == (1, 4) for a in arrays)
    fids, farr = s.vectors_for([fid], "file")
    assert fids.tolist() == [fid] and farr[0][0, 0] == 2.0
    assert s.vectors_for([c1], "colbert")[0].size == 0  # no colbert model recorded
    assert s.count_with_vectors("dense") == 2
    batches = list(s.iter_vectors("dense", batch=1))
    assert [b[0].tolist() for b in batches] == [[c1], [c2]]


def test_prune_drops_unreferenced_and_foreign_model_vectors():
    s = Store(":memory:")
    s.set_model("dense", "tiny", "tiny@abc", 4)
    fid = _file(s, hash="fh")
    s.insert_chunk(fid, FakeChunk(1, 1, 0, 5), "used")
    s.put_vectors("tiny@abc", "dense", [("used", np.ones(4)), ("stale1", np.ones(4)), ("stale2", np.ones(4))])
    s.put_vectors("gone@1", "dense", [("used", np.ones(4))])
    assert s.prune_vectors(keep_unreferenced=5) == 1  # only the foreign model's
    assert s.prune_vectors(keep_unreferenced=1) == 2
    assert s.cached_hashes("tiny@abc", "dense") == {"used"}


def test_on_disk_store_uses_wal_and_readers_see_commits(tmp_path):
    path = tmp_path / "store.sqlite"
    w = Store(path)
    assert w.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    r = Store(path, readonly=True)
    with w.transaction():
        _file(w, "a.py")
        # A reader during an open write transaction sees the last committed state, unblocked.
        assert r.file_paths() == {}
    assert list(r.file_paths().values()) == ["a.py"]
    w.close(), r.close()


def test_migrations_run_from_version_zero_and_keep_data(tmp_path, monkeypatch):
    path = tmp_path / "store.sqlite"
    sqlite3.connect(path).close()  # an empty database: user_version 0
    s = Store(path)
    assert s.schema_version == len(store_mod.MIGRATIONS)
    _file(s, "kept.py")
    s.close()
    # A later release appends a migration: it runs on open, in one transaction, data kept.
    monkeypatch.setattr(
        store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS, "ALTER TABLE files ADD COLUMN owner TEXT;"]
    )
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", len(store_mod.MIGRATIONS))
    s = Store(path)
    assert s.schema_version == store_mod.SCHEMA_VERSION
    assert list(s.file_paths().values()) == ["kept.py"]
    assert s.conn.execute("SELECT owner FROM files").fetchone() == (None,)
    s.close()


def _old_store(path, version, vectors):
    """A store as codesearch of schema ``version`` wrote it: its migrations, blobs in rows."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode = WAL")
    for script in store_mod.MIGRATIONS[:version]:
        con.executescript(script)
    con.execute(f"PRAGMA user_version = {version}")
    for h, v in vectors.items():
        n, dim, blob = encode_array(v)
        con.execute("INSERT INTO vectors(model, kind, text_hash, dim, n, data) VALUES (?, ?, ?, ?, ?, ?)",
                    ("m@1", "colbert", h, dim, n, blob))
    con.close()


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_vectors_cache_is_read_as_is_and_upgraded_on_write(tmp_path, version):
    """Schema 2 stores the vectors cache by rowid (WITHOUT ROWID kept each blob in a b-tree
    ordered by a random hash: ~4x slower writes); schema 3 writes multi-vector arrays to
    segment files. A reader reads an older file as it is (a search right after upgrading
    codesearch); a writer migrates it, every vector kept where it is, and new arrays go to
    segments beside the old rows."""
    path = tmp_path / "store.sqlite"
    rng = np.random.default_rng(0)
    vectors = {f"h{i}": rng.standard_normal((i + 1, 8)).astype(np.float32) for i in range(5)}
    _old_store(path, version, vectors)
    with Store(path, readonly=True) as reader:  # no migration: a reader cannot write
        assert reader.schema_version == version
        got = reader.get_vectors("m@1", "colbert", list(vectors))
        for h, v in vectors.items():
            np.testing.assert_array_equal(got[h], v.astype(np.float16).astype(np.float32))
    with Store(path) as writer:
        assert writer.schema_version == store_mod.SCHEMA_VERSION == 3
        got = writer.get_vectors("m@1", "colbert", list(vectors))
        for h, v in vectors.items():
            np.testing.assert_array_equal(got[h], v.astype(np.float16).astype(np.float32))
        with writer.transaction():  # the key is still unique: a second write replaces
            writer.put_vectors("m@1", "colbert", [("h0", np.ones((2, 8), np.float32))])
        assert writer.count("vectors") == 5 and writer.get_vectors("m@1", "colbert", ["h0"])["h0"].shape == (2, 8)
        assert writer.conn.execute("SELECT count(*) FROM vectors WHERE seg IS NOT NULL").fetchone()[0] == 1
    sql = sqlite3.connect(path).execute("SELECT sql FROM sqlite_master WHERE name = 'vectors'").fetchone()[0]
    assert "WITHOUT ROWID" not in sql and "UNIQUE" in sql


def test_newer_schema_asks_to_upgrade(tmp_path):
    path = tmp_path / "store.sqlite"
    Store(path).close()
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {store_mod.SCHEMA_VERSION + 1}")
    con.close()
    with pytest.raises(IndexCorruptError, match="upgrade codesearch or run 'codesearch index --rebuild'"):
        Store(path)


def test_not_a_database_is_corrupt(tmp_path):
    path = tmp_path / "store.sqlite"
    path.write_bytes(b"this is not sqlite at all, just some bytes" * 100)
    with pytest.raises(IndexCorruptError, match=r"store\.sqlite.*codesearch index --rebuild"):
        Store(path)


def test_truncated_store_is_corrupt(tmp_path):
    path = tmp_path / "store.sqlite"
    s = Store(path)
    with s.transaction():
        for i in range(300):
            fid = _file(s, f"f{i}.py")
            s.insert_chunk(fid, FakeChunk(1, 1, 0, 5, text="x" * 500), f"t{i}")
    s.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    s.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(IndexCorruptError, match="codesearch index --rebuild"):
        s = Store(path)
        list(s.iter_chunk_records())


def test_second_writer_gets_a_clear_lock_error(tmp_path):
    with IndexLock(tmp_path):
        with pytest.raises(IndexLockedError, match=r"pid \d+.*run again"):
            IndexLock(tmp_path).acquire()
    # Released: the next writer gets it.
    with IndexLock(tmp_path) as lock:
        assert lock.held


def test_docstring_examples_run():
    import doctest

    assert doctest.testmod(store_mod).failed == 0


def test_writer_active_reads_the_holder_without_taking_the_lock(tmp_path):
    assert not IndexLock.writer_active(tmp_path)
    with IndexLock(tmp_path):
        assert IndexLock.writer_active(tmp_path)
    assert not IndexLock.writer_active(tmp_path)
    with IndexLock(tmp_path).acquire(role="reader"):
        assert not IndexLock.writer_active(tmp_path)
    # A holder killed with -9 leaves its line behind; a pid that no longer runs is no writer.
    (tmp_path / "lock").write_text("999999999 writer\n")
    assert not IndexLock.writer_active(tmp_path)


def test_a_writer_waits_for_a_reader_holding_the_lock_but_not_for_a_writer(tmp_path):
    import threading

    reader = IndexLock(tmp_path).acquire(role="reader")
    threading.Timer(0.3, reader.release).start()
    with IndexLock(tmp_path).acquire(wait_for_readers=10):
        with pytest.raises(IndexLockedError):
            IndexLock(tmp_path).acquire(wait_for_readers=10)


def test_the_float16_cast_is_numpys_bit_for_bit_with_torch_loaded(monkeypatch):
    """encode_array/decode_array cast with torch when the process has it (5-8x faster than
    numpy's): the bytes on disk and the arrays read back must not depend on that."""
    import sys

    from codesearch.store.sqlite import decode_array, encode_array

    pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    scales = [rng.standard_normal(4096).astype(np.float32) * s for s in (1e-9, 1e-6, 1e-3, 1, 1e3, 6e4, 1e6)]
    edges = np.array(
        [np.inf, -np.inf, 65504, 65519.99, 65520, -0.0, 0.0, 5.96e-8, 2.98e-8, 2.99e-8, 6.1e-5], np.float32
    )
    bits = rng.integers(0, 2**32, 8192, dtype=np.uint32).view(np.float32)
    x = np.concatenate([*scales, edges, bits[~np.isnan(bits)]])
    x = x[: len(x) // 8 * 8].reshape(-1, 8)
    with np.errstate(over="ignore"):
        fast = encode_array(x)
        blob = encode_array(np.float16(x))[2]  # float16 input is stored as it is
    monkeypatch.delitem(sys.modules, "torch")
    with np.errstate(over="ignore"):
        slow = encode_array(x)
    assert fast == slow and blob == slow[2]
    back = decode_array(*slow)
    monkeypatch.undo()
    np.testing.assert_array_equal(decode_array(*slow), back)
    assert back.dtype == np.float32
    nans = bits[np.isnan(bits)][:8].reshape(1, -1)  # a NaN stays one (its payload may differ)
    assert nans.size and np.isnan(decode_array(*encode_array(nans))).all()


@pytest.mark.parametrize("kind", ["colbert", "dense", "file"])
def test_vectors_by_id_look_each_id_up_by_key(tmp_path, kind):
    """`vectors_for` with a long id list (a publication's, a delta's): SQLite without
    statistics chose to walk every vector of the model and probe the ids, quadratic on a
    large index (11 s per 900 ids at 60k vectors). The plan must start from the ids."""
    s = Store(tmp_path / "store.sqlite")
    with s.transaction():
        s.set_model("colbert", "m", "m@1", 4)
        s.set_model("dense", "d", "d@1", 4)
        fid = _file(s)
        for i in range(3):
            s.insert_chunk(fid, FakeChunk(1, 1, 0, 1, text=f"t{i}"), f"h{i}")
    statements: list[str] = []
    s.conn.set_trace_callback(statements.append)
    s.vectors_for(list(range(1, 901)), kind)
    s.conn.set_trace_callback(None)
    (sql,) = [q for q in statements if "JOIN vectors" in q]
    plan = [row[3] for row in s.conn.execute("EXPLAIN QUERY PLAN " + sql)]
    assert plan[0].startswith("SEARCH t USING INTEGER PRIMARY KEY"), plan
    assert "text_hash=?" in plan[1], plan
    s.close()
