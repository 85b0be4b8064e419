"""The CUDA stack: torch's varlen flash attention against the packed SDPA path on the CPU, the
compiled layers against eager ones, and parity with transformers (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from codesearch.encoder import load
from codesearch.encoder.attention import SdpaBackend, VarlenBackend, varlen_available
from codesearch.encoder.modernbert import PackedBatch
from fixtures.models import CODE_CORPUS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda")


def _varlen_reason() -> str | None:
    return varlen_available(CUDA, torch.bfloat16) if torch.cuda.is_available() else "no CUDA"


needs_varlen = pytest.mark.skipif(_varlen_reason() is not None, reason=str(_varlen_reason()))

WINDOW = 8  # small window: short sequences cross it, as 8k-token files cross the real one
TEXTS = ["", "x", "def f(x): return x + 1", " ".join(CODE_CORPUS), " ".join(CODE_CORPUS * 3)]


def _attend(backend, qkv, lengths, n_keys, is_local, device):
    batch = PackedBatch.from_ids([[1] * n for n in lengths], device, n_keys)
    return backend(qkv.to(device), backend.plan(batch, WINDOW), is_local).float().cpu()


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    # both sides see the same bf16 inputs; the kernel accumulates in fp32 and rounds its output to bf16
    assert (a - b).abs().max().item() <= 2e-2
    assert F.cosine_similarity(a.flatten(1), b.flatten(1), dim=1).min().item() >= 0.999


CASES = {
    "one_token": ([1], None),
    "mixed": ([1, 2, 5, 9, 17, 24, 25, 26, 40, 77, 3], None),
    "past_the_window": ([200, 17, 9, 10], None),  # local layers use the (w, w) window
    "keys_fit_window": ([9, 9, 6], [4, 9, 2]),  # key-restricted, every sequence within a window: seqused_k
    "keys_long": ([12, 40, 40, 5], [4, 40, 9, 5]),  # key-restricted past the window: local layers fall back
}


@needs_varlen
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("is_local", [False, True], ids=["global", "local"])
def test_varlen_matches_cpu_sdpa(case, is_local):
    lengths, n_keys = CASES[case]
    torch.manual_seed(len(lengths))
    qkv = torch.randn(sum(lengths), 3, 4, 64).to(torch.bfloat16)  # (T, 3, heads, head_dim)
    ours = _attend(VarlenBackend(torch.bfloat16, CUDA), qkv, lengths, n_keys, is_local, CUDA)
    ref = _attend(SdpaBackend(torch.float32), qkv.float(), lengths, n_keys, is_local, "cpu")
    _close(ours, ref)


@needs_varlen
def test_auto_picks_varlen_on_cuda(modernbert_dir):
    assert load(modernbert_dir, device="cuda", dtype="bfloat16").backend == "varlen"
    assert load(modernbert_dir, device="cuda", dtype="float32").backend == "sdpa"  # fp32: no flash kernel


@needs_varlen
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_varlen_hidden_states_match_cpu(modernbert_dir, dtype):
    gpu = load(modernbert_dir, device="cuda", dtype=dtype, backend="varlen")
    cpu = load(modernbert_dir, device="cpu", dtype="float32")
    for a, b in zip(gpu.hidden_states(TEXTS), cpu.hidden_states(TEXTS)):
        assert a.shape == b.shape
        assert F.cosine_similarity(a, b, dim=1).min().item() >= 0.999


@needs_varlen
def test_varlen_colbert_matches_cpu(colbert_dir):
    """Queries carry [MASK] expansion tokens that are not keys (seqused_k on CUDA)."""
    gpu = load(colbert_dir, device="cuda", dtype="bfloat16")
    cpu = load(colbert_dir, device="cpu", dtype="float32")
    for kind in ("query", "document"):
        for a, b in zip(gpu.encode(TEXTS, kind=kind), cpu.encode(TEXTS, kind=kind)):
            assert a.shape == b.shape
            assert (a * b).sum(axis=1).min() >= 0.99  # unit rows: cosine
