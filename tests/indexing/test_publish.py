"""Publications of a run's vectors: the index files are made first and the generation is
committed with them, so a search never finds the store ahead of its indexes; for an encoder
that computes elsewhere (workers, a GPU) they run beside the encoding.

Real walk, tree-sitter, SQLite, FAISS and PLAID; the tiny random checkpoints encode. The
background path is forced with the local encoder (the Ray tests run it with real workers).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fixtures.pipeline_helpers import check_consistent, module_source

from codesearch.encoder.base import Encoders
from codesearch.indexes import registry
from codesearch.indexes.plaid import PlaidIndex
from codesearch.indexing import encode, publish
from codesearch.indexing.run import build_index
from codesearch.search.searcher import Searcher
from codesearch.store import Store
from codesearch.types import STORE_FILE, default_index_dir

PUBLISHER = "codesearch-publish"


@pytest.fixture(scope="module")
def encoders(single_vector_dir, colbert_dir):
    from codesearch.encoder import load

    return Encoders(dense=load(str(single_vector_dir)), multi=load(str(colbert_dir)))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    for i in range(5):
        (root / "pkg" / f"mod{i}.py").write_text(module_source(f"mod{i}", 2, 4))
    return root


@pytest.fixture
def publish_often(monkeypatch):
    monkeypatch.setattr(encode, "ENCODE_BATCH", 2)  # many committed batches
    monkeypatch.setattr(publish, "PUBLISH_EVERY_S", 0.0)


def _count_rebuilds(monkeypatch) -> list[str]:
    real, rebuilt = registry._rebuild_index, []
    monkeypatch.setattr(registry, "_rebuild_index", lambda n, s: rebuilt.append(n) or real(n, s))
    return rebuilt


def _in_background(monkeypatch, before) -> None:
    """Publications run in the background (as with workers), and ``before(path)`` runs in
    the publication's thread before each index file it saves."""
    monkeypatch.setattr(encode, "_encodes_elsewhere", lambda enc: True)
    real_save = registry._save_index

    def save(index, path):
        if threading.current_thread().name == PUBLISHER:
            before(path)
        real_save(index, path)

    monkeypatch.setattr(registry, "_save_index", save)


def _complete_on_disk(idir: Path, monkeypatch) -> None:
    """Every index file holds what the store has, as written (a search rebuilds nothing)."""
    rebuilt = _count_rebuilds(monkeypatch)
    check_consistent(idir, complete=True)
    assert rebuilt == []


def test_a_search_while_a_publication_writes_its_files_waits_for_nothing(repo, encoders, publish_often, monkeypatch):
    idir = default_index_dir(repo)
    real_save, seen = registry._save_index, []

    def save(index, path):
        real_save(index, path)
        if path.name != "plaid" or seen or not searchable:  # (the run's first sync makes them)
            return
        # Mid-publication: the dense files are new, PLAID's not yet. The store still says
        # the last generation, and each file that is newer holds only committed vectors,
        # so a search opens at once, on what is there, and rebuilds nothing.
        rebuilt = _count_rebuilds(monkeypatch)
        with Store(idir / STORE_FILE, readonly=True) as s:
            gen = s.generation
        t0 = time.monotonic()
        with Searcher(idir, encoders=encoders) as searcher:
            hits = searcher.search("mod1 function", 3, mode="hybrid").hits
            seen.append((gen, searcher._generation, time.monotonic() - t0, list(rebuilt), len(hits)))
        monkeypatch.setattr(registry, "_rebuild_index", real_rebuild)

    real_rebuild = registry._rebuild_index
    monkeypatch.setattr(registry, "_save_index", save)
    published: list[int] = []
    searchable: list[int] = []

    def progress(event):
        if event.stage in ("searchable", "published"):
            (searchable if event.stage == "searchable" else published).append(event.done)

    build_index(repo, encoders=encoders, progress=progress)
    assert published == sorted(set(published)) and len(published) > 1
    assert seen, "a publication wrote its PLAID file"
    for gen, searcher_gen, took, rebuilt, hits in seen:
        assert searcher_gen == gen and rebuilt == [] and hits > 0
        assert took < registry.load_derived.__kwdefaults__["wait_s"]  # it did not wait for the writer
    monkeypatch.setattr(registry, "_save_index", real_save)
    _complete_on_disk(idir, monkeypatch)


def test_a_background_publication_runs_beside_the_batches(repo, encoders, publish_often, monkeypatch):
    idir = default_index_dir(repo)
    in_flight = threading.Event()

    def slow(path):  # a publication that takes a while, as PLAID's does at scale
        in_flight.set()
        time.sleep(0.3)

    _in_background(monkeypatch, slow)
    events: list[tuple[str, str, bool]] = []

    def progress(event):
        events.append((event.stage, threading.current_thread().name, in_flight.is_set()))
        if event.stage == "published":
            in_flight.clear()
            # 'published' means committed and written: a searcher opened now is on it.
            with Store(idir / STORE_FILE, readonly=True) as s:
                assert s.generation == event.done
                assert {s.get_meta(f"gen.{n}") for n in registry.wanted(s)} == {str(event.done)}

    build_index(repo, encoders=encoders, progress=progress)
    stages = [stage for stage, _, _ in events]
    assert stages.count("published") > 1
    # Every event, the publication's own 'sync' ones too, is told on the writer's thread.
    assert {thread for _, thread, _ in events} == {threading.main_thread().name}
    # The writer committed batches while a publication was in flight.
    assert any(stage == "encode" and busy for stage, _, busy in events)
    monkeypatch.undo()
    _complete_on_disk(idir, monkeypatch)


def test_a_failed_background_publication_fails_the_run_and_loses_nothing(repo, encoders, publish_often, monkeypatch):
    idir = default_index_dir(repo)

    def full_disk(path):
        raise OSError(28, "No space left on device")

    _in_background(monkeypatch, full_disk)
    with pytest.raises(OSError, match="No space left"):
        build_index(repo, encoders=encoders)
    with Store(idir / STORE_FILE, readonly=True) as s:
        kept = s.count_with_vectors("dense")
    assert kept > 0  # the committed batches stay
    monkeypatch.undo()
    build_index(repo, encoders=encoders)  # the next run completes it
    _complete_on_disk(idir, monkeypatch)


def test_a_search_with_every_dense_vector_and_some_colbert_ones(repo, encoders):
    # The moment of a first index after the dense model's stream, during ColBERT's: a
    # hybrid search with a long-context dense model (file vectors) used to fail there with
    # KeyError 'file_vectors'.
    assert encoders.dense.max_length >= 1024  # file vectors rank files
    idir = default_index_dir(repo)
    build_index(repo, encoders=encoders)
    # The PLAID index as a publication mid-stream leaves it: half the documents the store has
    # vectors for (saved with the store's vectors mark, so an open takes it as it is).
    plaid = PlaidIndex.load(idir / "plaid")
    plaid.remove(plaid.ids()[::2])
    plaid.save(idir / "plaid")
    with Searcher(idir, encoders=encoders) as searcher:
        result = searcher.search("mod1 function", 3, mode="hybrid")
    assert result.hits and "colbert" in result.indexes_used
    assert any("semantic vectors for" in n and "% of chunks" in n for n in result.notices), result.notices


@pytest.mark.parametrize("background", [True, False])
def test_near_the_end_of_a_stream_beside_workers_publications_run_back_to_back(background):
    # The run waits for its last publication after the workers' last batch: when the rest of
    # the stream comes in before the next regular publication, that one would hold all of it
    # (25 s after 41 s of workers at 4M tokens under load). Back to back, it holds what came
    # in during the one before.
    pub = publish.Publisher(None, None, background=background)
    now = time.monotonic()
    pub.last, pub.began, pub.cost = now - 5, now - 6, 1.0  # the next regular one: in ~15 s
    pub.add("colbert", (f"h{i}" for i in range(600)))  # ~100 texts a second since it began
    assert not pub.due(left=5_000)  # ~50 s of stream left: the regular rhythm
    assert pub.due(left=500) == background  # ~5 s left: now, when it runs beside the batches
    assert not pub.due(left=0)  # nothing left: the run's last publication takes the rest
    pub.last = now - 60
    assert pub.due(left=5_000) and pub.due()  # the regular rhythm, either way


def test_a_dense_index_made_from_the_store_is_filled_from_its_reads(tmp_path, encoders, monkeypatch):
    """A sync that makes a dense index afresh fills it from reads of the store (the training
    sample, the lists' sizes, their entries: `DenseIndex.fill`), never every vector at once;
    it is the index one add of them all makes."""
    import numpy as np

    from codesearch.indexes.dense import DenseIndex

    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    for i in range(40):
        (root / "pkg" / f"mod{i}.py").write_text(module_source(f"mod{i}", 4, 4))
    build_index(root, encoders=Encoders(dense=encoders.dense))
    monkeypatch.setitem(DenseIndex.__init__.__kwdefaults__, "exact_threshold", 20)
    fills = []
    real_fill = DenseIndex.fill
    monkeypatch.setattr(DenseIndex, "fill",
                        lambda self, read, count: fills.append(count) or real_fill(self, read, count))
    with Store(default_index_dir(root) / STORE_FILE) as store:
        index = registry.rebuild_index("dense_chunks", store)
        found, arrays = zip(*store.iter_vectors("dense"))
    ids, vectors = np.concatenate(found), np.concatenate([np.concatenate(a) for a in arrays]).astype(np.float32)
    assert fills == [len(ids)] and len(ids) >= 78 and index.kind == "ivf" and len(index) == len(ids)
    one = DenseIndex(index.dim)
    one.add(ids, vectors)
    for (a_ids, a_scores), (b_ids, b_scores) in zip(index.search(vectors[:8], 5), one.search(vectors[:8], 5)):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_scores, b_scores)


def test_a_run_builds_the_dense_lists_in_the_index_folder_and_saves_them_as_built(
    tmp_path, encoders, publish_often, monkeypatch
):
    """The run's syncs and publications write a dense index's IVF lists (its builds, merges
    and retrains) into files of the index's own folder as they make them, and each save takes
    its file as it is: the folder ends holding its manifest's files, and the index searches as
    the one made in memory from the same store does."""
    import numpy as np

    from codesearch.indexes import dense
    from codesearch.indexes.dense import DenseIndex

    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    for i in range(40):
        (root / "pkg" / f"mod{i}.py").write_text(module_source(f"mod{i}", 4, 4))
    monkeypatch.setitem(DenseIndex.__init__.__kwdefaults__, "exact_threshold", 20)
    written = []
    real = dense._lists_in_file
    monkeypatch.setattr(dense, "_lists_in_file", lambda *a: written.append(a[-1].parent.name) or real(*a))
    build_index(root, encoders=Encoders(dense=encoders.dense))
    idir = default_index_dir(root)
    assert "dense_chunks" in written
    for name in ("dense_chunks", "dense_files"):
        folder = idir / registry.DERIVED[name].filename
        manifest = (folder / "manifest.json").read_text()
        assert all(p.name == "manifest.json" or p.name in manifest for p in folder.iterdir()), name
    with Store(idir / STORE_FILE) as store:
        saved = registry._load_index("dense_chunks", idir / registry.DERIVED["dense_chunks"].filename)
        made = registry.rebuild_index("dense_chunks", store)
        found, arrays = zip(*store.iter_vectors("dense"))
    queries = np.concatenate([np.concatenate(a) for a in arrays]).astype(np.float32)[:8]
    assert saved.kind == made.kind == "ivf" and len(saved) == len(made) == len(np.concatenate(found))
    for (a_ids, _), (b_ids, _) in zip(saved.search(queries, 5), made.search(queries, 5)):
        assert a_ids[0] == b_ids[0]
