"""The ``--regex`` filter: RE2 syntax, limits, one-line errors, linear time,
and what it keeps through `CodeSearch.query` and the CLI."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from codesearch.api import CodeSearch
from codesearch.cli.app import app
from codesearch.errors import QueryError
from codesearch.globs import glob_deadline
from codesearch.textregex import REGEX_LIMITS, compile_regex
from codesearch.types import SearchRequest


def test_matches_anywhere_lines_anchor_and_flags():
    rx = compile_regex("Retry-After|backoff")
    assert rx.match("    # honour Retry-After\n") and rx.match("x = backoff(2)") and not rx.match("retry after")
    assert compile_regex("^def ").match("import os\ndef f():")  # ^ at each line, as ripgrep's lines
    assert compile_regex(r"\)$").match("f(x)\ny = 1")
    assert not compile_regex("a.b").match("a\nb") and compile_regex("(?s)a.b").match("a\nb")
    assert compile_regex("(?i)retry").match("RETRY") and not compile_regex("retry").match("RETRY")


@pytest.mark.parametrize(
    "pattern,needle",
    [
        ("(a", "missing )"),
        (r"(a)\1", "backreferences are not supported"),
        ("(?=x)a", "lookaround is not supported"),
        ("", "the regex is empty"),
        ("x" * (REGEX_LIMITS.chars + 1), f"over the limit of {REGEX_LIMITS.chars:,}"),
        (r"(\w+\s*){200}x", f"over the limit of {REGEX_LIMITS.program:,}"),
        (r"[\p{L}\d_]{1000}z", "over 8 MiB"),
    ],
)
def test_a_bad_or_oversized_pattern_is_one_query_error_naming_it(pattern, needle):
    with pytest.raises(QueryError) as raised:
        SearchRequest("retry", regex=pattern)
    message = str(raised.value)
    assert needle in message and "\n" not in message and "(" in message


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(a|a)*b", r"(x+x+)+y", r"(.*a){20}", r"^(\w+\s?)*$"])
def test_catastrophic_backtracking_patterns_run_in_linear_time(pattern):
    # Each of these takes Python's `re` longer than a test run on this text (exponential in
    # the run of letters); RE2 answers in one pass. No clock is read here: a backtracking
    # engine would not return at all.
    text = ("a" * 5000 + "!\n") * 20 + "x" * 5000
    assert compile_regex(pattern).match(text) in (True, False)


def test_a_passed_deadline_stops_the_filter_with_a_query_error():
    rx = compile_regex("needle")
    with glob_deadline(0.0), pytest.raises(QueryError, match="regex filter ran past the search's time limit"):
        list(rx.matches(["hay"] * 1000))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("rx")
    (root / "client.py").write_text(
        "def send(request):\n    return transport(request)\n\n\n"
        "def retry(call, attempts=5):\n    '''Retry a failed call.'''\n    for n in range(attempts):\n"
        "        delay = backoff(n)\n    return call()\n\n\n"
        "def parse_retry_after(headers):\n    return int(headers['Retry-After'])\n"
    )
    (root / "notes.md").write_text("# Retry logic\n\nWe retry with exponential backoff.\n")
    (root / "util.go").write_text("package util\n\n// Wait a little.\nfunc Sleep(n int) {}\n")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    return root


def _all_chunks(root):
    from codesearch.store import Store

    with Store(root / ".codesearch" / "store.sqlite", readonly=True) as store:
        return [(r.chunk.path, r.chunk.start_line, r.chunk.text) for r in store.iter_chunk_records()]


@pytest.mark.parametrize("pattern", ["Retry-After|backoff", r"(?i)^def \w+\(", "Sleep", "no_such_text_anywhere"])
@pytest.mark.parametrize("mode", ["lexical", "hybrid"])
def test_the_filter_keeps_exactly_the_matching_chunks_and_ranks_them(repo, pattern, mode):
    want = {(p, s) for p, s, text in _all_chunks(repo) if re.search(pattern, text, re.M)}
    with CodeSearch(repo, model=None, multi_model=None) as cs:
        every = cs.query("retry logic", 100, mode=mode, regex=pattern)
        assert {(h.path, h.start_line) for h in every.hits} == want  # all of them, even unscored
        for k in range(1, len(want) + 1):
            top = cs.query("retry logic", k, mode=mode, regex=pattern)
            assert top.hits == every.hits[:k]  # a prefix of a larger k
        unfiltered = [h for h in cs.query("retry logic", 100, mode=mode).hits if (h.path, h.start_line) in want]
    scored = [h for h in every.hits if h.score > 1e-3]
    assert [(h.path, h.start_line) for h in scored] == [(h.path, h.start_line) for h in unfiltered][: len(scored)]


def test_the_cli_takes_regex_and_a_bad_one_is_one_line(repo):
    runner = CliRunner()
    ok = runner.invoke(app, ["query", "retry", "-p", str(repo), "--regex", "Retry-After", "--json", "--no-server"])
    assert ok.exit_code == 0, ok.stderr
    hits = json.loads(ok.stdout)["results"]
    assert hits and all("Retry-After" in h["text"] for h in hits)
    bad = runner.invoke(app, ["query", "retry", "-p", str(repo), "--regex", "(?<=x)y", "--no-server"])
    assert bad.exit_code == 1 and bad.stdout == ""
    (line,) = bad.stderr.splitlines()
    assert line.startswith("Error: invalid regex '(?<=x)y'") and "lookaround" in line


@pytest.mark.parametrize("mode", ["dense", "colbert", "hybrid"])
def test_the_filter_applies_in_every_vector_mode(tmp_path, repo, single_vector_dir, colbert_dir, mode):
    import shutil

    root = tmp_path / "rx"
    shutil.copytree(repo, root, ignore=shutil.ignore_patterns(".codesearch"))
    pattern = "Retry-After|backoff"
    want = {(p, s) for p, s, text in _all_chunks(repo) if re.search(pattern, text, re.M)}
    with CodeSearch(root, model=str(single_vector_dir), multi_model=str(colbert_dir)) as cs:
        cs.index()
        every = cs.query("retry logic", 100, mode=mode, regex=pattern)
        assert set(every.indexes_used) >= ({"dense", "colbert"} if mode == "hybrid" else {mode})
        assert {(h.path, h.start_line) for h in every.hits} == want
        assert cs.query("retry logic", 1, mode=mode, regex=pattern).hits == every.hits[:1]


class _Batch(list):
    """A list a weak reference can follow (to see when the filter let go of a batch)."""


@pytest.mark.parametrize("glob", [None, "*.{py,md}"])
def test_the_filter_reads_bounded_batches_and_drops_each_before_the_next(repo, monkeypatch, glob):
    """The texts are most of an index's bytes: the filter reads them in batches of at most
    `_TEXT_BATCH` and lets go of each before it reads the next (before: one read of every
    text without another filter, every batch kept to the end with one). It keeps the same
    chunks as one pass over everything."""
    import weakref

    from codesearch.search import searcher as searcher_mod
    from codesearch.search.searcher import Searcher

    monkeypatch.setattr(searcher_mod, "_TEXT_BATCH", 1)
    pattern = "retry|Retry|Sleep|backoff"
    want = {(p, s) for p, s, text in _all_chunks(repo) if re.search(pattern, text, re.M)
            and (glob is None or p.endswith((".py", ".md")))}
    with Searcher(repo / ".codesearch") as searcher:
        store, reads, alive = searcher._store, [], []
        real = store.chunk_texts

        def chunk_texts(ids=None):
            assert all(ref() is None for ref in alive), "the previous batch is still held"
            reads.append(None if ids is None else len(ids))
            batch = _Batch(real(ids))
            alive.append(weakref.ref(batch))
            return batch

        monkeypatch.setattr(store, "chunk_texts", chunk_texts)
        hits = searcher.search(SearchRequest("retry logic", 100, mode="lexical", regex=pattern,
                                             globs=(glob,) if glob else ())).hits
    assert {(h.path, h.start_line) for h in hits} == want
    assert len(reads) > 1 and all(n == 1 for n in reads), reads
