"""Cut source files into chunks that follow the code's own structure.

The approach is that of cAST (Zhang et al., 2025): parse with tree-sitter, make each
definition (function, class, impl block, ...) a chunk, split a definition that is over the
token budget at its children's boundaries, recursively, and merge small neighbours
(imports, constants, one-line helpers) until the budget is reached. Text without a grammar
(Markdown, YAML, JSON, ...) is cut by headings and paragraphs instead.

Guarantees, relied on by the store and by every consumer of a hit:

- chunks of one file never overlap and, together, cover every non-blank line;
- ``start_line``/``end_line`` are 1-based and inclusive, and ``text`` is exactly those
  lines of the source joined by ``"\\n"`` (``"\\r"`` of CRLF files included);
- ``start_byte``/``end_byte`` index ``source.encode("utf-8")``: the file's own offsets
  whenever it is valid UTF-8 (`read_source` replaces each invalid byte by U+FFFD, which is
  three bytes long, so offsets after such a byte move; line numbers never do).

Example
-------
>>> from codesearch.indexing.chunking import chunk_source
>>> src = "import os\\n\\n\\nclass A:\\n    def f(self):\\n        return os.sep\\n"
>>> [(c.start_line, c.end_line, c.kind, c.symbol) for c in chunk_source("a.py", src, "python")]
[(1, 6, 'class', 'A')]

Modules: `grammars` (the language table), `document` (lines, costs, pieces), `tree` (the
syntax-tree splitter), `markdown`, `source` (`chunk_source`: one file), `parallel`
(`chunk_many`: a process pool).
"""

from __future__ import annotations

from codesearch.indexing.chunking.document import estimate_tokens
from codesearch.indexing.chunking.grammars import CHUNKED_LANGUAGES
from codesearch.indexing.chunking.parallel import chunk_many
from codesearch.indexing.chunking.source import CHUNKER_VERSION, chunk_source
from codesearch.types import Chunk

__all__ = [
    "CHUNKED_LANGUAGES",
    "CHUNKER_VERSION",
    "Chunk",
    "chunk_many",
    "chunk_source",
    "estimate_tokens",
]
