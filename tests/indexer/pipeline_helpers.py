"""Shared by the pipeline tests: a fixture repository, a counting encoder, a consistency check."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from codesearch.indexer import pipeline
from codesearch.indexer.store import STORE_FILE, Store


def function_source(name: str, body_word: str = "value", lines: int = 30) -> str:
    body = "".join(f"    {body_word}_{i} = {name}_helper({i}) + {i}\n" for i in range(lines))
    return f"def {name}(x):\n    \"\"\"Compute {name} of x.\"\"\"\n{body}    return x\n\n\n"


def module_source(stem: str, n_functions: int = 3, lines: int = 30) -> str:
    return f'"""Module {stem}."""\n\nimport os\n\n\n' + "".join(
        function_source(f"{stem}_fn{i}", lines=lines) for i in range(n_functions)
    )


def make_repo(root: Path, n_files: int = 4, n_functions: int = 3, lines: int = 30) -> Path:
    """A small Python package plus a README; with the defaults every function is one chunk
    under the approximate token count (the tiny models' tokenizer splits them further)."""
    (root / "pkg").mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        (root / "pkg" / f"mod{i}.py").write_text(module_source(f"mod{i}", n_functions, lines))
    (root / "README.md").write_text("# Fixture\n\nA fixture repository for the pipeline tests.\n")
    return root


class CountingEncoder:
    """The real encoder, with every text sent to ``encode`` recorded (not a mock)."""

    def __init__(self, inner):
        self.inner = inner
        self.texts: list[str] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, texts, kind="document", batch_tokens=None):
        self.texts += list(texts)
        return self.inner.encode(texts, kind=kind, batch_tokens=batch_tokens)


def chunk_set(index_dir: Path) -> set[tuple]:
    with Store(index_dir / STORE_FILE) as s:
        return {(r.path, r.start_line, r.end_line, r.header, r.text) for r in s.iter_chunk_records()}


def index_ids(index) -> set[int]:
    """The ids an index holds (``ids`` is a property on some classes, a method on others)."""
    ids = index.ids
    return set((ids() if callable(ids) else ids).tolist())


def check_consistent(index_dir: Path, *, complete: bool = True) -> dict:
    """Assert the index folder is coherent; returns the loaded derived indexes.

    ``complete``: every chunk (and file) has a vector of each recorded model.
    """
    with Store(index_dir / STORE_FILE) as s:
        fk = s.conn.execute("PRAGMA foreign_key_check").fetchall()
        assert fk == []
        assert s.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        n_chunks, n_files = s.count("chunks"), s.count("files")
        models = s.models()
        if complete:
            if "dense" in models:
                assert s.count_with_vectors("dense") == n_chunks
                assert s.count_with_vectors("file") == n_files
            if "colbert" in models:
                assert s.count_with_vectors("colbert") == n_chunks
        derived = pipeline.load_derived(index_dir, s)
        assert len(derived["lexical"]) == n_chunks
        assert index_ids(derived["lexical"]) == {r.id for r in s.iter_chunk_records()}
        if "dense" in models:
            ids = index_ids(derived["dense_chunks"])
            assert ids == set(s.vectors_for([r.id for r in s.iter_chunk_records()], "dense")[0].tolist())
            assert index_ids(derived["dense_files"]) == set(
                s.vectors_for(list(s.file_paths()), "file")[0].tolist()
            )
        if "colbert" in models:
            assert index_ids(derived["plaid"]) == set(
                s.vectors_for([r.id for r in s.iter_chunk_records()], "colbert")[0].tolist()
            )
        # Every derived index is recorded at the store's generation after load_derived.
        gen = str(s.generation)
        for name in derived:
            assert s.get_meta(f"gen.{name}") == gen, name
    return derived


def dense_vector_of(index_dir: Path, chunk_id: int) -> np.ndarray:
    with Store(index_dir / STORE_FILE) as s:
        ids, arrays = s.vectors_for([chunk_id], "dense")
        return arrays[0]
