"""The incremental pipeline on small fixture repos: real walk, tree-sitter, SQLite, indexes.

Lexical-only tests need no model; the encoder tests use the tiny random checkpoints and
count what reaches the encoder through :class:`CountingEncoder` and the summary.
"""

from __future__ import annotations

import os
import shutil
import sqlite3

import pytest
from fixtures.pipeline_helpers import (
    check_consistent,
    chunk_set,
    function_source,
    index_ids,
    make_repo,
    module_source,
)

from codesearch.encoder.base import Encoders
from codesearch.errors import (
    IndexCorruptError,
    IndexLockedError,
    ModelMismatchError,
    NothingToIndexError,
    PathError,
)
from codesearch.indexes import registry
from codesearch.indexes.registry import load_derived
from codesearch.indexing import run as pipeline
from codesearch.indexing.chunking import CHUNKER_VERSION
from codesearch.indexing.encoders import resolve_encoders
from codesearch.indexing.run import build_index
from codesearch.indexing.status import staleness
from codesearch.store import IndexLock, Store
from codesearch.types import STORE_FILE


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo")


def _store(repo):
    return Store(pipeline.default_index_dir(repo) / STORE_FILE)


def _bump_mtime(path):
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


# -- lexical-only -------------------------------------------------------------------------------


def test_lexical_only_build_end_to_end(repo):
    events = []
    summary = build_index(repo, progress=events.append)
    idir = pipeline.default_index_dir(repo)
    assert summary.files_indexed == 5 and summary.files_unchanged == 0
    assert summary.chunks_encoded == 0 and summary.models == {}
    assert summary.chunks_total >= 13  # 4 modules x 3 functions, plus the README
    assert (idir / ".gitignore").read_text() == "*\n"
    assert {e.stage for e in events} >= {"walk", "chunk", "write", "sync"}
    derived = check_consistent(idir)
    assert set(derived) == {"lexical"}
    ids, _ = derived["lexical"].search(["mod2_fn1"], k=1)[0]
    with _store(repo) as s:
        (hit,) = s.chunk_records(ids.tolist())
        assert hit.chunk.path == "pkg/mod2.py" and hit.chunk.symbol == "mod2_fn1"
    assert summary.to_dict()["index_dir"] == str(idir)


def test_unchanged_rerun_costs_only_stats(repo):
    build_index(repo)
    with _store(repo) as s:
        gen = s.generation
    summary = build_index(repo)
    assert (summary.files_read, summary.files_indexed, summary.chunks_encoded) == (0, 0, 0)
    assert summary.files_unchanged == 5
    with _store(repo) as s:
        assert s.generation == gen  # nothing changed: no new generation, no derived rewrite


def test_touched_file_is_read_but_not_rechunked(repo):
    build_index(repo)
    before = chunk_set(pipeline.default_index_dir(repo))
    _bump_mtime(repo / "pkg/mod1.py")
    summary = build_index(repo)
    assert (summary.files_read, summary.files_indexed, summary.files_unchanged) == (1, 0, 5)
    assert chunk_set(pipeline.default_index_dir(repo)) == before
    assert build_index(repo).files_read == 0  # the new stat was recorded


def test_edit_keeps_ids_of_moved_chunks_and_replaces_the_edited_one(repo):
    build_index(repo)
    with _store(repo) as s:
        fid = {v: k for k, v in s.file_paths().items()}["pkg/mod0.py"]
        old = {r.chunk.symbol: r.id for r in s.chunk_records(s.file_chunk_ids(fid))}
    src = (repo / "pkg/mod0.py").read_text()
    # Edit fn0 so it gains lines: fn1 and fn2 move down but keep their text.
    src = src.replace(function_source("mod0_fn0"), function_source("mod0_fn0", body_word="edited", lines=35))
    (repo / "pkg/mod0.py").write_text(src)
    summary = build_index(repo)
    assert summary.files_indexed == 1
    with _store(repo) as s:
        new = {r.chunk.symbol: r for r in s.chunk_records(s.file_chunk_ids(fid))}
    assert new["mod0_fn1"].id == old["mod0_fn1"] and new["mod0_fn2"].id == old["mod0_fn2"]
    assert new["mod0_fn0"].id != old["mod0_fn0"] and "edited_34" in new["mod0_fn0"].chunk.text
    derived = check_consistent(pipeline.default_index_dir(repo))
    assert old["mod0_fn0"] not in index_ids(derived["lexical"])


def test_deleted_file_leaves_every_table_and_index(repo):
    build_index(repo)
    (repo / "pkg/mod3.py").unlink()
    summary = build_index(repo)
    assert summary.files_removed == 1
    with _store(repo) as s:
        assert "pkg/mod3.py" not in s.files()
        assert not any(r.chunk.path == "pkg/mod3.py" for r in s.iter_chunk_records())
    derived = check_consistent(pipeline.default_index_dir(repo))
    ids, _ = derived["lexical"].search(["mod3_fn1"], k=5)[0]
    with _store(repo) as s:
        assert all(r.chunk.path != "pkg/mod3.py" for r in s.chunk_records(ids.tolist()))


def test_staleness_reports_added_changed_removed_and_touched(repo):
    build_index(repo)
    (repo / "pkg/new.py").write_text(module_source("new"))
    (repo / "pkg/mod0.py").write_text(module_source("mod0", 4))
    (repo / "pkg/mod1.py").unlink()
    _bump_mtime(repo / "pkg/mod2.py")
    st = staleness(repo)
    assert (st.added, st.changed, st.removed, st.touched) == (
        ["pkg/new.py"], ["pkg/mod0.py"], ["pkg/mod1.py"], ["pkg/mod2.py"]
    )
    assert st.to_dict() == {"indexed": True, "new": 1, "changed": 1, "deleted": 1, "touched": 1}
    build_index(repo)
    assert not staleness(repo).stale


def test_staleness_of_an_unindexed_folder(repo):
    st = staleness(repo)
    assert not st.indexed and len(st.added) == 5


def test_walk_options_are_recorded(repo):
    build_index(repo, exclude=["pkg/mod3.py"], max_file_bytes=50_000)
    with _store(repo) as s:
        meta = s.meta()
    assert (meta["walk.include"], meta["walk.exclude"], meta["max_file_bytes"]) == ("[]", '["pkg/mod3.py"]', "50000")
    assert not staleness(repo, exclude=["pkg/mod3.py"]).stale


def test_new_chunk_budget_rechunks_everything(repo):
    build_index(repo)
    summary = build_index(repo, chunk_tokens=32)
    assert summary.files_indexed == 5
    with _store(repo) as s:
        assert s.get_meta("chunk_tokens") == "32"
    check_consistent(pipeline.default_index_dir(repo))


def test_chunks_of_another_chunker_version_are_rechunked(repo):
    build_index(repo)
    with _store(repo) as s:
        assert s.get_meta("chunker_version") == str(CHUNKER_VERSION)
    assert build_index(repo).files_indexed == 0
    # An index from before the version was recorded: every file is chunked again, once.
    with sqlite3.connect(repo / ".codesearch" / STORE_FILE) as db:
        db.execute("DELETE FROM meta WHERE key = 'chunker_version'")
    assert build_index(repo).files_indexed == 5
    assert build_index(repo).files_indexed == 0
    check_consistent(pipeline.default_index_dir(repo))


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_bad_root_is_a_path_error(tmp_path, kind):
    target = tmp_path / "nope"
    if kind == "file":
        target.write_text("x")
    with pytest.raises(PathError, match="nope"):
        build_index(target)


def test_nothing_to_index_says_what_was_skipped(tmp_path):
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 8)
    with pytest.raises(NothingToIndexError, match="binary"):
        build_index(tmp_path)
    # Nothing is left behind: a later query says "not indexed", not "no results".
    assert not (tmp_path / ".codesearch").exists()
    # A folder of the user's own keeps exactly what it held, even names the index uses.
    own = tmp_path / "own-index"
    (own / "plaid").mkdir(parents=True)
    (own / "plaid" / "keep.txt").write_text("mine")
    (own / "lexical.npz").write_text("mine too")
    before = sorted(p.relative_to(own) for p in own.rglob("*"))
    with pytest.raises(NothingToIndexError):
        build_index(tmp_path, index_dir=own)
    assert sorted(p.relative_to(own) for p in own.rglob("*")) == before
    assert (own / "plaid" / "keep.txt").read_text() == "mine"


def test_second_indexer_is_refused_while_the_first_holds_the_lock(repo):
    idir = pipeline.default_index_dir(repo)
    idir.mkdir()
    with IndexLock(idir), pytest.raises(IndexLockedError, match=f"pid {os.getpid()}"):
        build_index(repo)
    build_index(repo)  # released: works


def test_corrupt_store_asks_for_rebuild_and_rebuild_recovers(repo):
    build_index(repo)
    idir = pipeline.default_index_dir(repo)
    expected = chunk_set(idir)
    (idir / STORE_FILE).write_bytes(b"garbage" * 1000)
    for suffix in ("-wal", "-shm"):
        (idir / (STORE_FILE + suffix)).unlink(missing_ok=True)
    with pytest.raises(IndexCorruptError, match="--rebuild"):
        build_index(repo)
    build_index(repo, rebuild=True)
    assert chunk_set(idir) == expected


def test_rebuild_replaces_the_index_in_one_commit(repo):
    build_index(repo)
    idir = pipeline.default_index_dir(repo)
    before = chunk_set(idir)
    with _store(repo) as s:
        old_ids = {r.id for r in s.iter_chunk_records()}
    seen_by_reader = []

    def progress(event):
        if event.stage == "write" and event.done == 0:
            # Just before the rebuild's transaction: a reader still has the whole old index.
            with Store(idir / STORE_FILE, readonly=True) as r:
                seen_by_reader.append((r.count("files"), len(load_derived(idir, r)["lexical"])))

    summary = build_index(repo, rebuild=True, progress=progress)
    assert seen_by_reader == [(5, len(old_ids))]
    assert summary.files_indexed == 5 and summary.files_removed == 0
    assert chunk_set(idir) == before
    with _store(repo) as s:
        assert not old_ids & {r.id for r in s.iter_chunk_records()}  # ids are never reused
    check_consistent(idir)


def test_interrupted_rebuild_leaves_the_old_index(repo):
    build_index(repo)
    idir = pipeline.default_index_dir(repo)
    before = chunk_set(idir)

    def interrupt(event):
        if event.stage == "write":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_index(repo, rebuild=True, progress=interrupt)
    assert chunk_set(idir) == before
    check_consistent(idir)
    IndexLock(idir).acquire().release()  # the lock was released


def test_crash_between_store_commit_and_sync_is_healed(repo):
    build_index(repo)
    idir = pipeline.default_index_dir(repo)
    (repo / "pkg/mod0.py").write_text(module_source("mod0", 5))
    # Simulate a run killed after its store transaction: the store moves on, the lexical
    # file stays at the previous generation.
    with _store(repo) as s:
        s.set_meta("generation", s.generation + 1)
    with _store(repo) as s:
        derived = load_derived(idir, s)  # rebuilt from the store, persisted
        assert len(derived["lexical"]) == s.count("chunks")
        assert s.get_meta("gen.lexical") == str(s.generation)
    build_index(repo)
    check_consistent(idir)


def test_reader_waits_for_a_syncing_writer_instead_of_rebuilding(repo, monkeypatch):
    import threading

    build_index(repo)
    idir = pipeline.default_index_dir(repo)
    rebuilt = []
    real = registry._rebuild_index
    monkeypatch.setattr(registry, "_rebuild_index",
                        lambda name, store, **kw: rebuilt.append(name) or real(name, store, **kw))
    # A writer between its store commit and its derived-index writes.
    lock = IndexLock(idir).acquire()
    with _store(repo) as w:
        w.set_meta("generation", w.generation + 1)
        lexical = real("lexical", w, path=idir / "lexical")

        def finish_sync():
            lexical.save(idir / "lexical")
            w.set_meta("gen.lexical", w.generation)
            lock.release()

        timer = threading.Timer(0.4, finish_sync)
        timer.start()
        with Store(idir / STORE_FILE, readonly=True) as r:
            derived = load_derived(idir, r)
        timer.join()
        assert len(derived["lexical"]) == w.count("chunks")
    assert rebuilt == []  # it waited for the writer's file


def test_reader_rebuilds_in_memory_when_the_writer_takes_too_long(repo):
    build_index(repo)
    idir = pipeline.default_index_dir(repo)
    with IndexLock(idir), _store(repo) as w:
        w.set_meta("generation", w.generation + 1)
        with Store(idir / STORE_FILE, readonly=True) as r:
            derived = load_derived(idir, r, wait_s=0.2)
            assert len(derived["lexical"]) == r.count("chunks")
        assert w.get_meta("gen.lexical") != str(w.generation)  # not persisted under a writer's lock


def test_missing_derived_file_is_rebuilt(repo):
    build_index(repo)
    idir = pipeline.default_index_dir(repo)
    shutil.rmtree(idir / "lexical")
    check_consistent(idir)
    assert (idir / "lexical" / "manifest.json").exists()


def test_store_readers_see_the_last_commit_while_the_writer_holds_the_lock(repo):
    build_index(repo)
    idir = pipeline.default_index_dir(repo)
    with IndexLock(idir), Store(idir / STORE_FILE, readonly=True) as reader:
        assert reader.count("files") == 5
        assert len(load_derived(idir, reader)["lexical"]) == reader.count("chunks")


def test_old_store_without_schema_is_migrated(repo):
    idir = pipeline.default_index_dir(repo)
    idir.mkdir()
    sqlite3.connect(idir / STORE_FILE).close()  # version 0
    build_index(repo)
    check_consistent(idir)


# -- with encoders -----------------------------------------------------------------------------


@pytest.fixture
def model_repo(tmp_path):
    """Smaller than `repo`: the tiny models still take a while to encode on 2 busy cores."""
    return make_repo(tmp_path / "repo", n_files=3, n_functions=2, lines=5)


def _n_encoded(encoders):
    return len(encoders.dense.texts) + len(encoders.multi.texts)


def test_first_build_encodes_every_chunk_and_file_once(model_repo, counting):
    summary = build_index(model_repo, encoders=counting)
    n_chunks = summary.chunks_total
    assert summary.chunks_encoded == _n_encoded(counting)
    # Dense: one per distinct chunk text plus one per file; ColBERT: one per distinct chunk text.
    assert len(counting.multi.texts) <= n_chunks and len(counting.dense.texts) <= n_chunks + 4
    assert summary.tokens_encoded > 0
    assert set(summary.models) == {"dense", "colbert"}
    derived = check_consistent(pipeline.default_index_dir(model_repo))
    assert set(derived) == {"lexical", "dense_chunks", "dense_files", "plaid"}
    assert len(derived["dense_files"]) == 4


def test_edit_one_function_reencodes_exactly_its_chunk(model_repo, counting):
    build_index(model_repo, encoders=counting)
    counting.dense.texts.clear(), counting.multi.texts.clear()
    src = (model_repo / "pkg/mod1.py").read_text()
    # One line of one function changes, whatever the tokenizer does to chunk boundaries.
    src = src.replace("    value_3 = mod1_fn1_helper(3)", "    changed_0 = mod1_fn1_helper(3)")
    (model_repo / "pkg/mod1.py").write_text(src)
    summary = build_index(model_repo, encoders=counting)
    assert summary.files_indexed == 1
    assert len(counting.multi.texts) == 1 and "changed_0" in counting.multi.texts[0]
    # Dense: the chunk, and the file-level vector of the edited file.
    assert len(counting.dense.texts) == 2
    assert sum("changed_0" in t for t in counting.dense.texts) == 2
    assert summary.chunks_encoded == 3
    check_consistent(pipeline.default_index_dir(model_repo))


def test_rename_encodes_nothing(model_repo, counting):
    # Chunk budgets include the header (the path), so a file whose chunks sit right at the
    # budget may split differently under a longer name; this one is far below it.
    (model_repo / "pkg/small.py").write_text(function_source("small_fn", lines=2))
    build_index(model_repo, encoders=counting)
    counting.dense.texts.clear(), counting.multi.texts.clear()
    (model_repo / "pkg/sub").mkdir()
    (model_repo / "pkg/small.py").rename(model_repo / "pkg/sub/renamed_module.py")
    summary = build_index(model_repo, encoders=counting)
    assert (summary.files_renamed, summary.files_removed, summary.files_indexed) == (1, 1, 1)
    assert summary.chunks_encoded == 0 and _n_encoded(counting) == 0
    derived = check_consistent(pipeline.default_index_dir(model_repo))
    ids, _ = derived["lexical"].search(["renamed_module small_fn"], k=1)[0]
    with _store(model_repo) as s:
        assert s.chunk_records(ids.tolist())[0].chunk.path == "pkg/sub/renamed_module.py"


def test_unchanged_rerun_with_models_encodes_nothing(model_repo, counting):
    build_index(model_repo, encoders=counting)
    summary = build_index(model_repo, encoders=counting)
    assert (summary.files_read, summary.chunks_encoded) == (0, 0)


def test_deleted_file_leaves_the_vector_indexes(model_repo, counting):
    build_index(model_repo, encoders=counting)
    with _store(model_repo) as s:
        fid = {v: k for k, v in s.file_paths().items()}["pkg/mod0.py"]
        gone = set(s.file_chunk_ids(fid))
    (model_repo / "pkg/mod0.py").unlink()
    build_index(model_repo, encoders=counting)
    derived = check_consistent(pipeline.default_index_dir(model_repo))
    for name in ("lexical", "dense_chunks", "plaid"):
        assert not gone & index_ids(derived[name]), name
    assert fid not in index_ids(derived["dense_files"])


def test_file_centroids_of_a_short_context_model_follow_each_run_by_its_delta(model_repo, counting, monkeypatch):
    """A model that reads fewer than FILE_VECTOR_MIN_TOKENS tokens gets each file's mean chunk
    vector kept as an index when the index is written (the searcher then reads no chunk
    vector for them); each later run updates the files it changed, removed or added."""
    monkeypatch.setattr(registry, "FILE_VECTOR_MIN_TOKENS", 10**6)  # the tiny model counts as short
    build_index(model_repo, encoders=counting)
    idir = pipeline.default_index_dir(model_repo)
    assert "file_centroids" in check_consistent(idir)
    real, rebuilt = registry._rebuild_index, []
    monkeypatch.setattr(registry, "_rebuild_index", lambda n, s, *a, **kw: rebuilt.append(n) or real(n, s, *a, **kw))
    src = (model_repo / "pkg/mod1.py").read_text()
    (model_repo / "pkg/mod1.py").write_text(src.replace("value_3 = mod1_fn1_helper(3)", "changed_0 = other(3)"))
    (model_repo / "pkg/mod0.py").unlink()
    (model_repo / "pkg/new.py").write_text(module_source("new_mod", 2, 4))
    build_index(model_repo, encoders=counting)
    assert rebuilt == []  # every index updated by the run's delta
    derived = check_consistent(idir)
    with _store(model_repo) as s:
        assert len(derived["file_centroids"]) == s.count("files")


def test_opening_counts_no_chunk_vector_until_the_store_gains_one_the_index_lacks(model_repo, counting, monkeypatch):
    """A searcher's open checks each vector index against the store's count of vectors, a
    join over every chunk (seconds at 600k chunks): skipped while the store's vectors are
    as they were when the index was saved, done (and the drift healed) once they are not,
    as after a run killed between committing vectors and writing its indexes."""
    from codesearch.indexes.dense import DenseIndex
    from codesearch.store.vectors import VectorCache

    build_index(model_repo, encoders=counting)
    idir = pipeline.default_index_dir(model_repo)
    counted = []
    real = VectorCache.count_with_vectors
    monkeypatch.setattr(VectorCache, "count_with_vectors", lambda self, kind: counted.append(kind) or real(self, kind))
    with _store(model_repo) as s:
        n = len(load_derived(idir, s)["dense_chunks"])
    assert counted == []
    # The dense index as a run killed before its publication leaves it: one vector short of
    # the store, which committed that vector after the index was written.
    index = DenseIndex.load(idir / "dense_chunks")
    missing = int(index.ids()[0])
    index.remove([missing])
    index.save(idir / "dense_chunks")
    with _store(model_repo) as s:
        (h,) = s.hashes_of_chunks([missing]).values()
        _, (vector,) = s.vectors_for([missing], "dense")
        s.put_vectors(s.models()["dense"].identity, "dense", [(h, vector)])
        derived = load_derived(idir, s)
    assert "dense" in counted and len(derived["dense_chunks"]) == n and missing in derived["dense_chunks"].ids()


def test_a_damaged_vector_index_is_rebuilt_with_a_one_line_notice(model_repo, counting, caplog):
    build_index(model_repo, encoders=counting)
    idir = pipeline.default_index_dir(model_repo)
    (idir / "dense_chunks" / "manifest.json").write_bytes(b"{not json")
    with caplog.at_level("WARNING", logger="codesearch.indexes.registry"):
        check_consistent(idir)
    (notice,) = [r.getMessage() for r in caplog.records]
    assert "dense_chunks" in notice and "rebuilding" in notice and "\n" not in notice
    caplog.clear()
    check_consistent(idir)  # the rebuilt index was saved: the next open says nothing
    assert caplog.records == []


def test_vector_indexes_of_the_format_before_folders_open_as_they_are_and_the_next_run_replaces_them(
    model_repo, counting, monkeypatch
):
    """An index whose dense files are the one-file FAISS format (``dense_chunks.faiss``) and
    whose PLAID index is one ``index.npz`` opens without a rebuild; the next run writes the
    folders and removes the old files."""
    import json

    import faiss
    import numpy as np

    from codesearch.indexes.plaid import PlaidIndex

    build_index(model_repo, encoders=counting)
    idir = pipeline.default_index_dir(model_repo)
    for name in ("dense_chunks", "dense_files"):  # write each as the code before folders did
        ids, vectors = registry._load_index(name, idir / name)._all_vectors()
        old = faiss.IndexIDMap2(faiss.IndexFlatIP(vectors.shape[1]))
        old.add_with_ids(vectors, ids)
        payload = faiss.serialize_index(old).tobytes()
        head = json.dumps({"format": 1, "dim": vectors.shape[1], "kind": "exact", "count": len(ids),
                           "exact_threshold": 50_000, "nlist": None, "nprobe": None, "seed": 0, "trained_on": 0,
                           "payload_bytes": len(payload), "crc32": __import__("zlib").crc32(payload)}).encode()
        (idir / f"{name}.faiss").write_bytes(b"CSDENSE\n" + len(head).to_bytes(4, "little") + head + payload)
        shutil.rmtree(idir / name)
    plaid = PlaidIndex.load(idir / "plaid")
    vectors = np.asarray(plaid._vectors, dtype=np.float16)
    manifest = {"format": 1, "kind": "exact", "dim": plaid.dim, "n_docs": len(plaid._ids), "n_tokens": len(vectors),
                "shapes": {"ids": [len(plaid._ids)], "doclens": [len(plaid._ids)], "vectors": list(vectors.shape)},
                "params": plaid._params(), "build_error": 0.0, "added_error_sum": 0.0, "added_tokens": 0}
    shutil.rmtree(idir / "plaid")
    (idir / "plaid").mkdir()
    np.savez(idir / "plaid" / "index.npz", ids=plaid._ids, doclens=plaid._doclens, vectors=vectors,
             manifest=np.frombuffer(json.dumps(manifest).encode(), np.uint8))
    real, rebuilt = registry._rebuild_index, []
    monkeypatch.setattr(registry, "_rebuild_index", lambda n, s, *a, **kw: rebuilt.append(n) or real(n, s, *a, **kw))
    check_consistent(idir)
    assert rebuilt == []
    (model_repo / "pkg/mod0.py").unlink()
    build_index(model_repo, encoders=counting)
    check_consistent(idir)
    assert rebuilt == []
    assert not (idir / "dense_chunks.faiss").exists() and not (idir / "dense_files.faiss").exists()
    assert (idir / "dense_chunks" / "manifest.json").is_file() and not (idir / "plaid" / "index.npz").exists()


def test_another_model_is_a_mismatch(model_repo, counting, tmp_path_factory):
    from fixtures import models

    build_index(model_repo, encoders=counting)
    import codesearch.encoder as enc

    other = enc.load(str(models.make_single_vector(tmp_path_factory.mktemp("other_sv"), seed=7)))
    with pytest.raises(ModelMismatchError, match=r"built with dense model .* run 'codesearch index --rebuild'"):
        build_index(model_repo, encoders=Encoders(dense=other))
    # Refused before touching anything: the index is still the first model's.
    with _store(model_repo) as s:
        assert s.models()["dense"].identity == counting.dense.identity
    # --rebuild switches models: the ColBERT index of the old run goes, since this run has none.
    summary = build_index(model_repo, encoders=Encoders(dense=other), rebuild=True)
    assert summary.models == {"dense": other.name}
    idir = pipeline.default_index_dir(model_repo)
    assert not (idir / "plaid").exists()
    check_consistent(idir)
    with _store(model_repo) as s:
        assert {m for (m,) in s.conn.execute("SELECT DISTINCT model FROM vectors")} == {other.identity}


def test_lexical_only_index_gains_vectors_on_a_later_run(model_repo, counting):
    build_index(model_repo)
    summary = build_index(model_repo, encoders=counting)
    assert summary.chunks_encoded > 0
    check_consistent(pipeline.default_index_dir(model_repo))


def test_offline_run_keeps_models_and_a_later_run_fills_the_gaps(model_repo, counting):
    build_index(model_repo, encoders=counting)
    (model_repo / "pkg/extra.py").write_text(module_source("extra", 2, lines=5))
    summary = build_index(model_repo)  # the model is unavailable this time
    assert summary.files_indexed == 1  # the other files keep their model-tokenized chunks
    assert any("no dense vectors" in n.lower() or "no dense encoder" in n.lower() for n in summary.notices)
    idir = pipeline.default_index_dir(model_repo)
    check_consistent(idir, complete=False)
    counting.dense.texts.clear(), counting.multi.texts.clear()
    summary = build_index(model_repo, encoders=counting)
    assert summary.chunks_encoded > 0 and all("extra" in t for t in counting.multi.texts)
    check_consistent(idir)


# -- resolving encoders ----------------------------------------------------------------------


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """An empty hub cache and no network: the default models cannot be had."""
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_hub_cache"))


def test_unavailable_default_models_degrade_to_lexical_only_with_a_notice(offline_hub):
    encoders, notices = resolve_encoders(device="cpu")
    assert encoders.dense is None and encoders.multi is None
    # On a CPU the dense default is off (said once), and the ColBERT default is missing.
    assert len(notices) == 2 and notices[0].startswith("No dense model by default on a CPU")
    assert "not cached and the hub is unreachable; indexed lexical-only" in notices[1]
    assert "Run 'codesearch index' again online" in notices[1]


def test_the_fix_for_a_missing_default_names_the_option_that_picks_that_model(offline_hub, single_vector_dir):
    # Regression: with --model MINILM, the missing ColBERT default said "pass --model PATH"
    from codesearch.errors import ModelUnavailableError

    encoders, notices = resolve_encoders(str(single_vector_dir), device="cpu")
    assert encoders.dense is not None and encoders.multi is None
    (notice,) = notices
    assert "indexed without its vectors" in notice and "(or pass --multi-model PATH)" in notice
    assert "--model PATH" not in notice.replace("--multi-model PATH", "")
    with pytest.raises(ModelUnavailableError) as raised:
        resolve_encoders(None, "some-org/not-cached-colbert")
    message = str(raised.value)
    assert "pass --multi-model PATH" in message and "--multi-model none" in message
    assert "--model PATH" not in message.replace("--multi-model PATH", "")


def test_on_a_cpu_the_dense_default_is_off_but_not_recorded_as_switched_off(offline_hub, repo):
    from codesearch.indexing.encoders import DISABLED_KEY

    encoders, _ = resolve_encoders(device="cpu")
    assert encoders.disabled == ()  # a later GPU run, or --model, adds it
    build_index(repo, encoders=encoders)
    with Store(repo / ".codesearch" / STORE_FILE) as s:
        assert s.get_meta(DISABLED_KEY) == "[]"


def test_an_explicit_model_that_cannot_be_had_raises(offline_hub):
    from codesearch.errors import ModelUnavailableError

    with pytest.raises(ModelUnavailableError, match="some-org/not-cached"):
        resolve_encoders("some-org/not-cached", None)


def test_a_colbert_checkpoint_as_dense_model_is_refused(colbert_dir):
    from codesearch.errors import ModelError

    with pytest.raises(ModelError, match="not a single-vector model"):
        resolve_encoders(str(colbert_dir), None)


def test_default_reuses_the_models_the_index_records(offline_hub, single_vector_dir):
    s = Store(":memory:")
    s.set_model("dense", str(single_vector_dir), "whatever@1", 64)
    encoders, notices = resolve_encoders(multi_model=None, store=s)
    assert encoders.dense is not None and encoders.dense.name == str(single_vector_dir)
    assert encoders.multi is None and notices == []


def test_a_model_switched_off_stays_off_without_a_notice(offline_hub, repo, single_vector_dir):
    # `codesearch index --multi-model none --model X`, then a plain `codesearch index`: the
    # ColBERT model was switched off on purpose, so it is not reported as unavailable.
    encoders, notices = resolve_encoders(str(single_vector_dir), None)
    assert encoders.disabled == ("colbert",) and notices == []
    build_index(repo, encoders=encoders)
    with _store(repo) as s:
        again, notices = resolve_encoders(store=s)
    assert again.dense is not None and again.multi is None and notices == []
    # Naming a model again turns the role back on (it is then loaded, or refused offline).
    from codesearch.errors import ModelUnavailableError

    with _store(repo) as s, pytest.raises(ModelUnavailableError):
        resolve_encoders(multi_model="some-org/not-cached", store=s)


def test_a_gpu_encoder_gets_batches_its_size_and_a_cpu_one_keeps_small_commits():
    from types import SimpleNamespace

    from codesearch.indexing.encode import ENCODE_BATCH, ENCODE_BATCH_CHARS, _batch_size

    # What the Encoder protocol says of a CPU and a GPU encoder (its device is its own business).
    assert _batch_size(SimpleNamespace(offloaded=False, batch_tokens=16384)) == (ENCODE_BATCH, ENCODE_BATCH_CHARS)
    texts, chars = _batch_size(SimpleNamespace(offloaded=True, batch_tokens=262144))
    assert texts == 4096 and chars == 4 * 262144


def test_the_summary_says_how_long_each_stage_took(repo):
    summary = build_index(repo)
    assert set(summary.stage_seconds) == {"walk", "chunk", "write", "sync", "encode"}
    assert all(v >= 0 for v in summary.stage_seconds.values())


def test_a_damaged_vectors_segment_asks_for_a_rebuild_which_reencodes_only_that_text(model_repo, counting, monkeypatch):
    """The ColBERT arrays live in segment files beside the store. A damaged one is an error
    that names --rebuild; the rebuild drops the arrays that fail their checksum and encodes
    just those texts again (the rest come from the cache). (With the user's vector cache on,
    that text comes from there: tests/indexing/test_vector_cache.py.)"""
    monkeypatch.setenv("CODESEARCH_CACHE_SIZE", "0")
    build_index(model_repo, encoders=counting)
    idir = pipeline.default_index_dir(model_repo)
    with _store(model_repo) as s:
        off = s.conn.execute("SELECT off FROM vectors WHERE seg IS NOT NULL ORDER BY off LIMIT 1").fetchone()[0]
    (segment,) = (idir / (STORE_FILE + ".vectors")).iterdir()
    with open(segment, "r+b") as fh:
        fh.seek(off + 1)
        byte = fh.read(1)
        fh.seek(off + 1)
        fh.write(bytes([byte[0] ^ 0x10]))
    shutil.rmtree(idir / "plaid")  # a searcher now rebuilds PLAID from the cache, and reads the damage
    with Store(idir / STORE_FILE, readonly=True) as s, pytest.raises(IndexCorruptError, match="--rebuild"):
        load_derived(idir, s)
    counting.dense.texts.clear(), counting.multi.texts.clear()
    build_index(model_repo, encoders=counting, rebuild=True)
    assert len(counting.multi.texts) == 1 and counting.dense.texts == []
    check_consistent(idir)
