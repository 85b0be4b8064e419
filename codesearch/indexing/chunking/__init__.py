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
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import os
import pickle
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate

from codesearch.pathnames import quote_name
from codesearch.types import Chunk

__all__ = [
    "CHUNKED_LANGUAGES",
    "CHUNKER_VERSION",
    "Chunk",
    "chunk_many",
    "chunk_source",
    "estimate_tokens",
]

log = logging.getLogger(__name__)

#: Bumped when `chunk_source` cuts or labels the same text differently; an index whose
#: chunks came from another version is re-chunked on its next run (the pipeline records
#: it), so an upgrade reaches old indexes without --rebuild. 2: enclosing definition as
#: the symbol of a piece, kinds "test" and "imports" (issue 11).
CHUNKER_VERSION = 2




# --------------------------------------------------------------------------- token budget

# Code runs at about 3.3-4 characters per BPE token; 3 bytes per token errs on the side of
# chunks a little smaller than the budget rather than chunks the encoder truncates.
_BYTES_PER_TOKEN = 3.0
# Bytes of a file tokenized to scale byte counts to a caller's own tokenizer.
_SAMPLE_BYTES = 8192


def estimate_tokens(text: str) -> int:
    """Fast, conservative token count: UTF-8 bytes / 3, rounded up.

    Real BPE tokenizers give fewer tokens for typical code, so a chunk sized with this
    estimate fits the model's window.

    >>> estimate_tokens("def f(x):\\n    return x\\n")
    8
    """
    return -(-len(text.encode("utf-8", errors="surrogatepass")) // 3)


# --------------------------------------------------------------------------- languages

# Kinds that make a function inside them a method.
_CLASSLIKE = frozenset({
    "class", "struct", "impl", "trait", "interface", "object", "protocol", "record", "enum",
    "extension", "actor",
})

_JS_DEFS = {
    "function_declaration": "function",
    "generator_function_declaration": "function",
    "class_declaration": "class",
    "abstract_class_declaration": "class",
    "method_definition": "method",
    "interface_declaration": "interface",
    "type_alias_declaration": "type",
    "enum_declaration": "enum",
    "internal_module": "module",
    "module": "module",
    "lexical_declaration": "?js_var",
    "variable_declaration": "?js_var",
}
_C_DEFS = {
    "function_definition": "function",
    "struct_specifier": "?c_struct",
    "union_specifier": "?c_struct",
    "enum_specifier": "?c_struct",
    "type_definition": "type",
}
_CPP_DEFS = {
    **_C_DEFS,
    "class_specifier": "?c_struct",
    "namespace_definition": "module",
    "concept_definition": "type",
}
_CSHARP_DEFS = {
    "class_declaration": "class",
    "struct_declaration": "struct",
    "interface_declaration": "interface",
    "enum_declaration": "enum",
    "record_declaration": "record",
    "record_struct_declaration": "record",
    "namespace_declaration": "module",
    "file_scoped_namespace_declaration": "module",
    "method_declaration": "method",
    "constructor_declaration": "method",
    "destructor_declaration": "method",
    "operator_declaration": "method",
    "local_function_statement": "function",
}


@dataclass(frozen=True)
class _LangSpec:
    grammar: str
    defs: dict  # node type -> kind, or "?hook" for a type that needs a closer look
    wrappers: frozenset = frozenset()  # nodes that wrap one definition (decorators, export)
    trivia: frozenset = frozenset()  # non-comment nodes that attach to what follows


_SPECS: dict[str, _LangSpec] = {
    "python": _LangSpec(
        "python",
        {"function_definition": "function", "class_definition": "class"},
        wrappers=frozenset({"decorated_definition"}),
    ),
    "javascript": _LangSpec("javascript", _JS_DEFS, wrappers=frozenset({"export_statement"})),
    "typescript": _LangSpec(
        "typescript", _JS_DEFS, wrappers=frozenset({"export_statement", "expression_statement"})
    ),
    "tsx": _LangSpec(
        "tsx", _JS_DEFS, wrappers=frozenset({"export_statement", "expression_statement"})
    ),
    "go": _LangSpec(
        "go",
        {
            "function_declaration": "function",
            "method_declaration": "method",
            "type_declaration": "?go_type",
        },
    ),
    "rust": _LangSpec(
        "rust",
        {
            "function_item": "function",
            "struct_item": "struct",
            "union_item": "struct",
            "enum_item": "enum",
            "trait_item": "trait",
            "impl_item": "impl",
            "mod_item": "module",
            "macro_definition": "macro",
        },
        trivia=frozenset({"attribute_item", "inner_attribute_item"}),
    ),
    "java": _LangSpec(
        "java",
        {
            "class_declaration": "class",
            "interface_declaration": "interface",
            "enum_declaration": "enum",
            "record_declaration": "record",
            "annotation_type_declaration": "interface",
            "method_declaration": "method",
            "constructor_declaration": "method",
        },
    ),
    "kotlin": _LangSpec(
        "kotlin",
        {
            "class_declaration": "?kotlin_class",
            "object_declaration": "object",
            "companion_object": "object",
            "function_declaration": "function",
        },
    ),
    "scala": _LangSpec(
        "scala",
        {
            "class_definition": "class",
            "object_definition": "object",
            "trait_definition": "trait",
            "enum_definition": "enum",
            "function_definition": "function",
        },
    ),
    "swift": _LangSpec(
        "swift",
        {
            "class_declaration": "?swift_class",
            "protocol_declaration": "protocol",
            "function_declaration": "function",
            "init_declaration": "method",
        },
    ),
    "c": _LangSpec("c", _C_DEFS),
    "cpp": _LangSpec("cpp", _CPP_DEFS, wrappers=frozenset({"template_declaration"})),
    "csharp": _LangSpec("csharp", _CSHARP_DEFS),
    "php": _LangSpec(
        "php",
        {
            "class_declaration": "class",
            "interface_declaration": "interface",
            "trait_declaration": "trait",
            "enum_declaration": "enum",
            "function_definition": "function",
            "method_declaration": "method",
            "namespace_definition": "module",
        },
    ),
    "ruby": _LangSpec(
        "ruby",
        {
            "class": "class",
            "module": "module",
            "singleton_class": "class",
            "method": "function",
            "singleton_method": "method",
        },
    ),
    "elixir": _LangSpec("elixir", {"call": "?elixir_call"}),
    "haskell": _LangSpec(
        "haskell",
        {
            "function": "function",
            "bind": "function",
            "data_type": "type",
            "newtype": "type",
            "type_synomym": "type",
            "type_family": "type",
            "class": "class",
            "instance": "impl",
        },
        # A type signature belongs with the equations that follow it.
        trivia=frozenset({"signature"}),
    ),
    "lua": _LangSpec("lua", {"function_declaration": "function"}),
    "zig": _LangSpec("zig", {"Decl": "?zig_decl", "TestDecl": "?zig_test"}),
    "bash": _LangSpec("bash", {"function_definition": "function"}),
}
_SPECS["starlark"] = _SPECS["python"]
_SPECS["cython"] = _SPECS["python"]

#: Languages chunked along their syntax tree (everything else goes by lines/paragraphs).
CHUNKED_LANGUAGES = frozenset(_SPECS) | {"markdown"}

_NAME_TYPES = frozenset({
    "identifier", "type_identifier", "simple_identifier", "constant", "name", "word",
    "field_identifier", "property_identifier", "IDENTIFIER", "namespace_identifier",
    "scoped_identifier", "qualified_identifier", "variable", "alias",
})
_ELIXIR_DEFS = {
    "defmodule": "module", "defprotocol": "protocol", "defimpl": "impl",
    "def": "function", "defp": "function", "defmacro": "macro", "defmacrop": "macro",
    "defguard": "function", "defguardp": "function", "defdelegate": "function",
    "defn": "function", "defnp": "function",
}
# A Rust attribute that makes the item after it test code: `#[test]`, `#[tokio::test]`,
# `#[cfg(test)]`, `#[cfg(all(test, unix))]`; not `#[cfg(not(test))]` nor a feature named
# "test-utils".
_RUST_TEST_ATTR = re.compile(
    r"#\[\s*(?:(?:\w+::)*test\s*\]|cfg\s*\((?!\s*not\b).*(?<![\w\"-])test(?![\w\"-]))"
)
_ZIG_CONTAINER = re.compile(rb"=\s*(?:extern\s+|packed\s+)?(struct|enum|union|opaque)\b")

_local = threading.local()


def _parser(grammar: str):
    """One cached parser per grammar and thread (tree-sitter parsers are not thread-safe)."""
    cache = getattr(_local, "parsers", None)
    if cache is None:
        cache = _local.parsers = {}
    if grammar not in cache:
        try:
            from tree_sitter_language_pack import get_parser

            cache[grammar] = get_parser(grammar)
        except Exception as exc:  # noqa: BLE001 - a grammar missing from the wheel: fall back to lines
            log.warning("No tree-sitter grammar for %r (%s); chunking by lines", grammar, exc)
            cache[grammar] = None
    return cache[grammar]


# --------------------------------------------------------------------------- the document


class _Doc:
    """The source split into lines, with byte offsets and a token cost for any line range.

    Costs come from byte counts (O(1) per range) scaled to the caller's tokenizer: with a
    real `count_tokens`, the scale is measured once per file on a sample. Chunks built from
    these costs are then checked with the real count, and only a chunk that is over budget
    is cut again, line by line, in `counting` mode (real counts of each candidate run).
    """

    __slots__ = (
        "_count",
        "_memo",
        "_overhead",
        "counting",
        "data",
        "last",
        "line_bytes",
        "lines",
        "scale",
    )

    def __init__(self, text: str, count_tokens: Callable[[str], int] | None):
        self.lines = text.split("\n")
        self.data = text.encode("utf-8", errors="surrogatepass")
        # line i spans bytes [line_bytes[i], line_bytes[i + 1] - 1)
        self.line_bytes = [0, *accumulate(len(raw) + 1 for raw in self.data.split(b"\n"))]
        self._count = count_tokens
        self._memo: dict[tuple[int, int], int] = {}
        self._overhead = 0
        self.scale = 1.0 / _BYTES_PER_TOKEN
        self.counting = False
        self.last = len(self.lines) - 1
        if count_tokens is not None:
            self._overhead = count_tokens("")  # special tokens the counter adds
            sample = self.data[:_SAMPLE_BYTES].decode("utf-8", errors="ignore")
            real = count_tokens(sample) - self._overhead
            # A file denser than its sample (a license header, then code) makes some chunks
            # too big for the real count: the check after chunking cuts those again.
            self.scale = max(real, 1) / max(len(sample.encode("utf-8", "surrogatepass")), 1)

    def grow(self, total: int, lo: int, row: int) -> int:
        """Cost of lines lo..row given `total`, the cost of lo..row-1.

        In `counting` mode this sums per-line counts (each line tokenized once) instead of
        re-tokenizing the growing run; the caller checks the final run exactly.
        """
        if not self.counting:
            return self.cost(lo, row)
        return total + self.cost(row, row) - self._overhead + 1  # + the newline

    def cost(self, lo: int, hi: int) -> int:
        """Tokens of lines lo..hi (0-based, inclusive)."""
        if not self.counting:
            return int(-(-(self.line_bytes[hi + 1] - self.line_bytes[lo]) * self.scale // 1))
        key = (lo, hi)
        if key not in self._memo:
            self._memo[key] = self._count("\n".join(self.lines[lo : hi + 1]))
        return self._memo[key]

    def blank(self, row: int) -> bool:
        return not self.lines[row].strip()

    def node_text(self, node) -> str:
        return self.data[node.start_byte : node.end_byte].decode("utf-8", errors="replace")


@dataclass(slots=True)
class _Piece:
    start: int  # 0-based row, inclusive
    end: int  # 0-based row, inclusive
    cost: int
    scope: tuple  # ((kind, signature), ...) outermost first
    defs: list  # [(kind, name)] of the definitions inside
    base: str = "block"  # kind when it defines nothing
    primary: tuple | None = None  # the definition whose header this piece holds
    # Name of the innermost definition this piece was cut from: the label of a piece that
    # defines nothing itself (the middle of a long function), so a hit says what it is
    # part of instead of `symbol: null`.
    owner: str | None = None

    def label(self) -> tuple[str, str | None]:
        if self.primary is not None and len(self.defs) <= 1:
            return self.primary
        if len(set(self.defs)) == 1:  # one definition (Haskell: several equations of it)
            return self.defs[0]
        if self.defs:
            names = dict.fromkeys(name for _, name in self.defs if name)
            return "block", ", ".join(names) or self.owner
        return self.base, self.owner


def _merge(
    pieces: list[_Piece], budget: Callable[[tuple], int], nested: bool = False
) -> list[_Piece]:
    """Greedily join neighbours of the same scope while the sum stays within budget.

    With `nested`, a piece also joins a previous one whose scope encloses its own (a
    Markdown section followed by its subsections); the group keeps the outer scope.
    """
    out: list[_Piece] = []
    for p in pieces:
        prev = out[-1] if out else None
        same = prev is not None and (
            prev.scope == p.scope or (nested and p.scope[: len(prev.scope)] == prev.scope)
        )
        if same and prev.cost + p.cost <= budget(prev.scope):
            primary = None
            if prev.primary is not None and not p.defs:
                primary = prev.primary
            elif p.primary is not None and not prev.defs:
                primary = p.primary
            # In place: pieces handed to _merge belong to it (fewer objects on big files).
            prev.end = p.end
            prev.cost += p.cost
            prev.defs = prev.defs + p.defs
            prev.base = prev.base if prev.base == p.base else "block"
            prev.primary = primary
            prev.owner = prev.owner or p.owner
        else:
            out.append(p)
    return out


def _line_pieces(doc: _Doc, lo: int, hi: int, budget: int, scope: tuple, base: str) -> list[_Piece]:
    """Cut lines lo..hi into runs within budget, preferring to cut at blank lines."""
    pieces: list[_Piece] = []
    start = lo
    while start <= hi:
        end = start
        total = doc.cost(start, start)
        last_blank = -1
        while end < hi:
            grown = doc.grow(total, start, end + 1)
            if grown > budget:
                break
            end, total = end + 1, grown
            if doc.blank(end):
                last_blank = end
        # A cut at a paragraph break in the second half of the run reads better than a cut
        # in the middle of a paragraph.
        if end < hi and last_blank > start + (end - start) // 2:
            end = last_blank
        while end > start and doc.counting and doc.cost(start, end) > budget:
            end -= 1  # the per-line sum underestimated a real tokenizer's count
        pieces.append(_Piece(start, end, doc.cost(start, end), scope, [], base))
        start = end + 1
    return pieces


# --------------------------------------------------------------------------- tree splitting


_MAX_DEPTH = 150  # split() recursion depth; two Python frames per level


def _end_row(node) -> int:
    row, col = node.end_point
    # A node that ends with its newline (Rust doc comments, preprocessor lines) ends at
    # column 0 of the next row; that row holds none of it.
    if col == 0 and row > node.start_point[0]:
        return row - 1
    return row


class _Splitter:
    def __init__(self, doc: _Doc, spec: _LangSpec, budget: Callable[[tuple], int]):
        self.doc = doc
        self.spec = spec
        self.budget = budget

    # -- what a node defines

    def describe(self, node, scope: tuple):
        """(kind, name, signature, defining node) when `node` is a definition, else None."""
        inner = node
        if node.type in self.spec.wrappers:
            inner = next(
                (c for c in node.named_children if c.type in self.spec.defs
                 or c.type in self.spec.wrappers), None,
            )
            if inner is None:
                return None
            if inner.type in self.spec.wrappers:
                found = self.describe(inner, scope)
                return found
        kind = self.spec.defs.get(inner.type)
        if kind is None:
            return None
        name = None
        if kind.startswith("?"):
            found = getattr(self, "_hook_" + kind[1:])(inner)
            if found is None:
                return None
            kind, name = found
        if name is None:
            name = self._name(inner)
        if kind == "function" and scope and scope[-1][0] in _CLASSLIKE:
            kind = "method"
        if "attribute_item" in self.spec.trivia and self._test_attribute(node):
            kind = "test"
        return kind, name, self._signature(inner), inner

    def _test_attribute(self, node) -> bool:
        """Whether a Rust attribute above `node` marks it as test code."""
        prev = node.prev_named_sibling
        while prev is not None and (prev.type == "attribute_item" or "comment" in prev.type):
            if prev.type == "attribute_item" and _RUST_TEST_ATTR.match(self.doc.node_text(prev)):
                return True
            prev = prev.prev_named_sibling
        return False

    def _name(self, node) -> str | None:
        named = node.child_by_field_name("name")
        if named is None and node.type == "impl_item":
            trait, typ = node.child_by_field_name("trait"), node.child_by_field_name("type")
            if typ is not None:
                own = self.doc.node_text(typ)
                return f"{self.doc.node_text(trait)} for {own}" if trait is not None else own
        if named is None:
            # C/C++: the name sits at the bottom of a declarator chain.
            decl = node.child_by_field_name("declarator")
            while decl is not None and decl.child_by_field_name("declarator") is not None:
                decl = decl.child_by_field_name("declarator")
            named = decl
        if named is None:
            named = next((c for c in node.named_children if c.type in _NAME_TYPES), None)
        if named is None:
            return None
        return " ".join(self.doc.node_text(named).split())[:120] or None

    def _signature(self, node) -> str:
        """The definition's header: from its start to its body, on one line."""
        doc = self.doc
        body = node.child_by_field_name("body")
        start_row = node.start_point[0]
        if body is not None and body.start_point[0] - start_row <= 6:
            # Up to the body, leaving out comments between the header and the body.
            end = node.start_byte
            for child in node.children:
                if child.start_byte >= body.start_byte:
                    break
                if "comment" not in child.type:
                    end = child.end_byte
            raw = doc.data[node.start_byte : end].decode("utf-8", errors="replace")
        else:
            raw = doc.lines[start_row]
        sig = " ".join(raw.split())
        sig = sig.removesuffix("{").removesuffix(" do").rstrip()
        return sig[:160]

    # hooks for node types whose kind depends on what is inside

    def _hook_js_var(self, node):
        # `const f = () => {}` and `const C = class {}` define a function / class.
        decls = [c for c in node.named_children if c.type == "variable_declarator"]
        if len(decls) != 1:
            return None
        value = decls[0].child_by_field_name("value")
        if value is None:
            return None
        kinds = {
            "arrow_function": "function", "function": "function",
            "function_expression": "function", "generator_function": "function",
            "class": "class",
        }
        if value.type not in kinds:
            return None
        name = decls[0].child_by_field_name("name")
        return kinds[value.type], self.doc.node_text(name) if name is not None else None

    def _hook_c_struct(self, node):
        # `struct node *p;` mentions a struct; only a body defines one.
        if node.child_by_field_name("body") is None:
            return None
        kind = {"class_specifier": "class", "enum_specifier": "enum"}.get(node.type, "struct")
        return kind, None

    def _hook_go_type(self, node):
        spec = next((c for c in node.named_children if c.type in {"type_spec", "type_alias"}),
                    None)
        if spec is None:
            return None
        typ = spec.child_by_field_name("type")
        kind = {"struct_type": "struct", "interface_type": "interface"}.get(
            typ.type if typ is not None else "", "type")
        name = spec.child_by_field_name("name")
        return kind, self.doc.node_text(name) if name is not None else None

    def _hook_kotlin_class(self, node):
        for c in node.children:
            if c.type in {"class", "interface"}:
                kind = c.type
                break
        else:
            kind = "class"
        mods = next((c for c in node.named_children if c.type == "modifiers"), None)
        if mods is not None and "enum" in self.doc.node_text(mods).split():
            kind = "enum"
        return kind, None

    def _hook_swift_class(self, node):
        decl = node.child_by_field_name("declaration_kind")
        kind = self.doc.node_text(decl) if decl is not None else "class"
        return kind, None

    def _hook_elixir_call(self, node):
        target = node.child_by_field_name("target")
        if target is None or target.type != "identifier":
            return None
        kind = _ELIXIR_DEFS.get(self.doc.node_text(target))
        if kind is None:
            return None
        args = next((c for c in node.named_children if c.type == "arguments"), None)
        head = args.named_children[0] if args is not None and args.named_children else None
        while head is not None and head.type in {"call", "binary_operator"}:
            # `sum(a, b)` -> its target; `sum(a) when a > 0` -> the left side
            head = head.child_by_field_name("target") or head.child_by_field_name("left")
        return kind, self.doc.node_text(head) if head is not None else None

    def _hook_zig_decl(self, node):
        proto = next((c for c in node.named_children if c.type == "FnProto"), None)
        if proto is not None:
            name = next((c for c in proto.named_children if c.type == "IDENTIFIER"), None)
            return "function", self.doc.node_text(name) if name is not None else None
        var = next((c for c in node.named_children if c.type == "VarDecl"), None)
        if var is None:
            return None
        head = self.doc.data[var.start_byte : min(var.end_byte, var.start_byte + 200)]
        m = _ZIG_CONTAINER.search(head)
        if m is None:
            return None
        name = next((c for c in var.named_children if c.type == "IDENTIFIER"), None)
        return m.group(1).decode(), self.doc.node_text(name) if name is not None else None

    def _hook_zig_test(self, node):
        label = next((c for c in node.named_children if c.type.startswith("STRINGLITERAL")
                      or c.type == "IDENTIFIER"), None)
        return "test", self.doc.node_text(label).strip('"') if label is not None else None

    # -- splitting

    def split(self, node, lo: int, hi: int, scope: tuple, depth: int = 0) -> list[_Piece]:
        """Pieces covering rows lo..hi, which hold `node`'s children, each within budget."""
        doc, spec = self.doc, self.spec
        if depth > _MAX_DEPTH:
            # Left-nested syntax (a 2,000-link method chain) nests one level per line;
            # past this depth lines are as good a boundary as any, and the stack is safe.
            return _line_pieces(doc, lo, hi, self.budget(scope), scope, "block")
        segments = []  # (child, first row, last row)
        prev_end = lo - 1
        for child in node.named_children:
            if "comment" in child.type or child.type in spec.trivia:
                continue  # comments and attributes go with the definition that follows
            end = min(_end_row(child), hi)
            if end <= prev_end:
                continue  # shares its lines with the previous child
            segments.append((child, prev_end + 1, end))
            prev_end = end
        budget = self.budget(scope)
        if not segments:
            return _line_pieces(doc, lo, hi, budget, scope, "block")
        if prev_end < hi:
            child, first, _ = segments[-1]
            segments[-1] = (child, first, hi)
        pieces: list[_Piece] = []
        for child, first, last in segments:
            found = self.describe(child, scope)
            cost = doc.cost(first, last)
            if cost <= budget or first == last:
                defs = [(found[0], found[1])] if found else []
                pieces.append(_Piece(first, last, cost, scope, defs))
                continue
            pieces.extend(self.split_big(child, first, last, scope, found, depth + 1))
        return _merge(pieces, self.budget)

    def split_big(self, node, lo: int, hi: int, scope: tuple, found, depth: int) -> list[_Piece]:
        inner_scope = (*scope, (found[0], found[2])) if found else scope
        row = node.start_point[0]  # the definition's first line, decorators included
        if found and found[3] is not node:
            # A wrapper (decorators, `export`): split the definition itself; the wrapper's
            # own lines above it join the first piece.
            node = found[3]
        if node.named_child_count:
            pieces = self.split(node, lo, hi, inner_scope, depth)
        else:  # a leaf over budget: a huge string or comment
            pieces = _line_pieces(self.doc, lo, hi, self.budget(inner_scope), inner_scope, "block")
        if found and pieces:
            # The piece holding the definition's first line is labelled with it and sits in
            # the outer scope (it shows the header itself); later pieces carry the scope.
            head = next((p for p in pieces if p.end >= row), pieces[-1])
            head.primary = (found[0], found[1])
            head.defs = [(found[0], found[1]), *head.defs]
            head.scope = scope
            for p in pieces:  # nested definitions' pieces already name their own owner
                if p.owner is None and p is not head:
                    p.owner = found[1]
        return pieces


def _error_fraction(root, size: int) -> float:
    """Share of the file's bytes that tree-sitter could not parse."""
    if not root.has_error:
        return 0.0
    if root.is_error:
        return 1.0
    bad = 0
    stack = [root]
    while stack:
        node = stack.pop()
        if node.is_error:
            bad += node.end_byte - node.start_byte
        elif node.has_error:
            stack.extend(node.children)
    return bad / max(size, 1)


# --------------------------------------------------------------------------- markdown

_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*#*[ \t]*\r?$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def _markdown_pieces(doc: _Doc, budget: Callable[[tuple], int]) -> list[_Piece]:
    """Sections by ATX heading (not inside fenced code), cut further by paragraphs."""
    sections = []  # (first row, level, title)
    fence = None
    for row, line in enumerate(doc.lines):
        m = _FENCE.match(line)
        if m:
            mark = m.group(1)[0] * 3
            if fence is None:
                fence = mark
            elif mark == fence:
                fence = None
            continue
        if fence is None:
            h = _HEADING.match(line)
            if h:
                sections.append((row, len(h.group(1)), (h.group(2) or "").strip()))
    pieces: list[_Piece] = []
    if not sections or sections[0][0] > 0:
        end = sections[0][0] - 1 if sections else doc.last
        pieces.extend(_line_pieces(doc, 0, end, budget(()), (), "text"))
    stack: list[tuple[int, str]] = []  # (level, "## Title") of the enclosing headings
    for i, (row, level, title) in enumerate(sections):
        end = sections[i + 1][0] - 1 if i + 1 < len(sections) else doc.last
        while stack and stack[-1][0] >= level:
            stack.pop()
        scope = tuple(("section", sig) for _, sig in stack)
        stack.append((level, "#" * level + " " + title))
        inner = (*scope, ("section", stack[-1][1]))
        # Like a split definition: the heading's piece sits in the outer scope, the rest of
        # a long section carries the heading as its scope.
        part = _line_pieces(doc, row, end, budget(inner), inner, "text")
        part[0].defs = [("section", title or None)]
        part[0].primary = ("section", title or None)
        part[0].scope = scope
        pieces.extend(part)
    return _merge(pieces, budget, nested=True)


# --------------------------------------------------------------------------- entry point


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
    doc = _Doc(text, count_tokens)
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
    spec = _SPECS.get(language)
    if spec is not None:
        pieces = _tree_pieces(doc, spec, budget, path)
    elif language == "markdown":
        pieces = _markdown_pieces(doc, budget)
    if pieces is None:
        pieces = _merge(_line_pieces(doc, 0, doc.last, budget(()), (), "text"), budget)
    if count_tokens is not None:
        pieces = _enforce_budget(doc, pieces, budget, path, max_tokens, count_tokens)
    return _to_chunks(doc, pieces, path, language)


def _header(path: str, scope: tuple) -> str:
    return " > ".join([path, *(sig for _, sig in scope)])


def _tree_pieces(
    doc: _Doc, spec: _LangSpec, budget: Callable[[tuple], int], path: str
) -> list[_Piece] | None:
    parser = _parser(spec.grammar)
    if parser is None:
        return None
    try:
        tree = parser.parse(doc.data)
    except Exception as exc:  # noqa: BLE001  # pragma: no cover - tree-sitter raises only on internal errors
        log.warning("tree-sitter failed on %s (%s); chunking by lines", quote_name(path), exc)
        return None
    root = tree.root_node
    if _error_fraction(root, len(doc.data)) > 0.3:
        log.debug("%s does not parse as %s; chunking by lines", path, spec.grammar)
        return None
    try:
        return _Splitter(doc, spec, budget).split(root, 0, doc.last, ())
    except RecursionError:  # pragma: no cover - _MAX_DEPTH keeps well below the limit
        log.warning("%s nests too deeply to split along its syntax; chunking by lines", quote_name(path))
        return None


def _trim(doc: _Doc, start: int, end: int) -> tuple[int, int]:
    """The row range without its leading and trailing blank lines (start > end if blank)."""
    lines = doc.lines
    while start <= end and not lines[start].strip():
        start += 1
    while end >= start and not lines[end].strip():
        end -= 1
    return start, end


def _enforce_budget(
    doc: _Doc,
    pieces: list[_Piece],
    budget: Callable[[tuple], int],
    path: str,
    max_tokens: int,
    count: Callable[[str], int],
) -> list[_Piece]:
    """Check each piece with the caller's real count; cut the few that are over, by lines."""
    out: list[_Piece] = []
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
            parts = _line_pieces(doc, start, end, budget(p.scope), p.scope, p.base)
        finally:
            doc.counting = False
        parts[0].defs, parts[0].primary = p.defs, p.primary  # the head keeps the label
        for part in parts[1:]:  # the rest are pieces of what the head defines
            part.owner = p.label()[1] or p.owner
        out.extend(parts)
    return out


# Lines of an import-only chunk. An import chunk only says which names a file uses; that
# is already in the chunks that use them, so on its own it is rarely what a search is
# after (two of four RAG context chunks were import blocks in issue 11). Kept narrow:
# a re-export (`export * from`, `pub use`, Python's `import X as X`) or a module
# declaration is part of a module's public shape and is not matched.
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


def _imports_only(text: str) -> bool:
    """Whether every line is an import (or its continuation), a package line, a comment or blank,
    with at least one import."""
    imports = depth = 0
    for raw in text.split("\n"):
        line = raw.strip()
        if _PY_REEXPORT.search(line):
            return False
        if depth > 0 or _IMPORT_LINE.match(line):
            # A multi-line import (`from x import (`, `import (`, `use a::{`) runs until its
            # brackets close.
            depth = max(0, depth + line.count("(") + line.count("{") - line.count(")") - line.count("}"))
            imports += 1
        elif line and not _HEADER_LINE.match(line):
            return False
    return imports > 0


def _is_test_code(p: _Piece) -> bool:
    """Inside a test definition, or made of test definitions only."""
    if any(kind == "test" for kind, _ in p.scope):
        return True
    return bool(p.defs) and all(kind == "test" for kind, _ in p.defs)


def _to_chunks(doc: _Doc, pieces: Sequence[_Piece], path: str, language: str) -> list[Chunk]:
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
        if not p.defs and _imports_only(text):
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


# -- many files: a process pool ------------------------------------------------------------

# Below this many files a pool costs more than it saves (BENCHMARKS.md "Walking and
# chunking"). Forked workers start at once and inherit the parent's imports: on 2 cores they
# won from 128 files up (a fresh process, quiet machine). Forkserver workers (a caller with
# threads) import tree-sitter and build their parsers first, ~0.3-0.5 s: they lost below
# ~500 files.
PARALLEL_MIN_FILES = 200
PARALLEL_MIN_FILES_FORKSERVER = 1000

_worker_args: tuple[int, Callable[[str], int] | None] = (512, None)


def _init_worker(max_tokens: int, count_tokens: Callable[[str], int] | None) -> None:
    global _worker_args
    _worker_args = (max_tokens, count_tokens)


def _chunk_item(item: tuple[str, str, str]) -> list[tuple]:
    path, text, language = item
    max_tokens, count_tokens = _worker_args
    chunks = chunk_source(path, text, language, max_tokens=max_tokens, count_tokens=count_tokens)
    # plain tuples: a third of the cost of pickling and unpickling Chunk objects (measured)
    return [_chunk_fields(c) for c in chunks]


_chunk_fields = operator.attrgetter(*(f.name for f in dataclasses.fields(Chunk)))


def _picklable(obj: object) -> bool:
    try:
        pickle.dumps(obj)
    except Exception:  # noqa: BLE001 - lambdas, closures, bound methods of unpicklable objects, ...
        return False
    return True


def chunk_many(
    items: Iterable[tuple[str, str, str]],
    *,
    max_tokens: int = 512,
    count_tokens: Callable[[str], int] | None = None,
    workers: int | None = None,
    min_files: int | None = None,
) -> Iterator[list[Chunk]]:
    """`chunk_source` over many ``(path, text, language)`` items, yielding each file's chunks
    in input order; the same chunks as calling `chunk_source` on each.

    With at least ``min_files`` items (default `PARALLEL_MIN_FILES`, or
    `PARALLEL_MIN_FILES_FORKSERVER` when the caller runs other threads), more than one worker
    (default ``os.cpu_count()``) and a ``count_tokens`` that pickles (None, or e.g.
    ``Encoder.token_counter()``; a lambda does not), files are chunked in a process pool:
    tree-sitter parsing is most of the cost and files share nothing. Otherwise, or if the
    pool breaks, they are chunked here.
    """
    items = list(items)
    n_workers = (os.cpu_count() or 1) if workers is None else workers
    done = 0
    method = _pool_method(len(items), min_files) if n_workers > 1 else None
    if method is not None and _picklable(count_tokens):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        ctx = multiprocessing.get_context(method)
        if method == "forkserver":
            ctx.set_forkserver_preload([__name__])
        chunksize = max(1, min(32, len(items) // (n_workers * 8)))
        try:
            pool = ProcessPoolExecutor(
                n_workers, mp_context=ctx, initializer=_init_worker, initargs=(max_tokens, count_tokens)
            )
            try:
                for rows in pool.map(_chunk_item, items, chunksize=chunksize):
                    done += 1
                    yield [Chunk(*row) for row in rows]
            finally:  # a caller that stops early does not wait for the files it will not read
                pool.shutdown(wait=True, cancel_futures=True)
            return
        except (BrokenProcessPool, OSError) as e:
            log.warning("parallel chunking failed (%s); chunking the remaining %d files here", e, len(items) - done)
    for path, text, language in items[done:]:
        yield chunk_source(path, text, language, max_tokens=max_tokens, count_tokens=count_tokens)


def _pool_method(n_files: int, min_files: int | None) -> str | None:
    """How to start pool workers for ``n_files`` files, or None when a pool does not pay."""
    import threading

    if threading.active_count() == 1:
        # fork: workers start at once with this process's imports and parsers, and never
        # re-import the caller's __main__ (a script without a main guard would run again)
        method, threshold = "fork", PARALLEL_MIN_FILES
    else:
        # other threads (server, watcher) may hold locks that a forked child would inherit
        # locked; workers start from a clean forkserver that imported only this module
        method, threshold = "forkserver", PARALLEL_MIN_FILES_FORKSERVER
    return method if n_files >= (threshold if min_files is None else min_files) else None
