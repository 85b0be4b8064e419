"""An index run reads, chunks and writes its changed files a batch at a time, inside one
transaction: the index equals the one a single batch makes, and a run stopped between
batches (Ctrl-C, or SIGKILL) leaves the previous index whole, which the next run completes
without chunking again what the stopped run had chunked."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures.pipeline_helpers import (
    check_consistent,
    chunk_set,
    count_reads,
    function_source,
    make_repo,
    module_source,
)

from codesearch.indexing import run as pipeline
from codesearch.indexing.chunking import parallel
from codesearch.indexing.run import build_index
from codesearch.search.searcher import Searcher
from codesearch.store import Store
from codesearch.types import STORE_FILE

QUERIES = ("helper value", "mod3_fn1", "fixture repository", "compute x")


def _repo(root: Path) -> Path:
    return make_repo(root, n_files=9, n_functions=3, lines=6)


def _change(repo: Path) -> None:
    """Edits, a delete and new files: the batches of the next run hold all three kinds."""
    for i in (0, 3, 7):
        path = repo / f"pkg/mod{i}.py"
        path.write_text(path.read_text().replace(f"mod{i}_fn1_helper(2)", "edited_helper(2)"))
    (repo / "pkg/mod5.py").unlink()
    for name in ("new_a", "new_b", "new_c"):
        (repo / f"pkg/{name}.py").write_text(module_source(name, 2, lines=4))
    (repo / "pkg/solo.py").write_text(function_source("solo_only", lines=3))


def _hits(index_dir: Path) -> list[list[tuple]]:
    with Searcher(index_dir) as s:
        return [[(h.path, h.start_line, h.end_line, round(h.score, 6)) for h in s.search(q, 5, mode="lexical").hits]
                for q in QUERIES]


def _generation(index_dir: Path) -> int:
    with Store(index_dir / STORE_FILE, readonly=True) as s:
        return s.generation


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(pipeline, "BATCH_FILES", 2)


def test_a_run_in_batches_makes_the_index_of_one_batch(tmp_path, monkeypatch):
    repo = _repo(tmp_path / "repo")
    one = tmp_path / "one"
    build_index(repo, index_dir=one)
    monkeypatch.setattr(pipeline, "BATCH_FILES", 2)
    events = []
    many = tmp_path / "many"
    build_index(repo, index_dir=many, progress=events.append)
    assert sum(1 for e in events if e.stage == "write" and 0 < e.done < e.total) >= 3  # several batches
    assert chunk_set(one) == chunk_set(many) and len(chunk_set(one)) > 9
    assert _hits(one) == _hits(many)
    check_consistent(many)
    # And an update in batches: the same as an update in one.
    _change(repo)
    monkeypatch.setattr(pipeline, "BATCH_FILES", 10_000)
    build_index(repo, index_dir=one)
    monkeypatch.setattr(pipeline, "BATCH_FILES", 2)
    build_index(repo, index_dir=many)
    assert chunk_set(one) == chunk_set(many)
    assert _hits(one) == _hits(many)
    check_consistent(many)


def test_a_batch_takes_at_most_its_bytes(tmp_path, monkeypatch):
    repo = _repo(tmp_path / "repo")
    size = max(p.stat().st_size for p in (repo / "pkg").iterdir())
    monkeypatch.setattr(pipeline, "BATCH_BYTES", 2 * size)  # two files at most, whatever the count
    from codesearch.indexing.commit import ChangeWriter

    written = []

    real = ChangeWriter.write

    def write(self, works):
        written.append(sum(len(w.text.encode()) for w in works))
        return real(self, works)

    monkeypatch.setattr(ChangeWriter, "write", write)
    build_index(repo)
    assert len(written) >= 5 and max(written) <= 2 * size


def _chunked_here(monkeypatch) -> list[str]:
    """The paths chunk_source is called for in this process (few files: no pool)."""
    called: list[str] = []
    real = parallel.chunk_source

    def counting(path, *args, **kwargs):
        called.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(parallel, "chunk_source", counting)
    return called


def test_ctrl_c_between_batches_keeps_the_previous_index_and_the_next_run_resumes(tmp_path, small_batches,
                                                                                  monkeypatch):
    repo = _repo(tmp_path / "repo")
    clean = tmp_path / "clean"
    idir = repo / ".codesearch"
    build_index(repo)
    before, gen = chunk_set(idir), _generation(idir)
    _change(repo)

    def stop_after_two_batches(event):
        if event.stage == "write" and event.done >= 4 and event.done < event.total:
            raise KeyboardInterrupt

    chunked = _chunked_here(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        build_index(repo, progress=stop_after_two_batches)
    stopped = set(chunked)
    assert len(stopped) >= 3  # batches were chunked, and written inside the transaction
    # Rolled back whole: the previous generation, every index at it, the lock free.
    assert chunk_set(idir) == before and _generation(idir) == gen
    check_consistent(idir)

    chunked.clear()
    summary = build_index(repo)
    build_index(repo, index_dir=clean)  # (after: its chunks go to the user's cache too)
    assert chunk_set(idir) == chunk_set(clean) and _generation(idir) == gen + 1
    assert summary.files_indexed == 7 and summary.files_removed == 1
    # The chunks the stopped run made came from the user's cache: those files were not chunked again.
    assert not stopped & set(chunked), stopped & set(chunked)
    check_consistent(idir)


CHILD = textwrap.dedent(
    """
    import sys, time
    from codesearch.indexing import run
    run.BATCH_FILES = 2

    def progress(ev):
        print(ev.stage, ev.done, ev.total, flush=True)
        time.sleep(0.05)  # the parent's SIGKILL lands here, mid-stage

    run.build_index(sys.argv[1], progress=progress)
    print("DONE", flush=True)
    """
)


def test_kill_between_batches_keeps_the_previous_index(tmp_path):
    repo = _repo(tmp_path / "repo")
    idir = repo / ".codesearch"
    build_index(repo)
    before, gen = chunk_set(idir), _generation(idir)
    _change(repo)
    clean = tmp_path / "clean"
    build_index(repo, index_dir=clean)

    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(repo)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line.strip())
            stage, done, total = (line.split() + ["0", "0"])[:3]
            if stage == "write" and 4 <= int(done) < int(total):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, f"the child finished before the kill point: {seen[-5:]}"

    assert chunk_set(idir) == before and _generation(idir) == gen
    check_consistent(idir)
    build_index(repo)
    assert chunk_set(idir) == chunk_set(clean) and _generation(idir) == gen + 1
    check_consistent(idir)


def test_the_encode_stage_reads_its_texts_a_batch_at_a_time(tmp_path, monkeypatch, single_vector_dir):
    """Texts to encode are read from the store (a chunk's) or the file (a whole file's) as
    the encoder takes each batch, never all at once; the vectors are those of a run that
    encodes in one batch."""
    import numpy as np

    import codesearch.encoder as E
    from codesearch.encoder.base import Encoders
    from codesearch.indexing import encode

    repo = _repo(tmp_path / "repo")
    enc = Encoders(dense=E.load(str(single_vector_dir)))
    one = tmp_path / "one"
    build_index(repo, index_dir=one, encoders=enc)

    monkeypatch.setenv("CODESEARCH_CACHE_DIR", str(tmp_path / "another_cache"))  # encoded again, not reused
    monkeypatch.setattr(encode, "ENCODE_BATCH", 3)
    monkeypatch.setattr(encode, "_REUSE_BATCH", 3)  # (the lookups in the user's cache, by part)
    read: list[int] = []
    real = encode._texts

    def texts(run, encoder, items):
        read.append(len(items))
        return real(run, encoder, items)

    monkeypatch.setattr(encode, "_texts", texts)
    many = tmp_path / "many"
    summary = build_index(repo, index_dir=many, encoders=enc)
    n_chunks = summary.chunks_total
    assert summary.chunks_encoded >= n_chunks and sum(read) >= n_chunks  # chunks and whole files
    assert max(read) <= 3, read

    def vectors(idir):
        with Store(idir / STORE_FILE, readonly=True) as s:
            recs = sorted(s.iter_chunk_records(), key=lambda r: (r.chunk.path, r.chunk.start_line))
            ids, arrays = s.vectors_for([r.id for r in recs], "dense")
            by_id = dict(zip(ids.tolist(), arrays))
            return np.stack([by_id[r.id] for r in recs])

    a, b = vectors(one).reshape(n_chunks, -1), vectors(many).reshape(n_chunks, -1)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.99, cos  # the same texts (batches pack them otherwise: bf16 rounds otherwise)
    check_consistent(many)


def test_an_incremental_run_opens_only_what_changed(tmp_path, monkeypatch):
    """A run after an edit looks at the edited file only: an unchanged file (same size and
    mtime as the store records) is neither sniffed by the walk nor read (a 114k-file
    repository: one open, not 114k of them, after each save the daemon's watcher sees)."""
    repo = _repo(tmp_path / "repo")
    build_index(repo)
    opened = count_reads(monkeypatch)
    path = repo / "pkg/mod2.py"
    path.write_text(path.read_text() + "\n\ndef added():\n    return 1\n")
    summary = build_index(repo)
    assert summary.files_indexed == 1 and summary.files_unchanged == 9
    assert sorted(set(opened)) == ["pkg/mod2.py"], opened
