"""From a name to a ready :class:`~codesearch.encoder.runtime.Encoder`.

``load("path/or/hub-id")`` resolves the checkpoint (a local directory, or a Hugging Face hub id:
cache first, then a download), reads its config and tokenizer, builds the backbone (our packed
ModernBERT for ``model_type == "modernbert"``, transformers' ``AutoModel`` for anything else),
reads the sentence-transformers / PyLate head files, and hands them to the runtime.

Every problem a user can cause ends as a one-line :class:`~codesearch.errors.CodeSearchError`:
``ModelUnavailableError`` (not cached, hub unreachable), ``CheckpointError`` (missing tensor,
wrong shape, bad config), ``BackendError`` (explicit device/backend that cannot run).
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codesearch.encoder.checkpoint import (
    TextTokenizer,
    checkpoint_identity,
    colbert_document_length,
    modernbert_state_dict,
    read_json,
)
from codesearch.errors import CheckpointError, ModelError, ModelUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from codesearch.encoder.runtime import Encoder



log = logging.getLogger(__name__)


# Files a checkpoint needs; ONNX/OpenVINO exports and duplicate .bin weights are skipped.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*_Dense/*", "*_Pooling/*"]


def _unavailable(model_id: str) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"Model '{model_id}' is not in the local cache and the hub cannot be reached; pass --model "
        f"PATH to a local checkpoint or run 'codesearch models pull {model_id}' online"
    )


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", ".\\")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


def resolve(path_or_id: str | os.PathLike) -> Path:
    """The local directory holding the checkpoint ``path_or_id``.

    A directory is used as is. Anything else is a hub id: the local huggingface_hub cache is
    tried first, then a download (unless ``HF_HUB_OFFLINE`` is set).

    Raises
    ------
    ModelUnavailableError
        A hub id that is not cached while the hub cannot be reached.
    ModelError
        A path that does not exist, or a hub id the hub does not know.
    """
    name = os.fspath(path_or_id)
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelError(f"Model path '{name}' is a file; pass the checkpoint directory that holds config.json")
    if _looks_like_path(name) or not name.strip():
        raise ModelError(f"Model path '{name}' does not exist; pass a checkpoint directory or a hub id like org/name")
    cached = _cached_snapshot(name)
    if cached is not None:
        return cached
    return _download(name)


def locate(path_or_id: str | os.PathLike) -> Path:
    """:func:`resolve`, then check that the folder is a checkpoint: what loading a model can
    get wrong before importing torch or reading a weight (a run checks it before it writes)."""
    directory = resolve(path_or_id)
    if not (directory / "config.json").is_file() and not any(directory.glob("*.safetensors")):
        raise CheckpointError(
            f"'{directory}' is not a model checkpoint folder (no config.json); pass the folder "
            "that holds config.json, model.safetensors and tokenizer.json"
        )
    return directory


def colbert_window(path_or_id: str | os.PathLike) -> int | None:
    """The document window of a ColBERT checkpoint that is already on disk, from its JSON
    files alone (no torch, no weights, no network); None when it is not a ColBERT
    checkpoint, not on disk, or unreadable. A hint: :func:`load` has the last word."""
    name = os.fspath(path_or_id)
    path = Path(name).expanduser()
    try:
        directory = path if path.is_dir() else None if _looks_like_path(name) else _cached_snapshot(name)
        if directory is None:
            return None
        st_conf = read_json(directory / "config_sentence_transformers.json", required=False) or {}
        if st_conf.get("model_type") != "ColBERT":
            return None
        return colbert_document_length(
            st_conf,
            int((read_json(directory / "config.json") or {}).get("max_position_embeddings", 512)),
            (read_json(directory / "tokenizer_config.json", required=False) or {}).get("model_max_length"),
        )
    except (CheckpointError, ModelError, OSError, ValueError, TypeError):
        return None


def _cached_snapshot(model_id: str) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(model_id, local_files_only=True, allow_patterns=HUB_PATTERNS))
    except HFValidationError:
        raise ModelError(f"Model '{model_id}' is neither a directory nor a valid hub id (org/name)") from None
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        return None


def _download(model_id: str) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if constants.HF_HUB_OFFLINE:
        raise _unavailable(model_id)
    try:
        return Path(snapshot_download(model_id, allow_patterns=HUB_PATTERNS))
    except HFValidationError:
        raise ModelError(f"Model '{model_id}' is neither a directory nor a valid hub id (org/name)") from None
    except GatedRepoError:
        raise ModelError(
            f"Model '{model_id}' is gated on the hub; accept its terms and log in with 'hf auth login'"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise ModelError(
            f"Model '{model_id}' does not exist on the Hugging Face hub (or is private); check the id"
        ) from None
    except (LocalEntryNotFoundError, OSError, ConnectionError):
        # OSError covers requests/httpx connection failures and HfHubHTTPError (5xx, timeouts)
        raise _unavailable(model_id) from None


def pull(model_id: str) -> Path:
    """Download (or update) ``model_id`` into the huggingface_hub cache; return its directory.

    Raises
    ------
    ModelUnavailableError
        The hub cannot be reached.
    ModelError
        The hub does not know ``model_id``.
    """
    return _download(model_id)


@dataclass(frozen=True, slots=True)
class CachedModel:
    """A model in the local huggingface_hub cache."""

    repo_id: str
    path: Path  # newest snapshot directory
    size_bytes: int

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def cached_models() -> list[CachedModel]:
    """Models present in the local huggingface_hub cache, sorted by id (no network)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir()
    except (CacheNotFound, OSError):
        return []
    out = []
    for repo in info.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        newest = max(repo.revisions, key=lambda r: r.last_modified)
        out.append(CachedModel(repo.repo_id, Path(newest.snapshot_path), int(repo.size_on_disk)))
    return sorted(out, key=lambda m: m.repo_id)


def build_modernbert(directory: Path, config: dict[str, Any], device, dtype):
    """Our ModernBERT with the checkpoint's weights, on ``device`` in ``dtype``."""
    import torch

    from codesearch.encoder.modernbert import ModernBert, ModernBertConfig

    cfg = ModernBertConfig.from_hf_dict(config)
    state = modernbert_state_dict(directory, cfg)
    with torch.device("meta"):
        model = ModernBert(cfg)
    # assign=True adopts the loaded tensors instead of copying into randomly initialised ones
    model.load_state_dict(state, strict=True, assign=True)
    model.init_rope()  # the meta-device tables hold no data
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    model.init_rope(device)  # rotary tables stay fp32 whatever the weights' dtype
    return model


def build_transformers(directory: Path, device, dtype, attn_implementation: str):
    """Any other encoder (BERT, MiniLM, ...) through transformers' AutoModel (padded)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()  # no bars on stderr from a library call
    try:
        model, info = transformers.AutoModel.from_pretrained(
            str(directory), dtype=dtype, attn_implementation=attn_implementation, output_loading_info=True
        )
    except (ValueError, OSError, KeyError) as e:
        if attn_implementation == "sdpa" and "sdpa" in str(e).lower():
            return build_transformers(directory, device, dtype, "eager")
        raise CheckpointError(f"transformers cannot load '{directory}': {str(e).splitlines()[0]}") from None
    missing = [k for k in info.get("missing_keys", []) if "position_ids" not in k]
    if missing:
        raise CheckpointError(
            f"Checkpoint '{directory}' has no tensor '{sorted(missing)[0]}'; re-download the model"
        )
    mismatched = info.get("mismatched_keys") or []
    if mismatched:
        raise CheckpointError(f"Checkpoint tensor '{mismatched[0][0]}' has the wrong shape; re-download the model")
    return model.to(device).eval().requires_grad_(False)


def load(
    path_or_id: str | os.PathLike,
    device: str = "auto",
    dtype: str | torch.dtype = "auto",
    backend: str = "auto",
) -> Encoder:
    """Load an encoder from a local checkpoint directory or a Hugging Face hub id.

    Parameters
    ----------
    path_or_id
        A directory with ``config.json``, ``model.safetensors`` and ``tokenizer.json`` (and,
        optionally, sentence-transformers / PyLate files), or a hub id such as
        ``"lightonai/LateOn-Code-edge"``.
    device
        ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"`` ...
    dtype
        ``"auto"`` (bf16 on CUDA and on CPUs with AMX/AVX512-bf16, else fp32), ``"float32"``,
        ``"bfloat16"``, ``"float16"`` or a ``torch.dtype``.
    backend
        Attention backend for ModernBERT checkpoints: ``"auto"``, ``"varlen"`` (CUDA) or ``"sdpa"``.

    Returns
    -------
    Encoder

    Raises
    ------
    ModelUnavailableError, ModelError, CheckpointError, BackendError

    Examples
    --------
    >>> from codesearch.encoder import load
    >>> enc = load("lightonai/LateOn-Code-edge")                 # doctest: +SKIP
    >>> vecs = enc.encode(["def add(a, b): return a + b"])      # doctest: +SKIP
    """
    from codesearch.encoder import heads, runtime
    from codesearch.encoder.attention import select_backend

    name = os.fspath(path_or_id)
    directory = locate(name)
    dev = runtime.resolve_device(device)
    dt = runtime.resolve_dtype(dtype, dev)
    config = read_json(directory / "config.json")
    tokenizer = TextTokenizer(directory)

    if config.get("model_type") == "modernbert":
        attention = select_backend(backend, dev, dt)  # before reading weights: fail fast
        model = build_modernbert(directory, config, dev, dt)
        model.use_backend(attention)
        backbone = runtime.PackedBackbone(model, dev)
        hidden = model.config.hidden_size
        model_max = model.config.max_position_embeddings
    else:
        if backend not in ("auto", "sdpa", "flash"):
            select_backend(backend, dev, dt)  # raises the BackendError for an unknown name
        if backend == "flash":
            select_backend("flash", dev, dt)
        impl = "flash_attention_2" if backend == "flash" else "sdpa"
        model = build_transformers(directory, dev, dt, impl)
        backbone = runtime.PaddedBackbone(model, dev, tokenizer.pad_id or 0)
        hidden = int(model.config.hidden_size)
        model_max = int(getattr(model.config, "max_position_embeddings", 512))

    head = heads.load_head(directory, hidden, tokenizer, model_max)
    identity = checkpoint_identity(name, directory, {"head": head.describe(), "config": config})
    return runtime.Encoder(
        name=name,
        identity=identity,
        directory=directory,
        backbone=backbone,
        tokenizer=tokenizer,
        head=head,
        device=dev,
        dtype=dt,
    )
