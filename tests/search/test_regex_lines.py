"""``--regex`` with ``--max-lines N`` shows the lines that match, as ripgrep does, not the
chunk's first N lines, and the JSON marks them (``match_lines``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fixtures.sample_repo import write_sample_repo

from codesearch.api import CodeSearch
from codesearch.types import SearchRequest


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = write_sample_repo(tmp_path_factory.mktemp("regex") / "repo")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    return root


def _lines_of(root, hit) -> list[str]:
    return (root / hit.path).read_text().splitlines()[hit.start_line - 1 : hit.end_line]


def test_max_lines_shows_the_matching_lines_and_marks_them(repo):
    with CodeSearch(repo) as cs:
        whole = cs.query(SearchRequest("retry", 3, "lexical", regex="gave up"))
        cut = cs.query(SearchRequest("retry", 3, "lexical", regex="gave up", max_lines=2))
    top = whole.hits[0]
    assert top.text.splitlines()[0] != "" and 'raise ConnectionError("gave up after retrying")' in top.text
    first_match = top.start_line + next(i for i, line in enumerate(top.text.splitlines()) if "gave up" in line)
    assert first_match - top.start_line >= 2  # below the chunk's first two lines: the case in question
    shown = cut.hits[0]
    assert "gave up after retrying" in shown.text and len(shown.text.splitlines()) <= 2
    assert shown.start_line == first_match and shown.match_lines == (first_match,)
    assert shown.text.splitlines() == _lines_of(repo, shown)  # still exactly those lines of the file
    assert shown.end_line + shown.more_lines == top.end_line
    assert top.match_lines == (first_match,)  # marked without --max-lines too


def test_the_json_of_the_cli_marks_the_matching_lines(repo):
    env = {**os.environ, "CODESEARCH_NO_DAEMON": "1"}
    done = subprocess.run([sys.executable, "-m", "codesearch.cli", "query", "retry", "-p", str(repo), "--mode",
                           "lexical", "--regex", "gave up|Retry", "--max-lines", "2", "--json"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    hits = json.loads(done.stdout)["results"]
    assert hits
    for hit in hits:
        lines = hit["text"].splitlines()
        marked = [hit["start_line"] + i for i, line in enumerate(lines) if "gave up" in line or "Retry" in line]
        assert marked and hit["match_lines"] == marked, hit
