"""Offline, the notices after a lexical-only index say what will add the vectors there: a
plain ``codesearch index`` cannot download the default model, a local model folder can."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fixtures.sample_repo import write_sample_repo


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "codesearch.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def _offline(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "CODESEARCH_NO_DAEMON": "1",
            "CODESEARCH_CACHE_DIR": str(tmp_path / "cache")}


def _says_what_works_offline(notice: str) -> None:
    assert "--model PATH" in notice and "local model folder" in notice, notice
    assert "offline" in notice and "online" in notice, notice


def test_offline_notices_after_a_lexical_only_index_name_a_way_that_works_offline(tmp_path, single_vector_dir):
    env = _offline(tmp_path)
    repo = write_sample_repo(tmp_path / "repo")
    done = _cli(["query", "retry with backoff", "-p", str(repo)], env)  # no index yet: built lexically first
    assert done.returncode == 0, done.stderr
    first = next(line for line in done.stderr.splitlines() if "no index yet" in line)
    _says_what_works_offline(first)
    doc = json.loads(_cli(["query", "retry with backoff", "-p", str(repo), "--json"], env).stdout)
    (notice,) = [n for n in doc["notices"] if n.startswith("lexical index only")]
    _says_what_works_offline(notice)
    # And what it says works: offline, a local model folder adds the vectors.
    added = _cli(["index", str(repo), "--model", str(single_vector_dir), "--quiet"], env)
    assert added.returncode == 0, added.stderr
    doc = json.loads(_cli(["query", "retry with backoff", "-p", str(repo), "--json"], env).stdout)
    assert "dense" in doc["indexes_used"] and not [n for n in doc["notices"] if n.startswith("lexical index only")]
