"""Names as JSON shows them: two files never show the same name.

A file named ``caf``, byte E9, ``.py`` (not UTF-8) is shown ``caf\\xe9.py``; a file named
with those nine characters was shown the same, so a hit in one read as a hit in the other.
"""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from codesearch.cli.app import app
from codesearch.pathnames import text_name, valid_text

NAMES = ["caf\udce9.py", "caf\\xe9.py", "caf\\x5cxe9.py", "x\\u00e9.py", "x\udcc3\udca9.py", "a\\b.py", "plain.py",
         "caf\u00e9.py"]


def test_no_two_names_show_the_same():
    shown = [text_name(n) for n in NAMES]
    assert len(set(shown)) == len(NAMES), shown
    assert text_name("a\\b.py") == "a\\b.py" and text_name("plain.py") == "plain.py"  # a plain name is itself
    assert all(s.encode("utf-8") for s in shown)


def test_text_other_than_names_keeps_its_backslashes():
    assert valid_text('printf("\\x41\\n")') == 'printf("\\x41\\n")'
    assert valid_text("caf\udce9") == "caf\\xe9"


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="file names of any bytes")
def test_json_hits_of_two_such_files_name_each_its_own(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    for i, raw in enumerate([b"caf\xe9.py", b"caf\\xe9.py"]):
        with open(os.path.join(os.fsencode(root), raw), "wb") as fh:
            fh.write(f"def token_{i}_marker(x):\n    return x\n".encode())
    runner = CliRunner()
    assert runner.invoke(app, ["index", str(root), "--model", "none", "--multi-model", "none", "-q"]).exit_code == 0
    paths = []
    for i in range(2):
        res = runner.invoke(app, ["query", f"token_{i}_marker", "-p", str(root), "--mode", "lexical", "-k", "1",
                                  "--json", "--no-server", "--no-refresh"])
        assert res.exit_code == 0, res.output
        (hit,) = json.loads(res.stdout)["results"]
        paths.append(hit["path"])
    assert paths[0] != paths[1], paths
    assert paths[1] == "caf\\x5cxe9.py" and paths[0] == "caf\\xe9.py"
