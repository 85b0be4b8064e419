"""The console script on awkward repositories and under concurrent use, in real subprocesses:
a query while another process indexes, files deleted or replaced by folders between runs,
names with spaces and non-ASCII characters, a very long line."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from fixtures.console import SCRIPT, ok
from fixtures.sample_repo import EXPECTED, write_sample_repo

from codesearch.store import IndexLock

LEXICAL = ("--model", "none", "--multi-model", "none")
QUERY, WINNER = "parseConfigFile", EXPECTED["parseConfigFile"]


def search(repo: Path, query: str, *extra: str) -> tuple[list[dict], str]:
    done = ok("query", query, "-p", repo, "--mode", "lexical", "--json", *extra)
    return json.loads(done.stdout)["results"], done.stderr


def test_query_while_another_process_indexes_sees_the_last_committed_index(tmp_path, colbert_dir):
    repo = write_sample_repo(tmp_path / "repo")
    ok("index", repo, *LEXICAL, "-q")
    gen = repo / "gen"
    gen.mkdir()
    for i in range(120):
        (gen / f"m{i}.py").write_text(
            "".join(f"def newly_added_{i}_{j}(x):\n    return x + {j}\n\n" for j in range(30))
        )
    argv = [
        str(SCRIPT),
        "index",
        str(repo),
        "--model",
        "none",
        "--multi-model",
        str(colbert_dir),
        "--device",
        "cpu",
        "-q",
    ]
    writer = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while (
            writer.poll() is None and not IndexLock.writer_active(repo / ".codesearch") and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        hits, _ = search(repo, QUERY, "--no-refresh")
        during = writer.poll() is None
        # A refresh cannot write now: it searches what is there and says why.
        refreshed_hits, notes = search(repo, QUERY)
        assert hits[0]["path"] == WINNER and refreshed_hits[0]["path"] == WINNER
        if during and writer.poll() is None:
            # Lexical first: once the writer has committed the files (before their vectors)
            # they are searchable and nothing is stale; before that, the refresh says that
            # another process is writing.
            committed = search(repo, "newly_added_7_3", "--no-refresh")[0][:1]
            assert "another process is updating the index" in notes or committed[0]["path"] == "gen/m7.py"
    finally:
        _, err = writer.communicate(timeout=300)
    assert writer.returncode == 0, err
    if not during:
        pytest.skip("the index run finished before the query")
    hits, notes = search(repo, "newly_added_7_3", "--no-refresh")
    assert hits[0]["path"] == "gen/m7.py" and "refreshed" not in notes


def test_a_file_deleted_after_indexing_leaves_on_the_next_query(tmp_path):
    repo = write_sample_repo(tmp_path / "repo")
    ok("index", repo, *LEXICAL, "-q")
    (repo / WINNER).unlink()
    stale, _ = search(repo, QUERY, "--no-refresh")
    assert stale and stale[0]["path"] == WINNER  # asked not to refresh: the indexed state
    hits, notes = search(repo, QUERY)
    assert WINNER not in [h["path"] for h in hits]
    assert "index refreshed: 1 file(s)" in notes
    status = json.loads(ok("status", repo, "--json").stdout)
    assert status["files"] == 4 and not status["is_stale"]


def test_names_with_spaces_and_non_ascii(tmp_path):
    repo = tmp_path / "my repo ünï"
    (repo / "dïr ä" / "日本").mkdir(parents=True)
    (repo / "dïr ä" / "日本" / "fïle näme.py").write_text("def grüße_sagen():\n    return 'hallo'\n", encoding="utf-8")
    (repo / "x y.py").write_text("def plain_name():\n    return 1\n")
    ok("index", repo, *LEXICAL, "-q")
    hits, _ = search(repo, "grüße_sagen")
    assert hits[0]["path"] == "dïr ä/日本/fïle näme.py" and hits[0]["symbol"] == "grüße_sagen"
    # Found from a subfolder with such a name too, and listed as files.
    done = ok("query", "plain_name", "--files-only", "--mode", "lexical", cwd=repo / "dïr ä" / "日本")
    assert done.stdout.splitlines()[0] == "x y.py"


def test_a_file_replaced_by_a_folder_and_back(tmp_path):
    repo = write_sample_repo(tmp_path / "repo")
    ok("index", repo, *LEXICAL, "-q")
    target = repo / "src" / "config.js"
    saved = target.read_text()
    target.unlink()
    target.mkdir()
    (target / "inner.py").write_text("def inside_the_new_folder():\n    return 1\n")
    hits, notes = search(repo, "inside_the_new_folder")
    assert hits[0]["path"] == "src/config.js/inner.py" and "index refreshed: 2 file(s)" in notes
    assert not [h for h in search(repo, QUERY)[0] if h["path"] == WINNER]
    (target / "inner.py").unlink()
    target.rmdir()
    target.write_text(saved)
    ok("index", repo, *LEXICAL, "-q")
    assert search(repo, QUERY)[0][0]["path"] == WINNER
    assert not search(repo, "inside_the_new_folder")[0]


def test_a_very_long_line_under_the_size_limit(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    head = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n" for i in range(200))
    long_line = 'TABLE = "' + "ab" * 100_000 + '"  # marker_on_the_long_line\n'
    tail = "def after_the_long_line():\n    return 0\n"
    (repo / "data.py").write_text(head + long_line + tail)
    ok("index", repo, *LEXICAL, "-q")
    lines = (head + long_line + tail).splitlines()
    for query, needle in (
        ("marker_on_the_long_line", "marker_on_the_long_line"),
        ("after_the_long_line", "def after_"),
    ):
        hit = search(repo, query)[0][0]
        assert hit["path"] == "data.py"
        assert hit["text"].splitlines() == lines[hit["start_line"] - 1 : hit["end_line"]]
        assert needle in hit["text"]
