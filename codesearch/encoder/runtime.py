"""Where the model runs: device, dtype, compile, token-budget batching, and the public ``Encoder``.

The model file knows nothing about devices or precision; this module decides them once at
load time (``resolve_device``, ``resolve_dtype``, ``compile_wanted``), groups texts into
batches of at most ``batch_tokens`` real tokens over length-sorted inputs (so similar lengths
meet and the few padded attention groups stay small), runs them, and returns results in input
order.

Keeping a GPU busy (``Encoder.encode`` on CUDA)
-----------------------------------------------
The GPU must never wait for Python. Texts are tokenized and packed on a CPU thread, a few
batches ahead, into pinned memory, so the copy to the device is asynchronous; the heads
(pooling, ColBERT projection, normalisation) run on the device; each batch comes back in ONE
asynchronous copy, which the CPU splits per text while the GPU already runs the next batch.
Nothing in between reads a CUDA tensor back (that would wait for the GPU to drain). On the CPU
the same steps run in the caller's thread, one after another: the forward pass already uses
every core, and tokenizing costs under 1% of it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from codesearch.encoder.cpu import CONTENTION, CONTENTION_MIN_TOKENS, cpu_has_fast_bf16, single_thread, threads_at_most
from codesearch.encoder.heads import HeadInput, Tokenized
from codesearch.encoder.modernbert import (
    CpuLayers,
    FusedLayers,
    PackedBatch,
    attention_input,
    attention_output_and_mlp,
)
from codesearch.errors import BackendError

log = logging.getLogger(__name__)

# Real tokens per forward pass. Large enough that per-call overhead disappears on CPU, small
# enough that activations stay in the tens of MB for ModernBERT-base; one 8192-token file fits.
DEFAULT_BATCH_TOKENS = 16384
# On CUDA, at most this many: a GPU needs large batches to hide per-kernel overhead (ModernBERT-
# base on an H100: 253k tok/s at 16k tokens, 366k at 262k); less where memory is short
# (default_batch_tokens).
CUDA_BATCH_TOKENS = 262144
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
    """``"auto"``: bf16 on CUDA (fp16 where bf16 is unsupported) and on CPUs whose bf16 matmuls
    are clearly faster than fp32 ones (:func:`cpu_has_fast_bf16`), fp32 elsewhere.

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


def default_batch_tokens(device: torch.device, hidden_size: int, intermediate_size: int, dtype: torch.dtype) -> int:
    """Token budget per forward pass for ``device``: 16384 on CPU; on CUDA as many as a quarter
    of the free GPU memory holds (activations of one layer at a time), a power of two between
    16384 and 262144."""
    if device.type != "cuda":
        return DEFAULT_BATCH_TOKENS
    # live activations per token in a layer: x, its norm, qkv (3h), attention out, Wo out, GeGLU
    # in (2i) and out (i); doubled for the allocator's slack and the head's fp32 copies
    per_token = 2 * torch.finfo(dtype).bits // 8 * (7 * hidden_size + 3 * intermediate_size)
    free, _ = torch.cuda.mem_get_info(device)
    fit = int(0.25 * free // per_token)
    budget = DEFAULT_BATCH_TOKENS
    while budget * 2 <= min(fit, CUDA_BATCH_TOKENS):
        budget *= 2
    return budget


# Texts are tokenized in waves of about this many batches (at ~4 characters per token): large
# enough that length sorting inside a wave groups similar lengths, small enough that the first
# batch reaches the device soon and the next wave is tokenized while the device works.
WAVE_BATCHES = 4
CHARS_PER_TOKEN = 4


def waves(texts: list[str], budget: int) -> list[range]:
    """Consecutive index ranges of ``texts`` holding about ``WAVE_BATCHES`` batches each."""
    limit = WAVE_BATCHES * budget * CHARS_PER_TOKEN
    most = max(1, WAVE_BATCHES * budget // 2)  # every text is at least [CLS] [SEP]
    out, start, chars = [], 0, 0
    for i, t in enumerate(texts):
        if i > start and (chars + len(t) > limit or i - start >= most):
            out.append(range(start, i))
            start, chars = i, 0
        chars += len(t)
    if start < len(texts):
        out.append(range(start, len(texts)))
    return out


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


# --------------------------------------------------------------------------------------------
# Backbones: token ids in, packed hidden states out
# --------------------------------------------------------------------------------------------


COMPILE_ENV = "CODESEARCH_COMPILE"  # "0" turns torch.compile off
# Passes smaller than this run uncompiled: a search query never waits for a compile, and the
# first compile happens where it pays (indexing), announced.
COMPILE_MIN_TOKENS = 4096
COMPILE_ESTIMATE_S = 20  # two small graphs, dynamic in the token count; less with a warm inductor cache


def compile_wanted(device: torch.device, compile: bool | None = None) -> bool:
    """Compile the elementwise work? ``None``: on CUDA unless ``CODESEARCH_COMPILE=0``.

    Never by default on the CPU: our CPU path is tuned eager (measured; BENCHMARKS.md, 'Encoder
    against transformers') and a compile there needs a C++ toolchain.
    """
    if compile is not None:
        return compile
    off = os.environ.get(COMPILE_ENV, "1").strip().lower() in ("0", "false", "no", "off")
    return device.type == "cuda" and not off


class PackedBackbone:
    """Our ModernBERT on one packed stream (no padding anywhere outside attention groups).

    ``prepare`` (any thread) packs token ids on the host, pinned on CUDA; ``forward`` (the
    device's thread) moves the batch asynchronously and runs the model.

    On CUDA the layers' elementwise work (RoPE, GeGLU, residual + LayerNorm) is compiled with
    ``torch.compile``: two graphs shared by every layer, dynamic in the token count, so batch
    sizes never recompile. The compile happens on the first pass of at least
    ``COMPILE_MIN_TOKENS`` tokens and is announced (a warning: it takes ~20 s once); should it
    fail (no Triton, no compiler) the model runs uncompiled.

    On the CPU the layers run through ``modernbert.CpuLayers`` (residual adds inside the GEMMs,
    GeGLU in place); a bf16 model whose CPU multiplies bf16 slower than fp32 computes its
    matmuls and attention in fp32 (:func:`cpu_has_fast_bf16`).
    """

    padded = False

    def __init__(self, model, device: torch.device, compile: bool | None = None, compile_backend: str = "inductor"):
        self.model = model
        self.device = device
        self.hidden_size = model.config.hidden_size
        self.backend_name = model.backend.name
        self.compiled = False  # True once the compiled layers have run
        self._compile_lock = threading.Lock()
        self.compiling = compile_wanted(device, compile)
        if self.compiling:
            model.use_fused(
                FusedLayers(
                    model,
                    torch.compile(attention_input, backend=compile_backend),
                    torch.compile(attention_output_and_mlp, backend=compile_backend),
                    dynamic=True,
                )
            )
        elif device.type == "cpu":
            dtype = model.embeddings.tok_embeddings.weight.dtype
            slow_bf16 = dtype == torch.bfloat16 and not cpu_has_fast_bf16()
            model.use_fused(CpuLayers(model, torch.float32 if slow_bf16 else None))

    def prepare(self, ids: list[list[int]], n_keys: list[int] | None) -> PackedBatch:
        return PackedBatch.pack(ids, n_keys, pin=self.device.type == "cuda")

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """``(total_tokens, hidden)`` on the device, for a batch from :meth:`prepare`."""
        batch = batch.to(self.device, non_blocking=True)
        total = sum(batch.lengths)
        fused = self.model.fused is not None and (not self.compiling or total >= COMPILE_MIN_TOKENS)
        small = self.device.type == "cpu" and total <= SMALL_FORWARD_TOKENS and machine_busy()
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode())
            stack.enter_context(single_thread(small))
            if self.device.type == "cpu" and total >= CONTENTION_MIN_TOKENS:  # leave the cores others hold
                stack.enter_context(threads_at_most(CONTENTION.threads(torch.get_num_threads())))
                stack.enter_context(CONTENTION.measure())
            if fused and self.compiling and not self.compiled:
                return self._first_compiled(batch)
            return self.model(batch, fused=fused)  # (total_tokens, hidden)

    def _first_compiled(self, batch: PackedBatch) -> torch.Tensor:
        with self._compile_lock:  # one compile, even when several threads encode
            if self.model.fused is None or self.compiled:  # failed or done meanwhile
                return self.model(batch, fused=self.compiled)
            # a warning, so that it shows even where the application configured no logging
            log.warning(
                "compiling the encoder for this GPU (one-time, ~%d s; %s=0 skips it)", COMPILE_ESTIMATE_S, COMPILE_ENV
            )
            t0 = time.perf_counter()
            try:
                out = self.model(batch, fused=True)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
            except Exception as e:  # noqa: BLE001 - Triton/compiler missing, an inductor bug: eager still works
                first = (str(e).strip().splitlines() or [""])[0][:200]
                log.warning("torch.compile failed (%s: %s); running uncompiled", type(e).__name__, first)
                self.model.use_fused(None)
                return self.model(batch)
            self.compiled = True
            log.info("encoder compiled in %.1f s", time.perf_counter() - t0)
            return out

    def __call__(self, ids: list[list[int]], n_keys: list[int] | None) -> torch.Tensor:
        return self.forward(self.prepare(ids, n_keys))  # (total_tokens, hidden)


def padded_inputs(
    ids: list[list[int]], pad_id: int, n_keys: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A transformers model's inputs for ``ids``: right-padded ``(batch, L)`` token ids and the
    attention mask, 1 on the first ``n_keys[i]`` tokens of row i (default: its real tokens)."""
    keys = n_keys or [len(x) for x in ids]
    L = max(map(len, ids))
    input_ids = torch.full((len(ids), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), L), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x)
        mask[i, : keys[i]] = 1
    return input_ids, mask


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
        L = max(lengths)
        input_ids, mask = padded_inputs(ids, self.pad_id, n_keys)
        small = self.device.type == "cpu" and len(ids) * L <= SMALL_FORWARD_TOKENS and machine_busy()
        with torch.inference_mode(), single_thread(small):
            out = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device))
        hidden = out.last_hidden_state  # (batch, L, hidden)
        real = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (batch, L)
        return hidden[real.to(self.device)]  # (total_tokens, hidden), sequences in order

    def prepare(self, ids: list[list[int]], n_keys: list[int] | None) -> tuple:
        return ids, n_keys

    def forward(self, prepared: tuple) -> torch.Tensor:
        return self(*prepared)


# --------------------------------------------------------------------------------------------
# The overlapped run: a producer thread, one asynchronous copy back per batch
# --------------------------------------------------------------------------------------------


@dataclass
class _Prepared:
    """One batch made ready on the CPU: input positions, packed ids, the head's inputs."""

    where: list[int]  # input index of each text in the batch
    batch: object  # what backbone.prepare returned
    head: HeadInput


@dataclass
class _Failed:
    error: BaseException


_DONE = object()


def in_thread(make: Callable[[], Iterator], depth: int = 2) -> Iterator:
    """Run the generator ``make()`` on a thread, at most ``depth`` items ahead of the consumer.

    An exception in the thread is raised in the consumer, as itself (its traceback is the
    thread's). Closing the returned generator (or an exception in the consumer) stops the
    thread at its next item; the thread is joined before this generator finishes.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in make():
                if not put(item):
                    return
            put(_DONE)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            put(_Failed(e))

    thread = threading.Thread(target=work, name="codesearch-tokenize", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join()


def _start_copy(t: torch.Tensor) -> tuple[torch.Tensor, object]:
    """Start copying ``t`` to the host: ``(host tensor, event to wait on or None)``.

    On CUDA one asynchronous copy into pinned memory, ordered after the batch's kernels on the
    same stream; the caller waits on the event only after queueing the next batch.
    """
    if t.device.type == "cpu":
        return t, None
    if t.device.type != "cuda":
        return t.cpu(), None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


class _HiddenHead:
    """``hidden_states()`` as a head: the float32 token states, one array per text."""

    def prepare(self, tok: Tokenized, kind: str, pin: bool = False) -> HeadInput:
        return HeadInput({}, [len(x) for x in tok.ids])

    def forward(self, packed: torch.Tensor, inp: HeadInput) -> torch.Tensor:
        return packed.float()

    def split(self, host: np.ndarray, inp: HeadInput) -> list[torch.Tensor]:
        return [torch.from_numpy(part.copy()) for part in np.split(host, np.cumsum(inp.rows)[:-1])]


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
    # tokenize on a thread while the device runs (None: on CUDA, where the GPU would otherwise
    # wait for the tokenizer; on the CPU both compete for the same cores)
    overlap: bool | None = None
    _budget: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.head.to(self.device, self.dtype)

    @property
    def batch_tokens(self) -> int:
        """Default token budget per forward pass on this device (16384 on CPU; on CUDA up to
        262144, by free memory). Callers feeding ``encode`` in chunks should pass about
        ``4 * batch_tokens`` tokens per call to keep a GPU busy."""
        if self._budget is None:
            if self.backbone.padded:
                self._budget = DEFAULT_PADDED_BATCH_TOKENS
            else:
                cfg = self.backbone.model.config
                self._budget = default_batch_tokens(self.device, cfg.hidden_size, cfg.intermediate_size, self.dtype)
        return self._budget

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

    @property
    def offloaded(self) -> bool:
        """True on a GPU: the CPU is free while it encodes (`codesearch.encoder.base.Encoder`)."""
        return self.device.type == "cuda"

    def describe(self) -> str:
        """How this encoder embeds, for ``status``: ``local cpu (float32)``."""
        return f"local {self.device} ({str(self.dtype).removeprefix('torch.')})"

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
        from codesearch.encoder.checkpoint import TokenCounter

        return TokenCounter(self.tokenizer.path, self.head.count_extra("document"))

    def _batches(self, ids: list[list[int]], batch_tokens: int | None) -> list[list[int]]:
        return token_batches([len(x) for x in ids], batch_tokens or self.batch_tokens, padded=self.backbone.padded)

    def _prepared(
        self, texts: list[str], tokenize, head, kind: str, budget: int | None, tokenized: Tokenized | None,
        lengths: list[int] | None = None,
    ) -> Iterator[_Prepared]:
        """Tokenize wave by wave, batch, pack (pinned on CUDA): the CPU side of a run.
        ``tokenized``: all of ``texts`` already tokenized (used when they form one wave).
        ``lengths``: filled with each text's token count as tokenized (input order)."""
        pin = self.device.type == "cuda"
        parts = waves(texts, budget)
        for wave in parts:
            if tokenized is not None and len(parts) == 1:
                tok = tokenized
            else:
                tok = tokenize([texts[i] for i in wave])
            if lengths is not None:
                lengths[wave.start : wave.start + len(tok.ids)] = map(len, tok.ids)
            for batch in self._batches(tok.ids, budget):
                sub = Tokenized(
                    [tok.ids[i] for i in batch], None if tok.n_keys is None else [tok.n_keys[i] for i in batch]
                )
                yield _Prepared(
                    [wave.start + i for i in batch],
                    self.backbone.prepare(sub.ids, sub.n_keys),
                    head.prepare(sub, kind, pin),
                )

    def _run(
        self, texts: list[str], tokenize, head, kind: str, budget: int | None, tokenized: Tokenized | None = None,
        lengths: list[int] | None = None,
    ) -> list:
        """Every text through backbone and head, results in input order (see the module notes)."""
        results: list = [None] * len(texts)
        budget = budget or self.batch_tokens  # here, not in the thread: it may ask CUDA for free memory
        overlap = self.device.type == "cuda" if self.overlap is None else self.overlap
        make = functools.partial(self._prepared, texts, tokenize, head, kind, budget, tokenized, lengths)
        source = in_thread(make) if overlap and texts else make()

        def finish(p: _Prepared, host: torch.Tensor, event) -> None:
            if event is not None:
                event.synchronize()  # this batch's copy, while the device runs the next one
            for i, out in zip(p.where, head.split(host.numpy(), p.head)):
                results[i] = out

        pending = None
        with contextlib.closing(source), torch.inference_mode():
            for p in source:
                packed = self.backbone.forward(p.batch)
                out = head.forward(packed, p.head.to(self.device, non_blocking=True))
                copy = _start_copy(out)
                if pending is not None:
                    finish(*pending)
                pending = (p, *copy)
            if pending is not None:
                finish(*pending)
        return results

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
            Token budget per forward pass (default :attr:`batch_tokens`: 16384 packed on CPU,
            up to 262144 on CUDA, 8192 padded).

        Returns
        -------
        numpy.ndarray or list of numpy.ndarray
            Single-vector models: float32 ``(n, dim)``, L2-normalised when the checkpoint lists
            a Normalize module. Multi-vector: one float32 ``(n_tokens_i, dim)`` array per text,
            rows L2-normalised.
        """
        return self._encode(texts, kind, batch_tokens, None)

    def encode_counted(
        self, texts: list[str], kind: str = "document", batch_tokens: int | None = None
    ) -> tuple[np.ndarray | list[np.ndarray], list[int]]:
        """``encode(texts, kind)`` and the tokens each text took, from the same tokenization:
        ``min(count_tokens(text), max_length)`` for a document. A cluster worker returns both,
        so the driver never tokenizes what it sent."""
        lengths = [0] * len(texts)
        return self._encode(texts, kind, batch_tokens, lengths), lengths

    def _encode(
        self, texts: list[str], kind: str, batch_tokens: int | None, lengths: list[int] | None
    ) -> np.ndarray | list[np.ndarray]:
        if kind not in ("document", "query"):
            raise ValueError(f"kind must be 'document' or 'query', not {kind!r}")
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of texts, not one string; wrap it: encode([text])")
        texts = list(texts)

        def tokenize(some: list[str]) -> Tokenized:
            return self.head.tokenize(self.tokenizer, some, kind)

        small, tok = False, None
        if self.device.type == "cpu" and sum(map(len, texts)) <= 8 * SMALL_FORWARD_TOKENS:
            # a small input (a query): tokenized here, to count its tokens exactly; the head's
            # small ops too run on one thread, as a second one would spin on a busy machine
            tok = tokenize(texts)
            small = sum(map(len, tok.ids)) <= SMALL_FORWARD_TOKENS and machine_busy()
        with single_thread(small):
            results = self._run(texts, tokenize, self.head, kind, batch_tokens, tok, lengths)
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
        texts = list(texts)
        return self._run(
            texts, lambda t: Tokenized(self.tokenizer.encode(t, self.max_length)), _HiddenHead(), "document",
            batch_tokens,
        )
