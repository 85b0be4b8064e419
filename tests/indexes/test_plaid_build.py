"""A PLAID base built into its folder a block at a time (`PlaidIndex.fill`, streamed folds)
against the in-memory build, brute-force MaxSim and its own memory bounds."""

from __future__ import annotations

import numpy as np
import pytest
from test_plaid import DIM, corpus, queries_for, recall

from codesearch.indexes.plaid import PlaidIndex, maxsim_search
from codesearch.indexes.plaid import build as plaid_build
from codesearch.indexes.plaid import index as plaid_index
from codesearch.indexes.plaid.coded import Coded, train_on_sample
from codesearch.indexes.plaid.search import inverted_lists

pytestmark = pytest.mark.usefixtures("one_faiss_thread")


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks, runs and merges of a few hundred tokens: every loop of the build runs many times."""
    monkeypatch.setattr(plaid_build, "BLOCK_TOKENS", 300)
    monkeypatch.setattr(plaid_build, "IVF_BLOCK_TOKENS", 700)
    monkeypatch.setattr(plaid_build, "MERGE_ENTRIES", 250)


@pytest.fixture(scope="module")
def texts():
    """Token vectors as the store keeps them (float16), which a build compresses as they are."""
    return [d.astype(np.float16).astype(np.float32) for d in corpus(200, seed=3)]


@pytest.fixture(scope="module")
def collection(texts):
    """600 documents of 200 texts (copies of a text share its vectors, as chunks of one text
    share the store's): ids, token counts, keys, arrays."""
    which = np.random.default_rng(7).integers(0, len(texts), 600)
    ids = np.arange(600, dtype=np.int64) * 3 + 5
    docs = [texts[w] for w in which]
    return ids, np.array([len(d) for d in docs]), [f"text{w}" for w in which], docs


class Reads:
    """``fetch`` over ``collection``, recording the ids of each call."""

    def __init__(self, ids, docs) -> None:
        self.pos = {int(i): n for n, i in enumerate(ids)}
        self.docs, self.calls = docs, []

    def __call__(self, batch):
        self.calls.append(np.asarray(batch).tolist())
        return [self.docs[self.pos[int(i)]] for i in batch]


def _filled(tmp_path, collection, **kw) -> tuple[PlaidIndex, Reads]:
    ids, lens, keys, docs = collection
    index = PlaidIndex(DIM, exact_threshold=1000)
    index.lists_dir = tmp_path / "plaid"
    reads = Reads(ids, docs)
    assert index.fill(ids, lens, keys, reads, **kw)
    return index, reads


def test_a_fill_under_a_codec_is_the_in_memory_build_byte_for_byte(tmp_path, collection, texts, small_blocks):
    ids, _, _, docs = collection
    codec = train_on_sample(texts[:80], nbits=4, n_centroids=64)
    filled, _ = _filled(tmp_path, collection, codec=codec)
    memory = PlaidIndex(DIM, exact_threshold=1000)
    memory.add(ids, docs, coded=Coded(*codec, [None] * len(docs)))
    np.testing.assert_array_equal(filled.ids(), memory.ids())
    np.testing.assert_array_equal(np.asarray(filled._codes.base), np.asarray(memory._codes.base))
    np.testing.assert_array_equal(np.asarray(filled._residuals.base), np.asarray(memory._residuals.base))
    offsets, lists = inverted_lists(np.asarray(memory._codes.base), memory._doclens, 64)
    np.testing.assert_array_equal(filled._ivf[0], offsets)  # the runs merged: the lists made in memory
    np.testing.assert_array_equal(np.asarray(filled._ivf[1]), lists)
    assert filled.build_error == codec[1]
    queries = queries_for(docs, 20)
    for (a, sa), (b, sb) in zip(filled.search(queries, 10), memory.search(queries, 10)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(sa, sb)


def test_a_fill_reads_each_text_once_a_block_at_a_time_and_maps_what_it_wrote(tmp_path, collection, small_blocks):
    ids, lens, keys, docs = collection
    index, reads = _filled(tmp_path, collection)
    n_centroids = len(index.codec.centroids)
    sample, *blocks = reads.calls
    sampled = sum(int(lens[reads.pos[i]]) for i in sample)
    assert sampled <= plaid_build.SAMPLE_TOKENS_PER_CENTROID * n_centroids + int(lens.max())
    for batch in blocks:  # what a block holds: its texts' tokens, one text over the budget alone
        assert len(batch) == 1 or sum(int(lens[reads.pos[i]]) for i in batch) <= plaid_build.BLOCK_TOKENS
    read = [i for batch in blocks for i in batch]
    assert sorted(keys[reads.pos[i]] for i in read) == sorted(set(keys))  # each text read once
    assert all(isinstance(a, np.memmap) for a in (index._codes.base, index._residuals.base, index._ivf[1]))
    by_key = {}
    for doc_id, (codes, packed) in index.doc_codes(ids).items():  # a text's copies: its codes
        by_key.setdefault(keys[reads.pos[doc_id]], set()).add((codes.tobytes(), packed.tobytes()))
    assert all(len(v) == 1 for v in by_key.values())
    queries = queries_for(docs, 40)
    assert recall(index.search(queries, 10), maxsim_search(queries, ids, docs, 10)) >= 0.8


def test_a_streamed_fold_and_compaction_agree_with_the_same_changes_in_memory(tmp_path, collection, small_blocks,
                                                                            monkeypatch):
    monkeypatch.setattr(plaid_index, "_MIN_TAIL", 200)  # folds at test size
    ids = collection[0]
    index, _ = _filled(tmp_path, collection)
    twin = PlaidIndex.load(tmp_path / "plaid")  # the same index, changed in memory
    more = corpus(120, seed=11)
    new_ids = np.arange(10_000, 10_120, dtype=np.int64)
    folds = []
    monkeypatch.setattr(plaid_build, "compact", lambda *a, real=plaid_build.compact: (
        folds.append(len(a[1])), real(*a))[1])
    for one in (index, twin):
        one.add(new_ids[:60], more[:60])
        one.remove(ids[:400])  # past a quarter dead: a compaction
        one.add(new_ids[60:], more[60:])
    assert folds and index._base_docs == len(index) - len(index._ids[index._base_docs:])
    index.save(tmp_path / "plaid")
    again = PlaidIndex.load(tmp_path / "plaid")
    assert sorted(again.ids().tolist()) == sorted(twin.ids().tolist())
    queries = queries_for(more, 20)
    for (a, sa), (b, sb), (c, _) in zip(again.search(queries, 10), twin.search(queries, 10),
                                         index.search(queries, 10)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
        np.testing.assert_allclose(sa, sb, rtol=1e-6)
    names = {p.name.split(".")[0] for p in (tmp_path / "plaid").iterdir()}
    assert "ivf-runs" not in names and len(list((tmp_path / "plaid").iterdir())) == 15  # 14 arrays, a manifest


def test_a_fill_whose_reads_disagree_leaves_the_index_and_its_folder_as_they_were(tmp_path, collection):
    ids, lens, keys, docs = collection
    index = PlaidIndex(DIM, exact_threshold=1000)
    index.add(ids[:5], docs[:5])
    index.lists_dir = tmp_path / "plaid"
    wrong = lens.copy()
    wrong[len(wrong) // 2] += 1  # the store changed between its reads
    assert not index.fill(ids, wrong, keys, Reads(ids, docs))
    assert index.kind == "exact" and index.ids().tolist() == ids[:5].tolist()
    assert not (tmp_path / "plaid").exists() or not list((tmp_path / "plaid").iterdir())


@pytest.mark.parametrize("why", ["no folder", "below the threshold"])
def test_a_fill_that_does_not_apply_says_so(tmp_path, collection, why):
    ids, lens, keys, docs = collection
    index = PlaidIndex(DIM, exact_threshold=10**9 if why == "below the threshold" else 1000)
    if why != "no folder":
        index.lists_dir = tmp_path / "plaid"
    assert not index.fill(ids, lens, keys, Reads(ids, docs)) and len(index) == 0


def test_an_array_file_written_out_of_order_opens_as_the_array_saved_whole(tmp_path):
    from codesearch.indexes.folder import ArrayFile, read_folder, write_folder

    array = np.random.default_rng(0).integers(0, 255, (1000, 24)).astype(np.uint8)
    streamed = ArrayFile(tmp_path / "f", "residuals", np.uint8, array.shape)
    for start in np.random.default_rng(1).permutation(np.arange(0, 1000, 100)).tolist():
        streamed.write(start, array[start : start + 100])
    with pytest.raises(ValueError):
        streamed.write(950, array[:100])  # past the end: refused, not grown
    np.testing.assert_array_equal(streamed.read(250, np.empty((10, 24), np.uint8)), array[250:260])
    kept = streamed.finish()
    whole = write_folder(tmp_path / "g", {}, {"residuals": array})["residuals"]
    assert {k: v for k, v in kept.entry.items() if k != "file"} == {k: v for k, v in whole.items() if k != "file"}
    write_folder(tmp_path / "f", {"n": 1}, {"residuals": kept})
    np.testing.assert_array_equal(read_folder(tmp_path / "f", "test", verify=True).arrays["residuals"], array)
    left = ArrayFile(tmp_path / "f", "codes", np.uint16, (10,))
    left.discard()
    assert not left.path.exists()


def test_documents_of_no_tokens_and_given_codes_that_do_not_fit_are_built_as_in_memory(tmp_path, collection, texts,
                                                                                      small_blocks):
    ids, lens, keys, docs = collection
    docs = [d[:0] if n % 50 == 0 else d for n, d in enumerate(docs)]  # (a text of no tokens: stored, never found)
    keys = [f"empty{n}" if n % 50 == 0 else k for n, k in enumerate(keys)]
    lens = np.array([len(d) for d in docs])
    codec = train_on_sample(texts[:80], nbits=4, n_centroids=64)
    real = {k: codec[0].compress_documents([d])[0] for k, d in zip(keys, docs)}
    short = {k: type(c)(c.codes, c.packed[:-1], c.error) for k, c in real.items() if len(c.codes)}  # a row short
    index = PlaidIndex(DIM, exact_threshold=1000)
    index.lists_dir = tmp_path / "plaid"
    assert index.fill(ids, lens, keys, Reads(ids, docs), codec=codec, given=lambda t: [short.get(k) for k in t])
    memory = PlaidIndex(DIM, exact_threshold=1000)
    memory.add(ids, docs, coded=Coded(*codec, [None] * len(docs)))
    np.testing.assert_array_equal(np.asarray(index._codes.base), np.asarray(memory._codes.base))
    np.testing.assert_array_equal(np.asarray(index._residuals.base), np.asarray(memory._residuals.base))
    assert len(index) == len(ids) and index.n_tokens == int(lens.sum())


def test_a_refill_reads_only_the_texts_the_index_does_not_hold(tmp_path, collection, texts, small_blocks):
    ids, lens, keys, docs = collection
    codec = train_on_sample(texts[:80], nbits=4, n_centroids=64)
    held_keys = set(keys[:300])
    own = {k: codec[0].compress_documents([d])[0] for k, d in zip(keys, docs) if k in held_keys}
    kept = []
    index = PlaidIndex(DIM, exact_threshold=1000)
    index.lists_dir = tmp_path / "plaid"
    reads = Reads(ids, docs)
    assert index.fill(ids, lens, keys, reads, codec=codec, held=lambda t: [own.get(k) for k in t], keep_drift=True,
                      wants=lambda t: [True] * len(t),
                      keep=lambda made, got, hashes, arrays: kept.extend(hashes.values()))
    read = {keys[reads.pos[i]] for batch in reads.calls for i in batch}
    assert read == set(keys) - held_keys and set(kept) == read  # the held ones neither read nor kept again
    fresh = [n for n, k in enumerate(keys) if k not in held_keys]
    assert index._added_tokens == int(lens[fresh].sum())  # what was coded anew counts in the drift check
