"""Files share their chunks through the user's cache (`codesearch.indexing.reuse`).

A second copy of a repository takes every unchanged file's chunks from the cache (no
tree-sitter, no tokenizer) and must build exactly the index a run without the cache builds:
the same chunks, the same vectors, the same answers. The spy below wraps the real chunker
and records the files it is asked to cut (not a mock: it returns what the chunker returns).
"""

from __future__ import annotations

import shutil
import sqlite3

import numpy as np
import pytest
from fixtures.pipeline_helpers import CountingEncoder, check_consistent, make_repo, module_source

from codesearch.api import CodeSearch
from codesearch.encoder.base import Encoders
from codesearch.indexing import run as pipeline
from codesearch.indexing.chunking import chunk_source, parallel
from codesearch.indexing.reuse import cache_model
from codesearch.indexing.run import build_index
from codesearch.store import Store
from codesearch.store.cache import CACHE_FILE, UserCache, cache_folder
from codesearch.types import STORE_FILE

QUERIES = ["retry the request", "mod1_fn0 helper value", "fixture repository"]


@pytest.fixture
def repo(tmp_path):
    root = make_repo(tmp_path / "main", n_files=4, n_functions=3, lines=12)
    (root / "pkg" / "types.ts").write_text(
        "export class Box<T> {\n  constructor(private v: T) {}\n  get(): T {\n    return this.v;\n  }\n}\n"
    )
    return root


@pytest.fixture
def chunked(monkeypatch):
    """The paths the real chunker cuts in this process."""
    seen: list[str] = []

    def spy(path, text, language, **kw):
        seen.append(path)
        return chunk_source(path, text, language, **kw)

    monkeypatch.setattr(parallel, "chunk_source", spy)
    return seen


def _copy(repo, where):
    return shutil.copytree(repo, where, ignore=shutil.ignore_patterns(".codesearch"))


def _index_content(root) -> dict:
    """Everything an index holds that a user can see, by path and position (ids left out)."""
    with Store(pipeline.default_index_dir(root) / STORE_FILE) as s:
        records = list(s.iter_chunk_records())
        chunks = sorted((r.chunk.to_dict() | {"hash": r.text_hash}).items().__repr__() for r in records)
        by_id = {r.id: (r.chunk.path, r.chunk.start_line) for r in records}
        vectors = {}
        for kind in ("dense", "colbert"):
            ids, arrays = s.vectors_for(list(by_id), kind)
            vectors[kind] = {by_id[int(i)]: np.asarray(a).tobytes() for i, a in zip(ids, arrays)}
        return {"chunks": chunks, "vectors": vectors, "files": sorted(s.file_paths())}


def _hits(root, single_vector_dir, colbert_dir):
    with CodeSearch(root, model=str(single_vector_dir), multi_model=str(colbert_dir), device="cpu") as cs:
        return [
            [(h.path, h.start_line, h.end_line, h.kind, h.symbol, round(h.score, 5)) for h in cs.search(q, k=8)]
            for q in QUERIES
        ]


def test_a_second_copy_chunks_nothing_and_builds_the_same_index(
    repo, tmp_path, counting, chunked, monkeypatch, single_vector_dir, colbert_dir
):
    build_index(repo, encoders=counting)
    assert len(chunked) == 6  # 4 modules, the TypeScript file, the README
    chunked.clear()

    warm = _copy(repo, tmp_path / "warm")
    build_index(warm, encoders=counting)
    assert chunked == []  # every file's chunks came from the cache

    # The same copy indexed with the cache off: the index a run without the cache builds.
    monkeypatch.setenv("CODESEARCH_CACHE_SIZE", "0")
    cold = _copy(repo, tmp_path / "cold")
    build_index(cold, encoders=counting)
    assert len(chunked) == 6
    assert _index_content(warm) == _index_content(cold)
    check_consistent(pipeline.default_index_dir(warm))
    assert _hits(warm, single_vector_dir, colbert_dir) == _hits(cold, single_vector_dir, colbert_dir)


def test_only_the_changed_files_are_chunked_again(repo, tmp_path, counting, chunked):
    build_index(repo, encoders=counting)
    chunked.clear()
    moved = _copy(repo, tmp_path / "moved")
    (moved / "pkg" / "mod1.py").write_text(module_source("edited", 3, lines=12))
    (moved / "pkg" / "new.py").write_text(module_source("brand_new", 2, lines=12))
    build_index(moved, encoders=counting)
    assert sorted(chunked) == ["pkg/mod1.py", "pkg/new.py"]


def test_the_same_content_under_another_name_is_cut_for_that_name(tmp_path, counting):
    # The header (the path) comes out of each chunk's budget: a long name leaves less room,
    # so the same content is cut at other lines. Its chunks are never taken from the short name's.
    source = module_source("same", 6, lines=14)
    a = tmp_path / "a"
    a.mkdir()
    (a / "m.py").write_text(source)
    build_index(a, encoders=counting, chunk_tokens=128)
    b = tmp_path / "b"
    long_name = "/".join(["a_rather_long_folder_name_for_headers"] * 3) + "/m.py"
    (b / long_name).parent.mkdir(parents=True)
    (b / long_name).write_text(source)
    build_index(b, encoders=counting, chunk_tokens=128)

    counter = counting.multi.token_counter()
    fresh = chunk_source(long_name, source, "python", max_tokens=128, count_tokens=counter)
    short = chunk_source("m.py", source, "python", max_tokens=128, count_tokens=counter)
    assert [(c.start_line, c.end_line) for c in fresh] != [(c.start_line, c.end_line) for c in short]
    with Store(pipeline.default_index_dir(b) / STORE_FILE) as s:
        assert sorted((r.chunk for r in s.iter_chunk_records()), key=lambda c: c.start_line) == fresh


@pytest.mark.parametrize("damage", ["bytes", "records"])
def test_a_damaged_entry_is_a_miss(repo, tmp_path, counting, chunked, damage):
    build_index(repo, encoders=counting)
    chunked.clear()
    with sqlite3.connect(cache_folder() / CACHE_FILE) as db:
        if damage == "bytes":  # the CRC no longer matches
            db.execute("UPDATE chunks SET data = CAST(replace(CAST(data AS TEXT), '1', '2') AS BLOB)")
        else:  # sound bytes whose lines are past the end of the file
            import json
            import zlib

            keys = [k for (k,) in db.execute("SELECT key FROM chunks").fetchall()]
            for key in keys:
                bad = json.dumps([[1, 10_000, 0, 1, None, "text", None, ""]]).encode()
                db.execute("UPDATE chunks SET data = ?, crc = ? WHERE key = ?", (bad, zlib.crc32(bad), key))
    copy = _copy(repo, tmp_path / "copy")
    build_index(copy, encoders=counting)
    assert len(chunked) == 6  # chunked again, from the files
    assert _index_content(copy)["chunks"] == _index_content(repo)["chunks"]
    chunked.clear()
    build_index(_copy(repo, tmp_path / "again"), encoders=counting)
    assert chunked == []  # and the damaged entries were replaced


def test_a_changed_tokenizer_beside_the_same_weights_reuses_nothing(repo, tmp_path, single_vector_dir):
    # A new snapshot of a hub model whose tokenizer.json changed and whose weights did not:
    # the same name, the same model identity, other ids for the same text.
    from tokenizers import Tokenizer, normalizers

    from codesearch.encoder import load

    model_dir = shutil.copytree(single_vector_dir, tmp_path / "model")
    first = CountingEncoder(load(str(model_dir)))
    first_key = cache_model(first)
    build_index(repo, encoders=Encoders(dense=first))

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.normalizer = normalizers.Lowercase()
    tok.save(str(model_dir / "tokenizer.json"))
    other = CountingEncoder(load(str(model_dir)))
    assert first.identity == other.identity  # the model identity cannot tell them apart
    assert first_key != cache_model(other)
    summary = build_index(_copy(repo, tmp_path / "copy"), encoders=Encoders(dense=other))
    assert summary.texts_reused == 0 and summary.chunks_encoded == len(other.texts) > 0


def test_chunk_records_are_evicted_least_recently_used_first(tmp_path):
    record = b'[[1,2,0,10,null,"text",null,""]]' * 40
    with UserCache.open(tmp_path / "c", limit=2 * 2**20) as cache:
        cache.put_chunks([(f"old{i}", record) for i in range(1000)])
        cache.conn.execute("UPDATE chunks SET used = used - 7200")
        for part in range(4):  # past the cap
            cache.put_chunks([(f"new{part}-{i}", record) for i in range(250)])
        assert cache.disk_bytes() <= 2 * 2**20
        assert len(cache.get_chunks([f"new3-{i}" for i in range(250)])) == 250
        assert len(cache.get_chunks([f"old{i}" for i in range(1000)])) < 1000
        cache.prune(everything=True)
        assert cache.status().chunked_files == 0


# -- no model load when every text is cached (codesearch.indexing.deferred) ---------------------------


def _index_with_pool(root, single_vector_dir, colbert_dir):
    from codesearch.api import EncoderPool

    pool = EncoderPool()
    with CodeSearch(root, model=str(single_vector_dir), multi_model=str(colbert_dir), device="cpu",
                    encoder_pool=pool) as cs:
        summary = cs.index()
    return summary, pool


def test_a_copy_whose_texts_are_all_cached_loads_no_model(repo, tmp_path, single_vector_dir, colbert_dir):
    first, pool = _index_with_pool(repo, single_vector_dir, colbert_dir)
    assert first.chunks_encoded > 0 and len(pool.loaded()) == 2

    copy = _copy(repo, tmp_path / "copy")
    summary, pool = _index_with_pool(copy, single_vector_dir, colbert_dir)
    assert summary.chunks_encoded == 0 and summary.texts_reused == first.chunks_encoded
    assert pool.loaded() == []  # neither model was loaded
    with Store(pipeline.default_index_dir(copy) / STORE_FILE) as s, \
            Store(pipeline.default_index_dir(repo) / STORE_FILE) as r:
        assert s.models() == r.models()
        assert s.get_meta("embedded") == r.get_meta("embedded")
    assert _index_content(copy) == _index_content(repo)
    check_consistent(pipeline.default_index_dir(copy))
    assert _hits(copy, single_vector_dir, colbert_dir) == _hits(repo, single_vector_dir, colbert_dir)


def test_a_copy_with_new_text_loads_the_model_and_encodes_it(repo, tmp_path, single_vector_dir, colbert_dir):
    _index_with_pool(repo, single_vector_dir, colbert_dir)
    moved = _copy(repo, tmp_path / "moved")
    (moved / "pkg" / "new.py").write_text(module_source("brand_new", 2, lines=12))
    summary, pool = _index_with_pool(moved, single_vector_dir, colbert_dir)
    assert summary.chunks_encoded > 0 and len(pool.loaded()) == 2
    check_consistent(pipeline.default_index_dir(moved))


def test_a_checkpoint_changed_on_disk_is_loaded_again(repo, tmp_path, single_vector_dir, colbert_dir):
    import os

    dense_dir = shutil.copytree(single_vector_dir, tmp_path / "dense")
    _index_with_pool(repo, dense_dir, colbert_dir)
    config = dense_dir / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    _, pool = _index_with_pool(_copy(repo, tmp_path / "copy"), dense_dir, colbert_dir)
    assert [e.name for e in pool.loaded()] == [str(dense_dir)]  # its card no longer matches; ColBERT's does


# -- the tokenizer beside the model identity, in the index -------------------------------------------


def _lowercase_tokenizer(model_dir):
    from tokenizers import Tokenizer, normalizers

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.normalizer = normalizers.Lowercase()
    tok.save(str(model_dir / "tokenizer.json"))


def test_an_index_refuses_a_changed_tokenizer_beside_the_same_weights(repo, tmp_path, single_vector_dir):
    from codesearch.encoder import load
    from codesearch.errors import ModelMismatchError

    model_dir = shutil.copytree(single_vector_dir, tmp_path / "model")
    build_index(repo, encoders=Encoders(dense=load(str(model_dir))))
    _lowercase_tokenizer(model_dir)
    with pytest.raises(ModelMismatchError, match=r"another tokenizer.*--rebuild"):
        build_index(repo, encoders=Encoders(dense=load(str(model_dir))))
    summary = build_index(repo, encoders=Encoders(dense=load(str(model_dir))), rebuild=True)
    assert summary.chunks_encoded > 0 and summary.texts_reused == 0  # nothing stale, in the index or the cache


def test_an_index_without_a_recorded_tokenizer_keeps_its_vectors(repo, single_vector_dir):
    # An index written before the tokenizer was recorded (the key deleted here) is found
    # compatible: nothing is re-embedded, and the next run records the tokenizer.
    from codesearch.encoder import load

    enc = CountingEncoder(load(str(single_vector_dir)))
    build_index(repo, encoders=Encoders(dense=enc))
    with Store(pipeline.default_index_dir(repo) / STORE_FILE) as s:
        recorded = s.get_meta("tokenizer.dense")
        assert recorded
        with s.transaction():
            s.delete_meta("tokenizer.dense")
    enc.texts.clear()
    (repo / "pkg" / "mod0.py").touch()
    build_index(repo, encoders=Encoders(dense=enc))
    assert enc.texts == []
    with Store(pipeline.default_index_dir(repo) / STORE_FILE) as s:
        assert s.get_meta("tokenizer.dense") == recorded


def test_a_fully_cached_index_run_imports_no_torch(repo, tmp_path, single_vector_dir, colbert_dir):
    import os
    import subprocess
    import sys

    _index_with_pool(repo, single_vector_dir, colbert_dir)  # fills the cache, writes the models' cards
    copy = _copy(repo, tmp_path / "copy")
    script = (
        "import sys\n"
        "from codesearch.api import CodeSearch\n"
        f"with CodeSearch({str(copy)!r}, model={str(single_vector_dir)!r}, multi_model={str(colbert_dir)!r},"
        " device='cpu') as cs:\n"
        "    s = cs.index()\n"
        "print(s.chunks_encoded, s.texts_reused, 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ, check=True)
    encoded, reused, torch_imported, transformers_imported = out.stdout.split()
    assert (encoded, torch_imported, transformers_imported) == ("0", "False", "False") and int(reused) > 0
