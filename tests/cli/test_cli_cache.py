"""``codesearch cache status | prune`` on a real cache folder (the test's own, see conftest)."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from codesearch.cli.app import app
from codesearch.store.cache import UserCache, cache_folder


def _fill(n: int) -> None:
    with UserCache.open() as cache:
        for i in range(n):
            cache.put_vectors("tiny@abc", "colbert", [(f"k{i}", np.ones((500, 64), np.float32) * i)])
        cache.put_vectors("tiny@abc", "dense", [("k0", np.ones(64, np.float32))])


def test_status_shows_the_folder_the_cap_and_the_vectors_per_model():
    _fill(3)
    result = CliRunner().invoke(app, ["cache", "status", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["path"] == str(cache_folder())
    assert doc["entries"] == {"tiny@abc": {"colbert": 3, "dense": 1}}
    assert doc["live_bytes"] == 3 * 500 * 64 * 2 + 64 * 2 and doc["limit_bytes"] == 4 * 2**30
    result = CliRunner().invoke(app, ["cache", "status"])
    assert result.exit_code == 0, result.output
    assert "tiny@abc: colbert: 3, dense: 1" in result.stdout.splitlines()
    assert f"path: {cache_folder()}" in result.stdout.splitlines()


def test_prune_to_a_size_then_everything():
    _fill(20)  # 64 KB each
    result = CliRunner().invoke(app, ["cache", "prune", "--max-size", "1M", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["evicted"] > 0 and doc["disk_bytes"] <= 2**20
    result = CliRunner().invoke(app, ["cache", "prune", "--all", "--json"])
    assert result.exit_code == 0, result.output
    with UserCache.open() as cache:
        assert cache.count() == 0


def test_a_cache_turned_off_is_one_line_with_the_fix(monkeypatch):
    monkeypatch.setenv("CODESEARCH_CACHE_SIZE", "0")
    result = CliRunner().invoke(app, ["cache", "status"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "Error: the vector cache is off (CODESEARCH_CACHE_SIZE=0; unset it to turn the cache on)"
    ]


def test_a_bad_cap_in_the_environment_is_one_line(monkeypatch):
    monkeypatch.setenv("CODESEARCH_CACHE_SIZE", "lots")
    result = CliRunner().invoke(app, ["cache", "status"])
    assert result.exit_code == 1
    assert result.stderr.strip().startswith("Error: CODESEARCH_CACHE_SIZE='lots'")


def test_status_counts_the_files_whose_chunks_are_cached():
    with UserCache.open() as cache:
        cache.put_chunks([("a", b"[]"), ("b", b"[]")])
    result = CliRunner().invoke(app, ["cache", "status", "--json"])
    assert json.loads(result.stdout)["chunked_files"] == 2
    result = CliRunner().invoke(app, ["cache", "status"])
    assert "chunked files: 2" in result.stdout.splitlines()
