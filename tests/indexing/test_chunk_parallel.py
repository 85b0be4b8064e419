"""Chunking many files in a process pool gives exactly the serial chunks, in order."""

from __future__ import annotations

import multiprocessing
import os
import pickle
from pathlib import Path

from fixtures.pipeline_helpers import chunk_set, make_repo

from codesearch.encoder import load
from codesearch.encoder.base import Encoders
from codesearch.indexing.chunking import chunk_many, chunk_source, estimate_tokens
from codesearch.indexing.chunking import parallel as chunk_pool
from codesearch.indexing.encoders import MAX_CHUNK_TOKENS, chunk_budget
from codesearch.indexing.run import build_index

SOURCES = {
    "python": "import os\n\n\nclass Client:\n    def get(self, url):\n        return os.path.join(url, 'x')\n\n"
    + "".join(f"def fn{i}(x):\n    y = x + {i}\n    return y * 2\n\n\n" for i in range(40)),
    "javascript": "".join(f"function f{i}(a) {{\n  return a + {i};\n}}\n\n" for i in range(30)),
    "markdown": "# Title\n\nSome words.\n\n## Part\n\nMore words here.\n",
    "text": "plain text\n" * 50,
}


def items(n: int) -> list[tuple[str, str, str]]:
    langs = list(SOURCES)
    return [(f"f{i}.{langs[i % 4][:2]}", SOURCES[langs[i % 4]] + f"# file {i}\n", langs[i % 4]) for i in range(n)]


class PidCounter:
    """A picklable token count that leaves a file named after the process that called it."""

    def __init__(self, directory: Path):
        self.directory = str(directory)

    def __call__(self, text: str) -> int:
        Path(self.directory, str(os.getpid())).touch()
        return estimate_tokens(text)


def test_pool_matches_serial_in_order(tmp_path):
    work = items(24)
    serial = [chunk_source(p, t, lang, max_tokens=64) for p, t, lang in work]
    counter = PidCounter(tmp_path)
    pooled = list(chunk_many(work, max_tokens=64, count_tokens=counter, workers=2, min_files=0))
    assert pooled == [chunk_source(p, t, lang, max_tokens=64, count_tokens=counter) for p, t, lang in work]
    assert sum(map(len, serial)) > len(work)  # files really were cut into several chunks
    assert {int(p.name) for p in tmp_path.iterdir()} - {os.getpid()}, "no worker process did the chunking"


def test_few_files_or_unpicklable_counter_stay_in_process(tmp_path):
    work = items(8)
    list(chunk_many(work, count_tokens=PidCounter(tmp_path), workers=2))  # 8 < PARALLEL_MIN_FILES
    assert {int(p.name) for p in tmp_path.iterdir()} == {os.getpid()}
    count = lambda s: len(s) // 3  # noqa: E731 - a lambda does not pickle
    assert list(chunk_many(work, count_tokens=count, workers=2, min_files=0)) == [
        chunk_source(p, t, lang, count_tokens=count) for p, t, lang in work
    ]


def test_pipeline_chunks_the_same_in_parallel(tmp_path, monkeypatch):
    serial_repo = make_repo(tmp_path / "serial", n_files=6)
    build_index(serial_repo)
    monkeypatch.setattr(chunk_pool, "PARALLEL_MIN_FILES", 0)
    monkeypatch.setattr(chunk_pool, "PARALLEL_MIN_FILES_FORKSERVER", 0)
    monkeypatch.setattr(chunk_pool.os, "cpu_count", lambda: 2)
    parallel_repo = make_repo(tmp_path / "parallel", n_files=6)
    build_index(parallel_repo)
    serial, parallel = chunk_set(serial_repo / ".codesearch"), chunk_set(parallel_repo / ".codesearch")
    assert serial == parallel and len(serial) > 6


def test_pipeline_counts_with_a_picklable_tokenizer(single_vector_dir):
    """With a model, the pipeline's token count is the encoder's, in a form workers can rebuild."""
    enc = load(single_vector_dir, device="cpu", dtype="float32")
    budget, counter, identity = chunk_budget(Encoders(dense=enc), None)
    # A single-vector model's window does not cap the chunk (it reads the chunk's start).
    assert identity == enc.identity and budget == MAX_CHUNK_TOKENS
    text = "def f(x):\n    return x + 1\n"
    assert pickle.loads(pickle.dumps(counter))(text) == enc.count_tokens([text])[0]


def test_a_multi_vector_models_window_caps_the_chunk(single_vector_dir, colbert_dir):
    dense = load(single_vector_dir, device="cpu", dtype="float32")
    multi = load(colbert_dir, device="cpu", dtype="float32")
    assert multi.max_length < MAX_CHUNK_TOKENS
    budget, _counter, identity = chunk_budget(Encoders(dense=dense, multi=multi), None)
    assert budget == multi.max_length and identity == multi.identity  # counted in its tokens
    assert chunk_budget(Encoders(dense=dense, multi=multi), 300)[0] == 300


def wide_dense(tmp_path):
    from fixtures.models import make_single_vector

    return load(make_single_vector(tmp_path / "dense"), device="cpu")


def test_a_wide_window_chunks_by_estimate_and_sees_every_chunk_whole(tmp_path):
    """A window of 3 budgets (LateOn-Code-edge reads 2048 tokens) holds any chunk the byte
    estimate allows: chunking calls no tokenizer, and no chunk is truncated by the encoder."""
    from fixtures.models import make_colbert

    from codesearch.store import Store

    wide = load(make_colbert(tmp_path / "wide", document_length=2048, max_position_embeddings=2048), device="cpu")
    assert wide.max_length == 2048
    assert chunk_budget(Encoders(multi=wide), None) == (MAX_CHUNK_TOKENS, None, "approx")
    # with a single-vector model too, chunks are sized in tokens (they scored better for it)
    assert chunk_budget(Encoders(dense=wide_dense(tmp_path), multi=wide), None)[2] == wide.identity
    # dense code: digits and punctuation are the tokens-per-byte worst case of a BPE
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "table.py").write_text(
        "".join(f"T{i} = [{', '.join(str(i * j % 97) for j in range(40))}]\n" for i in range(300))
    )
    (repo / "app.py").write_text(SOURCES["python"])
    build_index(repo, encoders=Encoders(multi=wide))
    with Store(repo / ".codesearch" / "store.sqlite") as store:
        assert store.get_meta("chunk_counter") == "approx" and store.get_meta("chunk_tokens") == str(MAX_CHUNK_TOKENS)
        texts = [row.chunk.encoder_text for row in store.iter_chunk_records()]
    assert len(texts) > 5
    counts = wide.count_tokens(texts)
    # dense enough that some chunks pass 512 real tokens, and still within the window
    assert MAX_CHUNK_TOKENS < max(counts) <= wide.max_length


def test_stopping_early_shuts_the_pool_down():
    work = items(40)
    gen = chunk_many(work, workers=2, min_files=0)
    first = next(gen)
    gen.close()
    assert not multiprocessing.active_children()  # the workers were shut down and joined
    assert first == chunk_source(*work[0][:2], work[0][2])


def test_one_pool_chunks_every_batch_of_a_run(tmp_path):
    """An index run chunks its files a batch at a time through one `Chunker`; a caller that
    stops reading a batch at its own last file (``zip``) must not stop the pool: the
    batches after it were chunked in the run's own process, one core for the whole run."""
    from codesearch.indexing.chunking.parallel import Chunker

    counter = PidCounter(tmp_path)
    with Chunker(48, max_tokens=64, count_tokens=counter, workers=2, min_files=0) as chunker:
        for n, batch in enumerate((items(24), items(24))):
            for p in tmp_path.iterdir():
                p.unlink()
            made = [chunks for _, chunks in zip(batch, chunker.map(batch))]
            assert len(made) == len(batch)
            assert {int(p.name) for p in tmp_path.iterdir()} - {os.getpid()}, f"batch {n} was chunked here"
