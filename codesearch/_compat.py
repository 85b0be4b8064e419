"""Old import paths, kept working for one release with a `DeprecationWarning`.

``codesearch.build`` was renamed ``codesearch.indexing`` (tools treat a folder named
``build`` as build output: linters, coverage and pytest skipped it). An import of an old
name gets the module under its new name, the same module object, not a copy, so state and
``isinstance`` checks are shared.
"""

from __future__ import annotations

import importlib
import sys

# Only for annotations: ``import codesearch`` runs this module before a warm query's first
# byte is sent, and importlib.abc/util, warnings and typing cost ~15 ms there.
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    import importlib.machinery
    from collections.abc import Callable, Sequence
    from types import ModuleType

#: Old dotted prefix -> new dotted prefix. The longest matching prefix wins.
MOVED: dict[str, str] = {
    "codesearch.build": "codesearch.indexing",
    # The Ray backend is an encoder (it implements the Encoder protocol), not a stage.
    "codesearch.indexing.distributed": "codesearch.encoder.ray",
    "codesearch.build.distributed": "codesearch.encoder.ray",
    # Moved down, so that types.py (the bottom) can use them.
    "codesearch.search.globs": "codesearch.globs",
    "codesearch.indexing.languages": "codesearch.languages",
    "codesearch.build.languages": "codesearch.languages",
    # The serve command lives with the server (python -m codesearch.server runs it without
    # the CLI); the option helpers are shared names.
    "codesearch.cli.serve": "codesearch.server.command",
    "codesearch.cli.options": "codesearch.types",
    # The index run, split into its stages (options, run, commit, encode, publish).
    "codesearch.indexing.pipeline": "codesearch.indexing.run",
    "codesearch.build.pipeline": "codesearch.indexing.run",
}


def new_name(old: str) -> str | None:
    """The module's name today, or None when ``old`` is not an old name."""
    if not old.startswith("codesearch."):
        return None  # (asked of every import in the process)
    for prefix in sorted(MOVED, key=len, reverse=True):
        if old == prefix or old.startswith(prefix + "."):
            return MOVED[prefix] + old[len(prefix):]
    return None


class _Alias:
    """The loader of an old name: the module under its new name (an `importlib.abc.Loader`)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        import warnings

        warnings.warn(
            f"{spec.name} is deprecated and will be removed in the next release; import {self.target}",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the module under its new name is already executed


class _Finder:
    """Old names to new modules, first on `sys.meta_path` (an `importlib.abc.MetaPathFinder`)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        moved = new_name(fullname)
        if moved is None:
            return None
        import importlib.util

        module = importlib.import_module(moved)  # ModuleNotFoundError names the new module
        return importlib.util.spec_from_loader(fullname, _Alias(moved), is_package=hasattr(module, "__path__"))


def moved_names(module: str, names: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for names that moved to another module (``"package.module"``)
    or became another name there (``"package.module:NewName"``): each resolves to the same
    object as its new home, with a `DeprecationWarning`.

    Example (in the old module)::

        __getattr__ = _compat.moved_names(__name__, {"Encoders": "codesearch.encoder.base"})
    """

    def __getattr__(name: str) -> object:
        home = names.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, new = home.partition(":")
        new = new or name
        import warnings

        warnings.warn(
            f"{module}.{name} is deprecated and will be removed in the next release; use {where}.{new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(where), new)

    return __getattr__


def install() -> None:
    """Put the finder first on `sys.meta_path`, once (called by ``import codesearch``).

    First: an old package name resolves to the new package, whose ``__path__`` would let
    the path finder load ``codesearch.build.walk`` from the new folder as a second copy.
    Any other name costs one prefix check.
    """
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
