"""Readers of a checkpoint folder: config and weight files, ModernBERT state dicts with shape
checks, the tokenizer (`TextTokenizer`) and a picklable token counter, and a checkpoint's
identity. Nothing here builds a model or imports the rest of the encoder package."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codesearch.errors import CheckpointError

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    import torch




def read_json(path: Path, *, required: bool = True) -> dict[str, Any] | None:
    """Parse a JSON file of a checkpoint; a malformed one is a CheckpointError naming it."""
    if not path.is_file():
        if required:
            raise CheckpointError(f"Checkpoint file '{path}' is missing; re-download the model")
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"Checkpoint file '{path}' is not valid JSON ({e}); re-download the model") from None


def weight_files(directory: Path) -> list[Path]:
    """The files holding a checkpoint's weights: model.safetensors, its shards, or the .bin."""
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    index = read_json(directory / "model.safetensors.index.json", required=False)
    if index is not None:
        return [directory / f for f in sorted(set(index.get("weight_map", {}).values()))]
    legacy = directory / "pytorch_model.bin"
    if legacy.is_file():
        return [legacy]
    raise CheckpointError(f"Checkpoint '{directory}' has no model.safetensors; re-download the model")


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of one weight file (.safetensors, or a .bin through weights_only torch.load)."""
    import torch

    if not path.is_file():
        raise CheckpointError(f"Checkpoint file '{path}' is missing; re-download the model")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - safetensors/pickle raise assorted types for a damaged file
        raise CheckpointError(f"Checkpoint file '{path}' cannot be read ({type(e).__name__}); re-download it") from None


def modernbert_state_dict(directory: Path, cfg) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under our (= the checkpoint's) names, shape-checked.

    A ``ModernBertForMaskedLM`` checkpoint prefixes the body with ``model.`` and adds ``head.``
    and ``decoder.`` tensors; the prefix is stripped and the MLM head ignored.
    """
    from codesearch.encoder.modernbert import expected_shapes

    tensors: dict[str, torch.Tensor] = {}
    for f in weight_files(directory):
        tensors.update(read_tensors(f))
    found = {}
    for name, t in tensors.items():
        if name.startswith(("head.", "decoder.", "classifier.", "drop.")):
            continue
        found[name.removeprefix("model.")] = t
    expected = expected_shapes(cfg)
    for name, shape in expected.items():
        if name not in found:
            raise CheckpointError(
                f"Checkpoint '{directory}' has no tensor '{name}'; it does not match its config.json "
                "(re-download the model)"
            )
        if tuple(found[name].shape) != shape:
            raise CheckpointError(
                f"Checkpoint tensor '{name}' has shape {tuple(found[name].shape)}, config.json implies "
                f"{shape}; the weights and config do not belong together (re-download the model)"
            )
    extra = sorted(set(found) - set(expected))
    if extra:
        log.warning("ignoring %d unexpected tensors in %s (first: %s)", len(extra), directory, extra[0])
    return {name: found[name] for name in expected}


def checkpoint_identity(name: str, directory: Path, extra: dict[str, Any]) -> str:
    """``name@<12 hex>``: a hash of the config, the head settings and every weight byte.

    Any change to the weights (a fine-tune with the same shapes) changes the identity, so an
    index built with one model is never silently mixed with vectors from another.
    """
    import xxhash

    h = xxhash.xxh3_64()
    h.update(json.dumps(extra, sort_keys=True, default=str).encode())
    files = [directory / "config.json", *weight_files(directory)]
    files += sorted(p for p in directory.glob("*_Dense/*") if p.is_file())
    for f in files:
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return f"{name}@{h.hexdigest()[:12]}"


def colbert_document_length(st_conf: dict[str, Any], model_max: int, tokenizer_max: Any) -> int:
    """A ColBERT checkpoint's document window: PyLate's ``document_length`` (180 when unset),
    capped by the model's positions and the tokenizer's ``model_max_length``."""
    limit = min(int(model_max), int(tokenizer_max or model_max))
    return min(int(st_conf.get("document_length", 180)), limit)


class TextTokenizer:
    """A ``tokenizers`` tokenizer from ``tokenizer.json`` plus the special ids the heads need."""

    def __init__(self, directory: Path):
        from tokenizers import Tokenizer

        path = directory / "tokenizer.json"
        self.path = path
        if not path.is_file():
            raise CheckpointError(f"Checkpoint '{directory}' has no tokenizer.json; re-download the model")
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception on a bad file
            raise CheckpointError(f"Checkpoint file '{path}' cannot be parsed ({e}); re-download it") from None
        self._tok.no_padding()
        self._tok.no_truncation()
        conf = read_json(directory / "tokenizer_config.json", required=False) or {}
        smap = read_json(directory / "special_tokens_map.json", required=False) or {}
        self.model_max_length = conf.get("model_max_length")
        self.cls_id = self._special(conf, smap, "cls_token", ["[CLS]", "<s>"])
        self.sep_id = self._special(conf, smap, "sep_token", ["[SEP]", "</s>"])
        self.pad_id = self._special(conf, smap, "pad_token", ["[PAD]", "<pad>"])
        self.mask_id = self._special(conf, smap, "mask_token", ["[MASK]", "<mask>"])
        self.unk_id = self._special(conf, smap, "unk_token", ["[UNK]", "<unk>"])
        self._specials = self._tok.num_special_tokens_to_add(False)
        # truncation is tokenizer state: one caller at a time (the server encodes from threads)
        self._lock = threading.Lock()

    def _special(self, conf: dict, smap: dict, key: str, fallbacks: list[str]) -> int | None:
        for value in (conf.get(key), smap.get(key), *fallbacks):
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str) and (i := self._tok.token_to_id(value)) is not None:
                return i
        return None

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, texts: list[str], max_length: int | None) -> list[list[int]]:
        """Token ids with the checkpoint's special tokens ([CLS] ... [SEP]); when longer than
        ``max_length``, the text is cut and the final [SEP] kept."""
        with self._lock:
            if max_length is None:
                self._tok.no_truncation()
            else:
                self._tok.enable_truncation(max(max_length, self._specials + 1))
            return [e.ids for e in self._tok.encode_batch(list(texts))]

    def count(self, texts: list[str]) -> list[int]:
        with self._lock:
            self._tok.no_truncation()
            return [len(e.ids) for e in self._tok.encode_batch(list(texts))]


class TokenCounter:
    """``count(text) -> int``: document tokens of one text, like ``Encoder.count_tokens([text])[0]``.

    Picklable: it travels as the ``tokenizer.json`` path plus the head's extra tokens and
    rebuilds the ``tokenizers.Tokenizer`` on first use, so worker processes (parallel chunking)
    can count exactly as the encoder does without loading the model.
    """

    def __init__(self, tokenizer_path: str | os.PathLike[str], extra: int = 0):
        self.tokenizer_path = str(tokenizer_path)
        self.extra = int(extra)
        self._tok = None

    def __getstate__(self) -> dict[str, Any]:
        return {"tokenizer_path": self.tokenizer_path, "extra": self.extra}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["tokenizer_path"], state["extra"])

    def __call__(self, text: str) -> int:
        if self._tok is None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(self.tokenizer_path)
            tok.no_padding()
            tok.no_truncation()
            self._tok = tok
        return len(self._tok.encode(text).ids) + self.extra
