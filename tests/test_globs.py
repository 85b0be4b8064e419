"""ripgrep-style --glob rules (codesearch.globs): negation, braces, repetition, `**`, and
one-line errors for patterns that cannot be parsed. The expected verdicts are what
`rg --files -g ...` prints for the same tree."""

from __future__ import annotations

import pytest

from codesearch.errors import QueryError
from codesearch.globs import GitIgnore, GlobFilter, expand_braces, scope_globs

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


# -- a glob can no longer freeze the process, and means what it meant -------------------------


def pathspec_verdict(patterns: list[str], path: str) -> bool:
    """The reference: the rules handed to pathspec as gitignore lines, as this module did
    before its own matcher (last match wins through gitignore's own negation)."""
    import warnings

    import pathspec

    from codesearch.globs import _rules

    lines = [f"!{body}" if negated else body for negated, body in _rules(patterns)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "[[]": a possible nested set, to `re`
        verdict = pathspec.PathSpec.from_lines("gitignore", lines).check_file(path).include
    has_include = any(not line.startswith("!") for line in lines)
    return (not has_include) if verdict is None else bool(verdict)


ORDINARY = [
    "*.py", "*.{rs,md}", "src/**", "/src", "src/", "src/*", "src/*.rs", "src/**/*.rs", "**/tests/**", "**/mod.rs",
    "tests", "/tests", "!tests/**", "!*.md", "docs/**/*.md", "*/*.rs", "**", "*", "**/", "*/", "/", "src/**/",
    "?etup.py", "[st]*/*.rs", "[a-m]*.md", "src/[!t]*/*.rs", "*.[!p]*", "src/{main,lib}.rs", "{src,tests}/**/*.rs",
    "**/{walk,data}/*", "*.{rs,md}{,.bak}", "a{b,{c,d}e}f", "README.*", "*E*", r"\*.md", "#readme", "!#x", "s*/**/h*",
    "src/**/**/mod.rs", "**/*/helpers.rs", "tests/*/notes.md", "[[]x]", "*.p[y]", "src//main.rs",
]
MORE_PATHS = [*PATHS, "src/a[1]/x.rs", "*.md", "a{b}/c.py", "deep/a/b/c/d/e/f/g.rs", "src/walk/tests/mod.rs",
              "x.py.bak", "README.md.bak", ".hidden/.env", "tests/data/sub/notes.md"]


@pytest.mark.parametrize("glob", ORDINARY)
def test_ordinary_globs_match_what_pathspec_matched(glob):
    f = GlobFilter.of([glob])
    assert [p for p in MORE_PATHS if f.match(p)] == [p for p in MORE_PATHS if pathspec_verdict([glob], p)]


@pytest.mark.parametrize("seed", range(12))
def test_random_rule_sets_match_what_pathspec_matched(seed):
    # Rule sets drawn from the syntax's pieces (anchors, **, classes, braces, escapes,
    # negation, comments), on paths drawn from a small alphabet so that pieces collide.
    # Negated classes are left out: [!x] never matches '/' here, as in ripgrep (pathspec's did).
    import random

    rng = random.Random(seed)
    tokens = ["a", "b", ".", "*", "?", "/", "[ab]", "**", "{a,b}", "{,a}", r"\*", "/**/", "**/", "/**", "[a-b]",
              "ab", "[]a]", "#", r"\#", "[.]", "a/", r"\ ", "{a,{b,c}}", r"\{", "!"]
    segments = ["a", "b", "ab", "ba", "a.b", ".a", "aa", "x", "*", "b.a", "#a", "a b"]
    compared = 0
    for _ in range(400):
        patterns = []
        for _ in range(rng.randint(1, 3)):
            body = "".join(rng.choice(tokens) for _ in range(rng.randint(1, 6)))
            patterns.append(("!" if rng.random() < 0.3 else "") + ("/" if rng.random() < 0.1 else "") + body)
        try:
            f = GlobFilter.of(patterns)
        except QueryError:
            continue
        for _ in range(8):
            path = "/".join(rng.choice(segments) for _ in range(rng.randint(1, 4)))
            assert f.match(path) == pathspec_verdict(patterns, path), (patterns, path)
            compared += 1
    assert compared > 1000


@pytest.mark.parametrize("seed", range(2))
def test_a_filter_of_many_rules_decides_as_its_rules_one_at_a_time(seed):
    """`matches` puts more than a few rules in one RE2 set (a search of 64 rules of 12
    wildcards: 0.6 s on 2,000 paths one rule at a time); its verdicts are `match`'s, rule
    for rule: the last rule that matches decides, names that are not UTF-8 and newlines too."""
    import random

    rng = random.Random(seed)
    tokens = ["a", "b", ".", "*", "?", "/", "[ab]", "**", "{a,b}", "{,a}", r"\*", "/**/", "**/", "[a-b]", "[!a]",
              "ab", "é", "[é-ü]", "\n", r"\ ", "{a,{b,c}}", "*a*", "*b*"]
    segments = ["a", "b", "ab", "a.b", ".a", "é", "aé", "a\nb", "x", "ü.a", "a b", "caf\udce9", "[ab]"]
    paths = ["/".join(rng.choice(segments) for _ in range(rng.randint(1, 4))) for _ in range(200)]
    compared = 0
    for _ in range(100):
        patterns = ["".join(rng.choice(tokens) for _ in range(rng.randint(1, 8))) for _ in range(rng.randint(3, 8))]
        patterns = [("!" if rng.random() < 0.3 else "") + p for p in patterns]
        try:
            f = GlobFilter.of(patterns)
        except QueryError:
            continue
        compared += f._set is not None
        assert list(f.matches(paths)) == [f.match(p) for p in paths], patterns
    assert compared > 30


@pytest.mark.parametrize("glob,path,kept", [
    ("a[!x]b", "a/b", False), ("a[!x]b", "ayb", True), ("a[^x]b", "a/b", False), ("*[!.]", "dir/x", True),
])
def test_a_negated_class_never_matches_a_slash(glob, path, kept):
    assert GlobFilter.of([glob]).match(path) is kept


@pytest.mark.parametrize("pattern,needle", [
    ("[z-a]", "range z-a is backwards"),  # raised re.error from pathspec: a 500 on the server
    ("*?" * 22 + "Z", "44 wildcards in one rule (the limit is 32"),
    ("{a,b}" * 16, "expand to more than 64 rules"),
    ("{" * 20 + "a,b" + "}" * 20 + "{a,b,c}" * 4, "expand to more than 64 rules"),
    ("{" * 33 + "a,b" + "}" * 33, "nests braces more than 32 deep (the limit"),
    ("a" * 257, "257 characters long (the limit is 256"),
])
def test_a_glob_past_a_limit_is_a_one_line_query_error(pattern, needle):
    from codesearch.globs import check_globs

    with pytest.raises(QueryError) as exc:
        check_globs([pattern])
    assert needle in str(exc.value) and "\n" not in str(exc.value) and "(" in str(exc.value)


def test_too_many_globs_is_a_query_error_and_the_limits_count_all_of_them_together():
    from codesearch.globs import GLOB_LIMITS, check_globs

    with pytest.raises(QueryError, match="33 globs in one search"):
        check_globs([f"*.x{i}" for i in range(33)])
    check_globs(["*.{a,b,c,d}"] * 16)  # 64 rules: at the limit
    with pytest.raises(QueryError, match="more than 64 rules"):
        check_globs(["*.{a,b,c,d}"] * 16 + ["x"])
    assert GLOB_LIMITS.rules == 64


def test_braces_are_counted_before_they_expand():
    # 2**400 alternatives: refused from the count alone, at once.
    with pytest.raises(QueryError, match=r"more than 1024 alternatives|more than 1024 rules"):
        expand_braces("{a,b}" * 400)
    # Nesting is bounded before anything recurses on it.
    assert expand_braces("{" * 32 + "x" + "}" * 32) == ["x"]
    with pytest.raises(QueryError, match="nests braces more than 32 deep"):
        GlobFilter.of(["{" * 10_000 + "*.py" + "}" * 10_000])


def test_folder_names_are_escaped_when_a_search_is_scoped_to_them():
    from codesearch.globs import escape_glob

    for name in ("a[1]", "x{y,z}", "star*", "q?", "bang!", "#hash", "back\\slash", "comma,"):
        f = GlobFilter.of(scope_globs(name, ["*.py"]))
        assert f.match(f"{name}/m.py") and f.match(f"{name}/deep/m.py")
        assert not f.match("a1/m.py") and not f.match("other/m.py")
        assert GlobFilter.of([escape_glob(name)]).match(name)
    assert GlobFilter.of(scope_globs("src", ["!*.md"])).match("src/a.py")


# Each pattern, as the sizes grow: refused as a QueryError, or matched against the paths that
# make a backtracking matcher explode. The sweep runs in a child process, so that a matcher
# that backtracks exponentially fails this test instead of hanging the suite (the one this
# replaced took more than 300 s for "*?" * 14 + "Z" on a 60-character name; this takes ms).
SWEEP = r"""
import json, sys
from codesearch.errors import QueryError
from codesearch.globs import GLOB_LIMITS, GlobFilter, check_globs
paths = ["a" * 45, "a" * 44 + "Z", "a" * 250, "/".join(["a" * 50] * 20), "a/" * 200 + "b", "ab" * 120]
families = {
    "stars": lambda n: "*a" * n + "b", "star-any": lambda n: "*?" * n + "Z", "any-star": lambda n: "?*" * n,
    "globstar": lambda n: "**/" * n + "b", "seg-star": lambda n: "a*/" * n + "c", "classes": lambda n: "[ab]*" * n,
    "mixed": lambda n: "**/" + "*a?[a-z]" * n + "/**/b*", "braces": lambda n: "{a*,b?}" * n,
    "nested": lambda n: "{a," * n + "*" + "}" * n, "literal": lambda n: "a" * (8 * n),
    "many": lambda n: ["*a*a*a*a*a*a*a*" + str(i) for i in range(n)],
}
out = {}
for name, make in families.items():
    for n in (1, 2, 4, 8, 12, 16, 22, 32, 48, 64):
        patterns = make(n) if isinstance(make(n), list) else [make(n)]
        try:
            check_globs(patterns)
        except QueryError as exc:
            out[f"{name}/{n}"] = "refused: " + str(exc)
            continue
        f = GlobFilter.of(patterns, GLOB_LIMITS)
        out[f"{name}/{n}"] = [f.match(p) for p in paths]
        # Beyond the limits, the library's own matcher is as quick: the limits bound the
        # work of a request, not the matcher's complexity.
        GlobFilter.of(patterns).match(paths[3])
json.dump(out, sys.stdout)
"""


def test_growing_globs_are_matched_in_linear_time_or_refused():
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", SWEEP], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    refused = {case: verdict for case, verdict in out.items() if isinstance(verdict, str)}
    assert all("\n" not in v and "limit" in v for v in refused.values())
    assert "star-any/22" in refused and "braces/8" in refused and "many/64" in refused  # past a limit
    assert out["star-any/8"] == [False, True, False, False, False, False]  # 16 wildcards: kept, and right
    assert out["stars/16"] == [False, False, False, False, False, True]
    assert out["globstar/4"] == [False, False, False, False, True, False]


def test_matching_stops_at_the_deadline_of_its_thread():
    import threading
    import time

    from codesearch.globs import glob_deadline

    f = GlobFilter.of(["*.{rs,md}", "!tests/**"])
    paths = PATHS * 1000
    assert list(f.matches(paths)) == [f.match(p) for p in paths]  # no deadline: every path
    with glob_deadline(time.monotonic() - 1), pytest.raises(QueryError, match="ran past the search's time limit"):
        list(f.matches(paths))
    with glob_deadline(time.monotonic() + 3600):
        assert sum(f.matches(paths)) == 6000
        seen: list[int] = []  # another thread has no deadline of its own
        other = threading.Thread(target=lambda: seen.append(sum(f.matches(paths))))
        other.start()
        other.join()
        assert seen == [6000]


# -- gitignore semantics for ignore files and --include/--exclude (the walk) ----------------


def walk_verdict(rules: GitIgnore, path: str) -> bool | None:
    """What the walk makes of ``path`` (a folder ends in ``/``) under one ignore file: it
    checks each folder on the way down and never enters an ignored one, so the first ignored
    folder above the path decides; failing one, the path's own verdict (None: no line
    matches it; False: a ``!`` line, which lets a deeper ignore file's verdict stand over a
    shallower one's)."""
    parts = path.rstrip("/").split("/")
    for depth in range(1, len(parts)):
        if rules.check("/".join(parts[:depth]) + "/") is True:
            return True
    return rules.check(path)


def git_verdicts(root, line_sets: list[tuple[list[str], list[str]]]) -> list[list[bool | None]]:
    """The reference: what git itself says of each path, for all line sets in one call.

    Each set is the ``.gitignore`` of its own folder ``s<n>`` (git reads a nested ignore
    file relative to its folder, as the root's: checked identical on 400 sets), its folders
    made on disk (git tells a folder from a file by looking), and all paths go through one
    ``git check-ignore --no-index -v -n --stdin``, which also says when a folder above a
    path is ignored (git never enters it) and which line decided: a ``!`` line is False,
    no line None. A call per set would cost ~10 ms each, 4,800 calls for the 12 seeds.
    """
    import os
    import subprocess

    queries = []
    for n, (lines, paths) in enumerate(line_sets):
        base = root / f"s{n}"
        base.mkdir()
        (base / ".gitignore").write_text("\n".join(lines) + "\n")
        for path in paths:
            folder = path[:-1] if path.endswith("/") else path.rpartition("/")[0]
            if folder:
                (base / folder).mkdir(parents=True, exist_ok=True)
            queries.append(f"s{n}/{path.rstrip('/')}")
    # No global or system configuration: a user's core.excludesFile must not leak in.
    env = {**os.environ, "HOME": str(root), "XDG_CONFIG_HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": os.devnull}
    subprocess.run(["git", "init", "-q", str(root)], check=True, env=env)
    proc = subprocess.run(["git", "check-ignore", "--no-index", "-v", "-n", "-z", "--stdin"], cwd=root, env=env,
                          input="\0".join(queries) + "\0", capture_output=True, text=True, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    fields = proc.stdout.split("\0")
    said = {fields[i + 3]: None if not fields[i] else not fields[i + 2].startswith("!")
            for i in range(0, len(fields) - 1, 4)}
    assert len(said) == len(set(queries)), proc.stderr
    return [[said[f"s{n}/{p.rstrip('/')}"] for p in paths] for n, (_, paths) in enumerate(line_sets)]


@pytest.mark.parametrize("seed", range(12))
def test_ignore_files_match_what_git_ignores(seed, tmp_path):
    # Line sets from the syntax's pieces on paths of a small alphabet, files and folders
    # ("a/b/"), so that lines collide, negate each other, and match through folders; the
    # reference is git (`git_verdicts`), each path judged as the walk judges it
    # (`walk_verdict`, and the walker's own rules object). pathspec is no reference here:
    # it differs from git on ~4% of these paths ("a/**" matching the folder "a", "***/",
    # escaped trailing spaces, folders above a path that a later line re-includes).
    import random
    import shutil

    from codesearch.indexing.walk import _IgnoreRules

    if shutil.which("git") is None:
        pytest.skip("git is not installed: it is the reference")
    rng = random.Random(seed)
    tokens = ["a", "b", ".", "*", "?", "/", "[ab]", "**", "{a,b}", r"\*", "/**/", "**/", "/**", "[a-b]", "ab",
              "[]a]", "#", r"\#", "[.]", "a/", r"\ ", " ", "!", r"\!", "***", "[!a]", "[z-a]", "[a-]", r"\/", "[/]",
              "[[:alpha:]]", "[[:x]", "\\", "\t"]
    segments = ["a", "b", "ab", "ba", "a.b", ".a", "aa", "x", "*", "b.a", "#a", "a b", "!a", "{a,b}", "-", "z", "a\tb"]
    line_sets = []
    for _ in range(400):
        lines = []
        for _ in range(rng.randint(1, 4)):
            body = "".join(rng.choice(tokens) for _ in range(rng.randint(1, 6)))
            lines.append(("!" if rng.random() < 0.3 else "") + ("/" if rng.random() < 0.1 else "") + body)
        paths = []
        for _ in range(8):
            path = "/".join(rng.choice(segments) for _ in range(rng.randint(1, 4)))
            paths.append(path + ("/" if rng.random() < 0.3 else ""))
        # A name that is a folder in one path is a folder in all: there is one tree on disk.
        folders = {"/".join(p.rstrip("/").split("/")[:d]) for p in paths for d in range(1, p.count("/") + 1)}
        line_sets.append((lines, [p + "/" if p in folders else p for p in paths]))
    compared = 0
    for (lines, paths), verdicts in zip(line_sets, git_verdicts(tmp_path, line_sets), strict=True):
        rules = GitIgnore.of(lines)
        walker = _IgnoreRules()
        walker.add("", lines)
        for path, verdict in zip(paths, verdicts, strict=True):
            assert walk_verdict(rules, path) is verdict, (lines, path)
            parts = path.rstrip("/").split("/")
            pruned = any(walker.ignored("/".join(parts[:d]), is_dir=True) for d in range(1, len(parts)))
            assert (pruned or walker.ignored(path.rstrip("/"), is_dir=path.endswith("/"))) is (verdict is True)
            compared += 1
    assert compared == 3200


@pytest.mark.parametrize("lines,path,verdict", [
    # check: the path itself; the last line that matches it decides
    (["dir/", "!dir/keep.txt"], "dir/keep.txt", False),  # (the walk never gets there: dir/ is ignored)
    (["*.log", "!important/"], "important/a.log", True),
    (["src/*"], "src/a/b.py", None),  # only through the folder src/a, which the walk does not enter
    (["!x/"], "x/f", None),  # a '!' line about a folder says nothing of what is below it
    (["/"], "a.py", None), (["#x", ""], "#x", None), ([r"\#x"], "#x", True),
    (["*.{py,js}"], "a.py", None), (["*.{py,js}"], "a.{py,js}", True),  # no braces in gitignore
    (["[", "a\\", "[z-a]", "x"], "x", True),  # unreadable lines are dropped, not fatal
    # what git says where pathspec did not (each checked with git check-ignore)
    (["a/**"], "a/", None), (["a/**"], "a/b", True),  # "a/**" is what is below a, not a
    (["***/b"], "x/y/b", True),  # three stars are two
    (["a\\  "], "a ", True),  # the escaped space stays, the one after it goes
    (["ab**/c"], "abc", True), (["ab**/c"], "abx/y/c", True),  # '**' right after git's literal head
    (["a**b/c"], "ax/yb/c", None),  # elsewhere, '**' in a name is '*'
    (["[z-a]"], "z", True), (["[a-c-e]"], "-", True), (["x/[a/b]c"], "x/bc", True),  # wildmatch's classes
    ([r"a\/b"], "a/b", True), (["[[:digit:]]x"], "1x", True), (["[[:nope:]]x"], "1x", None),
    (["x", "!x/"], "x", True), (["x", "!x/"], "x/", False),  # a folder line is about folders only
])
def test_gitignore_edge_cases(lines, path, verdict):
    assert GitIgnore.of(lines).check(path) is verdict


@pytest.mark.parametrize("lines,path", [
    (["d/", "!d/**"], "d/f"),  # "d/**" does not re-include the folder d: git never enters it
    (["[a-b]", "!a/**/**"], "a/ab"),
    (["dir/", "!dir/keep.txt"], "dir/keep.txt"),
])
def test_a_path_below_an_ignored_folder_is_ignored_whatever_later_lines_say(lines, path):
    assert walk_verdict(GitIgnore.of(lines), path) is True


def test_a_deeper_ignore_files_negation_of_a_folder_stands():
    # git: sub/.gitignore's "!d/" keeps sub/d, and the root's "d/" says nothing of sub/d/f.
    from codesearch.indexing.walk import _IgnoreRules

    rules = _IgnoreRules()
    rules.add("", ["d/"])
    rules.add("sub", ["!d/"])
    assert not rules.ignored("sub/d", is_dir=True) and not rules.ignored("sub/d/f")
    assert rules.ignored("d", is_dir=True) and rules.ignored("x/d", is_dir=True)
    # ... and "!d/**" there is about what is below sub/d, not sub/d: the root's "d/" hides it.
    rules = _IgnoreRules()
    rules.add("", ["d/"])
    rules.add("sub", ["!d/**"])
    assert rules.ignored("sub/d", is_dir=True)


def test_include_and_exclude_select_what_is_below_a_folder_they_name():
    # --include/--exclude match a path alone (folders are not walked for --include).
    assert GitIgnore.of(["src/"]).match("src/a/b.py")
    assert not GitIgnore.of(["src/", "!src/gen/"]).match("src/gen/x.py")
    assert GitIgnore.of(["src/*"]).match("src/a/b.py")
    assert not GitIgnore.of(["src/"]).match("lib/src.py")


def test_a_hostile_ignore_line_is_matched_in_linear_time():
    # `*?` fourteen times against a 60-character name: exponential in pathspec's regex.
    line, name = "*?" * 14 + "Z", "a" * 60 + ".py"
    assert GitIgnore.of([line]).check(name) is None and GitIgnore.of([line]).check(name[:-3] + "Z") is True
    # '**' after git's literal head, sixty times (wildmatch's own recursion on it overflows
    # git's stack for this path: `git check-ignore` dies of a segmentation fault).
    rules = GitIgnore.of(["a**/" * 60 + "b"])
    assert rules.check("a/" * 200 + "b") is True and rules.check("a/" * 20 + "b") is None
    rules = GitIgnore.of([r"a**\/" * 300 + "c", "/" + "**/x*" * 40 + "/b"])
    assert rules.check("a/" * 1000 + "b") is None and rules.check("a/" * 1000 + "c") is True
