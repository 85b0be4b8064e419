"""The scripts in examples/ run as a user would run them, on a sample repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.sample_repo import write_sample_repo

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("name", ["search_api.py", "rag_retriever.py"])
def test_examples_are_short(name):
    assert len((EXAMPLES / name).read_text().splitlines()) <= 60


def test_search_api_example(tmp_path):
    repo = write_sample_repo(tmp_path / "repo")
    done = run_example("search_api.py", repo, "parseConfigFile", "--lexical")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split()[1].startswith("src/config.js:")
    assert "indexed 5 files" in done.stderr and "mode=lexical" in done.stderr


def test_rag_retriever_example(tmp_path):
    repo = write_sample_repo(tmp_path / "repo")
    done = run_example("rag_retriever.py", repo, "where is openDatabaseConnection defined", "--lexical")
    assert done.returncode == 0, done.stderr
    prompt = done.stdout
    assert prompt.startswith("Answer the question using only the code below.")
    assert "### server/main.go:" in prompt and "func openDatabaseConnection(dsn string) error" in prompt
    assert prompt.rstrip().endswith("Question: where is openDatabaseConnection defined")
    assert "LangChain sources: server/main.go:" in done.stderr
