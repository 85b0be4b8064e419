"""Which encoders a run uses: the models named, the ones the index records, or the defaults,
and what to tell the user when a default cannot be had."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from codesearch import _compat
from codesearch.encoder import DEFAULT_DENSE_MODEL, DEFAULT_MULTI_MODEL
from codesearch.encoder.base import Encoders as _Encoders
from codesearch.errors import (
    CodeSearchError,
    IndexCorruptError,
    ModelError,
    ModelMismatchError,
    ModelUnavailableError,
)
from codesearch.store import Store
from codesearch.store.schema import DISABLED_KEY as _DISABLED_KEY
from codesearch.types import DEFAULT, STORE_FILE

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from codesearch.encoder.base import Encoder, Encoders, Loader, TokenCounter
    from codesearch.store import ModelRecord

#: `Encoders` lives in `codesearch.encoder.base` (beside the protocol it holds).
__getattr__ = _compat.moved_names(__name__, {"Encoders": "codesearch.encoder.base"})





#: Meta key: the model roles a run switched off with 'none' (JSON list).
DISABLED_KEY = _DISABLED_KEY
#: Meta key: set while a run without models (a lexical search's refresh) has left changed
#: code without the recorded models' vectors; the next run that encodes clears it.
VECTORS_PENDING_KEY = "vectors.pending"
#: Meta key: how the last run that embedded anything did it, per role (JSON dict).
EMBEDDED_KEY = "embedded"


#: Chunks are never longer than this many tokens, whatever the model accepts: retrieval
#: wants units of about a function or two. Measured on the semble dev split (lexical mode):
#: 128 tokens 0.815, 256 0.845, 512 0.861, 1024 0.837 NDCG@10 (BENCHMARKS.md, 'What each
#: ranking signal adds').
MAX_CHUNK_TOKENS = 512
#: A multi-vector window at least this many budgets (+ special tokens) wide holds any chunk
#: the byte estimate allows, so chunking needs no tokenizer (see `chunk_budget`).
WIDE_WINDOW = 3


def resolve_encoders(
    dense_model: str | None = DEFAULT,
    multi_model: str | None = DEFAULT,
    *,
    device: str = "auto",
    store: Store | None = None,
    index_dir: str | os.PathLike[str] | None = None,
    load: Loader | None = None,
) -> tuple[Encoders, list[str]]:
    """Load the encoders a run asks for; returns them and the notices to show.

    Parameters
    ----------
    dense_model, multi_model
        A hub id or a local checkpoint folder; ``None`` for none; :data:`DEFAULT` for the
        model the index already records (when ``store``/``index_dir`` has one), else the
        package default. A default that is not cached while the hub is unreachable is
        left out with a notice (the index is then built without its vectors); a model
        named explicitly that cannot be loaded raises.
    device
        Passed to :func:`codesearch.encoder.load`.
    store, index_dir
        Where to read the recorded models (either; ``store`` wins).
    load
        ``load(name, device=...)`` that returns an encoder; default
        :func:`codesearch.encoder.load`. `codesearch.api.EncoderPool.load` passes its
        memoised one, so processes with several `CodeSearch` objects load a model once.

    Raises
    ------
    ModelError
        An explicitly named model that cannot be loaded, or a model of the wrong kind
        (a ColBERT checkpoint as the dense model, or the reverse).
    """
    from codesearch import encoder as enc_mod

    recorded: dict[str, ModelRecord] = {}
    was_disabled: list[str] = []
    if store is not None:
        recorded, was_disabled = store.models(), json.loads(store.get_meta(DISABLED_KEY) or "[]")
    elif index_dir is not None and (Path(index_dir) / STORE_FILE).is_file():
        with contextlib.suppress(IndexCorruptError), Store(Path(index_dir) / STORE_FILE) as s:
            recorded, was_disabled = s.models(), json.loads(s.get_meta(DISABLED_KEY) or "[]")

    notices: list[str] = []
    missing_defaults: list[tuple[str, str]] = []  # (model, the option that picks it)
    disabled: list[str] = []

    off_on_this_device: list[str] = []

    def one(arg: str | None, role: str, package_default: str | None, want_multi: bool) -> Encoder | None:
        if arg is None or (arg == DEFAULT and role in was_disabled and role not in recorded):
            disabled.append(role)
            return None
        is_default = arg == DEFAULT
        name = arg
        if is_default:
            if role not in recorded and package_default is None:
                # Off by default on this device (not switched off by the user: a later run
                # on a GPU, or with --model, adds it).
                off_on_this_device.append(role)
                return None
            name = recorded[role].name if role in recorded else package_default
        flag = _FLAGS[role]
        try:
            enc = (load or enc_mod.load)(name, device=device)
        except ModelUnavailableError:
            if not is_default:
                # The loader cannot know which option named the model: say the one that did.
                raise ModelUnavailableError(_not_cached(name, flag)) from None
            missing_defaults.append((name, flag))
            return None
        except ModelError as exc:
            if not (is_default and role in recorded):
                raise
            # The model this index was built with is gone (a deleted local folder, say):
            # search and indexing go on without its vectors rather than refusing to run.
            notices.append(
                f"Model {name} recorded in the index cannot be loaded ({exc}); its vectors are left out "
                f"of this run (restore the model, or re-embed with 'codesearch index --rebuild {flag} PATH_OR_ID')"
            )
            return None
        if bool(enc.multivector) != want_multi:
            what = "a ColBERT (multi-vector)" if want_multi else "a single-vector"
            raise ModelError(
                f"Model {name!r} is not {what} model (pass --model for single-vector checkpoints "
                "and --multi-model for ColBERT ones)"
            )
        return enc

    # Only a role that is neither recorded nor switched off needs the device's default (and
    # deciding "auto" imports torch, which a lexical-only run must not).
    needs_default = [
        role for role, arg in (("dense", dense_model), ("colbert", multi_model))
        if arg == DEFAULT and role not in recorded and role not in was_disabled
    ]
    dense_default, multi_default = default_models(device) if needs_default else (None, None)
    dense = one(dense_model, "dense", dense_default, False)
    multi = one(multi_model, "colbert", multi_default, True)
    if "dense" in off_on_this_device and not recorded:
        notices.append(
            f"No dense model by default on a CPU (the 149M {enc_mod.DEFAULT_DENSE_MODEL} takes minutes for a few "
            f"dozen files there); pass --model {enc_mod.DEFAULT_DENSE_MODEL} to add dense vectors"
        )
    if missing_defaults:
        names = " and ".join(name for name, _ in missing_defaults)
        plural = "s" if len(missing_defaults) > 1 else ""
        cached = "are" if plural else "is"
        how = "indexed lexical-only" if dense is None and multi is None else "indexed without its vectors"
        paths = " or ".join(f"{flag} PATH" for _, flag in missing_defaults)  # the ColBERT one: --multi-model
        notices.append(
            f"Default model{plural} {names} {cached} not cached and the hub is unreachable; {how}. "
            f"Run 'codesearch index' again online (or pass {paths}) to add vectors."
        )
    return _Encoders(dense=dense, multi=multi, disabled=tuple(disabled)), notices


#: The option of `codesearch index` that picks each role's model.
_FLAGS = {"dense": "--model", "colbert": "--multi-model"}


def _not_cached(name: str, flag: str) -> str:
    return (
        f"Model '{name}' is not in the local cache and the hub cannot be reached; pass {flag} PATH to a local "
        f"checkpoint, {flag} none to index without it, or run 'codesearch models pull {name}' online"
    )


#: Meta key per model role: the identity of the tokenizer the role's vectors were made with
#: (`codesearch.indexing.reuse.tokenizer_identity`). The model identity hashes no tokenizer
#: file, and it stays as it was (indexes record it, and an old index must match without
#: re-embedding): an index without this key takes the tokenizer of its next run.
TOKENIZER_KEY = "tokenizer.{role}"


def tokenizer_of(enc: Encoder) -> str | None:
    """``enc``'s tokenizer identity (its files' hash), None when it names no files."""
    from codesearch.indexing.reuse import tokenizer_identity

    return tokenizer_identity(enc.token_counter())


def forget_other_tokenizers(store: Store, encoders: Encoders) -> None:
    """Before a rebuild: drop the store's vectors of a model whose recorded tokenizer is not
    ``encoders``' (the same identity, other ids: a rebuild would take them again)."""
    for role, enc in encoders.by_role().items():
        was = store.get_meta(TOKENIZER_KEY.format(role=role))
        if was is not None and tokenizer_of(enc) not in (None, was):
            store.drop_model_vectors(enc.identity)


def check_models(store: Store, encoders: Encoders, index_dir: Path) -> None:
    recorded = store.models()
    for role, enc in encoders.by_role().items():
        rec = recorded.get(role)
        if rec is not None and rec.identity != enc.identity:
            flag = _FLAGS[role]
            raise ModelMismatchError(
                f"Index at {index_dir} was built with {role} model {rec.name} ({rec.identity}); this run "
                f"asks for {enc.name} ({enc.identity}); run 'codesearch index --rebuild' to re-index with "
                f"the new model, or pass {flag} {rec.name}"
            )
        was = store.get_meta(TOKENIZER_KEY.format(role=role)) if rec is not None else None
        now = tokenizer_of(enc) if was is not None else None
        if was is not None and now is not None and now != was:
            raise ModelMismatchError(
                f"Index at {index_dir} was built with {role} model {rec.name} and another tokenizer "
                f"(tokenizer.json or its config changed: {was} -> {now}); run 'codesearch index --rebuild' to "
                "re-embed with the new tokenizer, or restore the model's tokenizer files"
            )


def holds_estimated_chunks(window: int, budget: int) -> bool:
    """Whether a multi-vector window holds any chunk the byte estimate sizes to ``budget``
    (see `chunk_budget`)."""
    return window >= WIDE_WINDOW * budget + 8


def chunk_budget(encoders: Encoders, chunk_tokens: int | None) -> tuple[int, TokenCounter | None, str]:
    """(max tokens per chunk, token counter or None, the counter's identity)."""
    encs = encoders.present()
    if chunk_tokens is not None:
        if chunk_tokens < 16:
            raise CodeSearchError(f"chunk size {chunk_tokens} tokens is too small (use 64 or more)")
        budget = int(chunk_tokens)
    else:
        # A multi-vector model truncates, and a token it drops cannot match: its window caps
        # the chunk. A single-vector model's window does not (MiniLM reads 256 tokens of a
        # 512-token chunk): on the benchmark, hybrid NDCG was the same with 256- and
        # 512-token chunks, lexical better with 512, and 512 halves the texts to encode.
        # (Reading a long chunk as the mean of its windows' vectors was measured too: hybrid
        # 0.875 -> 0.868 for 1.5x the encoding, `benchmarks/quality.py`.)
        budget = min([MAX_CHUNK_TOKENS, *(int(e.max_length) for e in encs if e.multivector)])
    if not encs:
        return budget, None, "approx"
    # A multi-vector model alone needs exact counts only to see each chunk whole. The byte
    # estimate (bytes / 3, headers included) bounds a chunk at about 3 * budget bytes, and no
    # tokenizer makes more tokens than bytes, so a window of 3 * budget (plus special tokens)
    # holds any chunk the estimate allows (LateOn-Code-edge reads 2048 tokens): then chunking
    # skips the tokenizer, which cost 16 of numpy's 27 CPU-s to searchable (a 50k BPE runs at
    # ~0.7 MB/s per core here). With a single-vector model, chunks sized in its own tokens
    # scored better: MiniLM hybrid 0.913 against 0.907 with estimated chunks (8 dev repos),
    # and again on the whole dev split, 0.8812 against 0.8731 (401 queries, both halves
    # lower; lexical 0.8606 against 0.8634, 13,426 chunks against 14,706: MiniLM reads 256
    # tokens, and the estimate makes fewer, longer chunks). So chunks depend on the model,
    # and one lexical query can rank differently in two indexes of a repository; a string
    # pasted from the code finds its chunk first in either (codesearch.search.phrase).
    # Count with the model whose window must hold the chunk whole (the multi-vector one).
    counter = next((e for e in encs if e.multivector), encs[0])
    wide = counter.multivector and holds_estimated_chunks(int(counter.max_length), budget)
    if wide and len(encs) == 1:
        return budget, None, "approx"
    # picklable (tokenizer path + extra tokens), so chunking can run in worker processes
    return budget, counter.token_counter(), counter.identity


# -- device-aware defaults ----------------------------------------------------------------


def default_models(device: str | torch.device) -> tuple[str | None, str | None]:
    """The (dense, multi-vector) models a run uses when the user names none, for ``device``.

    Parameters
    ----------
    device : str or torch.device
        Where the encoders will run, as given to :func:`codesearch.encoder.load`: ``"auto"``
        (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"`` or a
        ``torch.device``.

    Returns
    -------
    tuple
        ``(dense, multi)``: hub ids, ``None`` for a role that is off by default there.
        On CUDA both package defaults (gte-modernbert-base, 149M, and LateOn-Code-edge, 17M);
        anywhere else only LateOn-Code-edge (the lexical index is always built).

    Notes
    -----
    Measured with random weights of the exact shapes (speed depends only on shapes;
    ``benchmarks/default_cost.py``), ``codesearch index`` of a ~25-file Python package:

    - httpx (24 files), 2-core AMD EPYC (AVX2 only: fp32), load ~1: lexical only 1.2 s;
      the 17M ColBERT model 15-16 s (266 chunks, 75k tokens; 21.5 s at load 2.2 before the
      model load stopped importing torch._dynamo); the 149M dense model 4,358 s
      (136k tokens, 45% of them whole files; ~20 CPU minutes while the shared machine ran
      at load 10-18).
    - flask (26 files), at load ~4.5: lexical 0.8 s, 17M ColBERT 38.6 s,
      both 891.9 s. The 149M model does ~28x the matmul work of the 17M one per token
      (110M vs 3.9M parameters in linear layers) and encodes every file again whole, so it
      is 95% of the default's CPU time: minutes for 26 files, hours for 1,000.
    - int8 linear layers do not rescue it: per-tensor dynamic int8 moves real MiniLM vectors
      to a cosine of ~0.94 against fp32 (per-channel ~0.98); see `benchmarks/int8_cpu.py`
      and BENCHMARKS.md, 'Encoder against transformers'.
    - Quality, from published numbers only (the real weights cannot be fetched here, so
      the real-weight quality of either choice is unmeasured): on semble's code-search
      benchmark LateOn-Code-edge with full-text fusion scores 0.846 NDCG@10 (ColGREP's
      README), close to a 137M dense model in a hybrid (CodeRankEmbed 0.862) and well above
      it alone (0.765). Lexical + the 17M ColBERT model keeps most of the hybrid's quality
      for ~5% of its CPU time.

    On a GPU the 149M model's cost is small (bf16 varlen flash attention), so both stay on.

    Examples
    --------
    >>> default_models("cpu")
    (None, 'lightonai/LateOn-Code-edge')
    """
    if _is_gpu(device):
        return DEFAULT_DENSE_MODEL, DEFAULT_MULTI_MODEL
    return None, DEFAULT_MULTI_MODEL


def _is_gpu(device: str | torch.device) -> bool:
    kind = device.split(":", 1)[0] if isinstance(device, str) else device.type
    if kind == "auto":
        import torch  # only here: "cpu"/"cuda" must not pay torch's import time

        return torch.cuda.is_available()
    return kind == "cuda"
