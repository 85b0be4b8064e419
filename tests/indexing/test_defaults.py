"""Device-aware default models: the 149M dense model only where a GPU runs it."""

from __future__ import annotations

import pytest

from codesearch.encoder import DEFAULT_DENSE_MODEL, DEFAULT_MULTI_MODEL
from codesearch.indexing.encoders import default_models


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_a_cpu_gets_the_small_colbert_model_only(device):
    assert default_models(device) == (None, DEFAULT_MULTI_MODEL)


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_gpu_gets_both_models(device):
    assert default_models(device) == (DEFAULT_DENSE_MODEL, DEFAULT_MULTI_MODEL)


def test_torch_devices_and_auto_follow_the_hardware():
    torch = pytest.importorskip("torch")
    assert default_models(torch.device("cpu")) == (None, DEFAULT_MULTI_MODEL)
    want = DEFAULT_DENSE_MODEL if torch.cuda.is_available() else None
    assert default_models("auto") == (want, DEFAULT_MULTI_MODEL)
