"""The Encoder protocol: what the local model, the server's query batcher and the Ray backend
share, so that no caller asks an encoder what it is."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from codesearch.encoder import load
from codesearch.encoder.base import BatchEncoder, Encoder, Encoders, encode_stream
from codesearch.server.batching import QueryBatcher

PROTOCOL = ("name", "identity", "dim", "max_length", "multivector", "offloaded", "batch_tokens")


@pytest.fixture(scope="module")
def encoders(single_vector_dir, colbert_dir):
    return load(str(single_vector_dir), device="cpu"), load(str(colbert_dir), device="cpu")


def test_the_local_encoder_and_the_query_batcher_are_encoders(encoders):
    for enc in encoders:
        batcher = QueryBatcher(enc)
        for obj in (enc, batcher):
            assert isinstance(obj, Encoder)
        assert [getattr(batcher, a) for a in PROTOCOL] == [getattr(enc, a) for a in PROTOCOL]
        assert batcher.describe() == enc.describe() == f"local cpu ({str(enc.dtype).removeprefix('torch.')})"
        assert batcher.count_tokens(["def f(): pass"]) == enc.count_tokens(["def f(): pass"])
        assert batcher.token_counter()("def f(): pass") == enc.count_tokens(["def f(): pass"])[0]
        assert enc.offloaded is False


def test_a_stream_is_one_encode_per_batch_unless_the_encoder_streams_itself(encoders):
    dense = encoders[0]
    batches = [["def a(): pass"], ["def b(): pass", "class C: pass"]]
    out = list(encode_stream(dense, iter(batches)))
    assert [len(o) for o in out] == [1, 2]
    np.testing.assert_array_equal(out[1], dense.encode(batches[1]))

    class Streaming(BatchEncoder):
        def __init__(self) -> None:
            self.seen: list[list[str]] = []

        def encode_batches(self, batches, kind="document", idle=None):
            for texts in batches:
                self.seen.append(texts)
                yield dense.encode(texts, kind=kind)

    streaming = Streaming()
    assert len(list(encode_stream(streaming, iter(batches)))) == 2  # type: ignore[arg-type]
    assert streaming.seen == batches


def test_encoders_by_role_and_map(encoders):
    dense, multi = encoders
    pair = Encoders(dense=dense, multi=multi)
    assert pair.by_role() == {"dense": dense, "colbert": multi}
    assert list(pair.present()) == [dense, multi]
    wrapped = pair.map(QueryBatcher)
    assert isinstance(wrapped.dense, QueryBatcher) and wrapped.dense.wrapped is dense
    assert Encoders(multi=multi).map(QueryBatcher).dense is None


def test_the_old_home_of_encoders_still_answers_with_a_warning():
    import codesearch.indexing.encoders as old

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert old.Encoders is Encoders
    assert any(issubclass(w.category, DeprecationWarning) and "codesearch.encoder.base" in str(w.message)
               for w in seen)
