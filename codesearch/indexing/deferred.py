"""Encoders an index run loads only when it has something to encode.

A second worktree finds every vector in the user's cache, yet loading the model (importing
torch, reading and hashing the weights) was most of its run. What a run needs before it
encodes is small: the model's identity, its dimensions, window and kind, its tokenizer (to
count tokens) and how it would embed. A run that loads a model writes that down as a
*card*, keyed by the checkpoint folder's files as they are on disk (name, size, mtime,
inode of every file, the same test the index applies to source files); the next run whose
folder matches gets a `DeferredEncoder` from the card, which loads the real model on the
first call that needs it (``encode``). A run whose texts are all cached never loads it.

Cards live in the user's cache folder (``models/``) and follow its rules: nothing depends on
them, a card that cannot be read or does not match is ignored, and with the cache off
(``CODESEARCH_CACHE_SIZE=0``) every run loads its models as before. Searches never use
this: a query is always encoded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codesearch.store.cache import cache_folder, cache_limit
from codesearch.store.files import hash_text

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.encoder.base import Encoder, Loader

__all__ = ["CARD_VERSION", "DeferredEncoder", "deferring"]

log = logging.getLogger(__name__)

#: Bumped when a card's fields change.
CARD_VERSION = 1
#: Settings read at load time that change how a model embeds (`Encoder.describe`).
_ENV = ("CODESEARCH_CPU_BF16",)


class DeferredEncoder:
    """An `Encoder` that answers from a card and loads the model on first real use.

    Parameters
    ----------
    card
        What a load of the same checkpoint found (`_card_of`).
    load
        ``load()`` -> the real encoder; called at most once.
    """

    def __init__(self, card: dict[str, Any], load):
        self._card = card
        self._load = load
        self._real: Encoder | None = None
        self._lock = threading.Lock()

    # what the card answers
    name = property(lambda self: self._card["name"])
    identity = property(lambda self: self._card["identity"])
    dim = property(lambda self: int(self._card["dim"]))
    max_length = property(lambda self: int(self._card["max_length"]))
    multivector = property(lambda self: bool(self._card["multivector"]))
    offloaded = property(lambda self: bool(self._card["offloaded"]))

    def describe(self) -> str:
        return self._card["describe"]

    def token_counter(self):
        from codesearch.encoder.checkpoint import TokenCounter

        return TokenCounter(self._card["tokenizer_path"], int(self._card["extra"]))

    def count_tokens(self, texts: list[str]) -> list[int]:
        count = self.token_counter()
        return [count(t) for t in texts]

    @property
    def loaded(self) -> bool:
        return self._real is not None

    def real(self) -> Encoder:
        """The loaded model (loaded now, the first time)."""
        with self._lock:
            if self._real is None:
                self._real = self._load()
            return self._real

    def encode(self, texts, kind="document", **kw):
        return self.real().encode(texts, kind=kind, **kw)

    def __getattr__(self, name: str):
        # Anything else (batch_tokens, encode_batches, ...) is the loaded model's.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.real(), name)

    def __repr__(self) -> str:
        return f"DeferredEncoder({self.identity!r}, loaded={self.loaded})"


def deferring(load: Loader) -> Loader:
    """``load`` that returns a `DeferredEncoder` for a checkpoint with a matching card, and
    otherwise loads (and writes the card down for the next run)."""

    def deferred_load(name: str, *, device: str = "auto") -> Encoder:
        folder = _cards_folder()
        key = _card_key(name, device) if folder is not None else None
        if key is not None:
            card = _read_card(folder / f"{key}.json")
            if card is not None:
                return DeferredEncoder(card, lambda: load(name, device=device))
        enc = load(name, device=device)
        if key is not None:
            _write_card(folder / f"{key}.json", _card_of(enc))
        return enc

    return deferred_load


def _cards_folder() -> Path | None:
    try:
        if cache_limit() <= 0:
            return None
    except Exception:  # noqa: BLE001 - a bad CODESEARCH_CACHE_SIZE is the cache's to report
        return None
    return cache_folder() / "models"


def _card_key(name: str, device: str) -> str | None:
    """A hash of the name, the device, the settings and every file of the checkpoint folder
    as it is on disk; None when the folder cannot be found without loading."""
    from codesearch.encoder.loading import locate

    try:
        directory = locate(name)
        files = []
        for dirpath, dirnames, filenames in os.walk(directory, followlinks=True):
            dirnames.sort()
            for fname in sorted(filenames):
                path = os.path.join(dirpath, fname)
                st = os.stat(path)
                files.append([os.path.relpath(path, directory), st.st_size, st.st_mtime_ns, st.st_ino])
    except Exception:  # noqa: BLE001 - the real load says what is wrong with it
        return None
    env = {k: os.environ.get(k) for k in _ENV}
    return hash_text(json.dumps([CARD_VERSION, name, str(directory), device, env, files]))


def _card_of(enc: Encoder) -> dict[str, Any] | None:
    """What `DeferredEncoder` needs of ``enc``; None for an encoder that cannot say."""
    try:
        counter = enc.token_counter()
        return {
            "name": enc.name, "identity": enc.identity, "dim": int(enc.dim), "max_length": int(enc.max_length),
            "multivector": bool(enc.multivector), "offloaded": bool(enc.offloaded), "describe": enc.describe(),
            "tokenizer_path": str(counter.tokenizer_path), "extra": int(counter.extra),
        }
    except Exception:  # noqa: BLE001 - an encoder of another kind is simply loaded every time
        return None


_FIELDS = {"name": str, "identity": str, "dim": int, "max_length": int, "multivector": bool, "offloaded": bool,
           "describe": str, "tokenizer_path": str, "extra": int}


def _read_card(path: Path) -> dict[str, Any] | None:
    try:
        card = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(card, dict) or any(not isinstance(card.get(k), t) for k, t in _FIELDS.items()):
        return None
    if not Path(card["tokenizer_path"]).is_file():
        return None
    return card


def _write_card(path: Path, card: dict[str, Any] | None) -> None:
    if card is None:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(card))
        os.replace(tmp, path)  # whole or not at all: readers never see half a card
    except OSError as exc:
        log.debug("model card not written (%s)", exc)
        with contextlib.suppress(OSError):
            tmp.unlink()
