"""The packed SDPA backend against brute-force attention, one sequence at a time."""

from __future__ import annotations

import pytest
import torch

from codesearch.encoder.attention import SdpaBackend, VarlenBackend, select_backend
from codesearch.encoder.modernbert import PackedBatch
from codesearch.errors import BackendError

WINDOW = 8  # small window so that short test sequences exercise blocks and bands


def brute_force(qkv, lengths, n_keys, window):
    """softmax(q k^T / sqrt(d) + mask) v per sequence; a query with no visible key gives 0."""
    out, start = [], 0
    for n, k_n in zip(lengths, n_keys):
        q, k, v = qkv[start : start + n].unbind(1)  # each (n, heads, d)
        scores = torch.einsum("ihd,jhd->hij", q, k) / q.shape[-1] ** 0.5
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        allowed = j < k_n
        if window is not None:
            allowed = allowed & ((i - j).abs() <= window)
        scores = scores.masked_fill(~allowed, float("-inf"))
        p = torch.softmax(scores, -1).nan_to_num(0.0)
        out.append(torch.einsum("hij,jhd->ihd", p, v))
        start += n
    return torch.cat(out)


CASES = {
    "mixed": [1, 2, 5, 9, 17, 24, 25, 26, 40, 77, 3],
    "equal": [30, 30, 30],  # one contiguous group: no gather, no mask on global layers
    "one_long": [200],
    "single_token": [1],
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("is_local", [False, True], ids=["global", "local"])
def test_matches_brute_force(case, is_local):
    lengths = CASES[case]
    torch.manual_seed(len(lengths))
    qkv = torch.randn(sum(lengths), 3, 2, 16)
    batch = PackedBatch.from_ids([[1] * n for n in lengths])
    backend = SdpaBackend(torch.float32)
    out = backend(qkv.clone(), backend.plan(batch, WINDOW), is_local)
    ref = brute_force(qkv, lengths, lengths, WINDOW if is_local else None)
    assert (out - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("is_local", [False, True], ids=["global", "local"])
def test_key_restricted_sequences(is_local):
    """ColBERT query expansion: trailing tokens ask but are never attended to."""
    lengths, n_keys = [12, 40, 40, 5], [4, 40, 9, 5]
    torch.manual_seed(0)
    qkv = torch.randn(sum(lengths), 3, 2, 16)
    batch = PackedBatch.from_ids([[1] * n for n in lengths], n_keys=n_keys)
    backend = SdpaBackend(torch.float32)
    out = backend(qkv, backend.plan(batch, WINDOW), is_local)
    ref = brute_force(qkv, lengths, n_keys, WINDOW if is_local else None)
    assert (out - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("block,shape", [(None, (32, 1, 32, 160)), (128, (8, 1, 128, 256))])
def test_local_layers_use_blocks_for_long_sequences(block, shape):
    """Long sequences go through (blocks, b, b + 2w) tiles: cost linear in length, not quadratic.
    On the CPU b defaults to w/2 (32 queries see 160 keys)."""
    batch = PackedBatch.from_ids([[1] * 1000, [1] * 10])
    plan = SdpaBackend(block=block).plan(batch, 64)
    assert plan.blocks is not None and plan.blocks.mask.shape == shape
    assert [g.length for g in plan.local_groups] == [10]


@pytest.mark.parametrize(
    "name,device,dtype",
    [
        ("flash", "cpu", torch.bfloat16),  # removed: the error names its replacement
        ("varlen", "cpu", torch.bfloat16),
        ("varlen", "cpu", torch.float32),
        ("xformers", "cpu", torch.float32),
    ],
)
def test_explicit_unavailable_backend_is_an_error(name, device, dtype):
    with pytest.raises(BackendError, match=name):
        select_backend(name, torch.device(device), dtype)


def test_auto_logs_its_choice_once(caplog):
    import codesearch.encoder.attention as attention

    attention._logged.clear()
    with caplog.at_level("INFO", logger="codesearch.encoder.attention"):
        assert select_backend("auto", torch.device("cpu"), torch.float32).name == "sdpa"
        select_backend("auto", torch.device("cpu"), torch.float32)
    assert len([r for r in caplog.records if "attention backend: sdpa" in r.getMessage()]) == 1


def test_flash_error_names_varlen():
    with pytest.raises(BackendError, match="varlen"):
        select_backend("flash", torch.device("cpu"), torch.bfloat16)


# The varlen kernel needs CUDA (tests/encoder/test_varlen_gpu.py); its plan is plain
# bookkeeping and is checked here.


def test_varlen_plan_windows():
    backend = VarlenBackend(torch.bfloat16, "cpu")
    short = backend.plan(PackedBatch.from_ids([[1] * 65, [1] * 3]), 64)
    assert short.local_window == (-1, -1)  # every sequence fits in one window: exact without one
    long = backend.plan(PackedBatch.from_ids([[1] * 66, [1] * 3]), 64)
    assert long.local_window == (64, 64) and long.max_seqlen == 66
    assert long.cu_seqlens.dtype == torch.int32 and long.cu_seqlens.tolist() == [0, 66, 69]
    assert long.seqused_k is None and long.fallback is None


@pytest.mark.parametrize("lengths,falls_back", [([32, 32], False), ([32, 200], True)])
def test_varlen_plan_key_restricted(lengths, falls_back):
    """ColBERT queries: keys limited per sequence; local layers fall back only past a window."""
    backend = VarlenBackend(torch.bfloat16, "cpu")
    n_keys = [5, 9]
    plan = backend.plan(PackedBatch.from_ids([[1] * n for n in lengths], n_keys=n_keys), 64)
    assert (plan.fallback is not None) == falls_back
    keys = plan.seqused_k if plan.seqused_k is not None else plan.keys[1].diff()
    assert keys.tolist() == n_keys
