"""The user's vector cache returns what was put in it, or a miss: never a damaged array.

Before, arrays kept in their rows (dense and file vectors) carried no checksum: 20 random
bytes flipped in ``cache.sqlite`` gave 6-59 of 1,998 dense vectors of a fresh clone's
index values no encoder made, and changed its rankings.
"""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from codesearch.errors import CodeSearchError
from codesearch.store.cache import CACHE_FILE, UserCache, entry_crc

MODEL = "model@1"
N, DIM = 400, 64


def _filled(folder) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    vectors = {f"{i:032x}": rng.standard_normal((1, DIM)).astype(np.float16).astype(np.float32) for i in range(N)}
    cache = UserCache.open(folder)
    cache.put_vectors(MODEL, "dense", vectors.items())
    cache.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    cache.close()
    return vectors


def _read(folder, keys) -> dict[str, np.ndarray]:
    """What an index run takes from the cache: an error of the cache itself (a page SQLite
    finds damaged) makes the run stop using it (`codesearch.indexing.reuse`): all misses."""
    cache = UserCache.open(folder)
    if cache is None:
        return {}
    try:
        return cache.get_vectors(MODEL, "dense", keys)
    except (CodeSearchError, sqlite3.Error, OSError):
        return {}
    finally:
        cache.close()


def test_a_flipped_byte_in_an_array_is_a_miss_and_its_row_goes(tmp_path):
    vectors = _filled(tmp_path)
    key = sorted(vectors)[17]
    blob = vectors[key].astype(np.float16).tobytes()
    path = tmp_path / CACHE_FILE
    data = bytearray(path.read_bytes())
    at = data.find(blob)
    assert at > 0
    data[at + 21] ^= 0x04
    path.write_bytes(bytes(data))
    got = _read(tmp_path, list(vectors))
    assert key not in got
    assert len(got) == N - 1 and all(np.array_equal(got[k], vectors[k]) for k in got)
    assert key not in _read(tmp_path, [key])  # the damaged row went: the next run encodes it


@pytest.mark.parametrize("seed", range(5))
def test_random_flips_anywhere_give_right_vectors_or_misses(tmp_path, seed):
    vectors = _filled(tmp_path)
    path = tmp_path / CACHE_FILE
    data = bytearray(path.read_bytes())
    rng = np.random.default_rng(seed)
    page = int.from_bytes(data[16:18], "big") or 65536
    for at in rng.integers(page, len(data), 20):  # past the first page: the file opens
        data[at] ^= 1 << int(rng.integers(0, 8))
    path.write_bytes(bytes(data))
    got = _read(tmp_path, list(vectors))
    wrong = [k for k in got if not np.array_equal(got[k], vectors[k])]
    assert not wrong, f"{len(wrong)} of {len(got)} vectors are not the ones put"


def test_a_cache_made_before_entry_checksums_gets_them_once(tmp_path):
    """Rows kept in their rows by an older codesearch (no checksum) are summed on the next
    open, and read as they were."""
    vectors = _filled(tmp_path)
    conn = sqlite3.connect(tmp_path / CACHE_FILE)
    conn.execute("UPDATE vectors SET crc = NULL")
    conn.execute("DELETE FROM meta WHERE key = 'entry_crc'")
    conn.commit()
    conn.close()
    got = _read(tmp_path, list(vectors))
    assert len(got) == N and all(np.array_equal(got[k], vectors[k]) for k in got)
    conn = sqlite3.connect(tmp_path / CACHE_FILE)
    (model, kind, key, n, dim, blob, crc), = conn.execute(
        "SELECT model, kind, text_hash, n, dim, data, crc FROM vectors LIMIT 1").fetchall()
    conn.close()
    assert crc == entry_crc(model, kind, key, n, dim, blob)
