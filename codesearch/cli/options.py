"""Option types and converters shared by the commands of `codesearch.cli.app` and
`codesearch.cli.serve` (standard library only at import time, so `--help` stays fast)."""

from __future__ import annotations

from enum import Enum
from typing import Any


class Device(str, Enum):
    """``--device``: where the encoders run."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


def model_option(value: str | None) -> Any:
    """``--model``/``--multi-model``: `None` (not given) -> `codesearch.api.DEFAULT` (the
    index's model, else the package default); ``"none"`` -> None (that index disabled)."""
    from codesearch.api import DEFAULT

    if value is None:
        return DEFAULT
    return None if value.strip().lower() == "none" else value
