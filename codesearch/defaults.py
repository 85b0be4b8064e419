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

__all__ = ["default_models"]


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
    ``benchmarks/default_cost.py``) on a 2-core AMD EPYC (AVX2, no AVX512/AMX, so fp32) and in
    the issue's run on a busy 2-core machine, indexing ~25-file Python packages
    (httpx, 24 files; flask, 26 files):

    - lexical only is about 1 s; the 17M ColBERT model adds ~20-40 s; the 149M dense model
      (chunk vectors plus one whole-file vector per file, about twice the tokens) adds
      10-25 minutes. Per token the 149M model is ~10-20x the 17M one (BENCHMARKS.md).
      At that rate a 1,000-file repository takes hours with the dense model and minutes
      without it, so the CPU default can meet the "minutes, not hours" target only without it.
    - int8 linear layers do not close the gap (see BENCHMARKS.md, "int8 on a CPU").
    - Quality, from published numbers only (real weights are not available here, so the
      real-weight quality of either choice is unmeasured): on semble's code-search benchmark
      LateOn-Code-edge with full-text fusion scores 0.846 NDCG@10 (ColGREP's README), about
      what a 137M dense model reaches in a hybrid (CodeRankEmbed 0.862) and far above it
      alone (0.765). The lexical + 17M ColBERT pair keeps most of the hybrid's quality at a
      small fraction of its CPU cost.

    On a GPU the 149M model encodes thousands of tokens per second per layer stack in bf16
    flash attention, so both models stay on by default there.

    Examples
    --------
    >>> default_models("cpu")
    (None, 'lightonai/LateOn-Code-edge')
    """
    if _is_gpu(device):
        return DEFAULT_DENSE_MODEL, DEFAULT_MULTI_MODEL
    return None, DEFAULT_MULTI_MODEL


def _is_gpu(device: Any) -> bool:
    kind = getattr(device, "type", None) or str(device).split(":", 1)[0]
    if kind == "auto":
        import torch  # only here: "cpu"/"cuda" must not pay torch's import time

        return torch.cuda.is_available()
    return kind == "cuda"
