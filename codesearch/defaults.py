"""Which models a run gets when the user names none: decided by device, by measurement.

The package defaults (``codesearch.encoder.DEFAULT_DENSE_MODEL``, ``DEFAULT_MULTI_MODEL``)
are the best pair on a GPU. On a CPU the 149M dense model costs far more than it brings, so
a CPU user gets the 17M ColBERT model plus the lexical index by default and opts into the
dense model with ``--model``. The numbers behind this are in BENCHMARKS.md, "Default models
on a CPU"; the docstring of :func:`default_models` summarises them.
"""

from __future__ import annotations

from typing import Any

from codesearch.encoder import DEFAULT_DENSE_MODEL, DEFAULT_MULTI_MODEL

__all__ = ["default_models", "whole_file_vectors"]


def default_models(device: Any) -> tuple[str | None, str | None]:
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

    - httpx (24 files), 2-core AMD EPYC (AVX2 only: fp32), load ~2.2: lexical only 1.0 s;
      the 17M ColBERT model 21.5 s (231 chunks, 74k tokens); the 149M dense model 4,358 s
      (136k tokens, 45% of them whole files; ~20 CPU minutes while the shared machine ran
      at load 10-18).
    - flask (26 files), the issue's run at load ~4.5: lexical 0.8 s, 17M ColBERT 38.6 s,
      both 891.9 s. The 149M model does ~28x the matmul work of the 17M one per token
      (110M vs 3.9M parameters in linear layers) and encodes every file again whole, so it
      is 95% of the default's CPU time: minutes for 26 files, hours for 1,000.
    - int8 linear layers do not rescue it: per-tensor dynamic int8 moves real MiniLM vectors
      to a cosine of ~0.94 against fp32 (per-channel ~0.98); see BENCHMARKS.md.
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


def whole_file_vectors(device: Any) -> bool:
    """Whether the dense model also encodes every file whole (one long-context vector per file).

    True on CUDA. On a CPU the whole-file pass about doubles the dense model's tokens (every
    file is read again up to 8192 tokens), so a CPU user who opts into a dense model gets the
    file's centroid instead: the normalised mean of its chunk vectors, which the searcher
    already computes for short-context models (``w_file_centroid``; +0.6 / +1.0 NDCG points on
    the two halves of the dev split with MiniLM, BENCHMARKS.md). Centroid vs whole-file
    vector for a long-context model is unmeasured here.

    Examples
    --------
    >>> whole_file_vectors("cpu")
    False
    """
    return _is_gpu(device)


def _is_gpu(device: Any) -> bool:
    kind = getattr(device, "type", None) or str(device).split(":", 1)[0]
    if kind == "auto":
        import torch  # only here: "cpu"/"cuda" must not pay torch's import time

        return torch.cuda.is_available()
    return kind == "cuda"
