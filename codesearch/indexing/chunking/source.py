"""`chunk_source`: one file into chunks, by its grammar, as Markdown, or by lines; the budget
checked with the real token count; each chunk labelled (symbol, kind, scope, header)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence

from codesearch.indexing.chunking.document import Doc, Piece, estimate_tokens, line_pieces, merge
from codesearch.indexing.chunking.grammars import SPECS, LangSpec, parser_for
from codesearch.indexing.chunking.markdown import markdown_pieces
from codesearch.indexing.chunking.tree import Splitter, error_fraction
from codesearch.pathnames import quote_name
from codesearch.types import Chunk

log = logging.getLogger("codesearch.indexing.chunking")

#: Bumped when `chunk_source` cuts or labels the same text differently; an index whose
#: chunks came from another version is re-chunked on its next run (the pipeline records
#: it), so an upgrade reaches old indexes without --rebuild. 2: enclosing definition as
#: the symbol of a piece, kinds "test" and "imports".
CHUNKER_VERSION = 2

def chunk_source(
    path: str,
    text: str,
    language: str,
    *,
    max_tokens: int = 512,
    count_tokens: Callable[[str], int] | None = None,
) -> list[Chunk]:
    """Cut one file's text into chunks along its syntax.

    Parameters
    ----------
    path : str
        Path relative to the repository root (goes into each chunk and its header).
    text : str
        The file's text as `read_source` returns it (newlines untouched).
    language : str
        Name from `detect_language`. Languages in `CHUNKED_LANGUAGES` are cut along their
        syntax tree (Markdown along its headings); any other text by lines and paragraphs.
    max_tokens : int
        Budget for a chunk's `Chunk.encoder_text`, header included (by `count_tokens`'s
        measure). Only a single line longer than the budget can exceed it.
    count_tokens : callable, optional
        Token counter for a string; defaults to `estimate_tokens`. Pass the encoder's own
        count for exact budgets: it is called on a sample of the file (to scale byte counts
        to this tokenizer), on each header, and on each finished chunk; a chunk over budget
        is cut again by lines with real counts.

    Returns
    -------
    list[Chunk]
        In file order, non-overlapping, covering every non-blank line; empty for a blank
        file.

    Examples
    --------
    >>> src = "# Title\\n\\nIntro.\\n\\n## Usage\\n\\nRun it.\\n"
    >>> [(c.kind, c.symbol, c.start_line, c.end_line) for c in chunk_source("R.md", src, "markdown")]
    [('block', 'Title, Usage', 1, 7)]
    """
    if not text.strip():
        return []
    doc = Doc(text, count_tokens)
    count = count_tokens or estimate_tokens
    budgets: dict[tuple, int] = {}

    def budget(scope: tuple) -> int:
        # The header (path and enclosing signatures) shares the encoder's window with the
        # code, so each scope gets what its header leaves (2 tokens for joins and newline).
        if scope not in budgets:
            header = _header(path, scope)
            budgets[scope] = max(8, max_tokens - count(header) - 2)
        return budgets[scope]

    pieces = None
    spec = SPECS.get(language)
    if spec is not None:
        pieces = _tree_pieces(doc, spec, budget, path)
    elif language == "markdown":
        pieces = markdown_pieces(doc, budget)
    if pieces is None:
        pieces = merge(line_pieces(doc, 0, doc.last, budget(()), (), "text"), budget)
    if count_tokens is not None:
        pieces = _enforce_budget(doc, pieces, budget, path, max_tokens, count_tokens)
    return _to_chunks(doc, pieces, path, language)


def _header(path: str, scope: tuple) -> str:
    return " > ".join([path, *(sig for _, sig in scope)])


def _tree_pieces(
    doc: Doc, spec: LangSpec, budget: Callable[[tuple], int], path: str
) -> list[Piece] | None:
    parser = parser_for(spec.grammar)
    if parser is None:
        return None
    try:
        tree = parser.parse(doc.data)
    except Exception as exc:  # noqa: BLE001  # pragma: no cover - tree-sitter raises only on internal errors
        log.warning("tree-sitter failed on %s (%s); chunking by lines", quote_name(path), exc)
        return None
    root = tree.root_node
    if error_fraction(root, len(doc.data)) > 0.3:
        log.debug("%s does not parse as %s; chunking by lines", path, spec.grammar)
        return None
    try:
        return Splitter(doc, spec, budget).split(root, 0, doc.last, ())
    except RecursionError:  # pragma: no cover - MAX_DEPTH keeps well below the limit
        log.warning("%s nests too deeply to split along its syntax; chunking by lines", quote_name(path))
        return None


def _trim(doc: Doc, start: int, end: int) -> tuple[int, int]:
    """The row range without its leading and trailing blank lines (start > end if blank)."""
    lines = doc.lines
    while start <= end and not lines[start].strip():
        start += 1
    while end >= start and not lines[end].strip():
        end -= 1
    return start, end


def _enforce_budget(
    doc: Doc,
    pieces: list[Piece],
    budget: Callable[[tuple], int],
    path: str,
    max_tokens: int,
    count: Callable[[str], int],
) -> list[Piece]:
    """Check each piece with the caller's real count; cut the few that are over, by lines."""
    out: list[Piece] = []
    for p in pieces:
        start, end = _trim(doc, p.start, p.end)
        if start >= end:
            out.append(p)
            continue
        text = "\n".join(doc.lines[start : end + 1])
        if count(_header(path, p.scope) + "\n" + text) <= max_tokens:
            out.append(p)
            continue
        doc.counting = True
        try:
            parts = line_pieces(doc, start, end, budget(p.scope), p.scope, p.base)
        finally:
            doc.counting = False
        parts[0].defs, parts[0].primary = p.defs, p.primary  # the head keeps the label
        for part in parts[1:]:  # the rest are pieces of what the head defines
            part.owner = p.label()[1] or p.owner
        out.extend(parts)
    return out


# Lines of an import-only chunk. An import chunk only says which names a file uses; that
# is already in the chunks that use them, so on its own it is rarely what a search is
# after (two of four RAG context chunks were import blocks in a trial on fd and uvicorn).
# Kept narrow: a re-export (`export * from`, `pub use`, Python's `import X as X`) or a
# module declaration is part of a module's public shape and is not matched.
_IMPORT_LINE = re.compile(
    r"(?:from\s+[\w.]+\s+)?import\b(?!\()"  # Python, JS/TS, Java, Kotlin, Scala, Go, Swift, Haskell
    r"|(?:using|use)\s+(?:static\s+)?[\w.:\\*]+(?:(?:::|\\)\{|\s*=|\s*;|\s*$|\s+as\b|,)"  # C#, Rust, PHP, Elixir
    r"|extern\s+crate\b"
    r"|#\s*(?:include|import)\b"  # C, C++, Objective-C
    r"|(?:alias|require)\s+[A-Z][\w.]*"  # Elixir
    r"|require(?:_relative)?\s*\(?\s*[\"']"  # Ruby, Lua
    r"|(?:(?:local|const|let|var)\s+)?[\w{}\s,]+=\s*(?:require\s*\(?\s*[\"']|@import\()"  # Lua, JS, Zig
    r"|const\s+\w+\s*=\s*std(?:\.\w+)*;"  # Zig: a name from the standard library
)
_PY_REEXPORT = re.compile(r"\bimport\s+(\w+)\s+as\s+\1\b")
# Lines that may surround imports without making the chunk about something else.
_HEADER_LINE = re.compile(
    r"package\s+[\w.]+;?$|namespace\s+[\w.\\]+;$|<\?php|declare\s*\(\s*strict_types"
    r"|#\s*pragma\s+once|[\"']use strict[\"'];?$|@file:|#!"
    r"|#\s*(?:ifndef|define)\s+\w+$|#\s*endif\b"  # an include guard
    r"|//|/\*|\*|--|;"  # comments (C-like, Lua/Haskell, Lisp), and Python/Ruby/shell ones:
    r"|#(?![\[!]|\s*(?:define|undef|if|ifdef|ifndef|elif|else|error|warning|line)\b)"
)


def imports_only(text: str) -> bool:
    """Whether every line is an import (or its continuation), a package line, a comment or blank,
    with at least one import."""
    imports = depth = 0
    for raw in text.split("\n"):
        line = raw.strip()
        if "import" in line and _PY_REEXPORT.search(line):  # (the search only where it can match)
            return False
        if depth > 0 or _IMPORT_LINE.match(line):
            # A multi-line import (`from x import (`, `import (`, `use a::{`) runs until its
            # brackets close.
            depth = max(0, depth + line.count("(") + line.count("{") - line.count(")") - line.count("}"))
            imports += 1
        elif line and not _HEADER_LINE.match(line):
            return False
    return imports > 0


def _is_test_code(p: Piece) -> bool:
    """Inside a test definition, or made of test definitions only."""
    if any(kind == "test" for kind, _ in p.scope):
        return True
    return bool(p.defs) and all(kind == "test" for kind, _ in p.defs)


def _to_chunks(doc: Doc, pieces: Sequence[Piece], path: str, language: str) -> list[Chunk]:
    chunks: list[Chunk] = []
    lines, offsets = doc.lines, doc.line_bytes
    for p in pieces:
        start, end = _trim(doc, p.start, p.end)
        if start > end:
            continue
        kind, symbol = p.label()
        if _is_test_code(p):
            kind = "test"
        text = "\n".join(lines[start : end + 1])
        if not p.defs and imports_only(text):
            kind = "imports"
        scope = " > ".join(sig for _, sig in p.scope) or None
        chunks.append(Chunk(
            path=path,
            start_line=start + 1,
            end_line=end + 1,
            start_byte=offsets[start],
            end_byte=offsets[end + 1] - 1,
            language=language,
            symbol=symbol,
            kind=kind,
            scope=scope,
            text=text,
            header=_header(path, p.scope),
        ))
    return chunks
