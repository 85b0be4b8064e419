"""DenseIndex against a brute-force numpy oracle, exact and IVF, with deletes and persistence."""

from __future__ import annotations

import numpy as np
import pytest

from codesearch.errors import IndexCorruptError
from codesearch.indexes.dense import DenseIndex

DIM = 32


# Test-sized FAISS calls run on one OpenMP thread (tests/conftest.py, one_faiss_thread).
pytestmark = pytest.mark.usefixtures("one_faiss_thread")


def clustered(n: int, *, dim: int = DIM, n_clusters: int = 40, seed: int = 0) -> np.ndarray:
    """L2-normalised points around random centres: the shape real embeddings have."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, dim)).astype(np.float32)
    x = centres[rng.integers(0, n_clusters, n)] + 0.35 * rng.standard_normal((n, dim))
    x = x.astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_force(ids: np.ndarray, vectors: np.ndarray, queries: np.ndarray, k: int):
    scores = queries @ vectors.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [(ids[row], scores[i, row]) for i, row in enumerate(order)]


def build(kind: str, n: int = 3000, seed: int = 0):
    vectors = clustered(n, seed=seed)
    ids = np.arange(1000, 1000 + n, dtype=np.int64)
    # "ivf": a low threshold forces the approximate path on a test-sized collection.
    index = DenseIndex(DIM, exact_threshold=10**9 if kind == "exact" else 500)
    index.add(ids, vectors)
    assert index.kind == kind
    return index, ids, vectors


def recall_at(results, truth, k: int) -> float:
    hits = [len(set(r[0][:k].tolist()) & set(t[0][:k].tolist())) for r, t in zip(results, truth)]
    return sum(hits) / (k * len(truth))


def test_exact_matches_brute_force():
    index, ids, vectors = build("exact")
    queries = clustered(50, seed=1)
    for (got_ids, got_scores), (want_ids, want_scores) in zip(
        index.search(queries, 10), brute_force(ids, vectors, queries, 10)
    ):
        np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5, atol=1e-5)
        # Ties aside, the same ids in the same order.
        assert (got_ids == want_ids).mean() >= 0.9


def test_ivf_recall_at_10_vs_exact_is_at_least_0_95():
    index, ids, vectors = build("ivf")
    queries = clustered(100, seed=2)
    recall = recall_at(index.search(queries, 10), brute_force(ids, vectors, queries, 10), 10)
    assert recall >= 0.95, recall


def test_kind_follows_size_with_hysteresis():
    vectors = clustered(1200)
    ids = np.arange(1200, dtype=np.int64)
    index = DenseIndex(DIM, exact_threshold=1000)
    index.add(ids[:900], vectors[:900])
    assert index.kind == "exact"
    index.add(ids[900:], vectors[900:])
    assert index.kind == "ivf"
    index.remove(ids[:400])  # 800 left: below the threshold, above half of it
    assert index.kind == "ivf"
    index.remove(ids[400:800])  # 400 left: back to exact, nothing lost
    assert index.kind == "exact"
    assert sorted(index.ids().tolist()) == ids[800:].tolist()
    got = index.search(vectors[800:810], 1)
    assert [int(r[0][0]) for r in got] == ids[800:810].tolist()


@pytest.mark.parametrize("kind", ["exact", "ivf"])
def test_removed_ids_never_come_back(kind):
    index, ids, vectors = build(kind)
    gone = ids[::3]
    index.remove(gone)
    assert len(index) == len(ids) - len(gone)
    # Query with the removed vectors themselves: the strongest possible pull towards them.
    for got_ids, _ in index.search(vectors[::3][:200], 20):
        assert not np.isin(got_ids, gone).any()
    assert not np.isin(index.ids(), gone).any()


@pytest.mark.parametrize("kind", ["exact", "ivf"])
def test_remove_unknown_ids_is_a_no_op(kind):
    index, ids, _ = build(kind)
    index.remove(np.array([-5, 7, 10**12], dtype=np.int64))
    index.remove(np.array([], dtype=np.int64))
    assert len(index) == len(ids)


@pytest.mark.parametrize("kind", ["exact", "ivf"])
def test_added_after_build_are_found_and_upserts_replace(kind):
    index, ids, _ = build(kind)
    new = clustered(20, seed=9)
    new_ids = np.arange(50_000, 50_020, dtype=np.int64)
    index.add(new_ids, new)
    assert index.kind == kind  # 20 more does not trigger a retrain
    top1 = [int(r[0][0]) for r in index.search(new, 1)]
    assert top1 == new_ids.tolist()
    # Re-adding an id replaces its vector rather than duplicating it.
    index.add(new_ids[:1], new[1:2])
    assert len(index) == len(ids) + 20
    got_ids, got_scores = index.search(new[1:2], 2)[0]
    assert set(got_ids.tolist()) == {int(new_ids[0]), int(new_ids[1])}
    np.testing.assert_allclose(got_scores, [1.0, 1.0], atol=1e-5)


@pytest.mark.parametrize("kind", ["exact", "ivf"])
def test_save_load_round_trip_gives_identical_results(kind, tmp_path):
    index, ids, _ = build(kind)
    index.remove(ids[:10])
    queries = clustered(30, seed=3)
    path = tmp_path / "dense_chunks.faiss"
    index.save(path)
    loaded = DenseIndex.load(path)
    assert (loaded.kind, loaded.dim, len(loaded)) == (kind, DIM, len(index))
    for (a_ids, a_scores), (b_ids, b_scores) in zip(index.search(queries, 10), loaded.search(queries, 10)):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_scores, b_scores)
    # Still mutable after a load.
    loaded.remove(ids[10:20])
    assert len(loaded) == len(index) - 10
    assert [p.name for p in tmp_path.iterdir()] == ["dense_chunks.faiss"]  # no temp left behind


@pytest.mark.parametrize(
    "damage",
    ["truncate", "flip_payload_byte", "garbage", "empty", "missing"],
)
def test_damaged_file_raises_index_corrupt_naming_rebuild(damage, tmp_path):
    index, _, _ = build("exact", n=200)
    path = tmp_path / "dense.faiss"
    index.save(path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip_payload_byte":
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))
    elif damage == "garbage":
        path.write_bytes(b"\x00not an index at all" * 10)
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.unlink()
    with pytest.raises(IndexCorruptError) as err:
        DenseIndex.load(path)
    message = str(err.value)
    assert "codesearch index --rebuild" in message
    assert str(path) in message
    assert "\n" not in message


def test_empty_index_returns_empty_results():
    index = DenseIndex(DIM)
    results = index.search(clustered(3), 5)
    assert len(results) == 3
    for ids, scores in results:
        assert ids.dtype == np.int64 and scores.dtype == np.float32
        assert len(ids) == len(scores) == 0
    assert len(index) == 0 and len(index.ids()) == 0


@pytest.mark.parametrize("kind", ["exact", "ivf"])
def test_k_larger_than_size(kind):
    if kind == "exact":
        index = DenseIndex(DIM)
        index.add(np.arange(5), clustered(5))
        ids, scores = index.search(clustered(1, seed=4), 50)[0]
        assert sorted(ids.tolist()) == [0, 1, 2, 3, 4]
    else:
        index, all_ids, _ = build("ivf")
        ids, scores = index.search(clustered(1, seed=4), len(all_ids) + 100)[0]
        assert len(ids) <= len(all_ids) and len(set(ids.tolist())) == len(ids)
    assert np.all(np.diff(scores) <= 1e-6)  # best first


@pytest.mark.parametrize(
    "call",
    [
        lambda ix: ix.add(np.arange(3), np.zeros((3, DIM + 1), np.float32)),
        lambda ix: ix.add(np.arange(2), np.zeros((3, DIM), np.float32)),
        lambda ix: ix.add(np.array([1, 1]), np.zeros((2, DIM), np.float32)),
        lambda ix: ix.search(np.zeros((1, DIM + 1), np.float32), 3),
        lambda ix: ix.search(np.zeros((1, DIM), np.float32), 0),
    ],
    ids=["wrong_dim", "count_mismatch", "duplicate_ids", "query_dim", "k_zero"],
)
def test_bad_arguments_raise_value_error(call):
    with pytest.raises(ValueError):
        call(DenseIndex(DIM))


def test_empty_index_save_load(tmp_path):
    DenseIndex(DIM).save(tmp_path / "empty.faiss")
    loaded = DenseIndex.load(tmp_path / "empty.faiss")
    assert len(loaded) == 0 and loaded.dim == DIM and loaded.kind == "exact"


def test_small_searches_restore_the_openmp_thread_count():
    import faiss

    before = faiss.omp_get_max_threads()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = DenseIndex(16)
    index.add(np.arange(64), x)
    (ids, _), = index.search(x[:1], 5)
    assert ids[0] == 0
    assert faiss.omp_get_max_threads() == before
