"""Every user-facing failure through the installed console script, in a real subprocess.

A user error is exit status 1, exactly one line on stderr starting with ``Error:`` that
names the bad value and the way out, nothing on stdout, no traceback. Files codesearch
cannot use (binary, huge) are skipped with a counted reason, never an error; what can be
recovered (a truncated derived index, an interrupted run, an offline default model) is.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fixtures.console import SCRIPT, cli, ok
from fixtures.sample_repo import EXPECTED, write_sample_repo

LEXICAL = ("--model", "none", "--multi-model", "none")
QUERY, WINNER = "parseConfigFile", EXPECTED["parseConfigFile"]


def user_error(done: subprocess.CompletedProcess, *needles: str, notices: int = 0) -> str:
    """Assert the one-line user-error contract and return the line (after `notices`
    ``Notice:`` lines, such as the one a query says before indexing a new folder)."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert all(line.startswith("Notice: ") for line in lines[:notices]), done.stderr
    lines = lines[notices:]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: ") and "Traceback" not in done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def offline_env(tmp_path: Path) -> dict[str, str]:
    """No hub: offline mode and an empty cache (nothing to fall back on)."""
    home = tmp_path / "hf_home"
    home.mkdir(exist_ok=True)
    return {"HF_HUB_OFFLINE": "1", "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub")}


def top_path(done: subprocess.CompletedProcess) -> str:
    return json.loads(done.stdout)["results"][0]["path"]


@pytest.fixture()
def repo(tmp_path):
    return write_sample_repo(tmp_path / "repo")


@pytest.fixture(scope="module")
def model_index(tmp_path_factory, single_vector_dir, colbert_dir):
    """The sample repo indexed with both tiny models (dense, file and ColBERT indexes).
    Tests copy it before damaging it."""
    root = write_sample_repo(tmp_path_factory.mktemp("errors_models") / "repo")
    ok("index", root, "--model", single_vector_dir, "--multi-model", colbert_dir, "--device", "cpu", "-q")
    return root


# -- bad paths -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["index", "{missing}"],
        ["query", "x", "-p", "{missing}"],
        ["status", "{missing}"],
        ["serve", "{missing}", "--port", "0", "--mcp", "off"],
    ],
)
def test_a_path_that_does_not_exist(tmp_path, argv):
    missing = str(tmp_path / "no such dir")
    user_error(cli(*[a.format(missing=missing) for a in argv]), repr(missing), "does not exist")


def test_a_file_where_a_folder_is_expected(repo):
    user_error(cli("index", repo / "src" / "config.js", *LEXICAL), "config.js", "is not a folder")


@pytest.mark.parametrize("where", ["default", "option", "under a file"])
def test_an_index_folder_that_cannot_be_made(repo, tmp_path, where):
    (tmp_path / "afile").write_text("x\n")
    if where == "default":
        (repo / ".codesearch").write_text("not a folder\n")
        argv = ["index", repo, *LEXICAL]
    elif where == "option":
        argv = ["index", repo, "--index-dir", tmp_path / "afile", *LEXICAL]
    else:
        argv = ["index", repo, "--index-dir", tmp_path / "afile" / "index", *LEXICAL]
    user_error(cli(*argv), "index", "--index-dir")
    assert (tmp_path / "afile").read_text() == "x\n"


# -- files codesearch cannot use: skipped and counted, not errors --------------------------------


def test_binary_and_huge_files_are_skipped_with_a_counted_reason(repo):
    (repo / "big.py").write_text("x = 1\n" * 200_000)  # 1.2 MB, over the 1 MB default
    done = ok("index", repo, *LEXICAL)
    assert done.stdout == ""
    assert "binary: 1" in done.stderr and "too_large: 1" in done.stderr
    status = json.loads(ok("status", repo, "--json").stdout)
    assert status["files"] == 5 and not status["is_stale"]  # the skipped files are not "added"


def test_invalid_utf8_is_indexed_with_replacement_and_right_line_numbers(repo):
    raw = (
        b"def before_bad_bytes():\n    return 1\n\n"
        b"# latin-1 here: caf\xe9 \xff\xfe\n"
        b"def after_bad_bytes():\n    return 2\n"
    )
    (repo / "mixed.py").write_bytes(raw)
    ok("index", repo, *LEXICAL, "-q")
    hit = json.loads(ok("query", "after_bad_bytes", "-p", repo, "--mode", "lexical", "--json").stdout)["results"][0]
    assert hit["path"] == "mixed.py"
    lines = raw.decode("utf-8", errors="replace").splitlines()
    # The stored range is the file's own: its lines, decoded with replacement, are the text.
    assert hit["text"].splitlines() == lines[hit["start_line"] - 1 : hit["end_line"]]
    assert "after_bad_bytes" in lines[hit["end_line"] - 2] and "\ufffd" in hit["text"]


# -- corrupt index -----------------------------------------------------------------------------


def test_a_corrupt_store_names_rebuild_and_rebuild_fixes_it(repo):
    ok("index", repo, *LEXICAL, "-q")
    index_dir = repo / ".codesearch"
    (index_dir / "store.sqlite").write_bytes(b"this is not an SQLite database " * 100)
    for name in ("store.sqlite-wal", "store.sqlite-shm"):
        (index_dir / name).unlink(missing_ok=True)
    for argv in (["query", QUERY, "-p", repo], ["status", repo], ["index", repo, *LEXICAL]):
        user_error(cli(*argv), "store.sqlite", "codesearch index --rebuild")
    ok("index", repo, *LEXICAL, "-q", "--rebuild")
    assert top_path(ok("query", QUERY, "-p", repo, "--mode", "lexical", "--json")) == WINNER


@pytest.mark.parametrize("name", ["lexical", "dense_chunks", "dense_files", "plaid"])
def test_a_truncated_derived_index_is_rebuilt_from_the_store(model_index, tmp_path, name):
    # SQLite is the source of truth: a damaged derived file is rebuilt from it on the next
    # search (or the search says to run --rebuild); either way no result is lost.
    repo = Path(shutil.copytree(model_index, tmp_path / "copy"))
    target = repo / ".codesearch" / name
    files = sorted(p for p in target.rglob("*") if p.is_file()) if target.is_dir() else [target]
    assert files, f"{name} missing from the index"
    for f in files:
        with open(f, "r+b") as fh:
            fh.truncate(max(1, f.stat().st_size // 3))
    done = cli("query", QUERY, "-p", repo, "--json", "--no-refresh")
    if done.returncode != 0:
        user_error(done, name, "codesearch index --rebuild")
        ok("index", repo, "-q", "--rebuild")
        done = ok("query", QUERY, "-p", repo, "--json", "--no-refresh")
    doc = json.loads(done.stdout)
    assert doc["results"][0]["path"] == WINNER
    assert {"lexical", "dense", "colbert"} <= set(doc["indexes_used"])
    # ... and the repaired index serves the next process without complaint.
    assert top_path(ok("query", QUERY, "-p", repo, "--json", "--no-refresh")) == WINNER


# -- models --------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--model", "--multi-model"])
def test_a_model_folder_that_does_not_exist(repo, tmp_path, option):
    missing = str(tmp_path / "nonexistent")
    other = "--multi-model" if option == "--model" else "--model"
    user_error(cli("index", repo, option, missing, other, "none"), missing)
    assert not (repo / ".codesearch" / "store.sqlite").exists()


@pytest.mark.parametrize("option", ["--model", "--multi-model"])
def test_an_unknown_hub_id_offline(repo, tmp_path, option):
    other = "--multi-model" if option == "--model" else "--model"
    done = cli("index", repo, option, "some/unknown-id", other, "none", env=offline_env(tmp_path))
    user_error(done, "'some/unknown-id'", "codesearch models pull some/unknown-id")


def test_default_models_offline_give_a_lexical_index_said_once_by_the_index_run(repo, tmp_path):
    # The index run says it; each query shows it in indexes_used, not in a notice.
    env = offline_env(tmp_path)
    done = ok("index", repo, "-q", env=env)
    notices = done.stderr.splitlines()
    # One line for the missing default, and on a CPU one saying the dense model is opt-in.
    assert notices and all(n.startswith("Notice: ") for n in notices) and len(notices) <= 2
    assert any("indexed lexical-only" in n for n in notices)
    # Each hybrid answer then says, once, that BM25 alone ranked it.
    query = ok("query", QUERY, "-p", repo, env=env)
    assert query.stdout.startswith(f"{WINNER}:")
    assert len(query.stderr.splitlines()) == 1 and query.stderr.startswith("Notice: lexical index only")
    doc = json.loads(ok("query", QUERY, "-p", repo, "--json", env=env).stdout)
    assert doc["indexes_used"] == ["lexical"] and doc["results"][0]["path"] == WINNER
    assert len(doc["notices"]) == 1 and doc["notices"][0].startswith("lexical index only")


# -- interrupted and concurrent indexing -----------------------------------------------------------


def _grow(repo: Path, n: int) -> None:
    gen = repo / "gen"
    gen.mkdir(exist_ok=True)
    for i in range(n):
        body = "".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(30))
        (gen / f"m{i}.py").write_text(body)


def test_ctrl_c_mid_index_exits_130_in_one_line_and_the_next_run_completes(repo, colbert_dir):
    _grow(repo, 120)
    argv = [str(SCRIPT), "index", str(repo), "--model", "none", "--multi-model", str(colbert_dir), "--device", "cpu"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    from codesearch.store import IndexLock

    deadline = time.monotonic() + 120
    while proc.poll() is None and not IndexLock.writer_active(repo / ".codesearch") and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # well inside the run: walking, chunking or encoding
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the index run finished before the signal")
    assert proc.returncode == 130, err
    assert out == "" and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("Interrupted"), err
    ok("index", repo, "--model", "none", "--multi-model", colbert_dir, "--device", "cpu", "-q")
    status = json.loads(ok("status", repo, "--json").stdout)
    assert status["files"] == 125 and not status["is_stale"] and status["models"]["multi"] == str(colbert_dir)
    assert top_path(ok("query", QUERY, "-p", repo, "--mode", "lexical", "--json")) == WINNER


def test_an_index_locked_by_another_indexer(repo):
    from codesearch.store import IndexLock

    ok("index", repo, *LEXICAL, "-q")
    with IndexLock(repo / ".codesearch"):
        user_error(cli("index", repo, *LEXICAL), "another codesearch process", "wait for it")
        # Readers are never blocked by a writer.
        assert top_path(ok("query", QUERY, "-p", repo, "--mode", "lexical", "--json")) == WINNER
    ok("index", repo, *LEXICAL, "-q")


# -- queries -------------------------------------------------------------------------------------


@pytest.mark.parametrize("query", ["", "   "])
@pytest.mark.parametrize("indexed", [True, False])
def test_an_empty_query(repo, query, indexed):
    if indexed:
        ok("index", repo, *LEXICAL, "-q")
    # The empty query is the mistake to report, even in a folder without an index.
    user_error(cli("query", query, cwd=repo), "the query is empty")


def test_query_in_a_folder_without_an_index(tmp_path):
    # Outside any index or git work tree a query does not index the folder it stands in...
    user_error(cli("query", "retry", cwd=tmp_path), "no index found", "codesearch index")
    # ...while a named folder is indexed first, here with nothing in it to index.
    user_error(cli("query", "retry", "-p", tmp_path), "nothing to index", notices=1)


@pytest.mark.parametrize("content", ["empty", "binary only"])
def test_nothing_indexable_leaves_no_index_behind(tmp_path, content):
    folder = tmp_path / "nothing"
    folder.mkdir()
    if content == "binary only":
        (folder / "blob.bin").write_bytes(bytes(range(256)) * 8)
    line = user_error(cli("index", folder, *LEXICAL), "nothing to index", "--include/--exclude")
    if content == "binary only":
        assert "1 binary" in line
    # A failed first run must not leave an empty index that later answers "No results".
    assert not (folder / ".codesearch").exists()
    user_error(cli("query", "retry", "-p", folder), "nothing to index", notices=1)
    assert not (folder / ".codesearch").exists()
