"""Attention backends over a packed token stream, all with one signature.

A backend is chosen once at load time (``select_backend``) and stored in ``BACKENDS`` by name:

``"varlen"``
    CUDA in fp16/bf16: torch's own varlen flash attention (``torch.nn.attention.varlen``)
    straight on the packed stream, window ``(w, w)`` on local layers and ``(-1, -1)`` on
    global ones; nothing to install beyond a CUDA build of torch.
``"sdpa"``
    Everywhere else (CPU, fp32 on CUDA, torch without varlen): a packed path of our own on top
    of ``torch.nn.functional.scaled_dot_product_attention``.

Both expose ``plan(batch, window, dtype=None) -> plan`` (index bookkeeping, once per forward, shared by all
layers) and ``__call__(qkv, plan, is_local) -> (total_tokens, heads, head_dim)`` with ``qkv`` of
shape ``(total_tokens, 3, heads, head_dim)`` after RoPE.

How the ``sdpa`` path avoids quadratic cost on local layers
-----------------------------------------------------------
A local layer lets token i see tokens j with |i - j| <= w (w = 64). Every sequence is cut into
blocks of b query tokens (w/2 on the CPU, 2w elsewhere); a block only needs the b + 2w keys from w before it to w after
it, and a band mask inside that (b, b + 2w) tile removes the keys farther than w. The blocks of
a sequence go through one SDPA call on ``(blocks, heads, b, b + 2w)`` tiles that are views, not
copies: the key/value tiles overlap, so they are ``as_strided`` windows over a zero-padded copy
of the sequence (gathering them instead cost ~40% of an 8k-token local layer and 60% of a batch
of mixed lengths). A local layer costs O(n * w), not O(n^2). Sequences short enough that blocking does not pay
(length <= 3w) are attended whole, with the band mask when they are longer than the window.

Global layers attend whole sequences: sequences of similar length are grouped and padded
*inside the attention call only* (keys beyond a sequence's end are masked), so a batch of
equal-length sequences needs no mask at all.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from codesearch.errors import BackendError

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# The packed SDPA path (any device)
# --------------------------------------------------------------------------------------------


@dataclass
class _Group:
    """Sequences attended together in one padded SDPA call of shape (n, heads, L, head_dim)."""

    n: int  # sequences
    length: int  # padded length L
    gather: torch.Tensor | None  # (n * L,) stream rows (padding points at a masked real row); None: a view
    start: int  # with gather None: the group is stream rows [start, start + n * L)
    src: torch.Tensor | None  # (valid,) rows of the padded (n * L) output that are real tokens
    dst: torch.Tensor | None  # (valid,) stream rows they go to
    mask: torch.Tensor | None  # additive (n or 1, 1, L, L or 1) float mask; None when nothing is masked


@dataclass
class _Blocks:
    """Long sequences cut into blocks of b queries, each seeing b + 2w keys (blocked local window).

    No gathered copies: each layer copies a long sequence once into a zero-padded buffer
    (w rows before it, enough after it for whole blocks), and the key/value tiles of its
    blocks are overlapping ``as_strided`` views of that buffer, which SDPA reads as they are.
    """

    seqs: list[tuple[int, int, int, int]]  # (stream start, length, first block, blocks) per sequence
    mask: torch.Tensor  # additive (blocks, 1, b, b + 2w): band |i - j| <= w and key validity
    block: int  # b, queries per block
    window: int  # w


@dataclass
class SdpaPlan:
    total: int
    global_groups: list[_Group] = field(default_factory=list)
    local_groups: list[_Group] = field(default_factory=list)
    blocks: _Blocks | None = None


def _neg_inf_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Additive masks run faster than boolean ones in the CPU SDPA kernel (measured ~2x in bf16).
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


# A sequence at least this long is attended on its own, straight from a view of the stream:
# one SDPA call per sequence costs less than gathering and scattering it.
ALONE = 256


def _group_lengths(order: list[int], lengths: tuple[int, ...], slack: float = 1.25) -> list[list[int]]:
    """Greedy groups of sequences (given longest first) whose padded attention cost n * L^2
    stays within ``slack`` of their real cost sum(l^2); long sequences stay alone."""
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[groups[-1][0]] < ALONE:
            g = groups[-1]
            top = lengths[g[0]]
            real = sum(lengths[j] ** 2 for j in g) + lengths[i] ** 2
            if (len(g) + 1) * top * top <= slack * real:
                g.append(i)
                continue
        groups.append([i])
    return groups


def _make_group(
    seqs: list[int],
    starts: list[int],
    lengths: tuple[int, ...],
    n_keys: tuple[int, ...],
    window: int | None,
    dtype: torch.dtype,
    device: torch.device,
) -> _Group:
    n = len(seqs)
    L = max(lengths[i] for i in seqs)
    ls = torch.tensor([lengths[i] for i in seqs], device=device)
    ks = torch.tensor([n_keys[i] for i in seqs], device=device)
    pos = torch.arange(L, device=device)
    need_window = window is not None and L > window + 1

    allowed = None
    if bool((ks < L).any()):  # someone's keys end before L: mask keys per sequence
        allowed = (pos[None, :] < ks[:, None])[:, None, None, :]  # (n, 1, 1, L)
    if need_window:
        band = ((pos[:, None] - pos[None, :]).abs() <= window)[None, None]  # (1, 1, L, L)
        allowed = band if allowed is None else allowed & band
    mask = None if allowed is None else _neg_inf_mask(allowed, dtype)

    contiguous = all(lengths[i] == L for i in seqs) and all(
        starts[seqs[j]] == starts[seqs[0]] + j * L for j in range(n)
    )
    if contiguous:  # equal lengths, adjacent in the stream: a view, no gather, no scatter
        return _Group(n, L, None, starts[seqs[0]], None, None, mask)
    st = torch.tensor([starts[i] for i in seqs], device=device)
    valid = pos[None, :] < ls[:, None]  # (n, L)
    rows = st[:, None] + pos[None, :]  # (n, L)
    gather = torch.where(valid, rows, st[:, None]).reshape(-1)
    src = torch.nonzero(valid.reshape(-1)).squeeze(1)
    return _Group(n, L, gather, 0, src, rows.reshape(-1)[src], mask)


def _make_blocks(
    seqs: list[int],
    starts: list[int],
    lengths: tuple[int, ...],
    n_keys: tuple[int, ...],
    w: int,
    block: int,
    dtype: torch.dtype,
    device: torch.device,
) -> _Blocks:
    span = block + 2 * w  # keys a block of queries can reach: w before it, w after it
    nblocks = [-(-lengths[i] // block) for i in seqs]
    counts = torch.tensor(nblocks, device=device)
    b_keys = torch.repeat_interleave(torch.tensor([n_keys[i] for i in seqs], device=device), counts)
    b_k = torch.cat([torch.arange(n, device=device) for n in nblocks])  # block number in its sequence

    k_pos = b_k[:, None] * block - w + torch.arange(span, device=device)[None, :]  # (B, span)
    k_valid = (k_pos >= 0) & (k_pos < b_keys[:, None])
    # Query i of a block and key j of its span are i - j + w positions apart in every block: the
    # band is one (block, span) pattern, and only the keys' validity differs between blocks.
    i, j = torch.arange(block, device=device)[:, None], torch.arange(span, device=device)[None, :]
    band = _neg_inf_mask((i - j + w).abs() <= w, dtype)  # (block, span)
    mask = _neg_inf_mask(k_valid, dtype)[:, None, None, :] + band  # (B, 1, block, span)
    first = [0]
    for n in nblocks[:-1]:
        first.append(first[-1] + n)
    table = [(starts[i], lengths[i], f, n) for i, f, n in zip(seqs, first, nblocks)]
    return _Blocks(table, mask, block, w)


def _blocked_local(qkv: torch.Tensor, b: _Blocks, out: torch.Tensor) -> None:
    """Blocked local attention of every long sequence, written into ``out`` (see ``_Blocks``)."""
    _, _, heads, hd = qkv.shape
    w, block = b.window, b.block
    span = block + 2 * w
    for start, n, first, nb in b.seqs:
        rows = nb * block + 2 * w  # w pad, the sequence, pad to whole blocks plus w
        buf = qkv.new_empty(rows, 3, heads, hd)
        buf[:w].zero_()  # pad rows are masked keys; zeros keep them finite (0 * -inf would be NaN)
        buf[w + n :].zero_()
        buf[w : w + n] = qkv[start : start + n]
        rs = buf.stride(0)  # elements per stream row (3 * heads * hd)
        # queries of block k: rows w + k*b ... (a plain view); keys/values of block k: rows
        # k*b ... k*b + span (overlapping windows, one stride of b rows apart)
        q = buf[w : w + nb * block, 0].view(nb, block, heads, hd).transpose(1, 2)
        k, v = (
            buf.as_strided((nb, heads, span, hd), (block * rs, hd, rs, 1), buf.storage_offset() + part * heads * hd)
            for part in (1, 2)
        )
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=b.mask[first : first + nb])  # (nb, heads, b, hd)
        out[start : start + n] = o.transpose(1, 2).reshape(nb * block, heads, hd)[:n]


class SdpaBackend:
    """Packed attention through ``scaled_dot_product_attention``; works on every device."""

    name = "sdpa"

    def __init__(
        self, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", block: int | None = None
    ):
        # block: queries per tile on local layers. Smaller tiles waste less on the band (a query
        # needs 2w + 1 of its tile's block + 2w keys), larger ones run the SDPA kernel more
        # efficiently. Default w/2 on the CPU (32 queries see 160 keys: 6-8% faster end to end
        # than 2w at the 17M and 6-layer base shapes, Emerald Rapids, one thread),
        # 2w elsewhere (128 queries see 256 keys).
        self.dtype = dtype
        self.device = torch.device(device)
        self.block = block

    def plan(self, batch, window: int, dtype: torch.dtype | None = None) -> SdpaPlan:
        """``dtype``: of the q, k, v this plan will see (masks are built in it; default the
        backend's)."""
        lengths = batch.lengths
        n_keys = batch.n_keys or lengths
        # from the Python lengths, not cu_seqlens: reading a CUDA tensor would wait for the GPU
        starts = [0, *itertools.accumulate(lengths)][:-1]
        total = sum(lengths)
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        plan = SdpaPlan(total)
        mk = dict(starts=starts, lengths=lengths, n_keys=n_keys, dtype=dtype or self.dtype, device=self.device)
        for g in _group_lengths(order, lengths):
            plan.global_groups.append(_make_group(g, window=None, **mk))
        if lengths and max(lengths) <= window + 1:
            # Every sequence fits in one window (a query, a short chunk): each token already sees
            # every other, so local layers are global layers and share their groups.
            plan.local_groups = plan.global_groups
            return plan
        # Local layers: blocking pays off once a sequence is longer than 3w (below that, L^2 <= 3wL scores).
        short = [i for i in order if lengths[i] <= 3 * window]
        long = [i for i in order if lengths[i] > 3 * window]
        for g in _group_lengths(short, lengths):
            plan.local_groups.append(_make_group(g, window=window, **mk))
        if long:
            block = self.block or (max(1, window // 2) if self.device.type == "cpu" else 2 * window)
            plan.blocks = _make_blocks(long, w=window, block=block, **mk)
        return plan

    def __call__(
        self, qkv: torch.Tensor, plan: SdpaPlan, is_local: bool, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``out``: a ``(total_tokens, heads, head_dim)`` tensor to write into (default: a new one)."""
        total, _, heads, hd = qkv.shape
        groups = plan.local_groups if is_local else plan.global_groups
        out = qkv.new_empty(total, heads, hd) if out is None else out
        for g in groups:
            if g.gather is None:
                x = qkv[g.start : g.start + g.n * g.length].view(g.n, g.length, 3, heads, hd)
            else:
                x = qkv[g.gather].view(g.n, g.length, 3, heads, hd)
            x = x.permute(2, 0, 3, 1, 4)  # (3, n, heads, L, head_dim)
            o = F.scaled_dot_product_attention(x[0], x[1], x[2], attn_mask=g.mask)  # (n, heads, L, hd)
            o = o.transpose(1, 2).reshape(g.n * g.length, heads, hd)
            if g.gather is None:
                out[g.start : g.start + g.n * g.length] = o
            else:
                out[g.dst] = o[g.src]
        if is_local and plan.blocks is not None:
            _blocked_local(qkv, plan.blocks, out)
        return out


# --------------------------------------------------------------------------------------------
# torch's varlen flash attention (CUDA)
# --------------------------------------------------------------------------------------------

@functools.cache
def _varlen() -> tuple[Callable[..., torch.Tensor] | None, frozenset[str]]:
    """torch's ``varlen_attn`` and the keyword arguments it takes, or (None, empty).

    Imported on first use, never at module import: ``torch.nn.attention.varlen`` imports
    ``torch._dynamo``, which took 2.5 s of a 17M model's 2.8 s load on a CPU that never
    calls it. (window_size: torch 2.11, seqused_k: 2.13.)
    """
    try:  # torch >= 2.11; older versions have no varlen flash attention with a window
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # pragma: no cover - depends on the installed torch
        return None, frozenset()
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


@dataclass
class VarlenPlan:
    cu_seqlens: torch.Tensor  # (batch + 1,) int32 on the device
    max_seqlen: int
    local_window: tuple[int, int]  # (w, w); (-1, -1) when every sequence fits in one window
    seqused_k: torch.Tensor | None = None  # (batch,) int32 keys per sequence; None: every token is a key
    keys: tuple[torch.Tensor, torch.Tensor, int] | None = None  # torch without seqused_k: (key rows, cu, max)
    fallback: SdpaPlan | None = None  # local layers of key-restricted batches longer than a window


class VarlenBackend:
    """``torch.nn.attention.varlen.varlen_attn`` on the packed stream (CUDA, fp16/bf16).

    The flash-attention kernel shipped inside torch: q, k and v are strided views of the packed
    ``qkv`` (no copy), the window is ``(w, w)`` on local layers and ``(-1, -1)`` on global ones.

    ColBERT query expansion (only the first ``n_keys[i]`` tokens are keys) goes through
    ``seqused_k``: the kernel reads only those keys of each sequence. With fewer keys than
    queries the kernel anchors a window at the bottom-right corner (key ``j`` is compared with
    query ``i + n_keys - length``), which is not the band ``|i - j| <= w``; so a window is used
    only when it matters. When every sequence fits in one window (queries are 32 tokens, the
    window 129) a local layer attends as a global one, which is exact, and only batches with
    longer key-restricted sequences run their local layers through the SDPA path.
    """

    name = "varlen"

    def __init__(self, dtype: torch.dtype, device: torch.device | str):
        self._sdpa = SdpaBackend(dtype, device)
        self.device = torch.device(device)

    def plan(self, batch, window: int, dtype: torch.dtype | None = None) -> VarlenPlan:
        cu = batch.cu_seqlens if batch.cu_seqlens.dtype == torch.int32 else batch.cu_seqlens.to(torch.int32)
        longest = batch.max_seqlen
        fits = longest <= window + 1  # each token already sees every other: no window needed
        plan = VarlenPlan(cu, longest, (-1, -1) if fits else (window, window))
        if batch.n_keys is None:
            return plan
        if not fits:
            plan.fallback = self._sdpa.plan(batch, window, dtype)
        if "seqused_k" in _varlen()[1]:
            keys = batch.key_counts
            if keys is None:  # built by hand, not by PackedBatch.pack: one small synchronous copy
                keys = torch.tensor(batch.n_keys, dtype=torch.int32, device=self.device)
            plan.seqused_k = keys
        else:  # gather the keys into a stream of their own: same attention, one copy of k and v
            starts = batch.cu_seqlens[:-1].tolist()
            rows = torch.cat([torch.arange(s, s + k) for s, k in zip(starts, batch.n_keys)]).to(self.device)
            cu_k = torch.zeros(len(batch.n_keys) + 1, dtype=torch.int32)
            cu_k[1:] = torch.cumsum(torch.tensor(batch.n_keys, dtype=torch.int32), 0)
            plan.keys = (rows, cu_k.to(self.device), max(batch.n_keys))
        return plan

    def __call__(self, qkv: torch.Tensor, plan: VarlenPlan, is_local: bool) -> torch.Tensor:
        if is_local and plan.fallback is not None:
            return self._sdpa(qkv, plan.fallback, True)
        varlen_attn = _varlen()[0]
        q, k, v = qkv.unbind(1)  # each (T, heads, head_dim), views with a row stride of 3 * heads * head_dim
        window = plan.local_window if is_local else (-1, -1)
        if plan.keys is not None:
            rows, cu_k, max_k = plan.keys
            return varlen_attn(
                q, k[rows], v[rows], plan.cu_seqlens, cu_k, plan.max_seqlen, max_k, window_size=window
            )  # (T, heads, head_dim)
        extra = {} if plan.seqused_k is None else {"seqused_k": plan.seqused_k}
        return varlen_attn(
            q, k, v, plan.cu_seqlens, plan.cu_seqlens, plan.max_seqlen, plan.max_seqlen, window_size=window, **extra
        )  # (T, heads, head_dim)


BACKENDS = {"varlen": VarlenBackend, "sdpa": SdpaBackend}


def varlen_available(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when the varlen backend can run here, else the reason it cannot."""
    if device.type != "cuda":  # checked first: a CPU run never imports the varlen module
        return f"varlen flash attention needs a CUDA device, not {device.type!r}"
    if "window_size" not in _varlen()[1]:
        return f"torch {torch.__version__} has no varlen flash attention with a window (needs torch >= 2.11)"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"varlen flash attention needs float16 or bfloat16, not {str(dtype).removeprefix('torch.')}"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"flash attention needs an Ampere or newer GPU (compute capability 8.0), this one is {major}.{minor}"
    return None


_logged: set[tuple[str, str]] = set()


def select_backend(name: str, device: torch.device, dtype: torch.dtype):
    """Instantiate the backend ``name`` ("auto", "varlen", "sdpa") for this device and dtype.

    ``"auto"`` picks ``"varlen"`` on CUDA in fp16/bf16 and ``"sdpa"`` everywhere else.

    Raises
    ------
    BackendError
        ``name`` is unknown, or names a backend that cannot run on this device/dtype.
    """
    if name == "auto":
        reason = varlen_available(device, dtype)
        chosen = "sdpa" if reason else "varlen"
        key = (chosen, str(device))
        if key not in _logged:  # say it once per process, not once per model load
            _logged.add(key)
            why = f"; {reason}" if reason and device.type == "cuda" else ""
            log.info("attention backend: %s on %s (%s)%s", chosen, device, str(dtype).removeprefix("torch."), why)
        return BACKENDS[chosen](dtype, device)
    if name == "flash":
        # The flash-attn package has no binary wheel (a source build takes hours of nvcc), so
        # for users it never ran; torch ships the same kernels with a window.
        raise BackendError(
            "Attention backend 'flash' (the flash-attn package) was removed; torch's own varlen flash "
            "attention runs the same kernels with nothing to install: use backend='varlen' or 'auto'"
        )
    if name not in BACKENDS:
        raise BackendError(f"Unknown attention backend {name!r}; use one of 'auto', {', '.join(map(repr, BACKENDS))}")
    if name == "varlen":
        reason = varlen_available(device, dtype)
        if reason:
            raise BackendError(f"Attention backend 'varlen' cannot run here: {reason}; use backend='sdpa' or 'auto'")
    return BACKENDS[name](dtype, device)
