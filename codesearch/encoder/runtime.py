"""Where the model runs: device, dtype, token-budget batching, and the public ``Encoder``.

The model file knows nothing about devices or precision; this module decides them once at
load time (``resolve_device``, ``resolve_dtype``), groups texts into batches of at most
``batch_tokens`` real tokens over length-sorted inputs (so similar lengths meet and the few
padded attention groups stay small), runs them, and returns results in input order.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from codesearch.encoder.heads import Tokenized
from codesearch.encoder.modernbert import PackedBatch
from codesearch.errors import BackendError

log = logging.getLogger(__name__)

# Real tokens per forward pass. Large enough that per-call overhead disappears on CPU, small
# enough that activations stay in the tens of MB for ModernBERT-base; one 8192-token file fits.
DEFAULT_BATCH_TOKENS = 16384
# The padded (transformers) path pays for padding, so its budget counts padded tokens.
DEFAULT_PADDED_BATCH_TOKENS = 8192

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


# --------------------------------------------------------------------------------------------
# Device and dtype
# --------------------------------------------------------------------------------------------


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """True when the CPU multiplies bf16 in hardware (AMX-bf16 or AVX512-bf16).

    On such CPUs (Sapphire Rapids and later, Zen 4) bf16 matmuls run several times faster than
    fp32 through oneDNN; elsewhere bf16 is emulated and slower than fp32.
    """
    try:
        if "AMX" in str(torch.backends.cpu.get_cpu_capability()).upper():
            return True
    except Exception:  # older torch without the probe
        pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool({"amx_bf16", "avx512_bf16"} & flags)
    except OSError:
        pass
    return False


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; an explicit device must exist.

    Raises
    ------
    BackendError
        An unknown device string, or a device this machine does not have.
    """
    if isinstance(device, torch.device):
        dev = device
    elif device == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError):
            raise BackendError(f"Unknown device {device!r}; use 'auto', 'cpu' or 'cuda'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BackendError(f"Device {str(dev)!r} was requested but CUDA is not available here; use device='cpu'")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise BackendError(f"Device {str(dev)!r} was requested but MPS is not available here; use device='cpu'")
    return dev


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``"auto"``: bf16 on CUDA (fp16 where bf16 is unsupported) and on CPUs with AMX/AVX512-bf16
    (measured faster there, see BENCHMARKS.md), fp32 elsewhere.

    Raises
    ------
    BackendError
        An unknown dtype name.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "cpu" and cpu_has_fast_bf16():
            return torch.bfloat16
        return torch.float32
    if dtype not in DTYPES:
        raise BackendError(f"Unknown dtype {dtype!r}; use 'auto', 'float32', 'bfloat16' or 'float16'")
    return DTYPES[dtype]


# --------------------------------------------------------------------------------------------
# Batching
# --------------------------------------------------------------------------------------------


def token_batches(lengths: list[int], budget: int, *, padded: bool = False) -> list[list[int]]:
    """Indices grouped into batches of at most ``budget`` tokens, longest sequences first.

    Packed batches count real tokens; padded batches count ``len(batch) * longest``. A sequence
    longer than the budget gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    used = 0
    for i in order:
        n = lengths[i]
        if batches:
            cost = (len(batches[-1]) + 1) * lengths[batches[-1][0]] if padded else used + n
            if cost <= budget:
                batches[-1].append(i)
                used += n
                continue
        batches.append([i])
        used = n
    return batches


# --------------------------------------------------------------------------------------------
# Threads for small inputs
# --------------------------------------------------------------------------------------------

# A forward pass over at most this many tokens runs on one intra-op thread when the machine
# is busy (machine_busy). Such passes (a search query is 10-40 tokens) are bound by reading
# the weights; on a busy machine every op of a multi-threaded pass waits at an OpenMP
# barrier for a thread the OS has descheduled, which made one short query cost 10-25x its
# single-thread time, while on a quiet one a second thread still cuts it by a third
# (see BENCHMARKS.md "Query latency").
SMALL_FORWARD_TOKENS = 128


def machine_busy() -> bool:
    """True when the CPUs are already taken: the 1-minute load average is above the number
    of cores this process may run on, less one (unknown load counts as busy). Checked on
    every short pass, not once: the load changes while a server runs.

    Why: a short forward pass on a second OpenMP thread pays off only when that thread gets
    a core at once. On a quiet 2-core machine two threads encode a 149M-model query in
    25 ms instead of 40; on a busy one each of the ~400 small ops waits at a barrier for a
    descheduled thread, and the same query took 10-25x its single-thread time.
    """
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on this platform
        return True
    try:
        cores = len(os.sched_getaffinity(0))  # a container's share, not the host's count
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return load > cores - 1


_threads_lock = threading.Lock()
_threads_users = 0  # forward passes currently inside single_thread()
_threads_saved = 1  # the thread count to restore when the last one leaves


@contextlib.contextmanager
def single_thread(enabled: bool = True):
    """Run the body with ``torch.set_num_threads(1)``, restoring the previous count afterwards.

    The thread count is process-wide, so overlapping users are counted and only the last one
    out restores it; a large forward pass that starts meanwhile in another thread runs on one
    thread until then.
    """
    global _threads_users, _threads_saved
    if not enabled:
        yield
        return
    with _threads_lock:
        if _threads_users == 0:
            _threads_saved = torch.get_num_threads()
            if _threads_saved != 1:
                torch.set_num_threads(1)
        _threads_users += 1
    try:
        yield
    finally:
        with _threads_lock:
            _threads_users -= 1
            if _threads_users == 0 and _threads_saved != 1:
                torch.set_num_threads(_threads_saved)


# --------------------------------------------------------------------------------------------
# Backbones: token ids in, packed hidden states out
# --------------------------------------------------------------------------------------------


class PackedBackbone:
    """Our ModernBERT on one packed stream (no padding anywhere outside attention groups)."""

    padded = False

    def __init__(self, model, device: torch.device):
        self.model = model
        self.device = device
        self.hidden_size = model.config.hidden_size
        self.backend_name = model.backend.name

    def __call__(self, ids: list[list[int]], n_keys: list[int] | None) -> torch.Tensor:
        batch = PackedBatch.from_ids(ids, self.device, n_keys)
        small = self.device.type == "cpu" and sum(batch.lengths) <= SMALL_FORWARD_TOKENS and machine_busy()
        with torch.inference_mode(), single_thread(small):
            return self.model(batch)  # (total_tokens, hidden)


class PaddedBackbone:
    """A transformers ``AutoModel`` (BERT, MiniLM, ...): padded batches, real tokens kept."""

    padded = True
    backend_name = "transformers"

    def __init__(self, model, device: torch.device, pad_id: int):
        self.model = model
        self.device = device
        self.pad_id = pad_id
        self.hidden_size = int(model.config.hidden_size)

    def __call__(self, ids: list[list[int]], n_keys: list[int] | None) -> torch.Tensor:
        lengths = [len(x) for x in ids]
        keys = n_keys or lengths
        L = max(lengths)
        input_ids = torch.full((len(ids), L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), L), dtype=torch.long)
        for i, x in enumerate(ids):
            input_ids[i, : len(x)] = torch.tensor(x)
            mask[i, : keys[i]] = 1
        small = self.device.type == "cpu" and len(ids) * L <= SMALL_FORWARD_TOKENS and machine_busy()
        with torch.inference_mode(), single_thread(small):
            out = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device))
        hidden = out.last_hidden_state  # (batch, L, hidden)
        real = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (batch, L)
        return hidden[real.to(self.device)]  # (total_tokens, hidden), sequences in order


# --------------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------------


@dataclass
class Encoder:
    """A loaded text encoder: ``encode`` for vectors, ``hidden_states`` for raw token states.

    Build one with :func:`codesearch.encoder.load`.

    Attributes
    ----------
    name : str
        What was asked for (a path or a hub id).
    identity : str
        ``name@hash`` of config, head settings and weights: indexes refuse to mix identities.
    multivector : bool
        True for ColBERT checkpoints (one vector per token).
    dim : int
        Size of each output vector.
    max_length : int
        Longest document in tokens (ColBERT: ``document_length``); longer texts are truncated.

    Examples
    --------
    >>> enc = load("Alibaba-NLP/gte-modernbert-base")             # doctest: +SKIP
    >>> enc.encode(["def retry(): ..."], kind="document").shape    # doctest: +SKIP
    (1, 768)
    """

    name: str
    identity: str
    directory: Path
    backbone: PackedBackbone | PaddedBackbone
    tokenizer: object
    head: object
    device: torch.device
    dtype: torch.dtype

    def __post_init__(self) -> None:
        self.head.to(self.device, self.dtype)

    @property
    def multivector(self) -> bool:
        return bool(self.head.multivector)

    @property
    def dim(self) -> int:
        return int(self.head.dim)

    @property
    def max_length(self) -> int:
        return int(self.head.max_length)

    @property
    def backend(self) -> str:
        """Attention backend in use: "varlen", "sdpa" or "transformers"."""
        return self.backbone.backend_name

    def __repr__(self) -> str:
        return (
            f"Encoder({self.identity!r}, {'multivector' if self.multivector else 'single-vector'}, dim={self.dim}, "
            f"device={self.device}, dtype={str(self.dtype).removeprefix('torch.')}, backend={self.backend})"
        )

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens each text takes as a document before truncation, special and prefix tokens
        included (compare with ``max_length``)."""
        extra = self.head.count_extra("document")
        return [n + extra for n in self.tokenizer.count(list(texts))]

    def token_counter(self):
        """A picklable ``count(text) -> int`` equal to ``count_tokens([text])[0]`` (for worker
        processes: it carries the tokenizer file's path, not the loaded model)."""
        from codesearch.encoder.loading import TokenCounter

        return TokenCounter(self.tokenizer.path, self.head.count_extra("document"))

    def _batches(self, ids: list[list[int]], batch_tokens: int | None) -> list[list[int]]:
        padded = self.backbone.padded
        budget = batch_tokens or (DEFAULT_PADDED_BATCH_TOKENS if padded else DEFAULT_BATCH_TOKENS)
        return token_batches([len(x) for x in ids], budget, padded=padded)

    def encode(
        self, texts: list[str], kind: str = "document", batch_tokens: int | None = None
    ) -> np.ndarray | list[np.ndarray]:
        """Vectors for ``texts``, in input order.

        Parameters
        ----------
        texts
            Texts to encode.
        kind
            ``"document"`` or ``"query"`` (ColBERT prefixes and query expansion differ).
        batch_tokens
            Token budget per forward pass (default 16384 packed, 8192 padded).

        Returns
        -------
        numpy.ndarray or list of numpy.ndarray
            Single-vector models: float32 ``(n, dim)``, L2-normalised when the checkpoint lists
            a Normalize module. Multi-vector: one float32 ``(n_tokens_i, dim)`` array per text,
            rows L2-normalised.
        """
        if kind not in ("document", "query"):
            raise ValueError(f"kind must be 'document' or 'query', not {kind!r}")
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of texts, not one string; wrap it: encode([text])")
        texts = list(texts)
        tok = self.head.tokenize(self.tokenizer, texts, kind)
        results: list = [None] * len(texts)
        # the head's small ops too: a second thread woken for them would spin on a busy machine
        small = self.device.type == "cpu" and sum(map(len, tok.ids)) <= SMALL_FORWARD_TOKENS and machine_busy()
        with single_thread(small):
            for batch in self._batches(tok.ids, batch_tokens):
                sub = Tokenized(
                    [tok.ids[i] for i in batch], None if tok.n_keys is None else [tok.n_keys[i] for i in batch]
                )
                packed = self.backbone(sub.ids, sub.n_keys)
                out = self.head(packed, [len(x) for x in sub.ids], sub, kind)
                for j, i in enumerate(batch):
                    results[i] = out[j]
        if self.multivector:
            return results
        if not results:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack(results).astype(np.float32, copy=False)

    def hidden_states(self, texts: list[str], batch_tokens: int | None = None) -> list[torch.Tensor]:
        """Last-layer hidden states of ``[CLS] text [SEP]`` (truncated to ``max_length``), real
        tokens only: one float32 CPU tensor ``(n_tokens, hidden)`` per text, in input order."""
        if isinstance(texts, str):
            raise TypeError("hidden_states() takes a list of texts, not one string; wrap it: hidden_states([text])")
        ids = self.tokenizer.encode(list(texts), self.max_length)
        results: list = [None] * len(ids)
        for batch in self._batches(ids, batch_tokens):
            packed = self.backbone([ids[i] for i in batch], None)
            for i, part in zip(batch, torch.split(packed, [len(ids[i]) for i in batch])):
                results[i] = part.float().cpu()
        return results
