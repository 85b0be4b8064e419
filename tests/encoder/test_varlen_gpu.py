"""The CUDA stack: torch's varlen flash attention against the packed SDPA path on the CPU, the
compiled layers against eager ones, and parity with transformers (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fixtures.models import CODE_CORPUS

from codesearch.encoder import load
from codesearch.encoder.attention import SdpaBackend, VarlenBackend, varlen_available
from codesearch.encoder.modernbert import PackedBatch

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


# ---------------------------------------------------------------- compiled layers, parity


LONG = TEXTS * 8  # > COMPILE_MIN_TOKENS tokens in one pass: the compiled layers run


def _hf_reference(directory, ids: list[list[int]]) -> list[torch.Tensor]:
    """transformers' ModernBertModel (sdpa) in fp32 on CUDA, one padded batch, real tokens only."""
    from transformers import ModernBertModel

    model = ModernBertModel.from_pretrained(str(directory), attn_implementation="sdpa", dtype=torch.float32)
    model = model.to(CUDA).eval()
    L = max(map(len, ids))
    x = torch.full((len(ids), L), model.config.pad_token_id)
    mask = torch.zeros((len(ids), L), dtype=torch.long)
    for i, s in enumerate(ids):
        x[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    with torch.inference_mode():
        out = model(input_ids=x.to(CUDA), attention_mask=mask.to(CUDA)).last_hidden_state.float().cpu()
    return [out[i, : len(s)] for i, s in enumerate(ids)]


def test_float32_matches_transformers_on_cuda(modernbert_dir):
    """fp32 on CUDA (sdpa backend, compiled layers) within 1e-4 of transformers."""
    assert not torch.backends.cuda.matmul.allow_tf32  # TF32 matmuls would not hold 1e-4
    enc = load(modernbert_dir, device="cuda", dtype="float32")
    ours = enc.hidden_states(LONG)
    assert enc.backbone.compiled
    ref = _hf_reference(modernbert_dir, enc.tokenizer.encode(LONG, enc.max_length))
    for a, b in zip(ours, ref):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() <= 1e-4


@needs_varlen
def test_bfloat16_token_cosine_against_float32(modernbert_dir):
    enc16 = load(modernbert_dir, device="cuda", dtype="bfloat16")
    ours = enc16.hidden_states(LONG)
    assert enc16.backend == "varlen" and enc16.backbone.compiled
    ref = _hf_reference(modernbert_dir, enc16.tokenizer.encode(LONG, enc16.max_length))
    for a, b in zip(ours, ref):
        assert F.cosine_similarity(a, b, dim=1).min().item() >= 0.999


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compiled_matches_eager_without_recompiling(modernbert_dir, dtype):
    from torch._dynamo.utils import counters

    from codesearch.encoder.runtime import COMPILE_MIN_TOKENS

    if dtype == "bfloat16" and _varlen_reason():
        pytest.skip(str(_varlen_reason()))
    enc = load(modernbert_dir, device="cuda", dtype=dtype)
    backbone, model = enc.backbone, enc.backbone.model
    g = torch.Generator().manual_seed(0)
    graphs = None
    for sizes in ([COMPILE_MIN_TOKENS, 3], [2000, 1500, 700, 9], [8000], [300] * 20):
        ids = [torch.randint(5, 500, (n,), generator=g).tolist() for n in sizes]
        batch = backbone.prepare(ids, None)
        got = backbone.forward(batch).float().cpu()
        with torch.inference_mode():
            want = model(batch.to(CUDA), fused=False).float().cpu()
        if dtype == "float32":
            assert (got - want).abs().max().item() <= 1e-4
        else:
            assert F.cosine_similarity(got, want, dim=1).min().item() >= 0.999
        if graphs is None:
            graphs = counters["stats"]["unique_graphs"]
    assert backbone.compiled
    assert counters["stats"]["unique_graphs"] == graphs  # batch sizes never recompile


def test_compile_can_be_turned_off(modernbert_dir, monkeypatch):
    monkeypatch.setenv("CODESEARCH_COMPILE", "0")
    enc = load(modernbert_dir, device="cuda", dtype="float32")
    enc.hidden_states(LONG)
    assert enc.backbone.model.fused is None and not enc.backbone.compiled


def test_gpu_budget_is_larger(modernbert_dir):
    enc = load(modernbert_dir, device="cuda", dtype="bfloat16")
    assert enc.batch_tokens > 16384
