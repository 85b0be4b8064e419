"""Fixtures shared by the index-run tests: the tiny random models loaded once per module, and
encoders that count what they are asked to encode."""

from __future__ import annotations

import pytest
from fixtures.pipeline_helpers import CountingEncoder

from codesearch.encoder.base import Encoders


@pytest.fixture(scope="module")
def tiny_encoders(single_vector_dir, colbert_dir):
    from codesearch.encoder import load

    return load(str(single_vector_dir)), load(str(colbert_dir))


@pytest.fixture
def counting(tiny_encoders):
    dense, multi = tiny_encoders
    return Encoders(dense=CountingEncoder(dense), multi=CountingEncoder(multi))
