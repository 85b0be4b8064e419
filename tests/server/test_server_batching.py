"""Query micro-batching over real (tiny) encoders: concurrent queries share forward
passes and each caller gets exactly its own row."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from codesearch.server.batching import QueryBatcher, batched_encoders, batcher_for

QUERIES = [f"retry failed request number {i} with backoff" for i in range(24)]


@pytest.fixture(scope="module", params=["single_vector_dir", "colbert_dir"])
def encoder(request):
    from codesearch.encoder import load

    return load(str(request.getfixturevalue(request.param)), device="cpu")


def test_concurrent_queries_get_their_own_rows_from_fewer_passes(encoder):
    batcher = QueryBatcher(encoder, max_batch=8)
    expected = [encoder.encode([q], kind="query") for q in QUERIES]
    results: dict[int, object] = {}
    start = threading.Barrier(len(QUERIES))

    def one(i: int) -> None:
        start.wait()
        results[i] = batcher.encode([QUERIES[i]], kind="query")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(QUERIES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert batcher.queries == len(QUERIES)
    assert batcher.batches < len(QUERIES)  # some queries shared a pass
    for i, want in enumerate(expected):
        got = results[i]
        if isinstance(want, np.ndarray):
            assert got.shape == want.shape == (1, encoder.dim)
            np.testing.assert_allclose(got, want, atol=1e-4)
        else:
            assert len(got) == len(want) == 1
            np.testing.assert_allclose(got[0], want[0], atol=1e-4)


def test_documents_and_attributes_pass_straight_through(encoder):
    batcher = QueryBatcher(encoder)
    docs = ["def a():\n    return 1\n", "class B:\n    pass\n"]
    want = encoder.encode(docs, kind="document")
    got = batcher.encode(docs, kind="document")
    if isinstance(want, np.ndarray):
        np.testing.assert_array_equal(got, want)
    else:
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert batcher.batches == 0
    assert (batcher.identity, batcher.dim, batcher.multivector) == (encoder.identity, encoder.dim, encoder.multivector)


def test_an_encoder_failure_reaches_every_waiter():
    class Broken:
        def encode(self, texts, kind="document"):
            raise RuntimeError("boom")

    batcher = QueryBatcher(Broken())
    with pytest.raises(RuntimeError, match="boom"):
        batcher.encode(["q"], kind="query")
    # and the batcher is usable afterwards (not stuck busy)
    with pytest.raises(RuntimeError, match="boom"):
        batcher.encode(["q"], kind="query")


def test_one_batcher_per_encoder_and_encoders_copy(encoder):
    from codesearch.encoder.base import Encoders

    assert batcher_for(encoder) is batcher_for(encoder)
    assert batcher_for(None) is None
    wrapped = batched_encoders(Encoders(dense=None if encoder.multivector else encoder,
                                        multi=encoder if encoder.multivector else None))
    role = "multi" if encoder.multivector else "dense"
    assert getattr(wrapped, role) is batcher_for(encoder)
