"""The user's vector cache on its own (`codesearch.store.cache`): the round trip, the LRU cap,
damage read as a miss, a damaged or newer database, the size syntax."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from codesearch.store.cache import CACHE_FILE, UserCache, cache_folder, parse_size


def _vec(seed: int, n: int = 1, dim: int = 8) -> np.ndarray:
    a = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return a[0] if n == 1 else a


def test_vectors_round_trip_and_a_key_is_written_once(tmp_path):
    with UserCache.open(tmp_path / "c") as cache:
        assert cache.put_vectors("m@1", "dense", [("a", _vec(1)), ("b", _vec(2))]) == 2
        assert cache.put_vectors("m@1", "colbert", [("a", _vec(3, n=40))]) == 1
        # The same key again (another process may have just put it) keeps the first array.
        assert cache.put_vectors("m@1", "dense", [("a", _vec(9)), ("c", _vec(4))]) == 1
        got = cache.get_vectors("m@1", "dense", ["a", "b", "c", "zz"])
        assert sorted(got) == ["a", "b", "c"]
        np.testing.assert_allclose(got["a"][0], _vec(1), atol=1e-2)
        multi = cache.get_vectors("m@1", "colbert", ["a"])["a"]
        assert multi.shape == (40, 8)
        np.testing.assert_allclose(multi, _vec(3, n=40), atol=1e-2)
        # The key is the model too: another model's vector of the same text is not this one.
        assert cache.get_vectors("m@2", "dense", ["a"]) == {}
        assert cache.get_vectors("m@1", "file", ["a"]) == {}
        assert cache.status().entries == {"m@1": {"dense": 3, "colbert": 1}}


def test_past_the_cap_the_least_recently_used_go(tmp_path):
    limit = 2 * 2**20
    with UserCache.open(tmp_path / "c", limit=limit) as cache:
        for i in range(10):
            cache.put_vectors("m@1", "colbert", [(f"old{i}", _vec(i, n=300, dim=128))])
        # Uses recorded long ago (the clock moves an hour at a time): these go first ...
        cache.conn.execute("UPDATE vectors SET used = used - 86400 WHERE text_hash LIKE 'old%'")
        cache.conn.execute("UPDATE vectors SET used = used - 3 * 86400 WHERE text_hash = 'old0'")
        # ... unless read again since, which records the use.
        assert "old0" in cache.get_vectors("m@1", "colbert", ["old0"])
        added = 0
        while cache.count() == 10 + added:  # until the first eviction
            cache.put_vectors("m@1", "colbert", [(f"new{added}", _vec(100 + added, n=300, dim=128))])
            added += 1
            assert added < 100, "never evicted"
        left = {r[0] for r in cache.conn.execute("SELECT text_hash FROM vectors")}
        gone = {f"old{i}" for i in range(10)} | {f"new{i}" for i in range(added)}
        gone -= left
        assert gone and gone <= {f"old{i}" for i in range(1, 10)}  # the oldest uses went, old0 stayed
        assert cache.disk_bytes() <= limit
        for i in range(added, added + 30):  # and it stays under the cap from then on
            cache.put_vectors("m@1", "colbert", [(f"new{i}", _vec(100 + i, n=300, dim=128))])
            assert cache.disk_bytes() <= limit
        left = {r[0] for r in cache.conn.execute("SELECT text_hash FROM vectors")}
        assert f"new{added + 29}" in left
        # What is left reads back whole (compaction moved arrays, their CRCs still hold).
        assert cache.drop_damaged_vectors() == 0
        assert len(cache.get_vectors("m@1", "colbert", sorted(left))) == len(left)


def test_prune_to_a_size_and_prune_everything(tmp_path):
    with UserCache.open(tmp_path / "c") as cache:
        for i in range(20):
            cache.put_vectors("m@1", "colbert", [(f"k{i}", _vec(i, n=1000, dim=128))])  # 256 KB each
        evicted, freed = cache.prune(2 * 2**20)
        assert 0 < evicted < 20 and freed > 0
        assert cache.count() == 20 - evicted
        assert cache.disk_bytes() <= 2 * 2**20
        assert sorted(cache.get_vectors("m@1", "colbert", [f"k{i}" for i in range(20)])) == sorted(
            f"k{i}" for i in range(evicted, 20)
        )
        assert cache.prune(everything=True)[0] == 20 - evicted
        assert cache.count() == 0
        assert sum(cache.segments.sizes().values()) == 0


def test_damaged_segment_bytes_read_as_a_miss_and_the_row_goes(tmp_path):
    with UserCache.open(tmp_path / "c") as cache:
        cache.put_vectors("m@1", "colbert", [("a", _vec(1, n=50)), ("b", _vec(2, n=50))])
        seg, off = cache.conn.execute("SELECT seg, off FROM vectors WHERE text_hash = 'a'").fetchone()
        path = cache.segments.path(seg)
        data = bytearray(path.read_bytes())
        data[off + 10] ^= 0xFF
        path.write_bytes(bytes(data))
    with UserCache.open(tmp_path / "c") as cache:
        assert sorted(cache.get_vectors("m@1", "colbert", ["a", "b"])) == ["b"]
        assert cache.count() == 1  # the next put of "a" writes it again
        assert cache.put_vectors("m@1", "colbert", [("a", _vec(1, n=50))]) == 1


def test_an_unreadable_database_is_set_aside_and_made_again(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / CACHE_FILE).write_bytes(b"this is not a database" * 100)
    (folder / "notes.txt").write_text("the user's own file")  # CODESEARCH_CACHE_DIR may be any folder
    with UserCache.open(folder) as cache:
        assert cache.count() == 0
        cache.put_vectors("m@1", "dense", [("a", _vec(1))])
    with UserCache.open(folder) as cache:
        assert cache.count() == 1
    assert (folder / "notes.txt").read_text() == "the user's own file"


def test_a_newer_cache_is_left_alone(tmp_path):
    folder = tmp_path / "c"
    with UserCache.open(folder) as cache:
        cache.put_vectors("m@1", "dense", [("a", _vec(1))])
    with sqlite3.connect(folder / CACHE_FILE) as conn:
        conn.execute("PRAGMA user_version = 99")
    assert UserCache.open(folder) is None  # not used ...
    with sqlite3.connect(folder / CACHE_FILE) as conn:  # ... and not set aside
        assert conn.execute("SELECT count(*) FROM vectors").fetchone()[0] == 1


def test_the_cache_is_off_at_size_zero_and_where_the_environment_says(tmp_path, monkeypatch):
    monkeypatch.setenv("CODESEARCH_CACHE_DIR", str(tmp_path / "here"))
    assert cache_folder() == tmp_path / "here"
    monkeypatch.setenv("CODESEARCH_CACHE_SIZE", "0")
    assert UserCache.open() is None
    assert not (tmp_path / "here").exists()
    monkeypatch.delenv("CODESEARCH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder() == tmp_path / "xdg" / "codesearch" / "vectors"


def test_a_file_where_the_folder_should_be_means_no_cache(tmp_path):
    (tmp_path / "f").write_text("x")
    assert UserCache.open(tmp_path / "f" / "c") is None


@pytest.mark.parametrize(
    ("text", "size"), [("0", 0), ("1000", 1000), ("500M", 500 * 2**20), ("4G", 4 * 2**30), ("2GiB", 2 * 2**30),
                       ("1.5k", 1536), ("3MB", 3 * 10**6)]
)
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "big", "-1G", "4X"])
def test_not_sizes(text):
    with pytest.raises(ValueError, match=r"size|negative"):
        parse_size(text)


OPENER = """
import sys, time
import numpy as np
from codesearch.store.cache import UserCache
folder, name, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
time.sleep(max(0.0, start - time.time()))  # all open the new folder at the same moment
cache = UserCache.open(folder)
assert cache is not None, "no cache"
cache.put_vectors("m@1", "colbert", [(name, np.full((30, 8), float(len(name)), np.float32))])
cache.close()
"""


def test_processes_making_a_new_cache_at_once_keep_every_vector(tmp_path):
    import subprocess
    import sys
    import time

    start = time.time() + 2.0
    procs = [
        subprocess.Popen([sys.executable, "-c", OPENER, str(tmp_path / "c"), f"key{i}", str(start)],
                         stderr=subprocess.PIPE, text=True)
        for i in range(8)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    with UserCache.open(tmp_path / "c") as cache:
        assert sorted(cache.get_vectors("m@1", "colbert", [f"key{i}" for i in range(8)])) == [
            f"key{i}" for i in range(8)
        ]


def test_a_cache_of_dense_vectors_past_its_cap_keeps_the_recent_ones(tmp_path):
    # Dense vectors live inside the database file: counted as the database's overhead, they
    # made the eviction target 0, and once past the cap every write emptied the cache.
    limit = 3 * 2**20
    with UserCache.open(tmp_path / "c", limit=limit) as cache:
        counts = []
        for batch in range(12):
            cache.put_vectors("m@1", "dense", [(f"b{batch}-{i}", _vec(batch * 1000 + i, n=1, dim=768))
                                               for i in range(200)])
            counts.append(cache.count())
        assert cache.disk_bytes() <= limit
        assert min(counts[1:]) >= 200, counts  # never emptied: at least the batch just written
        newest = [f"b11-{i}" for i in range(200)]
        assert len(cache.get_vectors("m@1", "dense", newest)) == 200


def _codec_arrays(k: int = 4, dim: int = 8):
    rng = np.random.default_rng(k)
    return rng.standard_normal((k, dim)).astype(np.float32), np.linspace(-1, 1, 15, dtype=np.float32), \
        np.linspace(-1, 1, 16, dtype=np.float32)


def test_codes_and_codecs_round_trip_and_damage_is_a_miss(tmp_path):
    with UserCache.open(tmp_path / "c") as cache:
        assert cache.put_codec("m@1", "4:fp", 4, _codec_arrays(), 0.25)
        assert not cache.put_codec("m@1", "4:fp", 4, _codec_arrays(), 0.5)  # kept once
        nbits, centroids, cutoffs, weights, error = cache.get_codec("m@1", "4:fp")
        assert (nbits, error) == (4, 0.25) and centroids.shape == (4, 8) and len(cutoffs) == 15 and len(weights) == 16
        assert cache.get_codec("m@2", "4:fp") is None
        assert cache.put_codes("m@1", "4:fp", [("a", 3, 1.5, b"x" * 30), ("b", 2, 0.5, b"y" * 20)]) == 2
        assert cache.put_codes("m@1", "4:fp", [("a", 3, 9.0, b"z" * 30)]) == 0  # the same array's codes: kept
        assert cache.code_coverage("m@1", ["a", "b", "c"]) == {"4:fp": (2, 5)}
        assert cache.get_codes("m@1", "4:fp", ["a", "c"]) == {"a": (3, 1.5, b"x" * 30)}
        assert cache.status().coded_texts == 2
        cache.conn.execute("UPDATE codes SET data = zeroblob(30) WHERE array_hash = 'a'")
        cache.conn.execute("UPDATE codecs SET crc = crc + 1")
        assert cache.get_codes("m@1", "4:fp", ["a", "b"]) == {"b": (2, 0.5, b"y" * 20)}  # damaged: a miss
        assert cache.get_codec("m@1", "4:fp") is None
        assert cache.code_coverage("m@1", ["a", "b"]) == {"4:fp": (1, 2)}  # and their rows went


def test_codes_count_toward_the_cap_and_go_with_their_codec(tmp_path):
    with UserCache.open(tmp_path / "c") as cache:
        cache.put_codec("m@1", "4:fp", 4, _codec_arrays(), 0.25)
        cache.put_codes("m@1", "4:fp", [(f"k{i}", 100, 1.0, bytes(2600)) for i in range(50)])
        assert cache.live_bytes() >= 50 * 2600
        cache.conn.execute("UPDATE codecs SET used = 0")  # the codec is the oldest: evicted first
        with cache.transaction():
            assert cache._evict_to(cache.live_bytes() - 1) == 51
        assert cache.status().coded_texts == 0  # its codes are of no use without it
        cache.put_codec("m@1", "4:fp", 4, _codec_arrays(), 0.25)
        cache.put_codes("m@1", "4:fp", [("k", 1, 0.0, bytes(26))])
        assert cache.prune(everything=True)[0] == 2 and cache.live_bytes() == 0


def test_older_builds_keep_using_a_cache_with_codes(tmp_path):
    """The code tables come with no schema version: a build that knows only the numbered
    migrations (and refuses a newer version whole) opens the cache as before."""
    from codesearch.store import cache as cache_module

    with UserCache.open(tmp_path / "c") as cache:
        cache.put_vectors("m@1", "dense", [("a", _vec(1))])
        cache.put_codes("m@1", "4:fp", [("k", 1, 0.0, bytes(26))])
        assert cache.schema_version == len(cache_module._MIGRATIONS) == 2
