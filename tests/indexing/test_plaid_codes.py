"""Which codec a run sends to its workers (codesearch.indexing.codes.plan_codes): the stored
index's, one trained on a sample that goes first, or none."""

from __future__ import annotations

import numpy as np
import pytest

from codesearch.indexes.plaid import PlaidIndex
from codesearch.indexing import codes


class Workers:
    """The face of an encoder that computes elsewhere and compresses (RayEncoder's)."""

    multivector = offloaded = True
    max_length = 512

    def __init__(self):
        self.codecs = []

    def set_codec(self, codec):
        self.codecs.append(codec)

    def codes_for(self, texts):
        return None


def _items(n, chars=400):
    return [((0, i), "colbert", f"h{i}", chars, i) for i in range(n)]


def test_an_index_that_is_plaid_sends_its_stored_codec(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.standard_normal((20, 16)).astype(np.float32) for _ in range(30)]
    docs = [d / np.linalg.norm(d, axis=1, keepdims=True) for d in docs]
    index = PlaidIndex(16, mode="plaid", n_centroids=8)
    index.add(np.arange(30), docs)
    index.save(tmp_path / "plaid")
    enc = Workers()
    run, items = codes.plan_codes(tmp_path, enc, _items(3))
    assert run is not None and run.ready and items == _items(3)  # no sample: the order stays
    assert [c.fingerprint for c in enc.codecs] == [index._codec.fingerprint] == [run.book.codec.fingerprint]
    assert run.book.error == index.build_error


@pytest.mark.parametrize("n, engaged", [(100, False), (20_000, False), (40_000, True)])
def test_a_large_first_index_samples_first_and_a_small_one_does_not(tmp_path, monkeypatch, n, engaged):
    monkeypatch.setitem(PlaidIndex.__init__.__kwdefaults__, "exact_threshold", 20_000)
    enc = Workers()
    run, items = codes.plan_codes(tmp_path, enc, _items(n))
    assert (run is not None) == engaged and not enc.codecs  # the codec comes after the sample
    if engaged:
        # 100 tokens a text, 4M tokens: 2^14 centroids (the cap), 96 sample tokens each; at
        # 2M tokens the sample would have been most of the texts (no codes: the driver trains)
        sample = {it[2] for it in items[: len(run._sample)]}
        assert sample == run._sample and len(sample) == -(-96 * 2**14 // 100)
        assert sorted(items) == sorted(_items(n)) and not run.ready


def test_a_codec_adopted_from_the_cache_goes_to_the_workers_with_its_codes(tmp_path):
    """A first index whose texts another copy coded (`cachedcodes`): no sample, no k-means;
    the workers get the cached codec, and the book already holds the cached codes."""
    from codesearch.indexes.plaid.coded import CodeBook

    rng = np.random.default_rng(0)
    docs = [rng.standard_normal((20, 16)).astype(np.float32) for _ in range(30)]
    index = PlaidIndex(16, mode="plaid", n_centroids=8)
    index.add(np.arange(30), [d / np.linalg.norm(d, axis=1, keepdims=True) for d in docs])
    known = CodeBook(index.codec, index.build_error)
    enc = Workers()
    run, items = codes.plan_codes(tmp_path, enc, _items(40_000), known)
    assert run is not None and run.book is known and run.ready and items == _items(40_000)
    assert [c.fingerprint for c in enc.codecs] == [index.codec.fingerprint]


def test_the_hold_ends_with_the_sample_coded_and_each_sample_token_assigned_once(monkeypatch):
    # While the stream holds, the driver assigned the training tokens (for the residual
    # buckets), the held-out fifth (for the error) and then the whole sample again (for its
    # codes). Now the buckets come from a sample of rows and the error from the sample's codes.
    from codesearch.indexes.plaid import codec as codec_module
    from codesearch.indexes.plaid import coded
    from codesearch.indexes.plaid.coded import CodeBook

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((int(rng.integers(5, 30)), 16)).astype(np.float32) for _ in range(40)]
    arrays = [a / np.linalg.norm(a, axis=1, keepdims=True) for a in arrays]
    hashes = [f"h{i}" for i in range(40)]
    assigned, real = [], codec_module._assign
    monkeypatch.setattr(codec_module, "_assign", lambda c, v: assigned.append(len(v)) or real(c, v))
    enc = Workers()
    run = codes.RunCodes(enc, CodeBook(), set(hashes), n_centroids=8)
    run.take(["t"] * 40, hashes, ["colbert"] * 40, arrays)
    run.hold(lambda: None)
    n_assigned = sum(assigned)
    assert run.ready and len(enc.codecs) == 1 and len(run.book) == 40
    codec = enc.codecs[0]
    got = run.book.coded(hashes)
    for doc, want in zip(got.docs, coded.compress_documents(codec, arrays)):
        np.testing.assert_array_equal(doc.codes, want.codes)
        np.testing.assert_array_equal(doc.packed, want.packed)
    # The buckets' rows (here every trained token: fewer than 4M values), then the sample once;
    # before, every sample token twice (trained or held out) and then once more.
    tokens = sum(len(a) for a in arrays)
    assert n_assigned < 2 * tokens
    # The error the drift check starts from: that of the fifth of the sample k-means did not see.
    _, held = coded.fit_on_sample(arrays, nbits=4, n_centroids=8)
    assert held.sum() == 8
    assert got.error == pytest.approx(coded.train_on_sample(arrays, nbits=4, n_centroids=8)[1])
