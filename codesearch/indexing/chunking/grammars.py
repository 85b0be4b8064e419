"""The language table: for each tree-sitter grammar, which nodes are definitions and of what
kind, and the parsers (one per grammar and thread)."""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass

log = logging.getLogger("codesearch.indexing.chunking")

# Kinds that make a function inside them a method.
CLASSLIKE = frozenset({
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
class LangSpec:
    grammar: str
    defs: dict  # node type -> kind, or "?hook" for a type that needs a closer look
    wrappers: frozenset = frozenset()  # nodes that wrap one definition (decorators, export)
    trivia: frozenset = frozenset()  # non-comment nodes that attach to what follows


SPECS: dict[str, LangSpec] = {
    "python": LangSpec(
        "python",
        {"function_definition": "function", "class_definition": "class"},
        wrappers=frozenset({"decorated_definition"}),
    ),
    "javascript": LangSpec("javascript", _JS_DEFS, wrappers=frozenset({"export_statement"})),
    "typescript": LangSpec(
        "typescript", _JS_DEFS, wrappers=frozenset({"export_statement", "expression_statement"})
    ),
    "tsx": LangSpec(
        "tsx", _JS_DEFS, wrappers=frozenset({"export_statement", "expression_statement"})
    ),
    "go": LangSpec(
        "go",
        {
            "function_declaration": "function",
            "method_declaration": "method",
            "type_declaration": "?go_type",
        },
    ),
    "rust": LangSpec(
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
    "java": LangSpec(
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
    "kotlin": LangSpec(
        "kotlin",
        {
            "class_declaration": "?kotlin_class",
            "object_declaration": "object",
            "companion_object": "object",
            "function_declaration": "function",
        },
    ),
    "scala": LangSpec(
        "scala",
        {
            "class_definition": "class",
            "object_definition": "object",
            "trait_definition": "trait",
            "enum_definition": "enum",
            "function_definition": "function",
        },
    ),
    "swift": LangSpec(
        "swift",
        {
            "class_declaration": "?swift_class",
            "protocol_declaration": "protocol",
            "function_declaration": "function",
            "init_declaration": "method",
        },
    ),
    "c": LangSpec("c", _C_DEFS),
    "cpp": LangSpec("cpp", _CPP_DEFS, wrappers=frozenset({"template_declaration"})),
    "csharp": LangSpec("csharp", _CSHARP_DEFS),
    "php": LangSpec(
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
    "ruby": LangSpec(
        "ruby",
        {
            "class": "class",
            "module": "module",
            "singleton_class": "class",
            "method": "function",
            "singleton_method": "method",
        },
    ),
    "elixir": LangSpec("elixir", {"call": "?elixir_call"}),
    "haskell": LangSpec(
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
    "lua": LangSpec("lua", {"function_declaration": "function"}),
    "zig": LangSpec("zig", {"Decl": "?zig_decl", "TestDecl": "?zig_test"}),
    "bash": LangSpec("bash", {"function_definition": "function"}),
}
SPECS["starlark"] = SPECS["python"]
SPECS["cython"] = SPECS["python"]

#: Languages chunked along their syntax tree (everything else goes by lines/paragraphs).
CHUNKED_LANGUAGES = frozenset(SPECS) | {"markdown"}

NAME_TYPES = frozenset({
    "identifier", "type_identifier", "simple_identifier", "constant", "name", "word",
    "field_identifier", "property_identifier", "IDENTIFIER", "namespace_identifier",
    "scoped_identifier", "qualified_identifier", "variable", "alias",
})
ELIXIR_DEFS = {
    "defmodule": "module", "defprotocol": "protocol", "defimpl": "impl",
    "def": "function", "defp": "function", "defmacro": "macro", "defmacrop": "macro",
    "defguard": "function", "defguardp": "function", "defdelegate": "function",
    "defn": "function", "defnp": "function",
}
# A Rust attribute that makes the item after it test code: `#[test]`, `#[tokio::test]`,
# `#[cfg(test)]`, `#[cfg(all(test, unix))]`; not `#[cfg(not(test))]` nor a feature named
# "test-utils".
RUST_TEST_ATTR = re.compile(
    r"#\[\s*(?:(?:\w+::)*test\s*\]|cfg\s*\((?!\s*not\b).*(?<![\w\"-])test(?![\w\"-]))"
)
ZIG_CONTAINER = re.compile(rb"=\s*(?:extern\s+|packed\s+)?(struct|enum|union|opaque)\b")

_local = threading.local()


def parser_for(grammar: str):
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
