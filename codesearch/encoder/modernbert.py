"""ModernBERT, written to be read top to bottom.

The model of Warner et al. (2024), "Smarter, Better, Faster, Longer: A Modern Bidirectional
Encoder", as the Hugging Face checkpoints lay it out, in the order a reader of the paper meets
it: config, embeddings, rotary positions, attention, GeGLU MLP, pre-norm layer, model.

Everything runs on one packed token stream (no padding): a batch of sequences is a single
``(total_tokens, hidden)`` tensor plus ``cu_seqlens``, the offsets where each sequence starts.
Embeddings, projections, MLPs and norms are per-token, so they never see a pad token; only
attention needs to know where sequences begin and end, and that is the job of the backend
chosen once at load time (``attention.py``). Device, dtype and batching belong to
``runtime.py``; this file only describes the network.

Weight names are the checkpoint's own (``embeddings.tok_embeddings``, ``layers.N.attn.Wqkv``,
``mlp.Wi``, ``final_norm`` ...), so loading is a dict copy with shape checks.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from codesearch.errors import CheckpointError

GLOBAL, LOCAL = "global", "local"

# `hidden_activation` values seen in ModernBERT configs -> the function they name.
ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
}


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModernBertConfig:
    """Architecture hyper-parameters; nothing about device, dtype or batching."""

    vocab_size: int  # rows of the token embedding table
    hidden_size: int  # width of the residual stream
    intermediate_size: int  # width of the GeGLU hidden layer (Wi produces twice this)
    num_layers: int  # transformer layers
    num_heads: int  # attention heads; head_dim = hidden_size // num_heads
    max_position_embeddings: int  # longest sequence the rotary tables cover (8192)
    layer_types: tuple[str, ...]  # GLOBAL or LOCAL per layer
    local_attention: int = 128  # local window width; a token sees |i - j| <= local_attention // 2
    global_rope_theta: float = 160_000.0  # rotary base on global layers
    local_rope_theta: float = 10_000.0  # rotary base on local layers
    norm_eps: float = 1e-5  # LayerNorm epsilon
    norm_bias: bool = False  # LayerNorms carry a bias (False in released checkpoints)
    attention_bias: bool = False  # Wqkv / Wo carry a bias
    mlp_bias: bool = False  # Wi / Wo carry a bias
    activation: str = "gelu"  # GeGLU gate activation, a key of ACTIVATIONS
    pad_token_id: int | None = None  # only used by the padded reference paths
    model_type: str = "modernbert"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def window(self) -> int:
        """Tokens seen on each side by a local layer (inclusive): 64 for local_attention=128."""
        return self.local_attention // 2

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModernBertConfig:
        """Read a checkpoint's ``config.json`` in either the legacy or the newer form.

        Legacy: ``global_attn_every_n_layers``, ``global_rope_theta``, ``local_rope_theta``.
        Newer (transformers >= 5): ``layer_types`` (``full_attention``/``sliding_attention``)
        and ``rope_parameters`` keyed by those names. Unknown keys are ignored.

        Raises
        ------
        CheckpointError
            A required key is missing or a value is inconsistent.
        """
        try:
            num_layers = int(d["num_hidden_layers"])
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            cfg_kw = dict(
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=num_layers,
                num_heads=heads,
                max_position_embeddings=int(d.get("max_position_embeddings", 8192)),
                local_attention=int(d.get("local_attention", 128)),
                norm_eps=float(d.get("norm_eps", 1e-5)),
                norm_bias=bool(d.get("norm_bias", False)),
                attention_bias=bool(d.get("attention_bias", False)),
                mlp_bias=bool(d.get("mlp_bias", False)),
                activation=str(d.get("hidden_activation", "gelu")),
                pad_token_id=d.get("pad_token_id"),
            )
        except KeyError as e:
            raise CheckpointError(
                f"config.json has no {e.args[0]!r}; it is not a ModernBERT config "
                "(re-download the checkpoint or pass a ModernBERT model directory)"
            ) from None
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"config.json has a malformed value ({e}); fix or re-download it") from None

        types = d.get("layer_types")
        if types is not None:
            names = {"full_attention": GLOBAL, "sliding_attention": LOCAL, GLOBAL: GLOBAL, LOCAL: LOCAL}
            if len(types) != num_layers or any(t not in names for t in types):
                raise CheckpointError(
                    f"config.json layer_types {types!r} must list {num_layers} entries of "
                    "'full_attention' or 'sliding_attention'"
                )
            layer_types = tuple(names[t] for t in types)
        else:
            every = int(d.get("global_attn_every_n_layers", 3))
            if every < 1:
                raise CheckpointError(f"config.json global_attn_every_n_layers={every} must be >= 1")
            layer_types = tuple(GLOBAL if i % every == 0 else LOCAL for i in range(num_layers))

        rope = d.get("rope_parameters") or {}
        g_theta = d.get("global_rope_theta", (rope.get("full_attention") or {}).get("rope_theta", 160_000.0))
        l_theta = d.get("local_rope_theta", (rope.get("sliding_attention") or {}).get("rope_theta", 10_000.0))
        for kind in ("full_attention", "sliding_attention"):
            rope_type = (rope.get(kind) or {}).get("rope_type", "default")
            if rope_type != "default":
                raise CheckpointError(
                    f"config.json rope_parameters[{kind!r}] uses rope_type {rope_type!r}; only "
                    "'default' is supported (use a checkpoint without RoPE scaling)"
                )
        if d.get("rope_scaling"):
            raise CheckpointError("config.json sets rope_scaling; only unscaled RoPE is supported")
        cfg_kw.update(layer_types=layer_types, global_rope_theta=float(g_theta), local_rope_theta=float(l_theta))

        if hidden <= 0 or heads <= 0 or hidden % heads:
            raise CheckpointError(
                f"config.json hidden_size={hidden} is not a multiple of num_attention_heads={heads}"
            )
        if (hidden // heads) % 2:
            raise CheckpointError(f"config.json head size {hidden // heads} must be even for RoPE")
        if cfg_kw["local_attention"] < 2:
            raise CheckpointError(f"config.json local_attention={cfg_kw['local_attention']} must be >= 2")
        if cfg_kw["activation"] not in ACTIVATIONS:
            raise CheckpointError(
                f"config.json hidden_activation {cfg_kw['activation']!r} is not one of {sorted(ACTIVATIONS)}"
            )
        return cls(**cfg_kw)


# --------------------------------------------------------------------------------------------
# A packed batch: the only input the model takes
# --------------------------------------------------------------------------------------------


@dataclass
class PackedBatch:
    """Sequences laid end to end in one stream.

    ``n_keys`` (optional, one per sequence) limits which tokens other tokens may attend to:
    only the first ``n_keys[i]`` tokens of sequence ``i`` are keys, the rest only ask. That is
    ColBERT query expansion with ``attend_to_expansion_tokens=False``: the [MASK] tokens read
    the query but nobody reads them (PyLate zeroes their attention mask).
    """

    input_ids: torch.Tensor  # (total_tokens,) int64
    position_ids: torch.Tensor  # (total_tokens,) int64, restarting at 0 in every sequence
    cu_seqlens: torch.Tensor  # (batch + 1,) int32 offsets, cu_seqlens[-1] == total_tokens
    lengths: tuple[int, ...]  # tokens per sequence
    n_keys: tuple[int, ...] | None = None  # tokens per sequence that may be attended to
    key_counts: torch.Tensor | None = None  # (batch,) int32 n_keys as a tensor (varlen's seqused_k)

    @property
    def max_seqlen(self) -> int:
        return max(self.lengths) if self.lengths else 0

    @classmethod
    def pack(cls, ids: list[list[int]], n_keys: list[int] | None = None, *, pin: bool = False) -> PackedBatch:
        """Pack token id lists (each non-empty) into one stream on the CPU.

        ``pin=True`` puts the tensors in page-locked memory, so that ``to(cuda, non_blocking=True)``
        is a true asynchronous copy (from pageable memory CUDA first waits for the GPU to drain).
        """
        lengths = tuple(len(x) for x in ids)
        assert all(n > 0 for n in lengths), "every sequence needs at least one token"
        lens = np.fromiter(lengths, dtype=np.int64, count=len(lengths))
        total = int(lens.sum())
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=total)
        cu = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lens, out=cu[1:])
        # positions restart at every sequence: arange(total) - start of the token's sequence
        positions = np.arange(total, dtype=np.int64) - np.repeat(cu[:-1].astype(np.int64), lens)
        keys = counts = None
        if n_keys is not None and any(k != n for k, n in zip(n_keys, lengths)):
            keys = tuple(int(k) for k in n_keys)
            counts = torch.tensor(keys, dtype=torch.int32)
        tensors = [torch.from_numpy(a) for a in (flat, positions, cu)]
        if pin:
            tensors = [t.pin_memory() for t in tensors]
            counts = None if counts is None else counts.pin_memory()
        return cls(*tensors, lengths, keys, counts)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedBatch:
        """The same batch on ``device`` (asynchronous from pinned memory with ``non_blocking``)."""

        def move(t):
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return PackedBatch(
            move(self.input_ids), move(self.position_ids), move(self.cu_seqlens), self.lengths, self.n_keys,
            move(self.key_counts),
        )

    @classmethod
    def from_ids(
        cls, ids: list[list[int]], device: torch.device | str = "cpu", n_keys: list[int] | None = None
    ) -> PackedBatch:
        """Pack token id lists (each non-empty) into one stream on ``device``."""
        return cls.pack(ids, n_keys).to(device)


# --------------------------------------------------------------------------------------------
# Embeddings: token lookup and LayerNorm (no absolute positions: RoPE does that)
# --------------------------------------------------------------------------------------------


class Embeddings(nn.Module):
    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        # Weights always come from a checkpoint (the model is built on the meta device, then
        # the loaded tensors are assigned), so no random init: nn.Embedding's normal_() on the
        # meta device imports torch._dynamo, 2.5 s of a CPU model load.
        shape = (cfg.vocab_size, cfg.hidden_size)
        self.tok_embeddings = nn.Embedding(*shape, _weight=torch.empty(shape))
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))  # (T, hidden)


# --------------------------------------------------------------------------------------------
# Rotary position embedding (Su et al.), "rotate half" layout as in the checkpoints
# --------------------------------------------------------------------------------------------


def rope_tables(theta: float, head_dim: int, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * theta^(-2i/d), shape (max_positions, head_dim), fp32.

    Each frequency appears twice (``cat(freqs, freqs)``), matching the "rotate half" layout of
    the checkpoints. Precomputed once per theta and gathered by position id: a packed batch has
    positions that restart per sequence, so a table lookup is simpler than recomputing them.
    """
    # On the CPU whatever the default device: on the meta device (where models are built)
    # these ops go through torch._refs, which imports torch._dynamo (2.5 s on a CPU load).
    cpu = torch.device("cpu")
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=cpu) / head_dim))
    freqs = torch.arange(max_positions, dtype=torch.float32, device=cpu)[:, None] * inv_freq[None, :]
    freqs = torch.cat((freqs, freqs), dim=-1)  # (max_positions, head_dim)
    return freqs.cos(), freqs.sin()


def apply_rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scratch: torch.Tensor | None = None) -> None:
    """Rotate q and k of a packed ``(T, 3, heads, head_dim)`` tensor in place:
    ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x1, x2) = (-x2, x1)``.

    In place on the q/k view, so the stream is not copied back; cos/sin are (T, 1, 1, head_dim)
    in the stream's dtype (transformers also casts them to the model dtype). ``scratch``: room
    for ``T * 2 * heads * head_dim / 2`` values of that dtype, used instead of a new tensor.
    """
    half = qkv.shape[-1] // 2
    qk = qkv[:, :2]  # (T, 2, heads, head_dim), a view
    x1, x2 = qk[..., :half], qk[..., half:]
    c, s = cos[..., :half], sin[..., :half]  # both halves of the tables are the same
    # (x1, x2) -> (x1 c - x2 s, x2 c + x1 s) half by half: one copy of x1 instead of building
    # rotate_half(x) whole; bit-identical, 1.6x faster on a CPU (20k tokens, 17M shape)
    if scratch is None:
        x1_old = x1.clone()
    else:
        x1_old = scratch[: x1.numel()].view(x1.shape).copy_(x1)  # (T, 2, heads, head_dim / 2)
    x1.mul_(c).addcmul_(x2, s, value=-1)
    x2.mul_(c).addcmul_(x1_old, s)


# --------------------------------------------------------------------------------------------
# Attention: fused Wqkv, RoPE, then the backend (global or local window), then Wo
# --------------------------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, cfg: ModernBertConfig, layer: int):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.is_local = cfg.layer_types[layer] == LOCAL
        self.Wqkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.attention_bias)
        self.Wo = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.attention_bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], backend, plan) -> torch.Tensor:
        total = x.shape[0]
        qkv = self.Wqkv(x).view(total, 3, self.num_heads, self.head_dim)  # (T, 3, heads, head_dim)
        apply_rope(qkv, *rope)
        out = backend(qkv, plan, self.is_local)  # (T, heads, head_dim)
        return self.Wo(out.reshape(total, self.num_heads * self.head_dim))  # (T, hidden)


# --------------------------------------------------------------------------------------------
# MLP: GeGLU, Wi produces [input | gate]; act(input) * gate; Wo back to hidden
# --------------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.act = ACTIVATIONS[cfg.activation]
        self.Wi = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.Wo = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp, gate = self.Wi(x).chunk(2, dim=-1)  # 2 x (T, intermediate)
        return self.Wo(self.act(inp) * gate)  # (T, hidden)


# --------------------------------------------------------------------------------------------
# Layer: pre-norm residual blocks; layer 0 has no attn_norm (the embedding norm precedes it)
# --------------------------------------------------------------------------------------------


class Layer(nn.Module):
    def __init__(self, cfg: ModernBertConfig, layer: int):
        super().__init__()
        self.attn_norm = (
            nn.Identity() if layer == 0 else nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)
        )
        self.attn = Attention(cfg, layer)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, rope, backend, plan) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, backend, plan)
        return x + self.mlp(self.mlp_norm(x))


# --------------------------------------------------------------------------------------------
# The same layer as two functions of plain tensors, for torch.compile (CUDA)
# --------------------------------------------------------------------------------------------
#
# On a GPU the matmuls are fast and the elementwise work around them (RoPE's cat/neg/mul,
# GeGLU, residual adds, LayerNorms) costs more than they do when each op is its own kernel.
# Compiled, each function below becomes the matmuls plus a few fused kernels. Weights are
# arguments, not module attributes, so every layer shares one compiled graph (two: layer 0
# has no attn_norm) instead of one graph per layer; only the token dimension varies.


def attention_input(
    x: torch.Tensor,
    norm_weight: torch.Tensor | None,
    norm_bias: torch.Tensor | None,
    wqkv: torch.Tensor,
    wqkv_bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
) -> torch.Tensor:
    """attn_norm (skipped when ``norm_weight`` is None), Wqkv, RoPE on q and k: the layer up to
    its attention backend, out of place. Returns ``(T, 3, heads, head_dim)``."""
    if norm_weight is not None:
        x = F.layer_norm(x, x.shape[-1:], norm_weight, norm_bias, eps)
    qkv = F.linear(x, wqkv, wqkv_bias).view(x.shape[0], 3, heads, -1)  # (T, 3, heads, head_dim)
    half = qkv.shape[-1] // 2
    qk = qkv[:, :2]  # (T, 2, heads, head_dim)
    rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
    return torch.cat((qk * cos + rotated * sin, qkv[:, 2:]), dim=1)  # (T, 3, heads, head_dim)


def attention_output_and_mlp(
    x: torch.Tensor,
    attn: torch.Tensor,
    wo: torch.Tensor,
    wo_bias: torch.Tensor | None,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor | None,
    wi: torch.Tensor,
    wi_bias: torch.Tensor | None,
    mlp_wo: torch.Tensor,
    mlp_wo_bias: torch.Tensor | None,
    eps: float,
    act,
) -> torch.Tensor:
    """The layer after its attention backend: Wo, residual, mlp_norm, GeGLU MLP, residual."""
    x = x + F.linear(attn.flatten(1), wo, wo_bias)  # (T, hidden)
    h = F.layer_norm(x, x.shape[-1:], norm_weight, norm_bias, eps)
    inp, gate = F.linear(h, wi, wi_bias).chunk(2, dim=-1)  # 2 x (T, intermediate)
    return x + F.linear(act(inp) * gate, mlp_wo, mlp_wo_bias)  # (T, hidden)


class FusedLayers:
    """Runs a model's layers through :func:`attention_input` and
    :func:`attention_output_and_mlp`, or through compiled versions of them.

    ``runtime.py`` builds one with ``torch.compile``d functions on CUDA; with the plain functions
    it computes what the modules compute (the tests check both).
    """

    def __init__(self, model: ModernBert, first=attention_input, second=attention_output_and_mlp, dynamic=False):
        self.model = model
        self.compute = None  # matmuls in the model's dtype
        self.first, self.second = first, second
        # compiled functions: the token dimension is dynamic, so a new batch size is no new graph
        self.dynamic = dynamic

    def __call__(self, x: torch.Tensor, ropes: list, backend, plan) -> torch.Tensor:
        cfg = self.model.config
        mark = torch._dynamo.maybe_mark_dynamic if self.dynamic else (lambda t, dim: None)
        for layer, (cos, sin) in zip(self.model.layers, ropes):
            for t in (x, cos, sin):
                mark(t, 0)
            norm = layer.attn_norm if isinstance(layer.attn_norm, nn.LayerNorm) else None
            a = layer.attn
            qkv = self.first(
                x, norm and norm.weight, norm and norm.bias, a.Wqkv.weight, a.Wqkv.bias, cos, sin, cfg.norm_eps,
                cfg.num_heads,
            )  # (T, 3, heads, head_dim)
            out = backend(qkv, plan, a.is_local)  # (T, heads, head_dim)
            mark(out, 0)
            m = layer.mlp
            x = self.second(
                x, out, a.Wo.weight, a.Wo.bias, layer.mlp_norm.weight, layer.mlp_norm.bias, m.Wi.weight, m.Wi.bias,
                m.Wo.weight, m.Wo.bias, cfg.norm_eps, m.act,
            )  # (T, hidden)
        return x


# --------------------------------------------------------------------------------------------
# The same layer for the CPU: fewer passes over memory, matmuls in the CPU's faster dtype
# --------------------------------------------------------------------------------------------
#
# On a CPU the matmuls are most of the time and every other op is a pass over a (T, hidden)
# or (T, intermediate) tensor, a fresh allocation (page faults) and a barrier between threads.
# So the residual adds go into the matmuls (``x.addmm_``: the GEMM adds its product to x),
# GeGLU runs in place on the Wi output, and nothing is allocated that the modules do not need.
#
# ``compute`` (fp32 for a bf16 model on a CPU whose bf16 matmuls are slower than its fp32 ones,
# see ``cpu.cpu_has_fast_bf16``): the weights and the residual stream stay bf16; each block
# (attention, MLP) reads the stream and the weights into fp32, computes in fp32, and its result
# is rounded once, when it is added to the stream. Products of bf16 values are exact in fp32
# and oneDNN's bf16 kernels accumulate in fp32 too, so this is the bf16 model computed on the
# fp32 FMA units, a little more precise (intermediate results are not rounded to bf16).

# In-place forms of ACTIVATIONS, for the GeGLU input half of the Wi output (a strided view).
ACTIVATIONS_INPLACE = {
    "gelu": lambda x: torch.ops.aten.gelu_(x),
    "gelu_pytorch_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "gelu_new": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "gelu_fast": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "silu": lambda x: F.silu(x, inplace=True),
    "swish": lambda x: F.silu(x, inplace=True),
    "relu": lambda x: x.relu_(),
}


class CpuLayers:
    """Runs a model's layers on the CPU as the modules do, with fewer passes over memory.

    ``compute``: the dtype of the matmuls and of attention (None: the model's own). A backend
    given to ``__call__`` must build its masks in that dtype.

    Everything but attention is per token, so it runs in slices of ``chunk`` tokens: a slice's
    LayerNorm output, its Wi output and its GeGLU stay in the caches between the ops that read
    them instead of going out to memory and back after every op (the MLP block alone: 1.14x at
    the base widths, 1.4-1.7x at the 17M ones, single and two threads). The slices' buffers
    are allocated once per pass; only qkv and the attention output are whole-batch tensors.
    """

    def __init__(self, model: ModernBert, compute: torch.dtype | None = None, chunk: int = 1024):
        self.model = model
        self.compute = compute
        self.chunk = chunk
        self.act_ = ACTIVATIONS_INPLACE[model.config.activation]

    def _w(self, t: torch.Tensor | None) -> torch.Tensor | None:
        # a bf16 weight read into fp32 on every call: ~1 ms a matrix against ~0.5 s of GEMM for
        # a 16k-token batch, and no second copy of the weights in memory
        return t if t is None or self.compute is None else t.to(self.compute)

    @staticmethod
    def _linear(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
        """``F.linear(h, w, b)`` written into ``out``."""
        if b is None:
            return torch.mm(h, w.t(), out=out)
        return torch.addmm(b, h, w.t(), out=out)

    @staticmethod
    def _add_linear(x: torch.Tensor, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, tmp) -> None:
        """``x += F.linear(h, w, b)`` in place: inside the GEMM for an fp32 stream, else the
        product (in ``tmp``, of h's dtype) is added to x as the modules add it. Not inside the
        GEMM for bf16: ``addmm_`` on a bf16 x drifted further from fp32 than the modules (max
        0.111 against 0.089 on the test checkpoint, over the test's 0.1)."""
        if x.dtype == h.dtype == torch.float32:
            x.addmm_(h, w.t())  # (n, hidden) += (n, in) @ (in, hidden)
            if b is not None:
                x.add_(b)
        else:
            x.add_(CpuLayers._linear(h, w, b, tmp[: h.shape[0]]))

    def __call__(self, x: torch.Tensor, ropes: list, backend, plan) -> torch.Tensor:
        cfg = self.model.config
        total, hidden, inter = x.shape[0], cfg.hidden_size, cfg.intermediate_size
        heads, hd, c = cfg.num_heads, cfg.head_dim, self.chunk
        cd = self.compute or x.dtype
        new = functools.partial(torch.empty, device=x.device, dtype=cd)
        qkv = new(total, 3, heads, hd)
        attn = new(total, heads, hd)
        y = new(min(c, total), 2 * inter)  # a slice's Wi output; its first half is the GeGLU output
        h_in = tmp = None
        if cd != x.dtype:  # a slice's LayerNorm output as the matmuls read it
            h_in = new(min(c, total), hidden)
        if x.dtype != torch.float32:  # a product to add to x (see _add_linear)
            tmp = new(min(c, total), hidden)
        slices = [(s, min(s + c, total)) for s in range(0, total, c)]
        w = self._w
        for layer, (cos, sin) in zip(self.model.layers, ropes):
            a, m = layer.attn, layer.mlp
            wqkv, bqkv, wo, bo = w(a.Wqkv.weight), w(a.Wqkv.bias), w(a.Wo.weight), w(a.Wo.bias)
            for s, e in slices:  # attn_norm, Wqkv, RoPE
                h = layer.attn_norm(x[s:e])  # (n, hidden); layer 0: x itself (Identity), only read
                if h_in is not None:
                    h = h_in[: e - s].copy_(h)
                self._linear(h, wqkv, bqkv, qkv[s:e].view(e - s, -1))  # (n, 3 * hidden)
                apply_rope(qkv[s:e], cos[s:e], sin[s:e], y.view(-1))  # y is free until the MLP
            out = backend(qkv, plan, a.is_local, out=attn)  # (T, heads, head_dim)
            wi, bi, wo2, bo2 = w(m.Wi.weight), w(m.Wi.bias), w(m.Wo.weight), w(m.Wo.bias)
            for s, e in slices:  # Wo and the residual, then the whole MLP block
                xs = x[s:e]
                self._add_linear(xs, out[s:e].view(e - s, hidden), wo, bo, tmp)
                h = layer.mlp_norm(xs)  # (n, hidden)
                if h_in is not None:
                    h = h_in[: e - s].copy_(h)
                ys = self._linear(h, wi, bi, y[: e - s])  # (n, 2 * intermediate)
                inp, gate = ys.chunk(2, dim=-1)  # 2 x (n, intermediate), views with a row stride of 2 * intermediate
                self.act_(inp).mul_(gate)
                self._add_linear(xs, inp, wo2, bo2, tmp)  # the GEMM reads the strided view, no copy
        return x


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


class ModernBert(nn.Module):
    """The encoder body: ``forward(PackedBatch) -> (total_tokens, hidden)`` last hidden states.

    The attention backend is set once with :meth:`use_backend` (``runtime.py`` does it at
    load); the forward pass calls through it without testing the device on every call.
    """

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.num_layers))
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)
        self.init_rope()
        self.backend = None
        self.fused: FusedLayers | None = None  # set by use_fused (runtime.py, on CUDA)

    def init_rope(self, device: torch.device | str | None = None) -> None:
        """(Re)build the rotary tables; needed after building the model on the meta device."""
        cfg = self.config
        for name, theta in ((GLOBAL, cfg.global_rope_theta), (LOCAL, cfg.local_rope_theta)):
            cos, sin = rope_tables(theta, cfg.head_dim, cfg.max_position_embeddings)
            # not weights: rebuilt from the config, never saved or loaded, kept in fp32
            self.register_buffer(f"{name}_cos", cos.to(device) if device else cos, persistent=False)
            self.register_buffer(f"{name}_sin", sin.to(device) if device else sin, persistent=False)

    def use_backend(self, backend) -> None:
        """Attach the attention backend (an object from ``attention.BACKENDS``)."""
        self.backend = backend

    def use_fused(self, fused: FusedLayers | None) -> None:
        """Run the layers through ``fused`` (compiled elementwise work) instead of the modules."""
        self.fused = fused

    def _rope(self, kind: str, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cos = getattr(self, f"{kind}_cos")[position_ids].to(dtype)  # (T, head_dim)
        sin = getattr(self, f"{kind}_sin")[position_ids].to(dtype)
        return cos[:, None, None, :], sin[:, None, None, :]  # (T, 1, 1, head_dim)

    def forward(self, batch: PackedBatch, fused: bool = True) -> torch.Tensor:
        """Last hidden states ``(total_tokens, hidden)``; ``fused=False`` runs the modules even
        when :meth:`use_fused` attached compiled layers."""
        assert self.backend is not None, "call use_backend() first"
        # from the Python lengths (positions restart at 0): reading the tensor would wait for a GPU
        if batch.max_seqlen > self.config.max_position_embeddings:
            raise ValueError(
                f"a sequence is longer than max_position_embeddings={self.config.max_position_embeddings}"
            )
        x = self.embeddings(batch.input_ids)  # (T, hidden)
        fused = fused and self.fused is not None
        compute = (self.fused.compute if fused else None) or x.dtype  # the dtype of q, k and v
        plan = self.backend.plan(batch, self.config.window, compute)
        ropes = {kind: self._rope(kind, batch.position_ids, compute) for kind in (GLOBAL, LOCAL)}
        if fused:
            x = self.fused(x, [ropes[kind] for kind in self.config.layer_types], self.backend, plan)
        else:
            for layer, kind in zip(self.layers, self.config.layer_types):
                x = layer(x, ropes[kind], self.backend, plan)
        return self.final_norm(x)  # (T, hidden)


def expected_shapes(cfg: ModernBertConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint must provide, by its checkpoint name, with its shape."""
    with torch.device("meta"):  # shapes only: no memory, no random init
        model = ModernBert(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}
