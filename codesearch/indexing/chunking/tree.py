"""Splitting by the syntax tree (cAST): each definition a piece, a definition over budget
split at its children's boundaries, recursively; small neighbours merged."""

from __future__ import annotations

from collections.abc import Callable

from codesearch.indexing.chunking.document import Doc, Piece, line_pieces, merge
from codesearch.indexing.chunking.grammars import (
    CLASSLIKE,
    ELIXIR_DEFS,
    NAME_TYPES,
    RUST_TEST_ATTR,
    ZIG_CONTAINER,
    LangSpec,
)

MAX_DEPTH = 150  # split() recursion depth; two Python frames per level


def _end_row(node) -> int:
    row, col = node.end_point
    # A node that ends with its newline (Rust doc comments, preprocessor lines) ends at
    # column 0 of the next row; that row holds none of it.
    if col == 0 and row > node.start_point[0]:
        return row - 1
    return row


class Splitter:
    def __init__(self, doc: Doc, spec: LangSpec, budget: Callable[[tuple], int]):
        self.doc = doc
        self.spec = spec
        self.budget = budget

    # -- what a node defines

    def describe(self, node, scope: tuple):
        """(kind, name, defining node) when `node` is a definition, else None (its signature,
        the header of the pieces cut from it, is worked out only for a definition that is split:
        most fit their piece whole)."""
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
        if kind == "function" and scope and scope[-1][0] in CLASSLIKE:
            kind = "method"
        if "attribute_item" in self.spec.trivia and self._test_attribute(node):
            kind = "test"
        return kind, name, inner

    def _test_attribute(self, node) -> bool:
        """Whether a Rust attribute above `node` marks it as test code."""
        prev = node.prev_named_sibling
        while prev is not None and (prev.type == "attribute_item" or "comment" in prev.type):
            if prev.type == "attribute_item" and RUST_TEST_ATTR.match(self.doc.node_text(prev)):
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
            named = next((c for c in node.named_children if c.type in NAME_TYPES), None)
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
        kind = ELIXIR_DEFS.get(self.doc.node_text(target))
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
        m = ZIG_CONTAINER.search(head)
        if m is None:
            return None
        name = next((c for c in var.named_children if c.type == "IDENTIFIER"), None)
        return m.group(1).decode(), self.doc.node_text(name) if name is not None else None

    def _hook_zig_test(self, node):
        label = next((c for c in node.named_children if c.type.startswith("STRINGLITERAL")
                      or c.type == "IDENTIFIER"), None)
        return "test", self.doc.node_text(label).strip('"') if label is not None else None

    # -- splitting

    def split(self, node, lo: int, hi: int, scope: tuple, depth: int = 0) -> list[Piece]:
        """Pieces covering rows lo..hi, which hold `node`'s children, each within budget."""
        doc, spec = self.doc, self.spec
        if depth > MAX_DEPTH:
            # Left-nested syntax (a 2,000-link method chain) nests one level per line;
            # past this depth lines are as good a boundary as any, and the stack is safe.
            return line_pieces(doc, lo, hi, self.budget(scope), scope, "block")
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
            return line_pieces(doc, lo, hi, budget, scope, "block")
        if prev_end < hi:
            child, first, _ = segments[-1]
            segments[-1] = (child, first, hi)
        pieces: list[Piece] = []
        for child, first, last in segments:
            found = self.describe(child, scope)
            cost = doc.cost(first, last)
            if cost <= budget or first == last:
                defs = [(found[0], found[1])] if found else []
                pieces.append(Piece(first, last, cost, scope, defs))
                continue
            pieces.extend(self.split_big(child, first, last, scope, found, depth + 1))
        return merge(pieces, self.budget)

    def split_big(self, node, lo: int, hi: int, scope: tuple, found, depth: int) -> list[Piece]:
        inner_scope = (*scope, (found[0], self._signature(found[2]))) if found else scope
        row = node.start_point[0]  # the definition's first line, decorators included
        if found and found[2] is not node:
            # A wrapper (decorators, `export`): split the definition itself; the wrapper's
            # own lines above it join the first piece.
            node = found[2]
        if node.named_child_count:
            pieces = self.split(node, lo, hi, inner_scope, depth)
        else:  # a leaf over budget: a huge string or comment
            pieces = line_pieces(self.doc, lo, hi, self.budget(inner_scope), inner_scope, "block")
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


def error_fraction(root, size: int) -> float:
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
