"""Hostile file names: bytes that are not UTF-8, newlines, tabs, ESC, CR, backslashes, a
leading dash, very long names, both Unicode normalisation forms, ``..``, spaces, quotes,
glob metacharacters, the Unicode line separator and a bidirectional override.

Each such file is indexed under its own name (the store keeps the bytes whole, so the
file is read again by that name: refresh, ``--context``), is found by a search, and is
printed safely: one line per hit in plain output, no control character reaching the
terminal (names are quoted as git quotes them), valid UTF-8 JSON. Never a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import unicodedata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codesearch.api import CodeSearch
from codesearch.cli.app import app
from codesearch.pathnames import escape_controls, quote_name, text_name

LEXICAL = ["--model", "none", "--multi-model", "none"]

#: name (bytes, as the file system holds it) -> why it is hostile
NAMES: dict[bytes, str] = {
    b"caf\xe9.py": "latin-1 byte, not UTF-8",
    b"\xff\xfe\xfd.py": "bytes that are never UTF-8",
    b"new\nline.py": "newline",
    b"tab\there.py": "tab",
    b"esc\x1b[31mred\x1b[0m.py": "ESC: a terminal colour sequence",
    b"carriage\rreturn.py": "carriage return",
    b"bell\x07del\x7f.py": "BEL and DEL",
    b"c1\xc2\x85nel.py": "U+0085 (NEL), a C1 control",
    "sep\u2028arator.py".encode(): "U+2028 line separator",
    "bidi\u202eyp.evil.py".encode(): "right-to-left override",
    b"back\\slash.py": "backslash",
    b"-leading-dash.py": "leading dash",
    b"--help.py": "an option's name",
    b"l" * 240 + b".py": "243 bytes long",
    "caf\u00e9_nfc.py".encode(): "NFC",
    unicodedata.normalize("NFD", "cafe\u0301_nfd.py").encode(): "NFD",
    b"a..b.py": "two dots",
    b"..leading_dots.py": "leading dots",
    b"with space .py": "spaces",
    b"double\"quote.py": "double quote",
    b"single'quote.py": "single quote",
    b"star*.py": "glob star",
    b"question?.py": "glob question mark",
    b"[bracket].py": "glob class",
    b"{brace,s}.py": "glob alternation",
    "emoji\U0001f600.py".encode(): "astral plane",
    b"dir\nwith\x1bodd/inner.py": "a folder with a newline and ESC",
}


def token(i: int) -> str:
    return f"hostile_token_{i:02d}"


def write_repo(root: Path, *, git: bool) -> dict[str, str]:
    """The hostile files, each defining its own token; returns token -> name (str, as os gives it)."""
    root.mkdir(parents=True)
    names = {}
    for i, raw in enumerate(NAMES):
        path = os.path.join(os.fsencode(root), raw)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        body = "".join(f"    step_{j} = x + {j}\n" for j in range(80))  # a chunk per function
        with open(path, "wb") as fh:
            fh.write(f"def {token(i)}(x):\n{body}    return x\n\n\ndef other_{i}(y):\n{body}    return y\n".encode())
        names[token(i)] = os.fsdecode(raw)
    if git:
        if shutil.which("git") is None:  # pragma: no cover - git is part of the dev setup
            pytest.skip("git is not installed")
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                       check=True)
    return names


def cli(*argv):
    result = CliRunner().invoke(app, [str(a) for a in argv])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def assert_printable(text: str) -> None:
    """No character a terminal acts on, besides the line breaks of the output itself."""
    assert escape_controls(text.replace("\n", "")) == text.replace("\n", ""), ascii(text)


@pytest.fixture(scope="module", params=["files", "git"])
def indexed(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param) / "repo"
    names = write_repo(root, git=request.param == "git")
    result = cli("index", root, *LEXICAL)
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert_printable(result.stderr)
    return root, names


def test_every_hostile_name_is_indexed_under_its_own_name(indexed):
    root, names = indexed
    with CodeSearch(root, model=None, multi_model=None) as cs:
        assert cs.status().files == len(NAMES)
        for tok, name in names.items():
            hit = cs.query(tok, 1, mode="lexical").hits[0]
            assert hit.path == name, (tok, ascii(hit.path), ascii(name))
            assert tok in hit.text
            # The name is lossless: the file opens by it.
            assert (root / hit.path).read_bytes().startswith(f"def {tok}(x):".encode())


def test_json_output_is_valid_utf8_and_names_each_file(indexed):
    root, names = indexed
    for tok, name in names.items():
        result = cli("query", tok, "-p", root, "--mode", "lexical", "-k", "1", "--json", "--no-server", "--no-refresh")
        assert result.exit_code == 0, result.stderr
        result.stdout_bytes.decode("utf-8")  # strict
        (hit,) = json.loads(result.stdout)["results"]
        assert hit["path"] == text_name(name)
        lines = cli("query", tok, "-p", root, "--mode", "lexical", "-k", "1", "--jsonl", "--no-server",
                    "--no-refresh").stdout_bytes.decode("utf-8").split("\n")
        assert lines.pop() == ""
        assert len(lines) == 1 and json.loads(lines[0])["path"] == text_name(name)
        # No raw U+2028, U+2029 or U+0085 either: a line reader (str.splitlines) splits there.
        assert not {"\u2028", "\u2029", "\x85"} & set(lines[0] + result.stdout)


@pytest.mark.parametrize("extra", [["--no-snippet"], ["--files-only"]])
def test_plain_output_is_one_line_per_hit_with_no_control_character(indexed, extra):
    root, names = indexed
    by_text = {text_name(name): name for name in names.values()}
    argv = ["query", "hostile_token", "-p", root, "--mode", "lexical", "-k", len(NAMES) + 10, "--no-server",
            "--no-refresh", *extra]
    result = cli(*argv)
    assert result.exit_code == 0, result.stderr
    hits = json.loads(cli(*argv, "--json").stdout)["results"]
    lines = result.stdout.split("\n")
    assert lines.pop() == "" and len(lines) == len(hits) > 0
    assert_printable(result.stdout)
    for line, hit in zip(lines, hits):
        shown = quote_name(by_text[hit["path"]])
        assert line == shown if extra == ["--files-only"] else line.startswith(f"{shown}:{hit['start_line']}-")


def test_plain_snippets_show_each_quoted_name_once(indexed):
    root, names = indexed
    for tok, name in names.items():
        result = cli("query", tok, "-p", root, "--mode", "lexical", "-k", "1", "--no-server", "--no-refresh")
        assert result.exit_code == 0, result.stderr
        first = result.stdout.splitlines()[0]
        assert first.startswith(quote_name(name) + ":"), (ascii(first), ascii(quote_name(name)))
        assert_printable(first)


def test_context_reads_each_file_back_by_its_name(indexed):
    root, names = indexed
    with CodeSearch(root, model=None, multi_model=None) as cs:
        for tok, name in names.items():
            plain = cs.query(tok, 1, mode="lexical").hits[0]
            wide = cs.query(tok, 1, mode="lexical", context=3).hits[0]
            assert (wide.path, wide.start_line, wide.end_line) == (name, 1, plain.end_line + 3), ascii(name)


def test_a_changed_hostile_file_is_refreshed_by_a_query(tmp_path):
    root = tmp_path / "repo"
    names = write_repo(root, git=False)
    assert cli("index", root, *LEXICAL, "-q").exit_code == 0
    with CodeSearch(root, model=None, multi_model=None) as cs:
        for i, name in enumerate(list(names.values())[:8]):
            (root / name).write_text(f"def refreshed_{i}(x):\n    return x\n")
        for i, name in enumerate(list(names.values())[:8]):
            result = cs.query(f"refreshed_{i}", 1, mode="lexical", refresh=True)
            assert result.hits[0].path == name
        assert cs.status().stale == {"added": 0, "changed": 0, "removed": 0}


def test_status_and_errors_print_a_hostile_root_on_one_line(tmp_path):
    root = Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), b"root\n\x1b[2J\xe9")))
    root.mkdir()
    (root / "a.py").write_text("def ok():\n    pass\n")
    summary = cli("index", root, *LEXICAL)
    assert summary.exit_code == 0 and summary.stdout == ""
    assert_printable(summary.stderr)
    status = cli("status", root)
    assert status.exit_code == 0
    assert_printable(status.stdout)
    assert status.stdout.splitlines()[0] == f"root: {quote_name(str(root))}"
    as_json = cli("status", root, "--json")
    assert json.loads(as_json.stdout_bytes.decode("utf-8"))["root"] == text_name(str(root))
    missing = cli("index", root / "no\nsuch\x1bfolder", *LEXICAL)
    assert missing.exit_code == 1
    (line,) = missing.stderr.strip().split("\n")
    assert line.startswith("Error: ") and "\x1b" not in line
