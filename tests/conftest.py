"""Shared fixtures: tiny random checkpoints on disk, built once per session; and the
per-user daemon kept out of the user's runtime folder."""

from __future__ import annotations

import os

import pytest
from fixtures import models


@pytest.fixture(scope="session", autouse=True)
def private_daemon_runtime(tmp_path_factory):
    """Every ``codesearch`` process the tests start works in this process (no daemon:
    ``CODESEARCH_NO_DAEMON=1``) unless a test asks for one, and any daemon a test starts
    lives in a private runtime folder, never the user's; whatever runs there at the end is
    stopped (``.ci/run`` fails on a codesearch process left behind)."""
    folder = tmp_path_factory.mktemp("runtime")
    saved = {k: os.environ.get(k) for k in ("CODESEARCH_RUNTIME_DIR", "CODESEARCH_NO_DAEMON")}
    os.environ["CODESEARCH_RUNTIME_DIR"] = str(folder)
    os.environ["CODESEARCH_NO_DAEMON"] = "1"
    try:
        yield folder
    finally:
        from codesearch.server import daemon_client

        daemon_client.stop(folder)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session", autouse=True)
def one_bf16_verdict(tmp_path_factory):
    """Whether bf16 pays on this CPU is a timing where AVX512-bf16 comes without AMX
    (`codesearch.encoder.cpu`), kept once per cache folder. Each test has its own cache
    folder, so under load a test's server and its library could measure differently and
    compute one model in two precisions (a 0.2% score gap). Measure once for the run and
    hand the verdict to every process through ``CODESEARCH_CPU_BF16``."""
    if os.environ.get("CODESEARCH_CPU_BF16"):
        yield os.environ["CODESEARCH_CPU_BF16"]
        return
    from codesearch.encoder import runtime

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CODESEARCH_CACHE_DIR", str(tmp_path_factory.mktemp("bf16_probe")))
        verdict = "1" if runtime.cpu_has_fast_bf16() else "0"
    os.environ["CODESEARCH_CPU_BF16"] = verdict
    try:
        yield verdict
    finally:
        os.environ.pop("CODESEARCH_CPU_BF16", None)


@pytest.fixture(scope="session")
def modernbert_dir(tmp_path_factory):
    """A bare ModernBERT checkpoint, legacy config form."""
    return models.make_modernbert(tmp_path_factory.mktemp("modernbert_legacy"), form="legacy")


@pytest.fixture(scope="session")
def modernbert_new_dir(tmp_path_factory):
    """The same architecture with the newer `layer_types` + `rope_parameters` config form."""
    return models.make_modernbert(tmp_path_factory.mktemp("modernbert_new"), form="new")


@pytest.fixture(scope="session")
def single_vector_dir(tmp_path_factory):
    """A sentence-transformers ModernBERT with CLS pooling and L2 normalisation."""
    return models.make_single_vector(tmp_path_factory.mktemp("single_vector"))


@pytest.fixture(scope="session")
def colbert_dir(tmp_path_factory):
    """A PyLate ColBERT ModernBERT (1_Dense to 32 dims, [Q]/[D] prefixes)."""
    return models.make_colbert(tmp_path_factory.mktemp("colbert"))


@pytest.fixture(scope="module")
def one_faiss_thread():
    """Test-sized FAISS calls are too small to gain from threads, and on a shared 2-core
    runner OpenMP's barriers wait on descheduled threads (3x slower suites under load)."""
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.fixture(scope="module", autouse=True)
def _module_vector_cache(tmp_path_factory):
    """The user's vector cache of a module's fixtures (an index built once per module): its
    own folder, never the real ~/.cache, so no module reuses another's vectors by accident."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CODESEARCH_CACHE_DIR", str(tmp_path_factory.mktemp("vector_cache")))
        mp.delenv("CODESEARCH_CACHE_SIZE", raising=False)
        yield


@pytest.fixture(autouse=True)
def _vector_cache(tmp_path_factory, monkeypatch):
    """Each test's own vector cache (subprocesses inherit it): no test shares one by accident."""
    monkeypatch.setenv("CODESEARCH_CACHE_DIR", str(tmp_path_factory.mktemp("vector_cache")))
    monkeypatch.delenv("CODESEARCH_CACHE_SIZE", raising=False)
