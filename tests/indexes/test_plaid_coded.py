"""PLAID codes made away from the index (the run's workers): the same codes,
the same search, and a sound drift rule when the codec was trained on a sample."""

from __future__ import annotations

import numpy as np
import pytest

from codesearch.indexes.plaid import PlaidIndex
from codesearch.indexes.plaid.coded import CodeBook, Coded, compress_documents, train_on_sample
from tests.indexes.test_plaid import DIM, IDS, N_TOPICS, corpus, oracle, queries_for, recall

pytestmark = pytest.mark.usefixtures("one_faiss_thread")


def _f16(docs):
    """The vectors as the store gives them back (float16)."""
    return [d.astype(np.float16).astype(np.float32) for d in docs]


@pytest.fixture(scope="module")
def docs():
    return _f16(corpus(300))


@pytest.fixture(scope="module")
def sampled(docs):
    """A codec trained on a uniform sample of the documents: ~40 tokens per centroid, as a run samples."""
    pick = np.random.default_rng(5).choice(len(docs), 90, replace=False)
    return train_on_sample([docs[i] for i in pick], nbits=4, n_centroids=64)


def _worker_codes(codec, docs, seed):
    """Codes as workers make them: documents in random batches of 1-17."""
    rng = np.random.default_rng(seed)
    out, at = [], 0
    while at < len(docs):
        n = int(rng.integers(1, 18))
        out += compress_documents(codec, docs[at : at + n])
        at += n
    return out


def test_worker_codes_equal_the_index_own_codes_and_search_the_same(docs, sampled):
    codec, error = sampled
    # The index compresses every document itself (no codes given) ...
    driver = PlaidIndex(DIM, mode="plaid")
    driver.add(IDS, docs, coded=Coded(codec, error, [None] * len(docs)))
    # ... or takes the workers' codes, made in batches of other sizes.
    workers = PlaidIndex(DIM, mode="plaid")
    workers.add(IDS, docs, coded=Coded(codec, error, _worker_codes(codec, docs, seed=1)))
    assert driver._codec is codec and workers._codec is codec
    np.testing.assert_array_equal(workers._codes, driver._codes)
    np.testing.assert_array_equal(workers._residuals, driver._residuals)
    # Later adds too, and the drift bookkeeping.
    more = _f16(corpus(60, seed=3))
    ids = np.arange(5000, 5060)
    driver.add(ids, more)
    workers.add(ids, more, coded=Coded(codec, error, _worker_codes(codec, more, seed=2)))
    np.testing.assert_array_equal(workers._codes, driver._codes)
    np.testing.assert_array_equal(workers._residuals, driver._residuals)
    assert workers.added_error == pytest.approx(driver.added_error, rel=1e-5)
    assert workers.build_error == driver.build_error == error
    queries = queries_for(docs)
    for (a, sa), (b, sb) in zip(workers.search(queries, 10), driver.search(queries, 10)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(sa, sb)


def test_codes_of_another_codec_are_not_taken(docs, sampled):
    codec, error = sampled
    other, _ = train_on_sample(docs[100:160], nbits=4, n_centroids=64, seed=3)
    index = PlaidIndex(DIM, mode="plaid")
    index.add(IDS[:200], docs[:200], coded=Coded(codec, error, [None] * 200))
    wrong = Coded(other, error, compress_documents(other, docs[200:]))
    index.add(IDS[200:], docs[200:], coded=wrong)
    expect = PlaidIndex(DIM, mode="plaid")
    expect.add(IDS, docs, coded=Coded(codec, error, [None] * 300))
    np.testing.assert_array_equal(index._codes, expect._codes)


def test_a_small_index_stays_exact_and_ignores_codes(docs, sampled):
    codec, error = sampled
    index = PlaidIndex(DIM)  # auto: 2^18 tokens before PLAID
    index.add(IDS, docs, coded=Coded(codec, error, compress_documents(codec, docs)))
    assert index.kind == "exact"
    queries = queries_for(docs)
    truth = oracle(queries, IDS, docs, 10)
    assert recall(index.search(queries, 10), truth) == 1.0


def test_crossing_the_threshold_takes_the_sampled_codec(docs, sampled):
    codec, error = sampled
    index = PlaidIndex(DIM, exact_threshold=3000)
    index.add(IDS[:50], docs[:50])
    assert index.kind == "exact"
    index.add(IDS[50:], docs[50:], coded=Coded(codec, error, compress_documents(codec, docs[50:])))
    assert index.kind == "plaid" and index._codec is codec and index.build_error == error
    expect = PlaidIndex(DIM, mode="plaid")
    expect.add(IDS, docs, coded=Coded(codec, error, [None] * 300))
    np.testing.assert_array_equal(index._codes, expect._codes)


def test_a_sampled_codec_searches_about_as_well_and_its_drift_rule_holds(docs, sampled):
    codec, error = sampled
    queries = queries_for(docs)
    truth = oracle(queries, IDS, docs, 10)
    full = PlaidIndex(DIM, mode="plaid", n_centroids=64)
    full.add(IDS, docs)  # trained on everything, on the driver
    sample = PlaidIndex(DIM, mode="plaid")
    sample.add(IDS, docs, coded=Coded(codec, error, compress_documents(codec, docs)))
    assert recall(sample.search(queries, 10), truth) >= recall(full.search(queries, 10), truth) - 0.05
    # The held-out error of the sample stands for the whole collection: no false alarm on
    # the same distribution, an alarm on documents around topics the sample never saw.
    flat = np.concatenate(docs)
    assert sample.build_error == pytest.approx(float(codec.error(flat, *codec.compress(flat)).mean()), rel=0.15)
    assert not sample.needs_rebuild
    sample.add(np.arange(5000, 5100), _f16(corpus(100, seed=11)))
    assert not sample.needs_rebuild
    shifted = _f16(corpus(50, seed=7, topics=np.random.default_rng(99).standard_normal((N_TOPICS, DIM))))
    sample.add(np.arange(6000, 6050), shifted)
    assert sample.needs_rebuild


def test_code_book_keeps_only_its_codec_codes(docs, sampled):
    codec, error = sampled
    book = CodeBook()
    assert book.coded(["a"]) is None and not book.ready.is_set()
    d = compress_documents(codec, docs[:2])
    assert book.put(codec.fingerprint, zip("ab", d)) == 0  # no codec yet
    book.set_codec(codec, error)
    assert book.put("4:other", zip("ab", d)) == 0
    assert book.put(codec.fingerprint, zip("ab", d)) == 2
    coded = book.coded(["b", None, "c"])
    assert coded.docs[0] is d[1] and coded.docs[1] is None and coded.docs[2] is None
    book.drop(["a", "b"])
    assert len(book) == 0


@pytest.mark.parametrize("n_docs", [45, 90])
def test_the_sample_error_stands_for_the_collection(docs, n_docs):
    # Held out by whole documents: a document's tokens share its topics, so tokens held out
    # of trained documents fit better than the collection (0.08 against 0.13 at 45 documents
    # when tokens were held out), and the drift check would have trusted a poor sample.
    pick = np.random.default_rng(5).choice(len(docs), n_docs, replace=False)
    codec, error = train_on_sample([docs[i] for i in pick], nbits=4, n_centroids=64)
    flat = np.concatenate(docs)
    every = float(codec.error(flat, *codec.compress(flat)).mean())
    assert error == pytest.approx(every, rel=0.15)
    index = PlaidIndex(DIM, mode="plaid")
    index.add(IDS, docs, coded=Coded(codec, error, compress_documents(codec, docs)))
    assert index.build_error == error and not index.needs_rebuild


def test_a_codec_for_the_workers_decodes_as_well_as_one_that_coded_every_vector():
    # codes=False (fit_on_sample) fits the residual buckets on sampled rows instead of
    # assigning every vector: the buckets must still be those of new vectors, not of k-means's
    # own points (a first cut took most of its rows from them).
    from codesearch.indexes.plaid.codec import ResidualCodec

    rng = np.random.default_rng(1)
    topics = rng.standard_normal((200, 48)).astype(np.float32)
    x = topics[rng.integers(0, 200, 200_000)] + 0.6 * rng.standard_normal((200_000, 48)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    every, codes, _ = ResidualCodec.train(x, nbits=4, n_centroids=2048)
    fitted, none, _ = ResidualCodec.train(x, nbits=4, n_centroids=2048, codes=False)
    assert none is None and len(codes) == len(x)
    np.testing.assert_array_equal(fitted.centroids, every.centroids)  # the same k-means
    new = x[-50_000:]
    err = [float(c.error(new, *c.compress(new)).mean()) for c in (every, fitted)]
    assert err[1] == pytest.approx(err[0], rel=0.005)


def _stand_ins(docs, taken):
    """What a caller may pass for the documents ``coded_only`` marks: their shape, no data
    (NaN: a read of them would show in the codes)."""
    return [np.full(d.shape, np.nan, np.float32) if t else d for d, t in zip(docs, taken)]


@pytest.mark.parametrize("mode, threshold", [("auto", 10**9), ("exact", 0), ("auto", 1), ("plaid", 0)])
def test_coded_only_marks_exactly_the_documents_an_add_does_not_read(docs, sampled, mode, threshold):
    codec, error = sampled
    given = compress_documents(codec, docs)
    given = [None if i % 4 == 0 else d for i, d in enumerate(given)]
    given[1] = compress_documents(codec, [docs[1][:-1]])[0]  # codes of another length: not taken
    coded = Coded(codec, error, given)
    lens = np.array([len(d) for d in docs])
    index = PlaidIndex(DIM, mode=mode, exact_threshold=threshold)
    taken = index.coded_only(IDS, lens, coded)
    if index._should_be_plaid(int(lens.sum())):
        assert taken.tolist() == [i % 4 != 0 and i != 1 for i in range(len(docs))]
    else:  # an exact index holds the vectors themselves
        assert not taken.any()
    full = PlaidIndex(DIM, mode=mode, exact_threshold=threshold)
    full.add(IDS, docs, coded=coded)
    index.add(IDS, _stand_ins(docs, taken), coded=coded)
    for attr in ("_ids", "_doclens", "_codes", "_residuals", "_vectors"):
        a, b = getattr(index, attr), getattr(full, attr)
        assert (a is None and b is None) or np.array_equal(a, b), attr
    # An add to a PLAID index under another codec computes every code itself.
    if index.kind == "plaid":
        other = Coded(train_on_sample(docs[:50], nbits=4, n_centroids=16)[0], error, given)
        assert not index.coded_only(IDS[:5], lens[:5], other).any()
        assert index.coded_only(IDS[:5], lens[:5], coded).tolist() == [False, False, True, True, False]


@pytest.mark.parametrize("crosses", [True, False])
def test_coded_only_counts_the_documents_an_add_replaces(docs, sampled, crosses):
    """An exact index that an add makes PLAID takes the codes; whether it crosses the
    threshold counts the tokens of the documents the add replaces once."""
    codec, error = sampled
    lens = np.array([len(d) for d in docs])
    new = slice(100, None)
    after = int(lens.sum())  # the replaced 100..149 counted once
    threshold = after if crosses else after + 1
    given = [None if i % 3 == 0 else d for i, d in enumerate(compress_documents(codec, docs[new]))]
    coded = Coded(codec, error, given)
    index, full = (PlaidIndex(DIM, exact_threshold=threshold) for _ in range(2))
    for x in (index, full):
        x.add(IDS[:150], docs[:150])
        assert x.kind == "exact"
    taken = index.coded_only(IDS[new], lens[new], coded)
    assert taken.any() == crosses
    full.add(IDS[new], docs[new], coded=coded)
    index.add(IDS[new], _stand_ins(docs[new], taken), coded=coded)
    assert index.kind == full.kind == ("plaid" if crosses else "exact")
    for attr in ("_ids", "_doclens", "_codes", "_residuals", "_vectors"):
        a, b = getattr(index, attr), getattr(full, attr)
        assert (a is None and b is None) or np.array_equal(a, b), attr
