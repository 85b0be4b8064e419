"""The live searcher that `CodeSearch` and the server share: generations swapped under
running searches, leases, and encoders attached once and never for a lexical search."""

from __future__ import annotations

import sqlite3

import pytest
from fixtures.sample_repo import write_sample_repo

from codesearch.api import CodeSearch
from codesearch.encoder.base import Encoders
from codesearch.errors import NotIndexedError
from codesearch.search.live import LiveSearcher
from codesearch.types import default_index_dir


@pytest.fixture
def repo(tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    return root


def _add_file(root, name, body):
    (root / "src" / name).write_text(body)
    with CodeSearch(root, model=None, multi_model=None) as cs:  # another writer commits
        cs.index()


def test_a_replaced_generation_closes_when_its_last_search_returns(repo):
    attached = []
    live = LiveSearcher(default_index_dir(repo), encoders=lambda: attached.append(1) or (Encoders(), ["said"]),
                        pinned=True)
    with pytest.raises(NotIndexedError):  # pinned: nothing until the first swap
        with live.lease(lexical=True):
            pass
    live.swap(warm=False)
    with live.lease(lexical=True) as (old, notices):
        assert notices == []
        live.swap(warm=False)  # a run committed meanwhile: the next search gets the new one
        assert old.search("parseConfigFile", 1, mode="lexical").hits  # still open under its lease
        with live.lease(lexical=False) as (new, notices):
            assert new is not old and notices == ["said"]
    with pytest.raises(sqlite3.ProgrammingError):  # closed now: its store connection is gone
        old.search("parseConfigFile", 1, mode="lexical")
    assert attached == [1, 1]  # once per generation, at its swap
    live.close()


def test_a_following_searcher_moves_to_what_another_process_committed(repo):
    attached = []
    live = LiveSearcher(default_index_dir(repo), encoders=lambda: attached.append(1) or (Encoders(), []))
    with live.lease(lexical=True) as (first, _):
        assert first.search("parseConfigFile", 1, mode="lexical").hits
    assert attached == []  # a lexical search attaches nothing
    _add_file(repo, "late.py", "def arrived_later():\n    return 1\n")
    with live.lease(lexical=False) as (second, _):
        assert second is not first
        assert second.search("arrived_later", 1, mode="lexical").hits[0].path == "src/late.py"
    with live.lease(lexical=False) as (third, _):
        assert third is second  # nothing new committed: the same one, encoders attached once
    assert attached == [1]
    live.close()
