"""kill -9 at different moments of a real indexer process leaves a usable, resumable index.

A subprocess runs ``build_index`` with the tiny checkpoints; its progress callback prints
each event and pauses briefly, and the test sends SIGKILL as soon as the chosen stage
shows up. Then the index must open, be consistent (every chunk has its vectors, every
derived index loads at the store's generation), and a re-run must finish with exactly
the chunks of a clean build, encoding only what the killed run had not cached.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures.pipeline_helpers import (
    check_consistent,
    chunk_set,
    function_source,
    make_repo,
    module_source,
)

from codesearch.encoder.base import Encoders
from codesearch.indexing import run as pipeline
from codesearch.indexing.run import build_index
from codesearch.store import Store
from codesearch.types import STORE_FILE

CHILD = textwrap.dedent(
    """
    import sys, time
    from codesearch.indexing import commit, encode
    from codesearch.encoder.base import Encoders
    from codesearch.indexing.run import build_index

    repo, dense_dir, colbert_dir, group_s = sys.argv[1:5]
    encode.ENCODE_BATCH = 3  # several committed batches even on a small repo
    commit.COMMIT_GROUP_S = float(group_s)  # 0: each batch commits alone, as on a CPU run of a real model
    import codesearch.encoder as E
    encoders = Encoders(E.load(dense_dir), E.load(colbert_dir))

    def progress(ev):
        print(ev.stage, ev.done, ev.total, flush=True)
        time.sleep(0.05)  # the parent's SIGKILL lands here, mid-stage

    build_index(repo, encoders=encoders, progress=progress)
    print("DONE", flush=True)
    """
)

# (stage, minimum `done`) at which to kill: right before the store transaction; after the
# first derived index was saved (lexical first: the files and chunks are committed and
# searchable, no vector encoded yet); after a few encoded batches (committed, some vectors).
# (A kill while chunking leaves the same state as one right before the transaction.)
# "encode, grouped": the tiny models encode a batch in milliseconds, so with the default
# COMMIT_GROUP_S their batches share commits and the kill lands after a group.
KILL_POINTS = {
    "encode": ("encode", 6),
    "encode, grouped": ("encode", 6, 1.0),
    "write": ("write", 0),
    "sync": ("sync", 1),
}


def _small_repo(root: Path) -> Path:
    return make_repo(root, n_files=5, n_functions=2, lines=5)


def _change(repo: Path) -> None:
    """The edits the killed run was indexing: one edit, one delete, two new files."""
    src = (repo / "pkg/mod0.py").read_text()
    (repo / "pkg/mod0.py").write_text(
        src.replace("    value_2 = mod0_fn1_helper(2)", "    edited = mod0_fn1_helper(2)")
    )
    (repo / "pkg/mod4.py").unlink()
    (repo / "pkg/new_a.py").write_text(module_source("new_a", 2, lines=5))
    (repo / "pkg/new_b.py").write_text(function_source("new_b_only", lines=3))


@pytest.fixture(scope="module")
def encoder_dirs(single_vector_dir, colbert_dir):
    enc = pytest.importorskip("codesearch.encoder")
    if not hasattr(enc, "load"):
        pytest.skip("codesearch.encoder.load is not there yet")
    return str(single_vector_dir), str(colbert_dir)


@pytest.fixture(scope="module")
def encoders(encoder_dirs):
    import codesearch.encoder as E

    return Encoders(E.load(encoder_dirs[0]), E.load(encoder_dirs[1]))


@pytest.fixture(scope="module")
def built_template(tmp_path_factory, encoders):
    """A repo indexed once (generation 1), copied by each test."""
    repo = _small_repo(tmp_path_factory.mktemp("template") / "repo")
    build_index(repo, encoders=encoders)
    return repo


@pytest.fixture(scope="module")
def expected_after_change(tmp_path_factory, built_template, encoders):
    """The chunk set of a clean, uninterrupted build of the changed repo."""
    repo = tmp_path_factory.mktemp("clean") / "repo"
    shutil.copytree(built_template, repo, ignore=shutil.ignore_patterns(".codesearch"))
    _change(repo)
    idir = repo.parent / "clean_index"
    build_index(repo, index_dir=idir, encoders=encoders)
    return chunk_set(idir)


def _run_and_kill(repo: Path, encoder_dirs, stage: str, min_done: int, group_s: float = 0.0) -> list[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(repo), *encoder_dirs, str(group_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line.strip())
            parts = line.split()
            if parts and parts[0] == stage and int(parts[1]) >= min_done:
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, f"the child finished before the kill point: {seen[-5:]}"
    return seen


def _encode_progress(seen: list[str]) -> tuple[int, int]:
    """(texts encoded and committed, texts to encode) at the child's last encode event."""
    last = next(x for x in reversed(seen) if x.startswith("encode")).split()
    return int(last[1]), int(last[2])


@pytest.mark.slow
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_kill_during_an_update_leaves_a_usable_index(
    point, tmp_path, built_template, encoder_dirs, encoders, expected_after_change
):
    repo = tmp_path / "repo"
    shutil.copytree(built_template, repo)  # copy2 keeps mtime_ns: the copy is up to date
    idir = pipeline.default_index_dir(repo)
    with Store(idir / STORE_FILE) as s:
        gen_before = s.generation
    _change(repo)

    seen = _run_and_kill(repo, encoder_dirs, *KILL_POINTS[point])

    # Nothing half-written: the store opens and agrees with every derived index; after the
    # commit it holds the new files, some of whose vectors are still to come.
    committed = point in ("sync", "encode", "encode, grouped")
    check_consistent(idir, complete=not committed)
    with Store(idir / STORE_FILE) as s:
        assert (s.generation > gen_before) == committed
        assert ("pkg/new_a.py" in s.files()) == committed

    summary = build_index(repo, encoders=encoders)
    check_consistent(idir)
    assert chunk_set(idir) == expected_after_change
    if point.startswith("encode"):
        # Resumed: exactly the texts whose batches the killed run had not committed (encoded
        # again, or taken from the user's vector cache, which gets each batch before the store).
        done, total = _encode_progress(seen)
        assert 0 < done < total
        assert summary.chunks_encoded + summary.texts_reused == total - done
    if committed:
        assert summary.files_indexed == 0  # resumed: nothing re-read or re-chunked


@pytest.mark.slow
def test_kill_during_the_first_build_resumes(tmp_path, encoder_dirs, encoders, expected_after_change):
    repo = _small_repo(tmp_path / "repo")
    _change(repo)
    seen = _run_and_kill(repo, encoder_dirs, *KILL_POINTS["encode"])
    idir = pipeline.default_index_dir(repo)
    with Store(idir / STORE_FILE) as s:
        # Lexical first: the files are in and searchable; the committed batches survive.
        assert s.count("files") == 7 and s.count("vectors") >= 6
    check_consistent(idir, complete=False)
    done, total = _encode_progress(seen)
    summary = build_index(repo, encoders=encoders)
    assert 0 < done < total and summary.files_indexed == 0
    assert summary.chunks_encoded + summary.texts_reused == total - done
    check_consistent(idir)
    assert chunk_set(idir) == expected_after_change
