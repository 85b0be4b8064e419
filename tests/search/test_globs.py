"""ripgrep-style --glob rules (codesearch.search.globs): negation, braces, repetition, `**`, and
one-line errors for patterns that cannot be parsed. The expected verdicts are what
`rg --files -g ...` prints for the same tree."""

from __future__ import annotations

import pytest

from codesearch.errors import QueryError
from codesearch.search.globs import GlobFilter, expand_braces, scope_globs

PATHS = [
    "README.md",
    "src/main.rs",
    "src/lib.rs",
    "src/walk/mod.rs",
    "src/tests/helpers.rs",
    "tests/cli.rs",
    "tests/data/notes.md",
    "docs/guide.md",
    "setup.py",
]


def kept(*patterns: str) -> list[str]:
    f = GlobFilter.of(list(patterns))
    return [p for p in PATHS if f.match(p)]


@pytest.mark.parametrize(
    "patterns,expected",
    [
        # one include: a slash-free glob matches at any depth
        (["*.md"], ["README.md", "tests/data/notes.md", "docs/guide.md"]),
        # braces expand
        (["*.{rs,md}"], [p for p in PATHS if p != "setup.py"]),
        # negation only: everything but what it excludes (anchored: only the top tests/)
        (["!tests/**"], [p for p in PATHS if not p.startswith("tests/")]),
        # a slash-free negation excludes a folder of that name at any depth
        (["!tests"], [p for p in PATHS if not p.startswith("tests/") and "/tests/" not in p]),
        # repeated includes combine (any of them)
        (["*.py", "docs/**"], ["docs/guide.md", "setup.py"]),
        # include, then exclude: the last matching rule wins
        (["*.{rs,md}", "!tests/**"], ["README.md", "src/main.rs", "src/lib.rs", "src/walk/mod.rs",
                                      "src/tests/helpers.rs", "docs/guide.md"]),
        # ... and a later include brings a path back
        (["src/**", "!src/**/*.rs", "src/lib.rs"], ["src/lib.rs"]),
        # `**` in the middle
        (["src/**/mod.rs"], ["src/walk/mod.rs"]),
        # a glob that matches nothing is valid and keeps nothing
        (["*.zig"], []),
    ],
)
def test_rules_keep_what_ripgrep_keeps(patterns, expected):
    assert kept(*patterns) == expected


def test_braces_expand_nested_and_escaped():
    assert expand_braces("a{b,{c,d}e}f") == ["abf", "acef", "adef"]
    assert expand_braces("*.{rs,md}{,.bak}") == ["*.rs", "*.rs.bak", "*.md", "*.md.bak"]
    assert expand_braces(r"\{x\}") == [r"\{x\}"]  # escaped: literal braces for gitignore
    assert expand_braces("[{]x") == ["[{]x"]  # inside a class: literal


@pytest.mark.parametrize(
    "pattern,needle",
    [("*.{rs,md", "'{' is never closed"), ("a}b", "'}' has no opening"), ("[abc", "'[' is never closed"),
     ("!", "nothing to match"), ("src\\", "invalid glob")],
)
def test_an_invalid_pattern_is_a_one_line_query_error(pattern, needle):
    with pytest.raises(QueryError) as exc:
        GlobFilter.of(["*.py", pattern])
    message = str(exc.value)
    assert needle in message and repr(pattern) in message and "\n" not in message
    assert "--glob" in message  # the way out


def test_scoping_to_a_subfolder_keeps_the_rules_inside_it():
    assert scope_globs("src", ["!tests/**"]) == ("src/**", "!src/tests/**")
    assert scope_globs("src", ["*.{rs,md}"]) == ("src/**/*.rs", "src/**/*.md")
    assert scope_globs("src/", ["walk/*.rs"]) == ("src/walk/*.rs",)
    assert scope_globs("src", []) == ("src/**",)
    assert scope_globs(None, ["*.py"]) == ("*.py",)
    f = GlobFilter.of(scope_globs("src", ["!tests"]))
    assert [p for p in PATHS if f.match(p)] == ["src/main.rs", "src/lib.rs", "src/walk/mod.rs"]
