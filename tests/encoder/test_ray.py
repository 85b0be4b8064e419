"""The encode stage on a real local Ray cluster (two CPU workers) against the local encoder.

One cluster and one pool of actors serve the whole module (starting a Ray worker with torch
costs seconds); the tests compare vectors and ids with a local run of the same tiny
checkpoints in float32, kill a worker process mid-run, kill the head of a cluster of another
process mid-run (the next run resumes), and check the one-line errors.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import sys
import time

import numpy as np
import pytest
from fixtures.sample_repo import write_sample_repo
from fixtures.vectors import assert_stored_close

from codesearch.errors import ClusterError, MissingDependencyError
from codesearch.indexing import encode
from codesearch.store import Store
from codesearch.types import STORE_FILE

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason='needs codesearch[ray]')

TEXTS = [
    "def retry_request(session, url, attempts=3):\n    for i in range(attempts):\n        return session.get(url)\n",
    "class HttpClient:\n    def __init__(self, base_url):\n        self.base_url = base_url\n",
    "SELECT id, name FROM users WHERE email = ? ORDER BY created_at DESC;",
    "fn main() { let v: Vec<u32> = (0..10).collect(); }\n" * 12,
    "x",
]


# -- without Ray ----------------------------------------------------------------------------


@pytest.fixture
def no_ray(monkeypatch):
    """Ray made unimportable for this test (a None entry in sys.modules fails the import)."""
    monkeypatch.setitem(sys.modules, "ray", None)


def test_missing_extra_is_a_one_line_error_naming_it(no_ray, tmp_path):
    from typer.testing import CliRunner

    from codesearch.api import CodeSearch
    from codesearch.cli.app import app

    repo = write_sample_repo(tmp_path / "repo")
    with pytest.raises(MissingDependencyError, match=r'pip install "codesearch-local\[ray\]"'):
        CodeSearch(repo, ray="auto")
    result = CliRunner().invoke(app, ["index", str(repo), "--ray", "--quiet"])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
    assert 'pip install "codesearch-local[ray]"' in result.stderr
    assert not (repo / ".codesearch").exists()  # failed before any work


# -- on a local cluster ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local cluster: 3 CPUs, two for the shared pool and one for a throwaway pool."""
    ray = pytest.importorskip("ray")
    import logging

    ray.init(
        num_cpus=3,
        include_dashboard=False,
        object_store_memory=96 * 2**20,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def pool(ray_cluster):
    from codesearch.encoder.ray import WorkerPool

    p = WorkerPool(workers=2)
    p.start()
    yield p
    p.close()


@pytest.fixture(scope="module")
def local_encoders(single_vector_dir, colbert_dir):
    from codesearch import encoder

    return {
        "dense": encoder.load(str(single_vector_dir), device="cpu", dtype="float32"),
        "colbert": encoder.load(str(colbert_dir), device="cpu", dtype="float32"),
    }


def _assert_same(out, ref):
    # Same checkpoint, same dtype; only the thread count differs (1 per actor), which may
    # reorder a float reduction: equal up to the last bits.
    if isinstance(ref, list):
        assert len(out) == len(ref)
        for a, b in zip(out, ref):
            assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    else:
        assert out.dtype == ref.dtype == np.float32 and out.shape == ref.shape
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


@needs_ray
@pytest.mark.parametrize("role", ["dense", "colbert"])
def test_encode_batches_equal_local_in_input_order(pool, local_encoders, role):
    from codesearch.encoder.ray import RayEncoder

    local = local_encoders[role]
    enc = RayEncoder(local, pool)
    assert (enc.name, enc.identity, enc.dim, enc.max_length, enc.multivector) == (
        local.name, local.identity, local.dim, local.max_length, local.multivector,
    )
    batches = [TEXTS[i % 5: i % 5 + 1 + i % 3] for i in range(12)] + [[]]  # uneven, one empty
    consumed = []

    def lazily():
        for b in batches:
            consumed.append(len(b))
            yield b

    outs = []
    for out in enc.encode_batches(lazily()):
        # bounded: never more than 2 * depth * workers batches ahead of the consumer
        assert len(consumed) - len(outs) <= 2 * pool.depth * 2 + 1
        outs.append(out)
    assert len(outs) == len(batches)
    for b, out in zip(batches, outs):
        _assert_same(out, local.encode(b))
    _assert_same(enc.encode(TEXTS), local.encode(TEXTS))
    # a batch just encoded: the worker's counts, capped at max_length (all the pipeline reads)
    assert enc.count_tokens(TEXTS) == [min(n, local.max_length) for n in local.count_tokens(TEXTS)]
    stats = pool.progress()
    assert stats.tokens > 0 and len(stats.workers) == 2
    assert all(w.batches > 0 and w.tokens_per_s > 0 for w in stats.workers)  # both did work
    assert stats.describe().startswith("ray 2 workers: ")


@needs_ray
def test_the_driver_does_not_tokenize_what_the_workers_encode(pool, local_encoders, monkeypatch):
    """The workers return each text's token count with its vectors: the driver tokenizing
    every text again bounded a cluster at one core's tokenizer."""
    from codesearch.encoder.ray import RayEncoder

    local = local_encoders["colbert"]
    real = local.count_tokens
    calls = []
    monkeypatch.setattr(local, "count_tokens", lambda texts: calls.append(len(texts)) or real(texts))
    enc = RayEncoder(local, pool)
    batches = [TEXTS[:2], TEXTS[2:], ["def long():\n    pass\n" * 400]]  # the last one over max_length
    assert len(list(enc.encode_batches(batches))) == 3
    counts = [enc.count_tokens(b) for b in batches]  # what the pipeline asks next: a lookup
    assert calls == []
    assert counts == [[min(n, local.max_length) for n in real(b)] for b in batches]
    assert counts[2] == [local.max_length]
    assert pool.progress().tokens >= sum(map(sum, counts))


def _index(repo, index_dir, single_vector_dir, colbert_dir, progress=None, **kw):
    """An API index run in float32 (the actors take the local encoder's dtype), so that
    local and Ray vectors differ at most in the last float32 bits, never in a bf16 rounding."""
    from codesearch.api import CodeSearch
    from codesearch.encoder import runtime

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runtime, "cpu_has_fast_bf16", lambda: False)
        with CodeSearch(repo, index_dir=index_dir, model=str(single_vector_dir), multi_model=str(colbert_dir),
                        device="cpu", **kw) as cs:
            summary = cs.index(progress=progress)
            return summary, cs.status()


def _contents(index_dir):
    with Store(index_dir / STORE_FILE) as s:
        chunks = [(r.id, c.path, c.start_line, c.end_line, c.text) for r in s.iter_chunk_records() for c in [r.chunk]]
        vectors = {}
        for kind in ("dense", "file", "colbert"):
            for ids, arrays in s.iter_vectors(kind):
                for i, a in zip(ids.tolist(), arrays):
                    vectors[(kind, i)] = a
    return chunks, vectors


@pytest.fixture(scope="module")
def local_index(tmp_path_factory, single_vector_dir, colbert_dir):
    root = tmp_path_factory.mktemp("local")
    repo = write_sample_repo(root / "repo")
    _summary, status = _index(repo, root / "index", single_vector_dir, colbert_dir)
    assert status.embedded == {"dense": "local cpu (float32)", "multi": "local cpu (float32)"}
    return repo, _contents(root / "index")


def _assert_same_index(ray_dir, reference):
    chunks, vectors = _contents(ray_dir)
    ref_chunks, ref_vectors = reference
    assert chunks == ref_chunks  # same ids, same order, same text
    assert vectors.keys() == ref_vectors.keys()
    for key, v in vectors.items():
        assert_stored_close(v, ref_vectors[key], err_msg=str(key))


@needs_ray
def test_index_on_ray_equals_local_run(pool, local_index, tmp_path, single_vector_dir, colbert_dir):
    repo = local_index[0]
    events = []
    summary, status = _index(repo, tmp_path / "index", single_vector_dir, colbert_dir, ray=pool,
                             progress=events.append)
    _assert_same_index(tmp_path / "index", local_index[1])
    assert summary.chunks_encoded > 0
    assert status.embedded == {role: "ray local: 2 cpu workers (float32)" for role in ("dense", "multi")}
    encode = [e for e in events if e.stage == "encode"]
    assert encode and encode[-1].message.startswith("ray 2 workers: ")  # per-worker rates
    # an incremental run with nothing to embed keeps how the vectors were made
    summary, status = _index(repo, tmp_path / "index", single_vector_dir, colbert_dir, ray=pool)
    assert summary.chunks_encoded == 0 and status.embedded["dense"].startswith("ray ")


@needs_ray
def test_worker_killed_mid_run_is_retried_and_nothing_is_lost(
    pool, local_index, tmp_path, monkeypatch, single_vector_dir, colbert_dir
):
    monkeypatch.setattr(encode, "ENCODE_BATCH", 2)  # many batches, so the kill lands mid-run
    # Both runs encode every text: the reference's would otherwise reach the Ray run through
    # the user's vector cache, and no worker would have work to be killed in.
    monkeypatch.setenv("CODESEARCH_CACHE_SIZE", "0")
    # The reference is a local run with the same batches: the encoder's last float bits
    # depend on which texts share a forward pass (up to 1e-4 on a tiny random model).
    _index(local_index[0], tmp_path / "local", single_vector_dir, colbert_dir)
    before = pool.worker_pids()
    killed = []

    def kill_once(event):
        if event.stage == "encode" and not killed:
            killed.append(before[0])
            os.kill(before[0], signal.SIGKILL)

    summary, _ = _index(local_index[0], tmp_path / "index", single_vector_dir, colbert_dir, ray=pool,
                        progress=kill_once)
    assert killed and summary.chunks_encoded > 2 * len(before) * pool.depth  # killed with work left
    after = pool.worker_pids()
    assert before[0] not in after and len(after) == 2  # the actor came back as a new process
    _assert_same_index(tmp_path / "index", _contents(tmp_path / "local"))  # nothing lost or duplicated


@needs_ray
def test_every_worker_gone_is_a_one_line_cluster_error(ray_cluster, local_encoders):
    from codesearch.encoder.ray import RayEncoder, WorkerPool

    doomed = WorkerPool(workers=1, max_restarts=0)
    enc = RayEncoder(local_encoders["dense"], doomed)
    try:
        doomed.start()
        (pid,) = doomed.worker_pids()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ClusterError) as err:
            list(enc.encode_batches([TEXTS[:2], TEXTS[2:]]))
        assert "\n" not in str(err.value) and "run 'codesearch index' again to resume" in str(err.value)
    finally:
        doomed.close()


@needs_ray
def test_an_address_nobody_answers_is_a_one_line_error_at_once(tmp_path, colbert_dir):
    """`index --ray-address` at an address nobody answers: ray.init retried it for minutes,
    printing a warning every few seconds; now one line, at once. (A fresh process: this one
    is connected to the test cluster, which connect() would reuse.)"""
    import socket
    import subprocess

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = write_sample_repo(tmp_path / "repo")
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", "from codesearch.cli import main; main()", "index", str(repo),
         "--ray-address", f"127.0.0.1:{port}", "--model", "none", "--multi-model", str(colbert_dir),
         "--device", "cpu", "-q"],
        capture_output=True, text=True, timeout=300,
    )
    assert time.monotonic() - t0 < 60
    assert done.returncode != 0
    err = done.stderr.strip()
    assert "\n" not in err and f"127.0.0.1:{port}" in err and "--ray alone" in err, err


# The run of the test below, in a process of its own: one text per batch, each batch slowed
# on its way back, and the cluster's head (the GCS, a child of the driver on a cluster started
# here) killed when the first batch returns, so that the actors go on answering for a while
# with the head gone (as they do) and the head watch, made quick here, has to end the run.
_LOSE_THE_HEAD = r"""
import os, signal, sys, time
from codesearch.encoder.ray import backend, cluster
from codesearch.indexing import encode
from codesearch.encoder import runtime
from codesearch.cli import main

encode.ENCODE_BATCH = 1
cluster.HEAD_CHECK_S, cluster.HEAD_LOST_AFTER_S = 0.2, 1.0
runtime.cpu_has_fast_bf16 = lambda: False  # float32, like the reference
collect, killed = backend.RayEncoder._collect, []

def gcs_pids():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
            argv0 = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0]
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == os.getpid() and argv0.endswith(b"gcs_server"):
            yield int(pid)

def slowly(self, ray, task):
    if not killed:
        killed.extend(gcs_pids())
        assert killed, "no gcs_server among this process's children"
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    return collect(self, ray, task)

backend.RayEncoder._collect = slowly
cluster._local_head = lambda: None  # a cluster of its own, even beside a `ray start`ed one
sys.argv = ["codesearch", *sys.argv[1:]]
main()
"""


@needs_ray
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the GCS process in /proc")
def test_a_lost_head_ends_the_run_in_one_line_and_the_next_run_resumes(
    local_index, tmp_path, monkeypatch, single_vector_dir, colbert_dir
):
    """The cluster's head killed mid-run: a one-line ClusterError (Ray's own driver would end
    the process a minute later with a line of its own), every batch written so far is kept, and
    the next run (here without Ray) encodes only the rest and ends equal to an unbroken run."""
    import subprocess

    from typer.testing import CliRunner

    from codesearch.cli.app import app

    repo = local_index[0]
    monkeypatch.setattr(encode, "ENCODE_BATCH", 1)
    monkeypatch.setenv("CODESEARCH_CACHE_SIZE", "0")  # each run encodes (no user vector cache between them)
    full, _ = _index(repo, tmp_path / "local", single_vector_dir, colbert_dir)  # the reference
    done = subprocess.run(
        [sys.executable, "-c", _LOSE_THE_HEAD, "index", str(repo), "--index-dir", str(tmp_path / "index"),
         "--ray", "--model", str(single_vector_dir), "--multi-model", str(colbert_dir), "--device", "cpu", "-q"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
    assert last.startswith("Error: lost the Ray cluster at 'local' (its head stopped answering"), done.stderr
    assert "run 'codesearch index' again to resume" in last
    with Store(tmp_path / "index" / STORE_FILE) as s:
        kept = sum(len(ids) for kind in ("dense", "file", "colbert") for ids, _ in s.iter_vectors(kind))
    assert 0 < kept < full.chunks_encoded  # some batches written before the end, not all
    shown = CliRunner().invoke(app, ["status", str(repo), "--index-dir", str(tmp_path / "index")]).stdout
    assert "(run 'codesearch index' to finish)" in shown, shown

    resumed, status = _index(repo, tmp_path / "index", single_vector_dir, colbert_dir)
    assert resumed.chunks_encoded == full.chunks_encoded - kept  # only the rest
    # the ColBERT stream (the second) always ends in the resumed run; the dense one did too,
    # or ended on the cluster before the head was lost, and then says so
    assert status.embedded["multi"] == "local cpu (float32)"
    assert re.fullmatch(r"local cpu \(float32\)|ray local: \d+ cpu workers \(float32\)", status.embedded["dense"])
    _assert_same_index(tmp_path / "index", _contents(tmp_path / "local"))


@needs_ray
def test_a_cluster_that_wants_a_token_is_a_one_line_error_naming_it(ray_cluster, tmp_path, colbert_dir):
    """A cluster with token authentication (Ray's default for a new cluster, as the test one)
    and a driver without the token: ray.init retried for 20 s, then said only "Failed to
    connect"; now one line at once that says what to set."""
    import subprocess

    if os.environ.get("RAY_AUTH_MODE") != "token":
        pytest.skip("this Ray did not turn token authentication on for the test cluster")
    address = ray_cluster.get_runtime_context().gcs_address
    repo = write_sample_repo(tmp_path / "repo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"RAY_AUTH_MODE": "disabled"}
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", "from codesearch.cli import main; main()", "index", str(repo),
         "--ray-address", address, "--model", "none", "--multi-model", str(colbert_dir), "--device", "cpu", "-q"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert time.monotonic() - t0 < 60
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]  # after a warning line of Ray's own C++ client
    assert last.startswith(f"Error: the Ray cluster at {address!r} requires its authentication token"), done.stderr
    assert "RAY_AUTH_MODE=token" in last


@needs_ray
def test_names_without_a_port_are_left_to_ray():
    """RAY_ADDRESS=auto, --ray-address local or a Ray Client address: nothing to probe
    (GcsClient raised ValueError on them, a traceback)."""
    from codesearch.encoder.ray.cluster import _check_head

    for address in ("auto", "local", "ray://head:10001", "head"):
        assert _check_head(address) is None


@pytest.fixture
def small_plaid(monkeypatch):
    """PLAID (and the run's codes on the workers) at a test repository's size: PLAID from
    200 tokens, 8 centroids, a sample of 10 tokens per centroid."""
    from codesearch.indexes.plaid import PlaidIndex
    from codesearch.indexing import codes

    monkeypatch.setitem(PlaidIndex.__init__.__kwdefaults__, "exact_threshold", 200)
    monkeypatch.setitem(PlaidIndex.__init__.__kwdefaults__, "max_centroids", 8)
    monkeypatch.setattr(codes, "SAMPLE_PER_CENTROID", 10)
    monkeypatch.setattr(encode, "ENCODE_BATCH", 2)  # many batches, so the kill lands mid-run
    monkeypatch.setenv("CODESEARCH_CACHE_SIZE", "0")  # every text encoded by the workers


def _many_files(root, n=30):
    """A repository of ``n`` small Python files, a few functions each (~100 chunks)."""
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    for i in range(n):
        body = "".join(
            f"def {words[(i + j) % 8]}_{i}_{j}(x, y):\n    total = x * {j} + y - {i}\n"
            f"    for k in range({j + 2}):\n        total += k * {words[j % 8]!r}.count('a')\n    return total\n\n\n"
            for j in range(4)
        )
        path = root / f"pkg{i % 3}" / f"mod_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
    return root


def _driver_codes(index_dir):
    """The stored PLAID index, and its codes computed here from the stored vectors."""
    from codesearch.indexes.plaid import PlaidIndex

    index = PlaidIndex.load(index_dir / "plaid")
    with Store(index_dir / STORE_FILE) as s:
        ids, arrays = s.vectors_for(index.ids().tolist(), "colbert")
    assert ids.tolist() == index.ids().tolist()
    codes, packed = index._codec.compress(np.concatenate(arrays))
    return index, codes, packed


@needs_ray
def test_plaid_codes_come_from_the_workers_even_when_one_is_killed(
    pool, small_plaid, tmp_path, monkeypatch, single_vector_dir, colbert_dir
):
    from codesearch.encoder.ray import RayEncoder

    got = {"coded": 0, "plain": 0, "codecs": set()}
    codes_for, set_codec = RayEncoder.codes_for, RayEncoder.set_codec

    def counting(self, texts):
        out = codes_for(self, texts)
        got["coded" if out is not None else "plain"] += 1
        return out

    def recording(self, codec):
        got["codecs"].add(codec.fingerprint)
        set_codec(self, codec)

    monkeypatch.setattr(RayEncoder, "codes_for", counting)
    monkeypatch.setattr(RayEncoder, "set_codec", recording)
    repo = _many_files(tmp_path / "repo")
    before = pool.worker_pids()
    killed = []

    def kill_once(event):  # once the workers have the codec
        if event.stage == "encode" and got["coded"] and not killed:
            killed.append(before[0])
            os.kill(before[0], signal.SIGKILL)

    _index(repo, tmp_path / "index", single_vector_dir, colbert_dir, ray=pool, progress=kill_once)
    assert killed and before[0] not in pool.worker_pids()
    index, codes, packed = _driver_codes(tmp_path / "index")
    assert index.kind == "plaid" and got["codecs"] == {index._codec.fingerprint}  # the sampled codec
    assert got["coded"] >= 3  # batches came back with codes, after the kill too
    # Every stored code is the one the driver computes from the stored vectors.
    np.testing.assert_array_equal(index._codes, codes)
    np.testing.assert_array_equal(index._residuals, packed)
