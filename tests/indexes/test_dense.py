"""DenseIndex against a brute-force numpy oracle, exact and IVF, with deletes and persistence."""

from __future__ import annotations

import contextlib
import shutil

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
    path = tmp_path / "dense_chunks"
    index.save(path)
    loaded = DenseIndex.load(path)
    assert (loaded.kind, loaded.dim, len(loaded)) == (kind, DIM, len(index))
    for (a_ids, a_scores), (b_ids, b_scores) in zip(index.search(queries, 10), loaded.search(queries, 10)):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_scores, b_scores)
    # Still mutable after a load.
    loaded.remove(ids[10:20])
    assert len(loaded) == len(index) - 10
    assert [p.name for p in tmp_path.iterdir()] == ["dense_chunks"]
    assert not [p for p in path.iterdir() if p.name.startswith(".")]  # no temp left behind


def _files(folder):
    """The index folder's files by manifest name (``base_ids``, ``tail_vectors``, ...)."""
    import json

    entries = json.loads((folder / "manifest.json").read_text())["files"]
    return {name: folder / e["file"] for name, e in entries.items()}


@pytest.mark.parametrize("kind", ["exact", "ivf"])
@pytest.mark.parametrize(
    "damage",
    ["truncate_base", "truncate_ids", "flip_head_byte", "garbage_manifest", "empty_manifest", "missing_file",
     "missing", "unsorted_ids"],
)
def test_damaged_folder_raises_index_corrupt_naming_rebuild(kind, damage, tmp_path):
    # 5,000 vectors: past the smallest tail, so the exact index has a base (a mapped matrix).
    index, ids, _ = build(kind, n=800 if kind == "ivf" else 5000)
    index.remove(ids[:3])
    path = tmp_path / "dense"
    index.save(path)
    files = _files(path)
    big = files["base_lists" if kind == "ivf" else "base_vectors"]
    if damage == "truncate_base":
        big.write_bytes(big.read_bytes()[: big.stat().st_size // 2])
    elif damage == "truncate_ids":
        files["base_ids"].write_bytes(files["base_ids"].read_bytes()[:-8])
    elif damage == "flip_head_byte":
        data = bytearray(big.read_bytes())
        data[200] ^= 0xFF  # the FAISS header / quantizer, or the first vectors: CRC-checked either way
        big.write_bytes(bytes(data))
    elif damage == "garbage_manifest":
        (path / "manifest.json").write_bytes(b"\x00not an index at all" * 10)
    elif damage == "empty_manifest":
        (path / "manifest.json").write_bytes(b"")
    elif damage == "missing_file":
        files["removed"].unlink()
    elif damage == "unsorted_ids":
        a = np.load(files["base_ids"])
        np.save(files["base_ids"], a[::-1].copy())  # same size, shape and dtype: only the order
    else:
        shutil.rmtree(path)
    with pytest.raises(IndexCorruptError) as err:
        DenseIndex.load(path)
    message = str(err.value)
    assert "codesearch index --rebuild" in message
    assert str(path) in message
    assert "\n" not in message


def test_a_flipped_byte_in_the_mapped_lists_is_found_by_verify(tmp_path, monkeypatch):
    """Opening checks the head of a large FAISS file, not the hundreds of MB of vectors after
    it (a flipped bit there moves a score, not an offset); ``verify=True`` checks every byte."""
    from codesearch.indexes import folder

    monkeypatch.setattr(folder, "CHECKED_BYTES", 0)  # every file counts as large
    index, _, _ = build("ivf", n=800)
    index.save(tmp_path / "dense")
    lists = _files(tmp_path / "dense")["base_lists"]
    data = bytearray(lists.read_bytes())
    data[-100] ^= 0xFF
    lists.write_bytes(bytes(data))
    assert len(DenseIndex.load(tmp_path / "dense")) == 800
    with pytest.raises(IndexCorruptError, match="checksum"):
        DenseIndex.load(tmp_path / "dense", verify=True)


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
    DenseIndex(DIM).save(tmp_path / "empty")
    loaded = DenseIndex.load(tmp_path / "empty")
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


# -- memory-mapped, segmented storage ----------------------------------------------------------


def stored(n: int, *, seed: int = 0) -> np.ndarray:
    """Clustered vectors rounded to float16, as the store hands them to the index."""
    return clustered(n, seed=seed).astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("kind", ["exact", "ivf"])
def test_a_loaded_index_maps_its_base_instead_of_reading_it(kind, tmp_path):
    import faiss

    index, _, _ = build(kind, n=5000)
    index.save(tmp_path / "dense")
    loaded = DenseIndex.load(tmp_path / "dense")
    base = loaded._base
    if kind == "exact":
        assert isinstance(base.vectors, np.memmap) and not base.vectors.flags.writeable
    else:
        lists = faiss.downcast_InvertedLists(base.lists.invlists)
        assert isinstance(lists, faiss.OnDiskInvertedLists) and lists.read_only
    assert isinstance(base.ids, np.memmap)
    queries = clustered(20, seed=5)
    for (a_ids, a_scores), (b_ids, b_scores) in zip(index.search(queries, 10), loaded.search(queries, 10)):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_allclose(a_scores, b_scores, atol=1e-6)


@pytest.mark.parametrize("kind", ["exact", "ivf"])
def test_a_small_change_rewrites_the_tail_not_the_base(kind, tmp_path):
    index, ids, _ = build(kind, n=5000)
    path = tmp_path / "dense"
    index.save(path)
    base_files = {n: f for n, f in _files(path).items() if n.startswith("base_")}
    inodes = {n: f.stat().st_ino for n, f in base_files.items()}
    loaded = DenseIndex.load(path)
    loaded.remove(ids[:5])
    loaded.add(np.array([90_001, 90_002]), stored(2, seed=7))
    loaded.save(path)
    after = _files(path)
    assert {n: after[n] for n in base_files} == base_files
    assert {n: after[n].stat().st_ino for n in base_files} == inodes
    again = DenseIndex.load(path)
    assert len(again) == 5000 - 5 + 2
    assert not np.isin(again.ids(), ids[:5]).any() and {90_001, 90_002} <= set(again.ids().tolist())
    assert len(list(path.iterdir())) == len(after) + 1  # the manifest and its files, nothing left over


def test_ivf_recall_at_100_against_exact_is_at_least_0_95():
    n = 10_000
    vectors = stored(n, seed=11)
    ids = np.arange(n, dtype=np.int64) * 7
    index = DenseIndex(DIM, exact_threshold=2000)
    index.add(ids, vectors)
    assert index.kind == "ivf"
    queries = clustered(100, seed=12)
    recall = recall_at(index.search(queries, 100), brute_force(ids, vectors, queries, 100), 100)
    assert recall >= 0.95, recall


@pytest.mark.parametrize("writer", [False, True], ids=["in-memory", "lists-in-its-folder"])
def test_adds_removes_saves_and_loads_agree_with_a_brute_force_oracle(tmp_path, writer, monkeypatch):
    """A long random run through every path (tail, removals, merges into a mapped base, the
    switch to IVF, a retrain, the way back to exact), checked after each step against brute
    force over what the index should hold. Probing every cell makes IVF search exact. As a
    writer's index (``lists_dir``), every IVF base is built in a file of its folder, and an
    exact base's rows are read back with pread (as a matrix of 64 MB or more is)."""
    from codesearch.indexes import folder

    if writer:
        monkeypatch.setattr(folder, "SOURCE_MIN_BYTES", 0)
    rng = np.random.default_rng(0)
    pool = stored(30_000, seed=3)
    index = DenseIndex(DIM, exact_threshold=6000, nprobe=10**6)
    held: dict[int, int] = {}  # id -> row of pool
    path = tmp_path / "dense"
    index.lists_dir = path if writer else None
    kinds = set()
    for step in range(40):
        if step < 25 or rng.random() < 0.3:
            new = rng.integers(0, 40_000, int(rng.integers(50, 2500)))
            new = np.unique(new)
            rows = rng.integers(0, len(pool), len(new))
            index.add(new, pool[rows])
            held.update(zip(new.tolist(), rows.tolist()))
        else:
            live = np.array(sorted(held), dtype=np.int64)
            gone = rng.choice(live, min(len(live), int(rng.integers(100, 4000))), replace=False)
            index.remove(np.concatenate([gone, [-1, 10**9]]))
            for i in gone.tolist():
                held.pop(i)
        if step % 3 == 0:
            index.save(path)
            assert _only_its_files(path)
            index = DenseIndex.load(path)
            index.lists_dir = path if writer else None
        kinds.add(index.kind)
        ids = np.array(sorted(held), dtype=np.int64)
        assert len(index) == len(ids) and sorted(index.ids().tolist()) == ids.tolist()
        queries = clustered(5, seed=100 + step)
        want = brute_force(ids, pool[[held[i] for i in ids.tolist()]], queries, 20)
        for (got_ids, got_scores), (want_ids, want_scores) in zip(index.search(queries, 20), want):
            np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5, atol=1e-5)
            # Ties aside, the same ids: near-equal scores (float32 sums, in another order on
            # each CPU's kernels) may swap places, so the ids are compared as sets.
            overlap = len(set(got_ids.tolist()) & set(want_ids.tolist()))
            assert len(got_ids) == len(want_ids) and overlap >= 0.9 * len(want_ids)
    assert kinds == {"exact", "ivf"}


def test_the_one_file_format_before_folders_loads_and_the_next_save_writes_a_folder(tmp_path):
    """An index written before folders (magic, JSON header, ``faiss.serialize_index`` bytes)
    opens as it is, and a save at its path replaces the file with the folder."""
    import json
    import zlib

    import faiss

    vectors = stored(300, seed=4)
    ids = np.arange(300, dtype=np.int64) + 10
    old = faiss.IndexIDMap2(faiss.IndexFlatIP(DIM))
    old.add_with_ids(vectors, ids)
    payload = faiss.serialize_index(old).tobytes()
    header = {"format": 1, "dim": DIM, "kind": "exact", "count": 300, "exact_threshold": 50_000, "nlist": None,
              "nprobe": None, "seed": 0, "trained_on": 0, "payload_bytes": len(payload), "crc32": zlib.crc32(payload)}
    head = json.dumps(header).encode()
    path = tmp_path / "dense_chunks.faiss"
    path.write_bytes(b"CSDENSE\n" + len(head).to_bytes(4, "little") + head + payload)
    loaded = DenseIndex.load(path)
    queries = clustered(10, seed=6)
    want = brute_force(ids, vectors, queries, 5)
    assert [r[0].tolist() for r in loaded.search(queries, 5)] == [w[0].tolist() for w in want]
    loaded.save(path)
    assert path.is_dir() and [r[0].tolist() for r in DenseIndex.load(path).search(queries, 5)] == [
        w[0].tolist() for w in want]


def test_small_searches_run_blas_on_one_thread_and_restore_its_count(monkeypatch):
    """numpy's BLAS runs a search's products on one thread too (45 ms against 0.5 ms for a
    16k x 48 by 48 x 32 product on a loaded 2-core machine), and gets its count back."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from codesearch.indexes import dense

    def blas_threads():
        return {i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}

    index = dense.CentroidIndex(DIM)
    index.add(np.arange(5000), clustered(5000))  # a base: a matrix product, not only the tail's
    inside = []
    real = dense.one_thread

    @contextlib.contextmanager
    def watched():
        with real():
            yield
            inside.append(blas_threads())

    monkeypatch.setattr(dense, "one_thread", watched)
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        ids, _ = index.scores(clustered(1, seed=3))
        assert blas_threads() == {2}
    assert inside == [{1}] and sorted(ids.tolist()) == list(range(5000))


# -- lists sized once, and an index filled from reads (an index run's sync) -----------------


def _reads(ids: np.ndarray, vectors: np.ndarray, size: int):
    return lambda: ((ids[s : s + size], vectors[s : s + size]) for s in range(0, len(ids), size))


def _entries(index) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each IVF list's ids and codes, by id."""
    import faiss

    lists = faiss.downcast_InvertedLists(index._base.lists.invlists)
    out = []
    for cell in range(lists.nlist):
        n = lists.list_size(cell)
        ids = faiss.rev_swig_ptr(lists.get_ids(cell), n).copy() if n else np.zeros(0, np.int64)
        codes = faiss.rev_swig_ptr(lists.get_codes(cell), n * 2 * DIM).reshape(n, -1).copy() if n else None
        order = np.argsort(ids)
        out.append((ids[order], None if codes is None else codes[order]))
    return out


def _same_entries(a, b) -> bool:
    return all(np.array_equal(x[0], y[0]) and (x[1] is None or np.array_equal(x[1], y[1])) for x, y in zip(a, b))


def test_the_lists_hold_what_faiss_adds_would_put_there_through_builds_and_merges():
    import faiss

    vectors, ids = clustered(4000), np.arange(4000, dtype=np.int64) * 3 + 1
    index = DenseIndex(DIM, exact_threshold=1000)
    index.add(ids[:3000], vectors[:3000])  # trained: the lists built by `_fill_lists`
    assert index.kind == "ivf"
    ref = faiss.clone_index(index._base.lists)
    ref.reset()
    ref.add_with_ids(vectors[:3000], ids[:3000])
    got = _entries(index)
    index._base.lists, keep = ref, index._base.lists
    assert _same_entries(got, _entries(index))
    index._base.lists = keep
    # A merge of removals and a tail (`_merge_lists`) against FAISS's remove and add.
    index.remove(ids[:600:2])
    index.add(ids[3000:3400], vectors[3000:3400])
    index._merge()  # (as a tail past max(4096, base / 8) is)
    assert len(index._tail_ids) == 0 and len(index) == 3100
    ref.remove_ids(faiss.IDSelectorBatch(ids[:600:2]))
    ref.add_with_ids(vectors[3000:3400], ids[3000:3400])
    got = _entries(index)
    index._base.lists = ref
    assert _same_entries(got, _entries(index))


@pytest.mark.parametrize("n", [400, 3000])
def test_an_index_filled_from_reads_is_the_one_a_single_add_makes(n):
    # float16-exact vectors, as the store keeps them (and hands them over as float16)
    vectors, ids = clustered(n, seed=1).astype(np.float16).astype(np.float32), np.arange(n, dtype=np.int64) * 7 + 3
    one = DenseIndex(DIM, exact_threshold=500)
    one.add(ids, vectors)
    filled = DenseIndex(DIM, exact_threshold=500)
    assert filled.fill(_reads(ids, vectors.astype(np.float16), 256), n)
    assert filled.kind == one.kind == ("ivf" if n > 500 else "exact")
    np.testing.assert_array_equal(np.sort(filled.ids()), np.sort(one.ids()))
    if one.kind == "ivf":
        assert _same_entries(_entries(filled), _entries(one))
    queries = clustered(20, seed=7)
    for (a_ids, a_scores), (b_ids, b_scores) in zip(one.search(queries, 10), filled.search(queries, 10)):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_scores, b_scores)


def test_a_fill_whose_reads_disagree_leaves_the_index_empty():
    vectors, ids = clustered(2000), np.arange(2000, dtype=np.int64)
    index = DenseIndex(DIM, exact_threshold=500)
    assert not index.fill(_reads(ids, vectors, 256), 2001)  # fewer vectors than counted
    calls = []

    def changing():  # the second read of the lists is missing a vector
        calls.append(1)
        cut = 2000 if len(calls) < 3 else 1999
        return _reads(ids[:cut], vectors[:cut], 256)()

    assert not index.fill(changing, 2000)
    assert len(index) == 0 and len(calls) == 3
    index.add(ids, vectors)  # and it is still an index
    assert len(index) == 2000 and index.kind == "ivf"
    with pytest.raises(ValueError):
        index.fill(_reads(ids, vectors, 256), 2000)


def _lists_file(folder) -> bytes:
    (file,) = folder.glob("base_lists.*.faiss")
    return file.read_bytes()


def _unnamed(folder) -> set[str]:
    """The files of ``folder`` that its manifest (if any) does not name."""
    import json

    named = {"manifest.json"}
    if (folder / "manifest.json").exists():
        named |= {e["file"] for e in json.loads((folder / "manifest.json").read_text())["files"].values()}
    return {p.name for p in folder.iterdir()} - named


def _only_its_files(folder) -> bool:
    return not _unnamed(folder)


def test_lists_written_to_a_file_as_they_are_made_are_the_bytes_faiss_writes_from_memory(tmp_path):
    # A writer's index (lists_dir set) writes the IVF lists of a build, a merge and a retrain
    # straight into a file of its folder and maps it; the file is the one FAISS writes for the
    # lists an index in memory makes by the same steps, and the save takes it as it is.
    vectors, ids = clustered(5200, seed=2), np.arange(5200, dtype=np.int64) * 5 + 2
    mem, disk = DenseIndex(DIM, exact_threshold=1000), DenseIndex(DIM, exact_threshold=1000)
    disk.lists_dir = tmp_path / "disk"
    queries = clustered(20, seed=9)

    def merged(index):
        index.remove(ids[:300:3])
        index.add(ids[1200:1500], vectors[1200:1500])
        index._merge()  # (as a tail past max(4096, base / 8) is)

    steps = [
        lambda index: index.add(ids[:1200], vectors[:1200]),  # past the threshold: trained
        merged,
        lambda index: index.add(ids[1500:5200], vectors[1500:5200]),  # past 4x: retrained
    ]
    for step in steps:
        step(mem)
        step(disk)
        assert disk.kind == "ivf" and disk._base.spilled and disk._base.file.parent == tmp_path / "disk"
        assert len(_unnamed(tmp_path / "disk")) == 1  # (a build's file that a later build replaced went)
        for (a_ids, a_scores), (b_ids, b_scores) in zip(mem.search(queries, 10), disk.search(queries, 10)):
            np.testing.assert_array_equal(a_ids, b_ids)
            np.testing.assert_array_equal(a_scores, b_scores)
        mem.save(tmp_path / "mem")
        disk.save(tmp_path / "disk")
        assert not disk._base.spilled and _only_its_files(tmp_path / "disk")
        assert _lists_file(tmp_path / "disk") == _lists_file(tmp_path / "mem")
    # A loaded index merges from its file (read with pread), into a new file of its folder.
    (tmp_path / "disk" / "base_lists.0badf00d.faiss").write_bytes(b"left by a killed run")
    mem, disk = DenseIndex.load(tmp_path / "mem"), DenseIndex.load(tmp_path / "disk")
    disk.lists_dir = tmp_path / "disk"
    for index in (mem, disk):
        index.remove(ids[1500:1600])
        index._merge()
    mem.save(tmp_path / "mem")
    disk.save(tmp_path / "disk")
    assert _only_its_files(tmp_path / "disk")  # (the killed run's file too is gone)
    assert _lists_file(tmp_path / "disk") == _lists_file(tmp_path / "mem")
    again = DenseIndex.load(tmp_path / "disk", verify=True)
    assert len(again) == 5200 - 100 - 100
    for (a_ids, _), (b_ids, _) in zip(mem.search(queries, 10), again.search(queries, 10)):
        np.testing.assert_array_equal(a_ids, b_ids)


@pytest.mark.parametrize("n", [5, 4000])
def test_the_head_of_lists_that_few_or_most_cells_hold_is_faiss_own(n):
    # FAISS writes the list sizes in full where more than half the cells hold entries, and
    # as (cell, size) pairs otherwise.
    import faiss

    from codesearch.indexes.dense import _head_bytes

    index, _ = DenseIndex(DIM)._untrained(4000)
    index.train(clustered(4000))
    index.add_with_ids(clustered(n, seed=3), np.arange(n, dtype=np.int64))
    data = faiss.serialize_index(index).tobytes()
    sizes = np.array([index.invlists.list_size(c) for c in range(index.nlist)], dtype=np.int64)
    assert (np.count_nonzero(sizes) > index.nlist // 2) == (n > 5)
    head = _head_bytes(index, sizes)
    assert head is not None and data[: len(head)] == head and len(data) - len(head) == n * (index.code_size + 8)


def test_a_fill_into_a_folder_whose_reads_disagree_leaves_no_file_there(tmp_path):
    vectors, ids = clustered(2000), np.arange(2000, dtype=np.int64)
    index = DenseIndex(DIM, exact_threshold=500)
    index.lists_dir = tmp_path
    calls = []

    def changing():  # the third read (the lists' entries) is missing a vector
        calls.append(1)
        cut = 2000 if len(calls) < 3 else 1999
        return _reads(ids[:cut], vectors[:cut], 256)()

    assert not index.fill(changing, 2000)
    assert len(index) == 0 and not any(tmp_path.iterdir())
    assert index.fill(_reads(ids, vectors, 256), 2000) and index._base.spilled
    index.save(tmp_path)
    assert _only_its_files(tmp_path) and len(DenseIndex.load(tmp_path)) == 2000


def test_an_exact_base_merged_after_a_load_is_read_with_pread_and_written_in_id_order(tmp_path, monkeypatch):
    from codesearch.indexes import folder
    from codesearch.indexes.dense import CentroidIndex

    monkeypatch.setattr(folder, "SOURCE_MIN_BYTES", 0)  # (the per-file means of a monorepo: 170 MB)
    reads = []
    real = folder.Source.read
    monkeypatch.setattr(folder.Source, "read", lambda self, out, at: reads.append(at) or real(self, out, at))
    vectors, ids = stored(9000, seed=4), np.arange(9000, dtype=np.int64) * 3
    index = CentroidIndex(DIM)
    index.add(ids[:4500], vectors[:4500])  # (a tail past 4,096: merged into an exact base)
    assert len(index._tail_ids) == 0 and index.kind == "exact"
    index.save(tmp_path)
    index = CentroidIndex.load(tmp_path)
    index.remove(ids[:1000:2])
    index.add(np.concatenate([ids[4500:][::-1], ids[2000:2100]]),  # new ids in reverse, and replaced ones
              np.concatenate([vectors[4500:][::-1], vectors[:100]]))
    assert reads and len(index._tail_ids) == 0
    want = {int(i): v for i, v in zip(ids[1:1000:2], vectors[1:1000:2])}
    want |= {int(i): v for i, v in zip(ids[1000:], vectors[1000:])}
    want |= {int(i): v for i, v in zip(ids[2000:2100], vectors[:100])}
    np.testing.assert_array_equal(index._base.ids, sorted(want))
    np.testing.assert_array_equal(index._base.vectors, np.stack([want[i] for i in sorted(want)]))


@pytest.mark.parametrize("writer", [False, True], ids=["in-memory", "lists-in-its-folder"])
def test_an_index_saved_to_two_folders_in_turn_still_merges_and_retrains(tmp_path, writer):
    # Its lists are read back from the file its last save wrote (the one before may be gone).
    vectors, ids = clustered(6000, seed=5), np.arange(6000, dtype=np.int64)
    index = DenseIndex(DIM, exact_threshold=1000)
    index.lists_dir = tmp_path / "p" if writer else None
    index.add(ids[:1200], vectors[:1200])
    for folder in ("p", "q", "p"):
        index.save(tmp_path / folder)
    index.remove(ids[:100])
    index._merge()
    index.add(ids[1200:], vectors[1200:])  # past 4x: retrained
    assert len(index) == 5900 and index.kind == "ivf"
    index.save(tmp_path / "p")
    assert len(DenseIndex.load(tmp_path / "p")) == 5900
