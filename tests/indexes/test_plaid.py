"""PlaidIndex against brute-force MaxSim on clustered token vectors shaped like ColBERT output."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from codesearch.errors import IndexCorruptError
from codesearch.indexes.plaid import PlaidIndex, ResidualCodec, maxsim_search

DIM = 32


# Test-sized FAISS calls run on one OpenMP thread (tests/conftest.py, one_faiss_thread).
pytestmark = pytest.mark.usefixtures("one_faiss_thread")
N_TOPICS = 60


def _unit(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def corpus(n_docs: int = 300, *, seed: int = 0, topics: np.ndarray | None = None):
    """Documents of 10-50 tokens, each drawn around 3 of N_TOPICS topic directions."""
    rng = np.random.default_rng(seed)
    if topics is None:
        topics = np.random.default_rng(1234).standard_normal((N_TOPICS, DIM))
    docs = []
    for _ in range(n_docs):
        n = int(rng.integers(10, 50))
        picked = rng.choice(rng.integers(0, len(topics), 3), n)
        docs.append(_unit(topics[picked] + 0.5 * rng.standard_normal((n, DIM))))
    return docs


def queries_for(docs, n: int = 40, *, seed: int = 1):
    """8-token queries made of noisy tokens of one target document each."""
    rng = np.random.default_rng(seed)
    out = []
    for i in rng.integers(0, len(docs), n):
        d = docs[i]
        out.append(_unit(d[rng.choice(len(d), 8)] + 0.3 * rng.standard_normal((8, DIM))))
    return out


def oracle(queries, ids, docs, k):
    """Brute-force MaxSim written out longhand, independent of the index code."""
    out = []
    for q in queries:
        scores = np.array([(q @ d.T).max(axis=1).sum() for d in docs], dtype=np.float32)
        order = np.argsort(-scores, kind="stable")[:k]
        out.append((ids[order], scores[order]))
    return out


def recall(results, truth, k: int = 10) -> float:
    return float(np.mean([len(set(r[0][:k].tolist()) & set(t[0][:k].tolist())) / k for r, t in zip(results, truth)]))


IDS = np.arange(1000, 1300, dtype=np.int64)


@pytest.fixture(scope="module")
def docs():
    return corpus()


@pytest.fixture(scope="module")
def queries(docs):
    return queries_for(docs)


@pytest.fixture(scope="module")
def truth(docs, queries):
    return oracle(queries, IDS, docs, 10)


def make(kind: str, docs, nbits: int = 4) -> PlaidIndex:
    index = PlaidIndex(DIM, nbits=nbits, mode=kind)
    index.add(IDS[: len(docs)], docs)
    assert index.kind == kind
    return index


def test_oracle_agrees_with_library_brute_force(docs, queries, truth):
    got = maxsim_search(queries, IDS, docs, 10)
    for (a_ids, a_scores), (b_ids, b_scores) in zip(got, truth):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_allclose(a_scores, b_scores, rtol=1e-5)


def test_exact_path_matches_brute_force(docs, queries, truth):
    results = make("exact", docs).search(queries, 10)
    # float16 storage moves scores by ~1e-3: same top 10 in nearly all places.
    assert recall(results, truth) >= 0.98
    for (_, got), (_, want) in zip(results, truth):
        np.testing.assert_allclose(got, want, atol=2e-2)


@pytest.mark.parametrize(("nbits", "bound"), [(4, 0.9), (2, 0.8)])
def test_plaid_recall_at_10_vs_exact_maxsim(docs, queries, truth, nbits, bound):
    index = make("plaid", docs, nbits)
    assert recall(index.search(queries, 10), truth) >= bound


def test_auto_mode_switches_at_token_threshold_and_override_holds(docs):
    n_tokens = sum(len(d) for d in docs)
    auto = PlaidIndex(DIM, exact_threshold=n_tokens // 2)
    auto.add(IDS[:100], docs[:100])
    assert auto.kind == "exact"
    auto.add(IDS[100:], docs[100:])
    assert auto.kind == "plaid" and len(auto) == len(IDS) and auto.n_tokens == n_tokens
    forced = PlaidIndex(DIM, exact_threshold=n_tokens // 2, mode="exact")
    forced.add(IDS, docs)
    assert forced.kind == "exact"


@pytest.mark.parametrize("kind", ["exact", "plaid"])
def test_removed_ids_never_come_back(docs, kind):
    index = make(kind, docs)
    gone = IDS[::2]
    index.remove(gone)  # half the tokens: compaction runs on the way
    assert len(index) == len(IDS) - len(gone)
    assert not np.isin(index.ids(), gone).any()
    # Query with the removed documents' own tokens: the strongest pull towards them.
    for got_ids, _ in index.search([d[:8] for d in docs[::2][:30]], 20):
        assert len(got_ids) and not np.isin(got_ids, gone).any()
    index.remove(np.array([-1, 10**12]))  # unknown ids: no-op
    assert len(index) == len(IDS) - len(gone)


@pytest.mark.parametrize("kind", ["exact", "plaid"])
def test_docs_added_after_build_are_found_without_rebuild(docs, kind):
    index = make(kind, docs[:250])
    codec = index._codec
    new_ids = IDS[250:]
    index.add(new_ids, docs[250:])
    assert index._codec is codec  # same centroids and buckets, no retraining
    top1 = [int(r[0][0]) for r in index.search([d[:10] for d in docs[250:]], 1)]
    assert np.mean(np.array(top1) == new_ids) >= 0.9
    # Upsert: re-adding an id replaces the document.
    index.add(new_ids[:1], [docs[0]])
    assert len(index) == 300
    assert int(index.search([docs[0]], 2)[0][0][:2].tolist().count(int(new_ids[0]))) == 1


def test_needs_rebuild_tracks_drift_and_rebuild_clears_it(docs):
    index = make("plaid", docs[:200])
    index.add(IDS[200:250], docs[200:250])  # same distribution
    assert not index.needs_rebuild
    assert index.added_error == pytest.approx(index.build_error, rel=0.2)
    # Documents around topics the centroids never saw.
    shifted = corpus(50, seed=7, topics=np.random.default_rng(99).standard_normal((N_TOPICS, DIM)))
    index.add(np.arange(5000, 5050), shifted)
    assert index.needs_rebuild
    index.rebuild(np.arange(5000, 5050), shifted)  # originals for the new ones
    assert not index.needs_rebuild and len(index) == 300 and index.kind == "plaid"
    found = [int(r[0][0]) for r in index.search([d[:10] for d in shifted], 1)]
    assert np.mean(np.array(found) == np.arange(5000, 5050)) >= 0.9


def test_rebuild_of_small_auto_index_goes_back_to_exact(docs):
    index = PlaidIndex(DIM, exact_threshold=1000)
    index.add(IDS[:100], docs[:100])
    assert index.kind == "plaid"
    index.remove(IDS[20:100])
    index.rebuild()
    assert index.kind == "exact" and sorted(index.ids().tolist()) == IDS[:20].tolist()


@pytest.mark.parametrize("kind", ["exact", "plaid"])
@pytest.mark.parametrize("target", ["plaid", "plaid_index"])
def test_save_load_round_trip_gives_identical_results(docs, queries, tmp_path, kind, target):
    index = make(kind, docs)
    index.remove(IDS[:5])
    before = index.search(queries, 10)
    index.save(tmp_path / target)
    loaded = PlaidIndex.load(tmp_path / target)
    assert (loaded.kind, loaded.dim, len(loaded), loaded.n_tokens) == (kind, DIM, len(index), index.n_tokens)
    for (a_ids, a_scores), (b_ids, b_scores) in zip(before, loaded.search(queries, 10)):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_scores, b_scores)
    loaded.add(np.array([9999]), [docs[0]])  # still writable, with the same codec
    assert len(loaded) == len(index) + 1
    assert not any(p.name.startswith(".") for p in tmp_path.rglob("*"))  # no temp left


def _files(folder):
    """The index folder's files by manifest name (``codes``, ``tail_doclens``, ...)."""
    import json

    entries = json.loads((folder / "manifest.json").read_text())["files"]
    return {name: folder / e["file"] for name, e in entries.items()}


@pytest.mark.parametrize(
    "damage", ["truncate_codes", "truncate_doclens", "flip_byte", "garbage_manifest", "missing_file", "missing"]
)
def test_damaged_folder_raises_index_corrupt_naming_rebuild(docs, tmp_path, damage):
    folder = tmp_path / "plaid"
    make("plaid", docs[:100]).save(folder)
    files = _files(folder)
    if damage == "truncate_codes":
        files["residuals"].write_bytes(files["residuals"].read_bytes()[:-10])
    elif damage == "truncate_doclens":
        files["doclens"].write_bytes(files["doclens"].read_bytes()[:-8])
    elif damage == "flip_byte":
        data = bytearray(files["ivf_docs"].read_bytes())
        data[-3] ^= 0xFF  # a small file: its CRC is checked on opening
        files["ivf_docs"].write_bytes(bytes(data))
    elif damage == "garbage_manifest":
        (folder / "manifest.json").write_bytes(b"PK\x03\x04 nonsense" * 20)
    elif damage == "missing_file":
        files["centroids"].unlink()
    else:
        shutil.rmtree(folder)
    with pytest.raises(IndexCorruptError) as err:
        PlaidIndex.load(folder)
    assert "codesearch index --rebuild" in str(err.value)
    assert str(folder) in str(err.value) and "\n" not in str(err.value)


def _rewrite(file, change) -> None:
    """Rewrite the array in ``file`` with ``change`` applied, and its size, shape and dtype
    kept: a file whose bytes are consistent but wrong, as a fuzzer (or a bug) makes them."""
    a = np.load(file)
    b = change(a.copy())
    assert b.shape == a.shape and b.dtype == a.dtype
    np.save(file, b)


@pytest.mark.parametrize("damage", ["offsets_out_of_order", "tokens_do_not_add_up", "removed_out_of_range"])
def test_consistent_but_wrong_arrays_are_refused_on_opening(docs, tmp_path, monkeypatch, damage):
    from codesearch.indexes import folder as folder_module

    monkeypatch.setattr(folder_module, "CHECKED_BYTES", 0)  # no CRC on opening: the checks alone
    folder = tmp_path / "plaid"
    index = make("plaid", docs[:100])
    index.remove(IDS[:2])
    index.save(folder)
    files = _files(folder)
    if damage == "offsets_out_of_order":
        _rewrite(files["ivf_offsets"], lambda a: a[::-1])
    elif damage == "tokens_do_not_add_up":
        _rewrite(files["doclens"], lambda a: a + 1)
    else:
        _rewrite(files["removed"], lambda a: a + 10**6)
    with pytest.raises(IndexCorruptError):
        PlaidIndex.load(folder)


@pytest.mark.parametrize("damage", ["codes_out_of_range", "list_entries_out_of_range"])
def test_wrong_values_in_the_mapped_arrays_give_answers_not_errors(docs, queries, tmp_path, monkeypatch, damage):
    """Centroid ids and list entries are not scanned on opening (hundreds of MB at scale): a
    value out of range in them is clipped or skipped by a query, never an IndexError."""
    from codesearch.indexes import folder as folder_module

    monkeypatch.setattr(folder_module, "CHECKED_BYTES", 0)
    folder = tmp_path / "plaid"
    make("plaid", docs).save(folder)
    files = _files(folder)
    if damage == "codes_out_of_range":
        _rewrite(files["codes"], lambda a: a | np.uint16(0x8000))
    else:
        _rewrite(files["ivf_docs"], lambda a: a + np.int32(10**6))
    results = PlaidIndex.load(folder).search(queries, 10)
    assert len(results) == len(queries) and all(np.isin(ids, IDS).all() for ids, _ in results)


@pytest.mark.parametrize("kind", ["exact", "plaid"])
def test_a_loaded_index_maps_its_tokens_and_lists_instead_of_reading_them(docs, queries, tmp_path, monkeypatch, kind):
    from codesearch.indexes.plaid import index as plaid_index

    monkeypatch.setattr(plaid_index, "_MIN_TAIL", 100)  # an exact index this small keeps all in its tail
    index = make(kind, docs)
    index.save(tmp_path / "plaid")
    loaded = PlaidIndex.load(tmp_path / "plaid")
    payload = [loaded._codes.base, loaded._residuals.base, loaded._ivf[1]] if kind == "plaid" else [
        loaded._vectors.base]
    assert all(isinstance(a, np.memmap) and not a.flags.writeable for a in payload)
    assert loaded._pos_map is None  # no per-document dict until a change needs one
    for (a_ids, a_scores), (b_ids, b_scores) in zip(index.search(queries, 10), loaded.search(queries, 10)):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_scores, b_scores)


@pytest.mark.parametrize("kind", ["exact", "plaid"])
def test_a_small_change_rewrites_the_tail_not_the_base(docs, queries, tmp_path, monkeypatch, kind):
    from codesearch.indexes.plaid import index as plaid_index

    monkeypatch.setattr(plaid_index, "_MIN_TAIL", 1000)
    folder = tmp_path / "plaid"
    make(kind, docs[:280]).save(folder)
    base = {n: (f, f.stat().st_ino) for n, f in _files(folder).items() if not n.startswith("tail_") and n != "removed"}
    loaded = PlaidIndex.load(folder)
    loaded.remove(IDS[:3])
    loaded.add(IDS[280:], docs[280:])
    loaded.save(folder)
    after = _files(folder)
    assert {n: (after[n], after[n].stat().st_ino) for n in base} == base
    again = PlaidIndex.load(folder)
    assert len(again) == 297 and not np.isin(again.ids(), IDS[:3]).any()
    assert len(list(folder.iterdir())) == len(after) + 1  # the manifest and its files, nothing left over
    fresh = make(kind, docs[:280])
    fresh.remove(IDS[:3])
    fresh.add(IDS[280:], docs[280:])
    for (a_ids, a_scores), (b_ids, b_scores) in zip(fresh.search(queries, 10), again.search(queries, 10)):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_allclose(a_scores, b_scores, rtol=1e-6)


def test_adds_removes_saves_and_loads_agree_with_brute_force_maxsim(docs, tmp_path, monkeypatch):
    """A random run through the tail, removals, folds of the tail into a new base and
    compactions, with a save and load every few steps, checked against brute-force MaxSim
    over what the index should hold (exact mode) and for recall (PLAID)."""
    from codesearch.indexes.plaid import index as plaid_index

    monkeypatch.setattr(plaid_index, "_MIN_TAIL", 200)  # folds at test size
    more = corpus(300, seed=5)
    pool = docs + more
    rng = np.random.default_rng(0)
    for kind in ("exact", "plaid"):
        index = PlaidIndex(DIM, mode=kind)
        twin = PlaidIndex(DIM, mode=kind)  # the same changes, never saved: the same answers
        held: dict[int, int] = {}
        for step in range(24):
            if step < 12 or rng.random() < 0.5:
                # Id i is always document i (upserts re-add it): no two ids tie for a query.
                new = np.unique(rng.integers(0, len(pool), int(rng.integers(5, 60))))
                rows = new
                index.add(new, [pool[r] for r in rows])
                twin.add(new, [pool[r] for r in rows])
                held.update(zip(new.tolist(), rows.tolist()))
            else:
                live = np.array(sorted(held))
                gone = rng.choice(live, min(len(live), int(rng.integers(5, 80))), replace=False)
                index.remove(gone)
                twin.remove(gone)
                for i in gone.tolist():
                    held.pop(i)
            if step % 4 == 3:
                index.save(tmp_path / kind)
                index = PlaidIndex.load(tmp_path / kind)
            ids = np.array(sorted(held), dtype=np.int64)
            assert len(index) == len(ids) and sorted(index.ids().tolist()) == ids.tolist()
            if not len(ids):
                continue
            qs = queries_for([pool[held[i]] for i in ids.tolist()], 10, seed=step)
            truth = oracle(qs, ids, [pool[held[i]] for i in ids.tolist()], 10)
            results = index.search(qs, 10)
            for (a_ids, a_scores), (b_ids, b_scores) in zip(results, twin.search(qs, 10)):
                np.testing.assert_array_equal(a_ids, b_ids)
                np.testing.assert_allclose(a_scores, b_scores, rtol=1e-6)
            # (PLAID's codec is trained on the first few documents here, so its bound is low.)
            got = recall(results, truth, k=min(10, len(ids)))
            assert got >= (0.98 if kind == "exact" else 0.7), (kind, step, got)


def test_the_one_file_format_before_folders_loads_and_the_next_save_writes_a_folder(docs, queries, tmp_path):
    """An index written before folders (one ``index.npz``: arrays and a JSON manifest)
    opens as it is; a save replaces it with the folder's files."""
    import json

    index = make("plaid", docs)
    codec = index._codec
    arrays = {"ids": index._ids, "doclens": index._doclens, "codes": np.asarray(index._codes),
              "residuals": np.asarray(index._residuals), "centroids": codec.centroids, "cutoffs": codec.cutoffs,
              "weights": codec.weights}
    manifest = {"format": 1, "kind": "plaid", "dim": DIM, "n_docs": len(IDS), "n_tokens": index.n_tokens,
                "shapes": {n: list(a.shape) for n, a in arrays.items()}, "params": index._params(),
                "build_error": index.build_error, "added_error_sum": 0.0, "added_tokens": 0}
    folder = tmp_path / "plaid"
    folder.mkdir()
    np.savez(folder / "index.npz", **arrays, manifest=np.frombuffer(json.dumps(manifest).encode(), np.uint8))
    from codesearch.indexes.plaid.files import read_codec

    assert read_codec(folder)[0].fingerprint == codec.fingerprint
    before = index.search(queries, 10)
    loaded = PlaidIndex.load(folder)
    assert [r[0].tolist() for r in loaded.search(queries, 10)] == [r[0].tolist() for r in before]
    loaded.save(folder)
    assert not (folder / "index.npz").exists() and (folder / "manifest.json").is_file()
    assert [r[0].tolist() for r in PlaidIndex.load(folder).search(queries, 10)] == [r[0].tolist() for r in before]
    assert read_codec(folder)[0].fingerprint == codec.fingerprint


@pytest.mark.parametrize("kind", ["exact", "plaid"])
def test_empty_index_and_k_larger_than_size(docs, kind):
    empty = PlaidIndex(DIM, mode=kind)
    assert [len(ids) for ids, _ in empty.search([docs[0]], 5)] == [0]
    index = make(kind, docs[:30])
    ids, scores = index.search([docs[3]], 500)[0]
    if kind == "exact":
        assert sorted(ids.tolist()) == IDS[:30].tolist()  # every document once
    else:  # only the candidates the probed centroids reach, each once
        assert len(set(ids.tolist())) == len(ids) and set(ids.tolist()) <= set(IDS[:30].tolist())
    assert np.all(np.diff(scores) <= 0) and ids[0] == IDS[3]
    index.remove(IDS[:30])
    assert [len(ids) for ids, _ in index.search([docs[0]], 5)] == [0]


@pytest.mark.parametrize("kind", ["exact", "plaid"])
def test_document_without_tokens_is_kept_but_never_returned(docs, kind):
    index = make(kind, docs[:50])
    index.add(np.array([7, 8]), [np.empty((0,), np.float32), np.empty((0, DIM), np.float32)])
    assert len(index) == 52
    ids, _ = index.search([docs[0]], 100)[0]
    assert not np.isin(ids, [7, 8]).any()
    index.remove(np.array([7]))
    assert len(index) == 51


@pytest.mark.parametrize("dim", [32, 33, 48])
def test_codec_round_trip_and_4_bits_beat_2_bits(dim):
    x = _unit(np.random.default_rng(0).standard_normal((2000, dim)))
    errors = {}
    for nbits in (2, 4):
        codec, codes, _ = ResidualCodec.train(x, nbits=nbits, n_centroids=32)
        codes, packed = codec.compress(x, codes)
        assert packed.shape == (2000, -(-dim * nbits // 8)) and packed.dtype == np.uint8
        # Unpacking reproduces the buckets exactly: decode == centroid + weights[bucket].
        buckets = np.searchsorted(codec.cutoffs, x - codec.centroids[codes], side="right")
        expected = _unit(codec.centroids[codes] + codec.weights[buckets])
        np.testing.assert_allclose(codec.decompress(codes, packed), expected, atol=1e-6)
        errors[nbits] = np.linalg.norm(x - expected, axis=1).mean()
    assert errors[4] < 0.6 * errors[2]


@pytest.mark.parametrize(
    "call",
    [
        lambda ix: ix.add(np.arange(2), [np.zeros((3, DIM), np.float32)]),
        lambda ix: ix.add(np.array([1, 1]), [np.zeros((3, DIM), np.float32)] * 2),
        lambda ix: ix.add(np.arange(1), [np.zeros((3, DIM + 1), np.float32)]),
        lambda ix: ix.search([np.zeros((3, DIM + 1), np.float32)], 3),
        lambda ix: ix.search([np.zeros((3, DIM), np.float32)], 0),
        lambda ix: PlaidIndex(DIM, nbits=3),
        lambda ix: PlaidIndex(DIM, mode="fast"),
    ],
    ids=["count_mismatch", "duplicate_ids", "wrong_dim", "query_dim", "k_zero", "nbits", "mode"],
)
def test_bad_arguments_raise_value_error(call):
    with pytest.raises(ValueError):
        call(PlaidIndex(DIM))


def test_empty_index_save_load(tmp_path):
    PlaidIndex().save(tmp_path / "plaid")
    loaded = PlaidIndex.load(tmp_path / "plaid")
    assert len(loaded) == 0 and loaded.dim is None
    assert [len(ids) for ids, _ in loaded.search([np.zeros((2, DIM), np.float32)], 3)] == [0]


def test_training_on_32_points_per_centroid_prints_no_faiss_warning(capfd):
    # 32 sampled points per centroid is the design; faiss's default minimum (39) printed
    # "WARNING clustering ... please provide at least ... training points" on every run.
    vectors = _unit(np.random.default_rng(0).standard_normal((64 * 40, 16)).astype(np.float32))
    ResidualCodec.train(vectors, nbits=2, n_centroids=64)
    assert "WARNING" not in capfd.readouterr().err


def test_per_token_passes_in_steps_give_the_same_index(docs, monkeypatch):
    """Assign, compress and the reconstruction error run in steps of `_STEP` tokens (a 15M
    token publication took 24 GB in one piece): the steps change nothing, bit for bit."""
    from codesearch.indexes.plaid import codec as plaid

    whole = PlaidIndex(DIM, nbits=2, mode="plaid")
    whole.add(np.arange(len(docs) - 5), docs[:-5])
    whole.add(np.arange(len(docs) - 5, len(docs)) + 1000, docs[-5:])  # added after the build
    monkeypatch.setattr(plaid, "_STEP", 7)
    steps = PlaidIndex(DIM, nbits=2, mode="plaid")
    steps.add(np.arange(len(docs) - 5), docs[:-5])
    steps.add(np.arange(len(docs) - 5, len(docs)) + 1000, docs[-5:])
    for name in ("_codes", "_residuals"):
        np.testing.assert_array_equal(getattr(whole, name), getattr(steps, name))
    for name in ("centroids", "cutoffs", "weights"):
        np.testing.assert_array_equal(getattr(whole._codec, name), getattr(steps._codec, name))
    assert whole.build_error == steps.build_error and whole.added_error == steps.added_error


def test_inverted_lists_hold_each_document_once_per_centroid_it_has_a_token_in(docs):
    # Built on the first query of each process (sorted, repeats dropped; not np.unique's
    # hash path, which cost seconds for 2M tokens): checked against the pairs written out.
    index = make("plaid", docs)
    (offsets, listed), = index._inverted_lists()
    starts = np.concatenate(([0], np.cumsum(index._doclens)[:-1]))
    for c in range(len(index._codec.centroids)):
        want = sorted({d for d in range(len(index._ids))
                       if (index._codes[starts[d]:starts[d] + index._doclens[d]] == c).any()})
        assert listed[offsets[c]:offsets[c + 1]].tolist() == want
    assert offsets[-1] == len(listed)


def test_tokens_added_after_a_save_of_documents_without_tokens_load(docs, tmp_path):
    index = PlaidIndex(DIM, mode="exact")
    index.add(np.array([1]), [np.empty((0, DIM), np.float32)])
    index.save(tmp_path / "plaid")
    loaded = PlaidIndex.load(tmp_path / "plaid")
    loaded.add(IDS[:5], docs[:5])
    loaded.save(tmp_path / "plaid")  # the base (of no tokens) kept, the tokens in the tail
    again = PlaidIndex.load(tmp_path / "plaid")
    assert len(again) == 6 and again.search([docs[2]], 1)[0][0][0] == IDS[2]


def test_a_query_reads_at_most_the_probe_budget_and_an_ample_budget_changes_nothing(docs, queries, truth, monkeypatch):
    from codesearch.indexes.plaid import search as plaid_search

    index = make("plaid", docs)
    before = index.search(queries, 10)
    read: list[int] = []
    probe = plaid_search.PlaidSearch._within_budget

    def counted(self, probed, centroid_scores):
        kept = probe(self, probed, centroid_scores)
        read.append(sum(int((off[kept + 1] - off[kept]).sum()) for off, _ in self._inverted_lists()))
        return kept

    monkeypatch.setattr(plaid_search.PlaidSearch, "_within_budget", counted)
    monkeypatch.setattr(plaid_search, "PROBE_BUDGET", 10**9)
    for (a_ids, a_scores), (b_ids, b_scores) in zip(index.search(queries, 10), before):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_scores, b_scores)
    ample = max(read)
    read.clear()
    # A budget of a quarter of what the queries read: each reads no more (past its first
    # `MIN_PROBE` ranks), and recall holds most of what it was.
    monkeypatch.setattr(plaid_search, "PROBE_BUDGET", ample // 4)
    monkeypatch.setattr(plaid_search, "MIN_PROBE", 1)
    tight = index.search(queries, 10)
    assert max(read) <= ample // 4
    assert recall(tight, truth) >= 0.7


def test_big_token_arrays_are_read_from_their_files_with_the_same_answers(docs, queries, tmp_path, monkeypatch):
    from codesearch.indexes import folder as index_folder

    make("plaid", docs).save(tmp_path / "p")
    mapped = PlaidIndex.load(tmp_path / "p")
    monkeypatch.setattr(index_folder, "SOURCE_MIN_BYTES", 0)
    read = PlaidIndex.load(tmp_path / "p")
    assert read._codes._source is not None and read._residuals._source is not None
    assert read._ivf_reader is not None and read._ivf_reader[0] is read._ivf[1]  # the lists too
    assert read._ivf_reader[1]._source is not None
    assert mapped._codes._source is None and mapped._ivf_reader is None
    rows = np.r_[5:40, 100:101, 7:9, 300:350, 0:3]  # runs, out of order, one row alone
    for name in ("_codes", "_residuals"):
        np.testing.assert_array_equal(getattr(read, name).take(rows), getattr(mapped, name).take(rows))
    for (a_ids, a_scores), (b_ids, b_scores) in zip(read.search(queries, 10), mapped.search(queries, 10)):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_scores, b_scores)


def test_a_token_file_cut_short_after_opening_is_a_corrupt_index_in_one_line(docs, queries, tmp_path, monkeypatch):
    from codesearch.indexes import folder as index_folder

    make("plaid", docs).save(tmp_path / "p")
    monkeypatch.setattr(index_folder, "SOURCE_MIN_BYTES", 0)
    index = PlaidIndex.load(tmp_path / "p")
    residuals = next(f for f in (tmp_path / "p").iterdir() if f.name.startswith("residuals"))
    os.truncate(residuals, 256)  # (read by descriptor, not through the mapping: no SIGBUS)
    with pytest.raises(IndexCorruptError) as got:
        index.search(queries, 10)
    message = str(got.value)
    assert "\n" not in message and residuals.name in message and "codesearch index --rebuild" in message
