"""Old import paths keep working for one release: the same module objects, with a warning."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("old,new", [
    ("codesearch.build", "codesearch.indexing"),
    ("codesearch.build.pipeline", "codesearch.indexing.run"),
    ("codesearch.indexing.pipeline", "codesearch.indexing.run"),
    ("codesearch.build.chunking", "codesearch.indexing.chunking"),
    ("codesearch.indexing.distributed", "codesearch.encoder.ray"),
    ("codesearch.build.distributed", "codesearch.encoder.ray"),
    ("codesearch.search.globs", "codesearch.globs"),
    ("codesearch.indexing.languages", "codesearch.languages"),
    ("codesearch.build.languages", "codesearch.languages"),
    ("codesearch.cli.serve", "codesearch.server.command"),
    ("codesearch.cli.options", "codesearch.types"),
])
def test_an_old_module_name_is_the_new_module_and_warns(old, new):
    # A fresh interpreter: this one may have imported either name already.
    code = (
        "import importlib, sys, warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({new!r})\n"
        "assert old is new, (old, new)\n"
        f"assert any(issubclass(w.category, DeprecationWarning) and {new!r} in str(w.message) for w in seen), seen\n"
        "mods = [m for n, m in sys.modules.items() if n.startswith('codesearch') and getattr(m, '__file__', None)]\n"
        "print(len({m.__file__ for m in mods}) == len({id(m) for m in mods}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"  # every old name is an alias: no file loaded twice


def test_the_new_names_import_without_a_warning():
    code = "import warnings; warnings.simplefilter('error'); import codesearch.indexing.run, codesearch.api"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("module,name,new", [
    ("codesearch.indexing.encoders", "Encoders", "codesearch.encoder.base:Encoders"),
    ("codesearch.store", "ChunkRecord", "codesearch.store.records:StoredChunk"),
    ("codesearch.store", "ChunkRow", "codesearch.store.records:StoredChunk"),
    ("codesearch.api", "fit_result", "codesearch.search.snippets:fit"),
    ("codesearch.api", "widen_result", "codesearch.search.snippets:with_context"),
    ("codesearch.api", "scope_globs", "codesearch.globs:scope_globs"),
])
def test_a_moved_name_is_the_new_object_and_warns(module, name, new):
    import importlib
    import warnings

    where, _, attr = new.partition(":")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        old = getattr(importlib.import_module(module), name)
    assert old is getattr(importlib.import_module(where), attr)
    assert any(issubclass(w.category, DeprecationWarning) and f"{where}.{attr}" in str(w.message) for w in seen)
