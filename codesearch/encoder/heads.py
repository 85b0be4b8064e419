"""What turns per-token hidden states into the vectors the indexes store.

Two kinds of checkpoints, read from their own files:

* sentence-transformers (``modules.json``): ``Pooling`` (CLS / mean / max, per
  ``1_Pooling/config.json``), optional ``Dense`` layers, ``Normalize`` if listed -> one vector
  per text.
* PyLate ColBERT (``config_sentence_transformers.json`` with ``model_type: ColBERT`` or a
  ``pylate`` module): ``Dense`` projection(s) per token, ``[Q] ``/``[D] `` prefix token right
  after [CLS], queries padded to ``query_length`` with [MASK] (query expansion), punctuation
  (``skiplist_words``) dropped from documents only, L2 norm -> one vector per token.

Both heads tokenize (prefixes and expansion are tokenization) and pool; the backbone in
between only sees token ids. The rules follow PyLate's ``ColBERT.preprocess``/``encode`` and
sentence-transformers' ``Pooling``/``Normalize``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from codesearch.encoder.checkpoint import TextTokenizer, colbert_document_length, read_json, read_tensors
from codesearch.errors import CheckpointError

# sentence-transformers Dense `activation_function` values -> callables
DENSE_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.Tanh": torch.tanh,
    "torch.nn.modules.activation.ReLU": F.relu,
    "torch.nn.modules.activation.GELU": F.gelu,
    "torch.nn.modules.activation.Sigmoid": torch.sigmoid,
}


@dataclass
class Tokenized:
    """Token ids for a list of texts, plus how many of each may be attended to."""

    ids: list[list[int]]
    n_keys: list[int] | None = None  # None: every token is a key (the usual case)


@dataclass
class HeadInput:
    """What a head needs besides the hidden states, built on the CPU while the device works.

    ``tensors`` go to the device with the batch (pinned on CUDA, so the copy is asynchronous);
    ``rows`` says how many output rows belong to each text, to split the one host copy.
    """

    tensors: dict[str, torch.Tensor]
    rows: list[int] | None  # None: one row per text

    def to(self, device: torch.device, non_blocking: bool = False) -> HeadInput:
        return HeadInput({k: v.to(device, non_blocking=non_blocking) for k, v in self.tensors.items()}, self.rows)


def _host(arrays: dict[str, np.ndarray], pin: bool) -> dict[str, torch.Tensor]:
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
    return {k: t.pin_memory() for k, t in tensors.items()} if pin else tensors


# --------------------------------------------------------------------------------------------
# Dense layers (shared by both heads)
# --------------------------------------------------------------------------------------------


@dataclass
class DenseLayer:
    """A sentence-transformers / PyLate ``Dense`` module: activation(x @ W.T + b)."""

    weight: torch.Tensor  # (out_features, in_features)
    bias: torch.Tensor | None
    activation: str

    @classmethod
    def load(cls, directory: Path, in_features: int) -> DenseLayer:
        conf = read_json(directory / "config.json")
        act = conf.get("activation_function", "torch.nn.modules.activation.Tanh")
        if act not in DENSE_ACTIVATIONS:
            raise CheckpointError(
                f"'{directory / 'config.json'}' uses activation {act!r}; supported: {sorted(DENSE_ACTIVATIONS)}"
            )
        st = directory / "model.safetensors"
        # a .bin is read only when no safetensors file exists, and then without pickle code
        tensors = read_tensors(st if st.is_file() else directory / "pytorch_model.bin")
        if "linear.weight" not in tensors:
            raise CheckpointError(f"'{directory}' has no tensor 'linear.weight'; re-download the model")
        w = tensors["linear.weight"]
        want = (int(conf.get("out_features", w.shape[0])), int(conf.get("in_features", in_features)))
        if tuple(w.shape) != want or want[1] != in_features:
            raise CheckpointError(
                f"Dense tensor 'linear.weight' in '{directory}' has shape {tuple(w.shape)}, expected "
                f"({want[0]}, {in_features}); re-download the model"
            )
        bias = tensors.get("linear.bias")
        if conf.get("bias", False) and bias is None:
            raise CheckpointError(f"'{directory}' has no tensor 'linear.bias' but its config says bias=true")
        if bias is not None and tuple(bias.shape) != (want[0],):
            raise CheckpointError(f"Dense tensor 'linear.bias' in '{directory}' has shape {tuple(bias.shape)}")
        return cls(w, bias, act)

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def to(self, device, dtype) -> DenseLayer:
        b = None if self.bias is None else self.bias.to(device, dtype)
        return DenseLayer(self.weight.to(device, dtype), b, self.activation)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return DENSE_ACTIVATIONS[self.activation](F.linear(x, self.weight, self.bias))


def _apply_dense(layers: list[DenseLayer], x: torch.Tensor) -> torch.Tensor:
    for layer in layers:
        x = layer(x)
    return x


# --------------------------------------------------------------------------------------------
# Single vector: sentence-transformers Pooling (+ Dense) (+ Normalize)
# --------------------------------------------------------------------------------------------


@dataclass
class PoolingHead:
    """One vector per text: CLS or mean (or max) of the token states, then Dense and norm."""

    modes: tuple[str, ...]  # in sentence-transformers' concatenation order: cls, max, mean, mean_sqrt_len
    max_length: int
    dense: list[DenseLayer] = field(default_factory=list)
    normalize: bool = False
    hidden_size: int = 0
    prompts: dict[str, str] = field(default_factory=dict)  # kind -> text prepended (config prompts)

    multivector = False

    @property
    def dim(self) -> int:
        return self.dense[-1].out_features if self.dense else self.hidden_size * len(self.modes)

    def describe(self) -> dict[str, Any]:
        return {"kind": "pooling", "modes": self.modes, "normalize": self.normalize, "max_length": self.max_length,
                "prompts": self.prompts}

    def to(self, device, dtype) -> None:
        self.dense = [d.to(device, dtype) for d in self.dense]

    def tokenize(self, tokenizer: TextTokenizer, texts: list[str], kind: str) -> Tokenized:
        prompt = self.prompts.get(kind, "")
        return Tokenized(tokenizer.encode([prompt + t for t in texts], self.max_length))

    def count_extra(self, kind: str) -> int:
        return 0

    def prepare(self, tok: Tokenized, kind: str, pin: bool = False) -> HeadInput:
        """Per-text offsets and the token -> text index, on the CPU."""
        lens = np.fromiter(map(len, tok.ids), dtype=np.int64, count=len(tok.ids))
        arrays = {"lens": lens, "starts": np.cumsum(lens) - lens}
        if any(m != "cls" for m in self.modes):
            arrays["seq"] = np.repeat(np.arange(len(lens), dtype=np.int64), lens)  # (T,)
        return HeadInput(_host(arrays, pin), None)

    def forward(self, packed: torch.Tensor, inp: HeadInput) -> torch.Tensor:
        """``packed`` (total_tokens, hidden) of sequences laid end to end -> (n, dim) float32,
        on the device of ``packed`` (``inp`` must be there too)."""
        lens, starts = inp.tensors["lens"], inp.tensors["starts"]
        n = lens.shape[0]
        x = packed.float()
        parts = []
        for mode in self.modes:
            if mode == "cls":
                parts.append(x[starts])
            elif mode == "max":
                seq = inp.tensors["seq"]
                out = torch.full((n, x.shape[1]), float("-inf"), device=x.device)
                parts.append(out.scatter_reduce(0, seq[:, None].expand_as(x), x, "amax"))
            else:  # mean over every real token, [CLS] and [SEP] included, as sentence-transformers does
                sums = torch.zeros(n, x.shape[1], device=x.device).index_add_(0, inp.tensors["seq"], x)
                denom = lens[:, None].float() if mode == "mean" else lens[:, None].float().sqrt()
                parts.append(sums / denom)
        v = torch.cat(parts, dim=1)
        if self.dense:
            v = _apply_dense(self.dense, v.to(self.dense[0].weight.dtype)).float()
        if self.normalize:
            v = F.normalize(v, p=2, dim=1)
        return v  # (n, dim) float32

    def split(self, host: np.ndarray, inp: HeadInput) -> list[np.ndarray]:
        """The host copy of :meth:`forward`'s output -> one row per text (views)."""
        return list(host)

    def __call__(self, packed: torch.Tensor, lengths: list[int], tok: Tokenized, kind: str) -> np.ndarray:
        """``packed`` (total_tokens, hidden) of sequences laid end to end -> (n, dim) float32."""
        inp = self.prepare(tok, kind).to(packed.device)
        return self.forward(packed, inp).cpu().numpy().astype(np.float32, copy=False)


# --------------------------------------------------------------------------------------------
# Multi-vector: PyLate ColBERT
# --------------------------------------------------------------------------------------------


@dataclass
class ColbertHead:
    """One L2-normalised vector per token, PyLate's rules for prefixes, expansion, skiplist."""

    dense: list[DenseLayer]
    query_prefix_id: int | None
    document_prefix_id: int | None
    query_length: int
    document_length: int
    do_query_expansion: bool
    attend_to_expansion_tokens: bool
    mask_id: int
    skiplist: frozenset[int]

    multivector = True

    @property
    def dim(self) -> int:
        return self.dense[-1].out_features

    @property
    def max_length(self) -> int:
        return self.document_length

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "colbert",
            "prefixes": [self.query_prefix_id, self.document_prefix_id],
            "lengths": [self.query_length, self.document_length],
            "expansion": [self.do_query_expansion, self.attend_to_expansion_tokens],
            "skiplist": sorted(self.skiplist),
        }

    def to(self, device, dtype) -> None:
        self.dense = [d.to(device, dtype) for d in self.dense]

    def count_extra(self, kind: str) -> int:
        prefix = self.query_prefix_id if kind == "query" else self.document_prefix_id
        return 0 if prefix is None else 1

    def tokenize(self, tokenizer: TextTokenizer, texts: list[str], kind: str) -> Tokenized:
        """PyLate's ``preprocess``: truncate to length - 1 (specials included, [SEP] kept), insert
        the prefix token after [CLS]; queries then padded to ``query_length`` with [MASK]."""
        is_query = kind == "query"
        length = self.query_length if is_query else self.document_length
        prefix = self.query_prefix_id if is_query else self.document_prefix_id
        budget = length - 1 if prefix is not None else length
        ids = tokenizer.encode(texts, budget)
        n_keys = None
        if is_query and self.do_query_expansion:
            # PyLate pads to max_length with pad_token := mask_token; the pads' attention mask is 0
            # unless attend_to_expansion_tokens, and every position (pads too) yields a vector.
            n_keys = [len(x) + (prefix is not None) for x in ids]
            ids = [x + [self.mask_id] * (budget - len(x)) for x in ids]
        if prefix is not None:
            ids = [x[:1] + [prefix] + x[1:] for x in ids]
        if n_keys is None or self.attend_to_expansion_tokens:
            n_keys = None
        return Tokenized(ids, n_keys)

    def prepare(self, tok: Tokenized, kind: str, pin: bool = False) -> HeadInput:
        """Which token rows survive the skiplist (documents only), decided on the CPU from the ids."""
        lengths = [len(x) for x in tok.ids]
        if kind != "document" or not self.skiplist:
            return HeadInput({}, lengths)
        ids = np.fromiter(itertools.chain.from_iterable(tok.ids), dtype=np.int64, count=sum(lengths))
        keep = ~np.isin(ids, np.fromiter(self.skiplist, dtype=np.int64, count=len(self.skiplist)))
        seq = np.repeat(np.arange(len(lengths)), lengths)
        rows = np.bincount(seq[keep], minlength=len(lengths)).tolist()
        return HeadInput(_host({"keep": np.flatnonzero(keep)}, pin), rows)

    def forward(self, packed: torch.Tensor, inp: HeadInput) -> torch.Tensor:
        """Projected, skiplist-filtered, L2-normalised token vectors ``(kept rows, dim)`` float32."""
        x = _apply_dense(self.dense, packed.to(self.dense[0].weight.dtype)).float()  # (T, dim)
        if "keep" in inp.tensors:
            x = x[inp.tensors["keep"]]
        return F.normalize(x, p=2, dim=1)

    def split(self, host: np.ndarray, inp: HeadInput) -> list[np.ndarray]:
        """The host copy of :meth:`forward`'s output -> one ``(n_tokens_i, dim)`` array per text
        (copies: the host buffer may be pinned memory, which must not outlive the batch)."""
        if not inp.rows:
            return []
        bounds = np.cumsum(inp.rows)[:-1]
        return [part.copy() for part in np.split(host, bounds)]

    def __call__(self, packed: torch.Tensor, lengths: list[int], tok: Tokenized, kind: str) -> list[np.ndarray]:
        inp = self.prepare(tok, kind).to(packed.device)
        return self.split(self.forward(packed, inp).cpu().numpy(), inp)


# --------------------------------------------------------------------------------------------
# Reading the head files
# --------------------------------------------------------------------------------------------


def _module_kind(entry: dict[str, Any]) -> str:
    return str(entry.get("type", "")).rsplit(".", 1)[-1]


def _pooling_modes(directory: Path, conf: dict[str, Any]) -> tuple[str, ...]:
    flags = [
        ("cls", "pooling_mode_cls_token"),
        ("max", "pooling_mode_max_tokens"),
        ("mean", "pooling_mode_mean_tokens"),
        ("mean_sqrt_len", "pooling_mode_mean_sqrt_len_tokens"),
    ]
    for key in ("pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"):
        if conf.get(key):
            raise CheckpointError(f"'{directory}' uses {key}, which codesearch does not support")
    modes = tuple(name for name, key in flags if conf.get(key))
    if not modes:
        raise CheckpointError(f"'{directory}' Pooling config enables no pooling mode")
    return modes


def load_head(directory: Path, hidden_size: int, tokenizer: TextTokenizer, model_max: int):
    """The head described by the checkpoint's sentence-transformers / PyLate files.

    A bare checkpoint (no ``modules.json``) gets sentence-transformers' default: mean pooling,
    no normalisation.
    """
    modules = read_json(directory / "modules.json", required=False) or []
    st_conf = read_json(directory / "config_sentence_transformers.json", required=False) or {}
    bert_conf = read_json(directory / "sentence_bert_config.json", required=False) or {}
    if not isinstance(modules, list):
        raise CheckpointError(f"'{directory / 'modules.json'}' must be a JSON list of modules")

    is_colbert = st_conf.get("model_type") == "ColBERT" or any(
        str(m.get("type", "")).startswith("pylate.") for m in modules
    )
    dense: list[DenseLayer] = []
    width = hidden_size
    pooling_conf = None
    normalize = False
    for m in sorted(modules, key=lambda m: int(m.get("idx", 0))):
        kind = _module_kind(m)
        sub = directory / str(m.get("path", ""))
        if kind == "Dense":
            layer = DenseLayer.load(sub, width)
            dense.append(layer)
            width = layer.out_features
        elif kind == "Pooling":
            pooling_conf = read_json(sub / "config.json")
            width = hidden_size * max(1, len(_pooling_modes(directory, pooling_conf)))
        elif kind == "Normalize":
            normalize = True
        elif kind not in ("Transformer", "Identity", ""):
            raise CheckpointError(f"'{directory / 'modules.json'}' lists an unsupported module {m.get('type')!r}")

    model_limit = min(model_max, int(tokenizer.model_max_length or model_max))
    if is_colbert:
        if not dense:
            raise CheckpointError(
                f"ColBERT checkpoint '{directory}' has no Dense projection (1_Dense); re-download the model"
            )
        q_prefix = st_conf.get("query_prefix", "[Q] ")
        d_prefix = st_conf.get("document_prefix", "[D] ")
        ids = {}
        for label, p in (("query_prefix", q_prefix), ("document_prefix", d_prefix)):
            if p:
                ids[label] = tokenizer.token_to_id(p)
                if ids[label] is None:
                    raise CheckpointError(
                        f"ColBERT {label} {p!r} is not a token of '{directory / 'tokenizer.json'}'; re-download"
                    )
            else:
                ids[label] = None
        if tokenizer.mask_id is None:
            raise CheckpointError(f"ColBERT checkpoint '{directory}' has no [MASK] token for query expansion")
        expansion = bool(st_conf.get("do_query_expansion", True))
        words = st_conf.get("skiplist_words")
        if words is None:
            import string

            words = list(string.punctuation)
        # PyLate maps each word with convert_tokens_to_ids, which answers the unknown token's
        # id for a word not in the vocabulary; keep that quirk so skipped tokens match.
        skip = {tokenizer.token_to_id(w) for w in words}
        skip = {tokenizer.unk_id if i is None else i for i in skip} - {None}
        return ColbertHead(
            dense=dense,
            query_prefix_id=ids["query_prefix"],
            document_prefix_id=ids["document_prefix"],
            query_length=int(st_conf.get("query_length", 32)),
            document_length=colbert_document_length(st_conf, model_max, tokenizer.model_max_length),
            do_query_expansion=expansion,
            attend_to_expansion_tokens=bool(st_conf.get("attend_to_expansion_tokens", False)) and expansion,
            mask_id=tokenizer.mask_id,
            skiplist=frozenset(skip),
        )

    modes: tuple[str, ...] = ("mean",) if pooling_conf is None else _pooling_modes(directory, pooling_conf)
    max_length = min(int(bert_conf.get("max_seq_length") or model_limit), model_limit)
    prompts = {}
    conf_prompts = st_conf.get("prompts") or {}
    for kind, names in (("query", ("query",)), ("document", ("document", "passage", "corpus"))):
        for n in names:
            if conf_prompts.get(n):
                prompts[kind] = conf_prompts[n]
                break
    return PoolingHead(modes, max_length, dense, normalize, hidden_size, prompts)
