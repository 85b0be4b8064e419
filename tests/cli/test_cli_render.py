"""Terminal rendering: links and highlighting only on a terminal, progress only on a tty."""

from __future__ import annotations

import dataclasses
import io
import re
import sys

import pytest
from rich.console import Console

from codesearch.cli import render
from codesearch.types import ProgressEvent, SearchHit, SearchResult

HIT = SearchHit(
    path="src/http_client.py", start_line=17, end_line=18, score=0.8731, language="python",
    symbol="retry_with_backoff", kind="function", scope=None,
    text="def retry_with_backoff(call, attempts=5):\n    return call()", chunk_id=1,
)
RESULT = SearchResult(query="retry", mode="lexical", hits=[HIT], indexes_used=("lexical",))


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_output_has_a_file_link_and_highlighting(monkeypatch, tmp_path):
    buf = io.StringIO()
    monkeypatch.setattr(render, "stdout", lambda: Console(file=buf, force_terminal=True, width=120))
    render.search_result(RESULT, root=tmp_path, as_json=False, as_jsonl=False, files_only=False)
    out = buf.getvalue()
    uri = (tmp_path / "src/http_client.py").resolve().as_uri()
    assert "\x1b]8;id=" in out and uri in out  # OSC 8 hyperlink to the file
    assert "\x1b[" in out  # colours
    text = re.sub(r"\x1b\[[0-9;]*m|\x1b\]8;[^\x1b]*\x1b\\", "", out)  # drop colours and links
    assert text.splitlines()[0] == "src/http_client.py:17-18  0.8731  retry_with_backoff (function)"
    assert "17 def retry_with_backoff(call, attempts=5):" in text  # with line numbers


def test_a_cut_snippet_on_a_terminal_ends_with_an_unnumbered_marker(monkeypatch, tmp_path):
    # Regression: the "... (27 more lines)" marker was shown as numbered, highlighted code
    from codesearch.search.snippets import fit
    from codesearch.types import SearchRequest

    long = dataclasses.replace(HIT, end_line=46, text="".join(f"    step_{i}()\n" for i in range(30)))
    cut = fit(dataclasses.replace(RESULT, hits=[long]), SearchRequest("retry", max_lines=3))
    buf = io.StringIO()
    monkeypatch.setattr(render, "stdout", lambda: Console(file=buf, force_terminal=True, width=120))
    render.search_result(cut, root=tmp_path, as_json=False, as_jsonl=False, files_only=False)
    text = re.sub(r"\x1b\[[0-9;]*m|\x1b\]8;[^\x1b]*\x1b\\", "", buf.getvalue())
    lines = [line.rstrip() for line in text.splitlines()]
    assert lines[0].startswith("src/http_client.py:17-19  ")
    assert [line.split()[0] for line in lines[1:4]] == ["17", "18", "19"]
    assert lines[4] == "... (27 more lines)"  # no line number, not code
    assert not any(line.lstrip().startswith("20") for line in lines)


def test_piped_output_is_plain_text(monkeypatch, tmp_path, capsys):
    render.search_result(RESULT, root=tmp_path, as_json=False, as_jsonl=False, files_only=False)
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "src/http_client.py:17-18  0.8731  retry_with_backoff (function)"
    assert out.splitlines()[1:3] == HIT.text.splitlines()
    assert "\x1b" not in out


def _events() -> list[ProgressEvent]:
    return [
        ProgressEvent("walk", 5, 5, files=5),
        ProgressEvent("encode", 10, 40, files=5, chunks=12, tokens=900, tokens_per_s=450.0),
        ProgressEvent("encode", 40, 40, files=5, chunks=12, tokens=3600, tokens_per_s=480.0),
    ]


@pytest.mark.parametrize("tty,enabled,shown", [(True, True, True), (True, False, False), (False, True, False)])
def test_progress_only_on_a_terminal_and_not_quiet(monkeypatch, tty, enabled, shown):
    err = _Tty() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with render.IndexProgress(enabled=enabled) as progress:
        for event in _events():
            progress(event)
    out = err.getvalue()
    if shown:
        assert "encode" in out and "tok/s" in out and "40/40" in out
    else:
        assert out == ""


def test_terminal_output_obeys_no_control_character_of_a_name_or_of_the_code(monkeypatch, tmp_path):
    hit = dataclasses.replace(
        HIT, path="src/\x1b]0;owned\x07evil\n.py", symbol="heading\x1b[2J",
        text="def f():\r\n    return '\x1b[2J\x1b[31m'  # \u202e reversed\n    x = 1\rhidden\n",
    )
    buf = io.StringIO()
    monkeypatch.setattr(render, "stdout", lambda: Console(file=buf, force_terminal=True, width=120))
    render.search_result(dataclasses.replace(RESULT, hits=[hit]), root=tmp_path, as_json=False, as_jsonl=False,
                         files_only=False)
    out = buf.getvalue()
    # rich's own colours and links remain; nothing of the hit's ESC, BEL, CR or U+202E does.
    text = re.sub(r"\x1b\[[0-9;]*m|\x1b\]8;[^\x1b]*\x1b\\", "", out)
    assert not {"\x1b", "\x07", "\r", "\u202e"} & set(text), ascii(text)
    assert text.splitlines()[0].startswith('"src/\\x1b]0;owned\\aevil\\n.py":17-18')
    assert "\\x1b[2J\\x1b[31m" in text and "\\u202e reversed" in text and "\\rhidden" in text
    assert len(text.rstrip("\n").splitlines()) == 1 + 3  # the location, then the snippet's 3 lines
