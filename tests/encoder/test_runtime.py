"""The runtime on the CPU: the overlapped run (tokenizer thread) against the serial one, the
fused layer functions against the modules, and compiled layers (aot_eager: no C++ toolchain)."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
import torch
from fixtures.models import CODE_CORPUS

from codesearch.encoder import load, runtime
from codesearch.encoder.modernbert import FusedLayers, PackedBatch
from codesearch.encoder.runtime import COMPILE_MIN_TOKENS, PackedBackbone, in_thread, waves

# lengths from 1 to ~700 tokens, out of length order, so batches reorder and waves split them
TEXTS = [CODE_CORPUS[i % len(CODE_CORPUS)] * (1 + (i * 7) % 9) for i in range(23)] + ["", "x"]
BUDGET = 256  # small batches and waves (4 * 256 * 4 characters): several of each


def _threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def _same(a, b) -> None:
    if isinstance(a, np.ndarray) and not isinstance(b, list):
        assert np.array_equal(a, b)
        return
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape and (np.array_equal(x, y) if isinstance(x, np.ndarray) else torch.equal(x, y))


@pytest.fixture(scope="module")
def colbert(colbert_dir):
    return load(colbert_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def dense(single_vector_dir):
    return load(single_vector_dir, device="cpu", dtype="float32")


def test_waves_cover_the_input_in_order():
    texts = ["a" * n for n in (10, 3000, 5, 0, 4000, 7)]
    parts = waves(texts, 64)  # 1024 characters a wave
    assert [i for w in parts for i in w] == list(range(len(texts)))
    assert len(parts) > 1 and all(len(w) for w in parts)


@pytest.mark.parametrize("which,kind", [("dense", "document"), ("colbert", "document"), ("colbert", "query")])
def test_overlapped_equals_serial_in_input_order(request, which, kind):
    enc = request.getfixturevalue(which)
    assert len(waves(TEXTS, BUDGET)) > 1
    try:
        enc.overlap = False
        serial = enc.encode(TEXTS, kind=kind, batch_tokens=BUDGET)
        enc.overlap = True
        overlapped = enc.encode(TEXTS, kind=kind, batch_tokens=BUDGET)
    finally:
        enc.overlap = None
    _same(overlapped, serial)
    # input order: each text alone gives its own row(s)
    for i in (0, 5, len(TEXTS) - 1):
        alone = enc.encode([TEXTS[i]], kind=kind)[0]
        assert np.abs(alone - overlapped[i]).max() <= 1e-5
    assert not _threads_named("codesearch-tokenize")


@pytest.mark.parametrize("which", ["dense", "colbert"])
@pytest.mark.parametrize("overlap", [False, True])
def test_encode_counted_is_encode_with_each_texts_tokens(request, which, overlap):
    """What a cluster worker returns: the same vectors, and per text the tokens it took
    (``count_tokens`` capped at ``max_length``), in input order across several waves."""
    enc = request.getfixturevalue(which)
    texts = [*TEXTS, "def long():\n    pass\n" * 1500, ""]  # one over max_length (8192 dense), one empty
    assert len(waves(texts, BUDGET)) > 1
    try:
        enc.overlap = overlap
        out, counts = enc.encode_counted(texts, batch_tokens=BUDGET)
        _same(out, enc.encode(texts, batch_tokens=BUDGET))
    finally:
        enc.overlap = None
    assert counts == [min(n, enc.max_length) for n in enc.count_tokens(texts)]
    assert counts[-2] == enc.max_length


def test_overlapped_hidden_states_equal_serial(dense):
    try:
        dense.overlap = False
        serial = dense.hidden_states(TEXTS, batch_tokens=BUDGET)
        dense.overlap = True
        overlapped = dense.hidden_states(TEXTS, batch_tokens=BUDGET)
    finally:
        dense.overlap = None
    _same(overlapped, serial)
    assert [len(x) for x in overlapped] == [len(x) for x in dense.tokenizer.encode(TEXTS, dense.max_length)]


def test_tokenizer_error_in_the_thread_surfaces_as_itself(dense):
    """A text the tokenizer rejects, in a later wave: its error reaches the caller, no hang."""
    texts = TEXTS + [None]  # the real tokenizer raises TypeError on a non-string
    errors: list[BaseException] = []

    def call():
        try:
            dense.overlap = True
            dense.encode(texts, batch_tokens=BUDGET)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            dense.overlap = None

    caller = threading.Thread(target=call)
    caller.start()
    caller.join(timeout=120)
    assert not caller.is_alive(), "encode hung on a tokenizer error"
    assert len(errors) == 1 and isinstance(errors[0], TypeError)
    assert not _threads_named("codesearch-tokenize")


def test_consumer_stopping_early_stops_the_thread():
    made = []

    def make():
        for i in range(1000):
            made.append(i)
            yield i

    gen = in_thread(make, depth=2)
    assert next(gen) == 0
    gen.close()
    assert not _threads_named("codesearch-tokenize") and len(made) < 10


def test_batch_tokens_by_device(dense):
    assert dense.batch_tokens == runtime.DEFAULT_BATCH_TOKENS  # CPU: as before


# ---------------------------------------------------------------- fused and compiled layers


def _batch(sizes: list[int]) -> PackedBatch:
    g = torch.Generator().manual_seed(sum(sizes))
    return PackedBatch.from_ids([torch.randint(5, 500, (n,), generator=g).tolist() for n in sizes])


@pytest.fixture(scope="module")
def model(modernbert_dir):
    return load(modernbert_dir, device="cpu", dtype="float32").backbone.model


def test_fused_functions_compute_what_the_modules_do(model):
    batch = _batch([3, 70, 300, 1])  # local layers: whole, banded and blocked sequences
    with torch.inference_mode():
        eager = model(batch)
        model.use_fused(FusedLayers(model))
        try:
            fused = model(batch)
        finally:
            model.use_fused(None)
    assert (fused - eager).abs().max().item() <= 1e-5


@pytest.mark.slow  # ~10 s of tracing on 2 cores
def test_compiled_layers_match_eager_without_recompiling(modernbert_dir, caplog):
    """torch.compile traces the two layer functions once, dynamic in the token count.

    aot_eager runs the traced graphs without generating code, so this checks tracing, guards
    and the compile switch on any machine; CUDA kernels are checked in test_varlen_gpu.py.
    """
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = load(modernbert_dir, device="cpu", dtype="float32").backbone.model
    backbone = PackedBackbone(model, torch.device("cpu"), compile=True, compile_backend="aot_eager")
    small = _batch([5, 40])  # below COMPILE_MIN_TOKENS: uncompiled
    with caplog.at_level(logging.INFO, logger="codesearch.encoder.runtime"):
        out = backbone.forward(small)
        assert not backbone.compiled
        sizes = ([COMPILE_MIN_TOKENS - 100, 100], [COMPILE_MIN_TOKENS, 300, 7], [2 * COMPILE_MIN_TOKENS - 1])
        for i, s in enumerate(sizes):
            batch = _batch(s)
            got = backbone.forward(batch)
            with torch.inference_mode():
                want = model(batch, fused=False)
            assert (got - want).abs().max().item() <= 1e-4
            if i == 0:
                graphs = counters["stats"]["unique_graphs"]
    assert backbone.compiled
    assert counters["stats"]["unique_graphs"] == graphs  # new batch sizes, no new graphs
    assert sum("compiling the encoder" in r.getMessage() for r in caplog.records) == 1
    assert out.shape[0] == 45
