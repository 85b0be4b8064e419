"""flash-attn varlen backend on CUDA against our packed SDPA path (skipped without CUDA/flash-attn)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from codesearch.encoder import load
from fixtures.models import CODE_CORPUS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="needs flash-attn"),
]

TEXTS = ["", "x", "def f(x): return x + 1", " ".join(CODE_CORPUS), " ".join(CODE_CORPUS * 3)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_flash_matches_sdpa(modernbert_dir, dtype):
    flash = load(modernbert_dir, device="cuda", dtype=dtype, backend="flash")
    sdpa = load(modernbert_dir, device="cuda", dtype=dtype, backend="sdpa")
    assert flash.backend == "flash"
    for a, b in zip(flash.hidden_states(TEXTS), sdpa.hidden_states(TEXTS)):
        # both in half precision: same tolerance as bf16 against fp32 on CPU
        assert (a - b).abs().max().item() <= 0.1
        assert torch.nn.functional.cosine_similarity(a, b, dim=1).min().item() >= 0.999


def test_flash_colbert_queries_fall_back_for_expansion(colbert_dir):
    flash = load(colbert_dir, device="cuda", dtype="bfloat16", backend="flash")
    cpu = load(colbert_dir, device="cpu", dtype="float32")
    for kind in ("query", "document"):
        for a, b in zip(flash.encode(TEXTS, kind=kind), cpu.encode(TEXTS, kind=kind)):
            assert a.shape == b.shape
            assert (a * b).sum(axis=1).min() >= 0.99  # unit rows: cosine
