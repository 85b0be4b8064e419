"""The user's vector cache under several real processes: 4 indexers of 4 copies at once lose
and corrupt nothing; a kill -9 at any moment leaves a cache the next run uses.

Each child runs ``build_index`` with the tiny checkpoints on its own copy, all sharing the
cache folder the test points ``CODESEARCH_CACHE_DIR`` at (the children inherit it). What
"nothing lost" means is checked the way a user would meet it: a further copy holding every
file of the others encodes nothing, and its vectors equal the ones the children made.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from fixtures.pipeline_helpers import CountingEncoder, check_consistent, make_repo, module_source

from codesearch.encoder.base import Encoders
from codesearch.indexes.plaid import PlaidIndex
from codesearch.indexing import cachedcodes
from codesearch.indexing import run as pipeline
from codesearch.indexing.run import build_index
from codesearch.store import Store
from codesearch.store.cache import UserCache
from codesearch.types import STORE_FILE

#: Tokens from which the children's (and the checks') multi-vector indexes are PLAID.
PLAID_AT = 200

CHILD = textwrap.dedent(
    """
    import sys
    from codesearch.indexing import commit, encode
    from codesearch.encoder.base import Encoders
    from codesearch.indexing.run import build_index

    repo, dense_dir, colbert_dir = sys.argv[1:4]
    from codesearch.indexes.plaid import PlaidIndex
    # PLAID from a few hundred tokens: every run trains or adopts a codec and keeps its codes
    PlaidIndex.__init__.__kwdefaults__.update(exact_threshold=PLAID_AT, max_centroids=16)
    encode.ENCODE_BATCH = 3  # many small batches, so many cache writes interleave
    commit.COMMIT_GROUP_S = 0.0
    import codesearch.encoder as E
    encoders = Encoders(E.load(dense_dir), E.load(colbert_dir))
    print("LOADED", flush=True)
    sys.stdin.readline()  # all children start indexing together

    def progress(ev):
        print(ev.stage, ev.done, ev.total, flush=True)

    build_index(repo, encoders=encoders, progress=progress)
    print("DONE", flush=True)
    """
).replace("PLAID_AT", str(PLAID_AT))


@pytest.fixture(autouse=True)
def plaid_at_once(monkeypatch):
    monkeypatch.setitem(PlaidIndex.__init__.__kwdefaults__, "exact_threshold", PLAID_AT)
    monkeypatch.setitem(PlaidIndex.__init__.__kwdefaults__, "max_centroids", 16)


@pytest.fixture(scope="module")
def encoder_dirs(single_vector_dir, colbert_dir):
    return str(single_vector_dir), str(colbert_dir)


@pytest.fixture(scope="module")
def tiny_encoders(encoder_dirs):
    from codesearch.encoder import load

    return load(encoder_dirs[0]), load(encoder_dirs[1])


def _start(repo, encoder_dirs) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(repo), *encoder_dirs],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout.readline().strip() == "LOADED"
    return proc


def _vectors(index_dir, kind: str) -> dict[str, np.ndarray]:
    with Store(index_dir / STORE_FILE) as s:
        model = s.model_identity(kind)
        hashes = [r[0] for r in s.conn.execute("SELECT text_hash FROM vectors WHERE kind = ?", (kind,))]
        return s.get_vectors(model, kind, hashes)


def _cache_is_sound() -> None:
    with UserCache.open() as cache:
        assert cache.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert cache.drop_damaged_vectors() == 0
        _codes_are_exact(cache)


def _codes_are_exact(cache: UserCache) -> int:
    """Every kept text's codes equal its cached vectors compressed by its codec now."""
    checked = 0
    for model, fingerprint in cache.conn.execute("SELECT model, codec FROM codecs").fetchall():
        codec = cachedcodes._codec_of(cache.get_codec(model, fingerprint))[0]
        assert codec.fingerprint == fingerprint
        vectors = {cachedcodes.array_key(v): v for v in cache.get_vectors(model, "colbert", [
            r[0] for r in cache.conn.execute("SELECT text_hash FROM vectors WHERE kind = 'colbert'")]).values()}
        keys = [r[0] for r in cache.conn.execute(
            "SELECT array_hash FROM codes WHERE model = ? AND codec = ?", (model, fingerprint))]
        assert set(keys) <= set(vectors)
        for h, (n, error, data) in cache.get_codes(model, fingerprint, keys).items():
            doc = cachedcodes.unpack_codes(codec, n, error, data)
            codes, packed = codec.compress(vectors[h])
            assert doc is not None
            assert doc.codes.tobytes() == codes.tobytes() and doc.packed.tobytes() == packed.tobytes()
            checked += 1
    return checked


def _plaid_is_exact(index_dir) -> None:
    """The index's codes are its stored vectors compressed by its codec (whatever their source)."""
    index = PlaidIndex.load(index_dir / "plaid")
    assert index.kind == "plaid"
    with Store(index_dir / STORE_FILE) as s:
        ids, arrays = s.vectors_for(index.ids().tolist(), "colbert")
    held = index.doc_codes(ids.tolist())
    for i, a in zip(ids.tolist(), arrays):
        codes, packed = index.codec.compress(np.asarray(a, np.float32))
        assert held[i][0].tobytes() == codes.tobytes() and held[i][1].tobytes() == packed.tobytes()


@pytest.mark.slow
def test_four_processes_indexing_four_copies_at_once_lose_nothing(tmp_path, encoder_dirs, tiny_encoders):
    base = make_repo(tmp_path / "base", n_files=5, n_functions=2, lines=5)
    copies = []
    for i in range(4):
        copy = shutil.copytree(base, tmp_path / f"wt{i}")
        (copy / f"pkg/only_{i}.py").write_text(module_source(f"only_in_copy_{i}", 3, lines=5))
        copies.append(copy)
    # The cache folder is empty: the four also race to make it.
    procs = [_start(copy, encoder_dirs) for copy in copies]
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        assert out.rstrip().endswith("DONE")
    _cache_is_sound()

    union = shutil.copytree(base, tmp_path / "union")
    for i in range(4):
        shutil.copy2(copies[i] / f"pkg/only_{i}.py", union / f"pkg/only_{i}.py")
    dense, multi = tiny_encoders
    counting = Encoders(dense=CountingEncoder(dense), multi=CountingEncoder(multi))
    summary = build_index(union, encoders=counting)
    assert counting.dense.texts == [] and counting.multi.texts == []  # every vector was kept
    assert summary.texts_reused > 0 and summary.chunks_encoded == 0
    check_consistent(pipeline.default_index_dir(union))
    _plaid_is_exact(pipeline.default_index_dir(union))
    with UserCache.open() as cache:
        assert _codes_are_exact(cache) > 0  # the four kept their codes, and none is damaged
    for kind in ("colbert", "dense", "file"):
        got = _vectors(pipeline.default_index_dir(union), kind)
        for copy in copies:
            theirs = _vectors(pipeline.default_index_dir(copy), kind)
            assert theirs.keys() <= got.keys()
            for h, v in theirs.items():
                np.testing.assert_array_equal(got[h], v)


# (stage, least `done`, seconds after it) at which the parent kills the child: its encode
# loop runs on meanwhile, so the kill lands anywhere in it (a cache write, a store commit,
# a publication), not at a progress callback.
KILL_POINTS = {"first batch": ("encode", 1, 0.0), "later": ("encode", 9, 0.0), "later + 0.3 s": ("encode", 9, 0.3)}


@pytest.mark.slow
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_kill_at_any_moment_leaves_a_cache_the_next_run_uses(point, tmp_path, encoder_dirs, tiny_encoders):
    repo = make_repo(tmp_path / "repo", n_files=6, n_functions=2, lines=5)
    stage, least, delay = KILL_POINTS[point]
    proc = _start(repo, encoder_dirs)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line.split())
            if seen[-1][:1] == [stage] and int(seen[-1][1]) >= least:
                time.sleep(delay)
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, f"the child finished before the kill point: {seen[-3:]}"
    _cache_is_sound()

    dense, multi = tiny_encoders
    counting = Encoders(dense=CountingEncoder(dense), multi=CountingEncoder(multi))
    build_index(repo, encoders=counting)  # resumes the killed index (taking what it kept in the cache)
    check_consistent(pipeline.default_index_dir(repo))
    # A second copy then finds every vector in the cache.
    counting.dense.texts.clear(), counting.multi.texts.clear()
    copy = shutil.copytree(repo, tmp_path / "copy", ignore=shutil.ignore_patterns(".codesearch"))
    summary = build_index(copy, encoders=counting)
    assert counting.dense.texts == [] and counting.multi.texts == [] and summary.chunks_encoded == 0
    check_consistent(pipeline.default_index_dir(copy))
    _plaid_is_exact(pipeline.default_index_dir(copy))
