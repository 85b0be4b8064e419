"""The package's layering, read from its imports: no circles, and every arrow points down.

Each module of ``codesearch`` belongs to a unit (a subpackage such as ``search``, or a
top-level module such as ``types``), and each unit to a layer, bottom first (`LAYERS`). An
import may go to its own unit or to a unit of a lower layer; to a unit of the same layer or
a higher one only where `ALLOWED` names it, with the reason. Every import counts: at module
level, inside a function, under ``TYPE_CHECKING``, and the string tables of lazy imports
(``_LAZY``), since a deferred import is still a dependency.

Run as a script to print the figures (``python tests/test_layering.py [ROOT]``): module and
package circles, and each arrow that does not point down.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

#: Bottom first. A unit may import its own modules and any unit of a lower layer.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "_compat"),
    ("codesearch",),  # the package's own __init__: the version, the compat finder, lazy names
    ("pathnames", "languages", "globs", "workers"),
    ("textregex",),  # the --regex filter: stops at the search deadline `globs` holds
    ("types",),
    ("_stagehook",),  # a test hook on an index run's progress events (`types.ProgressEvent`)
    ("encoder", "store"),
    ("indexes",),
    ("indexing", "search"),
    ("api",),
    ("integrations", "server"),
    ("cli",),
]

#: (importing unit, imported module prefix) -> why this arrow may point up or sideways.
ALLOWED: dict[tuple[str, str], str] = {
    # The package's lazy top-level names (``from codesearch import CodeSearch``): the one
    # entry point that reaches up, and only when such a name is asked for.
    ("codesearch", "codesearch.api"): "the lazy public names of `codesearch/__init__.py`",
    ("codesearch", "codesearch.types"): "the lazy public names of `codesearch/__init__.py`",
}

#: Where the query side may reach into the encoder package: the protocol, never a model.
SEARCH_ENCODER = "codesearch.encoder.base"

ROOT = Path(__file__).resolve().parents[1]


def unit_of(module: str) -> str:
    """``codesearch.search.ranking`` -> ``search``; ``codesearch.types`` -> ``types``;
    ``codesearch`` -> ``codesearch`` (the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(unit: str) -> int:
    for i, units in enumerate(LAYERS):
        if unit in units:
            return i
    raise AssertionError(f"unit {unit!r} is in no layer of tests/test_layering.py (add it to LAYERS)")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package under ``root``."""
    out = {}
    for path in sorted((root / "codesearch").rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _target(name: str, known: dict[str, Path]) -> str | None:
    """The module an imported dotted name lands in: itself, or the nearest enclosing module."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The codesearch modules ``module`` imports, wherever the import sits."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from codesearch.store import sqlite` imports a module; `... import Store` a name.
                full = f"{base}.{alias.name}"
                names.add(full if full in known else base)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            if isinstance(node.value, ast.Dict):
                names.update(v.value for v in node.value.values if isinstance(v, ast.Constant))
    out = set()
    for name in names:
        if name == "codesearch" or name.startswith("codesearch."):
            target = _target(name, known)
            if target is not None and target != module:
                out.add(target)
    return out


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {m: imports(m, p, known) for m, p in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def package_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for m, targets in edges.items():
        out[unit_of(m)]
        for t in targets:
            if unit_of(t) != unit_of(m):
                out[unit_of(m)].add(unit_of(t))
    return out


def _allowed(unit: str, target: str) -> bool:
    return any(unit == u and (target == p or target.startswith(p + ".")) for u, p in ALLOWED)


def wrong_way(edges: dict[str, set[str]]) -> list[tuple[str, str, str]]:
    """(module, imported module, why it is wrong) for each arrow that does not point down."""
    out = []
    for m, targets in sorted(edges.items()):
        unit = unit_of(m)
        for t in sorted(targets):
            other = unit_of(t)
            if other == unit or _allowed(unit, t):
                continue
            if layer_of(other) > layer_of(unit):
                out.append((m, t, "up"))
            elif layer_of(other) == layer_of(unit):
                out.append((m, t, "sideways"))
            elif unit == "search" and other == "encoder" and t != SEARCH_ENCODER:
                out.append((m, t, "query time reaches past the Encoder protocol"))
    return out


# -- the tests --------------------------------------------------------------------------------


def test_no_import_circles():
    edges = graph()
    assert circles(edges) == []
    assert circles(package_edges(edges)) == []


def test_every_import_points_down():
    assert wrong_way(graph()) == []


def test_every_unit_has_a_layer():
    for m in graph():
        layer_of(unit_of(m))


def test_an_upward_import_is_caught(tmp_path):
    # The check itself: a store module that imports the searcher is an arrow up.
    pkg = tmp_path / "codesearch"
    (pkg / "store").mkdir(parents=True)
    (pkg / "search").mkdir()
    for init in (pkg, pkg / "store", pkg / "search"):
        (init / "__init__.py").write_text("")
    (pkg / "search" / "searcher.py").write_text("from codesearch.store import sqlite\n")
    (pkg / "store" / "sqlite.py").write_text("def f():\n    from codesearch.search.searcher import Searcher\n")
    edges = graph(tmp_path)
    assert wrong_way(edges) == [("codesearch.store.sqlite", "codesearch.search.searcher", "up")]
    assert circles(edges) == [["codesearch.search.searcher", "codesearch.store.sqlite"]]


def main(argv: list[str]) -> None:
    root = Path(argv[1]).resolve() if len(argv) > 1 else ROOT
    edges = graph(root)
    mod_circles = circles(edges)
    pkg_circles = circles(package_edges(edges))
    wrong = wrong_way(edges)
    print(f"modules: {len(edges)}, imports: {sum(map(len, edges.values()))}")
    print(f"module circles: {len(mod_circles)}")
    for c in mod_circles:
        print("  " + " <-> ".join(c))
    print(f"package circles: {len(pkg_circles)}")
    for c in pkg_circles:
        print("  " + " <-> ".join(c))
    print(f"arrows not pointing down: {len(wrong)} (allowed: {len(ALLOWED)} entry-point names)")
    for m, t, why in wrong:
        print(f"  {m} -> {t} ({why})")


if __name__ == "__main__":
    main(sys.argv)
