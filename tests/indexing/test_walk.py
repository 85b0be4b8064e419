"""Walking: ignore files (both modes), each skip reason, language detection, order."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from fixtures.trees import git, write

from codesearch.errors import PathError
from codesearch.indexing.walk import SKIP_REASONS, detect_language, read_source, walk

HAS_GIT = shutil.which("git") is not None


def paths(result) -> list[str]:
    return [f.path for f in result.files]


# ----------------------------------------------------------------- ignore rules, no git


def test_nested_gitignore_and_negation(tmp_path):
    write(tmp_path, ".gitignore", "*.log\n!keep.log\nsecrets/\n/only_root.py\n")
    write(tmp_path, "a.py")
    write(tmp_path, "debug.log", "log\n")
    write(tmp_path, "keep.log", "log\n")
    write(tmp_path, "secrets/key.py")
    write(tmp_path, "only_root.py")
    write(tmp_path, "sub/only_root.py")  # anchored pattern: only the root one is ignored
    write(tmp_path, "sub/.gitignore", "*.tmp.py\n!keep.log\n")
    write(tmp_path, "sub/x.tmp.py")
    write(tmp_path, "sub/deep/y.tmp.py")
    write(tmp_path, "sub/deep/z.py")
    write(tmp_path, "sub/deep/.gitignore", "!y.tmp.py\n")  # the deepest file wins
    result = walk(tmp_path)
    assert not result.git
    assert paths(result) == [
        ".gitignore", "a.py", "keep.log", "sub/.gitignore", "sub/deep/.gitignore",
        "sub/deep/y.tmp.py", "sub/deep/z.py", "sub/only_root.py",
    ]


def test_git_info_exclude_without_git_repo(tmp_path):
    # A .git folder that git itself cannot use: the filesystem walk still reads info/exclude.
    write(tmp_path, ".git/info/exclude", "generated_here.py\n")
    write(tmp_path, "generated_here.py")
    write(tmp_path, "kept.py")
    result = walk(tmp_path)
    assert paths(result) == ["kept.py"]


def test_codesearchignore_nested(tmp_path):
    write(tmp_path, ".codesearchignore", "fixtures/\n*.snap\n")
    write(tmp_path, "fixtures/big.py")
    write(tmp_path, "a.snap", "snap\n")
    write(tmp_path, "pkg/.codesearchignore", "legacy_*.py\n!legacy_keep.py\n")
    write(tmp_path, "pkg/legacy_old.py")
    write(tmp_path, "pkg/legacy_keep.py")
    write(tmp_path, "pkg/new.py")
    assert paths(walk(tmp_path)) == [
        ".codesearchignore", "pkg/.codesearchignore", "pkg/legacy_keep.py", "pkg/new.py",
    ]


def test_index_dir_and_vcs_dirs_never_walked(tmp_path):
    write(tmp_path, ".codesearch/store.py")
    write(tmp_path, "custom_index/x.py")
    write(tmp_path, ".hg/store.py")
    write(tmp_path, "src/a.py")
    assert paths(walk(tmp_path, index_dir="custom_index")) == ["src/a.py"]
    assert paths(walk(tmp_path, index_dir=tmp_path / "custom_index")) == ["src/a.py"]
    assert "custom_index/x.py" in paths(walk(tmp_path))


def test_include_and_exclude_globs(tmp_path):
    for rel in ["src/a.py", "src/b.js", "src/gen/c.py", "tests/test_a.py", "docs/x.md"]:
        write(tmp_path, rel)
    assert paths(walk(tmp_path, include=["*.py"])) == ["src/a.py", "src/gen/c.py", "tests/test_a.py"]
    assert paths(walk(tmp_path, include=["src/**"], exclude=["src/gen/"])) == ["src/a.py", "src/b.js"]
    assert paths(walk(tmp_path, exclude="tests")) == ["docs/x.md", "src/a.py", "src/b.js", "src/gen/c.py"]


# ----------------------------------------------------------------- git work tree


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
def test_git_repo_tracked_untracked_ignored(tmp_path):
    git(tmp_path, "init", "-q")
    write(tmp_path, ".gitignore", "*.log\nbuild_out/\n")
    write(tmp_path, "tracked.py")
    write(tmp_path, "forced.log", "tracked although ignored\n")
    git(tmp_path, "add", ".gitignore", "tracked.py")
    git(tmp_path, "add", "-f", "forced.log")
    git(tmp_path, "commit", "-q", "-m", "init")
    write(tmp_path, "untracked.py")
    write(tmp_path, "ignored.log", "no\n")
    write(tmp_path, "build_out/x.py")
    write(tmp_path, ".git/info/exclude", "local_only.py\n")
    write(tmp_path, "local_only.py")
    write(tmp_path, ".codesearchignore", "untracked_but_unwanted.py\n")
    write(tmp_path, "untracked_but_unwanted.py")
    (tmp_path / "deleted.py").write_text("y = 2\n")
    git(tmp_path, "add", "deleted.py")
    (tmp_path / "deleted.py").unlink()  # tracked, gone from the work tree
    result = walk(tmp_path)
    assert result.git
    assert paths(result) == [
        ".codesearchignore", ".gitignore", "forced.log", "tracked.py", "untracked.py",
    ]


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
def test_git_subfolder_root_and_codesearchignore_ignored_by_git(tmp_path):
    git(tmp_path, "init", "-q")
    write(tmp_path, ".gitignore", ".codesearchignore\n")
    write(tmp_path, "pkg/.codesearchignore", "skip_me.py\n")
    write(tmp_path, "pkg/a.py")
    write(tmp_path, "pkg/skip_me.py")
    write(tmp_path, "other/b.py")
    result = walk(tmp_path / "pkg")
    assert result.git
    assert paths(result) == ["a.py"]  # relative to the walked root, rules still applied


# ----------------------------------------------------------------- skip reasons


def test_each_skip_reason(tmp_path):
    root = tmp_path / "repo"
    outside = tmp_path / "outside.py"
    outside.write_text("secret = 1\n")
    write(root, "ok.py", "print('hi')\n")
    write(root, "blob.dat", b"abc\0def" * 10)
    write(root, "image.png", b"\x89PNG not really")
    write(root, "ctrl.txt", bytes(range(1, 32)) * 20)
    write(root, "big.py", "x = 1\n" * 600)
    write(root, "package-lock.json", "{}\n")
    write(root, "sub/Cargo.lock", "x\n")
    write(root, "app.min.js", "var a=1;\n")
    write(root, "bundle.js", "var a=1;" * 300)  # one 2.4 KB line
    write(root, "api_pb2.go", "// Code generated by protoc-gen-go. DO NOT EDIT.\npackage api\n")
    write(root, "node_modules/left-pad/index.js")
    write(root, "web/vendor/lib.js")
    write(root, "dist/out.js")
    write(root, "pkg/__pycache__/a.cpython-311.pyc", b"\0\0")
    write(root, "target/CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n")
    write(root, "target/debug/x.rs", "fn main() {}\n")
    (root / "link_out.py").symlink_to(outside)
    (root / "link_in.py").symlink_to(root / "ok.py")
    (root / "dir_out").symlink_to(tmp_path, target_is_directory=True)
    (root / "dangling.py").symlink_to(root / "missing.py")
    os.mkfifo(root / "pipe.py")
    result = walk(root, max_file_bytes=3000)
    assert paths(result) == ["link_in.py", "ok.py"]
    assert result.skipped == {
        "binary": ["blob.dat", "ctrl.txt", "image.png"],
        "too_large": ["big.py"],
        "generated": [
            "api_pb2.go", "app.min.js", "bundle.js", "dist/", "package-lock.json",
            "pkg/__pycache__/", "sub/Cargo.lock", "target/",
        ],
        "vendored": ["node_modules/", "web/vendor/"],
        "symlink_outside": ["dir_out", "link_out.py"],
        "unreadable": ["dangling.py", "pipe.py"],
    }
    assert list(result.skipped) == list(SKIP_REASONS)


@pytest.mark.parametrize(
    "name,line_bytes,kept",
    [
        ("notes.md", 900, True),  # one paragraph per line, as GitHub renders Markdown
        ("guide.rst", 1500, True),
        ("notes.txt", 3000, True),
        ("dump.txt", 20_000, False),  # hardly a newline: a data dump, even as .txt
        ("page.js", 900, False),  # code with 900-byte lines is minified
    ],
)
def test_long_lines_mark_generated_code_but_not_prose(tmp_path, name, line_bytes, kept):
    paragraph = ("Retries back off exponentially with jitter between attempts. " * 400)[:line_bytes]
    write(tmp_path, name, (paragraph + "\n\n") * 20)
    result = walk(tmp_path)
    assert (paths(result) == [name]) is kept
    assert (result.skipped["generated"] == [name]) is not kept


def _walk_as_nobody(root: Path) -> tuple[list[str], list[str], str]:
    """Walk in a forked child that dropped root: files, unreadable, warnings logged."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        status = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            records: list[str] = []
            handler = logging.Handler()
            handler.emit = lambda rec: records.append(rec.getMessage())
            logging.getLogger("codesearch").addHandler(handler)
            result = walk(root)
            payload = [paths(result), result.skipped["unreadable"], "\n".join(records)]
            os.write(w, json.dumps(payload).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(w)
    with os.fdopen(r) as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0
    files, unreadable, log_text = json.loads(data)
    return files, unreadable, log_text


def test_unreadable_file_warns_and_walk_continues(caplog):
    # chmod 000 does not stop root from reading. As root, the walk runs in a forked child
    # that drops to user "nobody", so the permission error is real, not simulated.
    root = Path(tempfile.mkdtemp(prefix="cs-walk-", dir="/tmp"))
    try:
        os.chmod(root, 0o755)
        write(root, "ok.py").chmod(0o644)
        write(root, "secret.py").chmod(0o000)
        if os.geteuid() == 0:
            files, unreadable, log_text = _walk_as_nobody(root)
        else:
            with caplog.at_level(logging.WARNING, logger="codesearch"):
                result = walk(root)
            files, unreadable, log_text = paths(result), result.skipped["unreadable"], caplog.text
        assert files == ["ok.py"]
        assert unreadable == ["secret.py"]
        assert "secret.py" in log_text and "Permission denied" in log_text
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_not_a_directory(tmp_path):
    f = write(tmp_path, "file.py")
    with pytest.raises(PathError, match="not a directory"):
        walk(f)
    with pytest.raises(PathError):
        walk(tmp_path / "missing")


def test_order_is_sorted_and_stable(tmp_path):
    for rel in ["b.py", "a/z.py", "a.py", "A.py", "a/b/c.py", "_x.py"]:
        write(tmp_path, rel)
    first = walk(tmp_path)
    assert paths(first) == sorted(paths(first))
    assert first.files == walk(tmp_path).files
    f = first.files[0]
    assert f.abs_path == (tmp_path / f.path).resolve()
    assert f.size == 6 and f.mtime_ns > 0
    assert f.to_dict()["path"] == f.path


# ----------------------------------------------------------------- languages


@pytest.mark.parametrize(
    ("path", "first_line", "language"),
    [
        ("a/b.py", "", "python"),
        ("x.pyi", "", "python"),
        ("web/app.tsx", "", "tsx"),
        ("web/app.ts", "", "typescript"),
        ("web/app.mjs", "", "javascript"),
        ("main.go", "", "go"),
        ("lib.rs", "", "rust"),
        ("A.java", "", "java"),
        ("build.gradle.kts", "", "kotlin"),
        ("M.scala", "", "scala"),
        ("V.swift", "", "swift"),
        ("x.h", "", "c"),
        ("x.hpp", "", "cpp"),
        ("P.cs", "", "csharp"),
        ("i.php", "", "php"),
        ("r.rb", "", "ruby"),
        ("m.ex", "", "elixir"),
        ("Main.hs", "", "haskell"),
        ("init.lua", "", "lua"),
        ("b.zig", "", "zig"),
        ("run.sh", "", "bash"),
        ("README.md", "", "markdown"),
        ("ci.yml", "", "yaml"),
        ("Makefile", "", "makefile"),
        ("Dockerfile", "", "dockerfile"),
        ("Dockerfile.dev", "", "dockerfile"),
        ("Rakefile", "", "ruby"),
        ("Gemfile", "", "ruby"),
        ("CMakeLists.txt", "", "cmake"),
        ("bin/tool", "#!/usr/bin/env python3", "python"),
        ("bin/tool", "#!/usr/bin/python3.11 -u", "python"),
        ("bin/tool", "#!/bin/bash", "bash"),
        ("bin/tool", "#!/bin/sh -e", "bash"),
        ("bin/tool", "#!/usr/bin/env node", "javascript"),
        ("bin/tool", "#!/usr/bin/env -S node --no-warnings", "javascript"),
        ("bin/tool", "#!/usr/bin/env ruby", "ruby"),
        ("bin/tool", "#!/usr/bin/env perl", "perl"),
        ("bin/tool", "", "text"),
        ("notes.weird", "", "text"),
        ("script.py", "#!/bin/bash", "python"),  # the extension wins over the shebang
    ],
)
def test_detect_language(path, first_line, language):
    assert detect_language(path, first_line) == language


def test_walk_uses_shebang(tmp_path):
    write(tmp_path, "bin/deploy", "#!/usr/bin/env bash\necho hi\n")
    write(tmp_path, "bin/notes", "just words\n")
    assert {f.path: f.language for f in walk(tmp_path).files} == {
        "bin/deploy": "bash", "bin/notes": "text",
    }


def test_read_source_keeps_newlines_and_replaces_bad_bytes(tmp_path):
    f = write(tmp_path, "m.py", b"a = 1\r\nb = '\xff'\r\n")
    assert read_source(f) == "a = 1\r\nb = '\ufffd'\r\n"


def test_cpp_header_told_from_c_header(tmp_path):
    write(tmp_path, "c_api.h", "#ifndef X\n#define X\nstruct point { int x; };\nint add(int, int);\n#endif\n")
    header = "#pragma once\n#include <vector>\nnamespace geo {\ntemplate <typename T>\nstruct V { T x; };\n}\n"
    write(tmp_path, "vec.h", header)
    write(tmp_path, "klass.h", "#pragma once\nclass Shape {\n public:\n  virtual ~Shape();\n};\n")
    assert {f.path: f.language for f in walk(tmp_path).files} == {
        "c_api.h": "c",
        "klass.h": "cpp",
        "vec.h": "cpp",
    }


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
def test_untracked_nested_repository_is_walked_by_its_own_rules(tmp_path):
    git(tmp_path, "init", "-q")
    write(tmp_path, "top.py")
    nested = tmp_path / "vendored_lib_checkout"
    nested.mkdir()
    git(nested, "init", "-q")
    write(nested, ".gitignore", "*.gen.py\n")
    write(nested, "inner.py")
    write(nested, "skip.gen.py")
    result = walk(tmp_path)
    assert paths(result) == [
        "top.py",
        "vendored_lib_checkout/.gitignore",
        "vendored_lib_checkout/inner.py",
    ]


def test_docstring_examples_run():
    import doctest

    from codesearch.indexing import walk as walk_module

    assert doctest.testmod(walk_module).failed == 0


@pytest.mark.parametrize("use_git", [False, True])
def test_build_dir_that_is_a_python_package_is_kept(tmp_path, use_git):
    if use_git:
        if not HAS_GIT:
            pytest.skip("git is not installed")
        git(tmp_path, "init", "-q")
    write(tmp_path, "pkg/build/__init__.py")
    write(tmp_path, "pkg/build/wheel.py")
    write(tmp_path, "build/lib/pkg/x.py")  # setup.py build output
    result = walk(tmp_path)
    assert result.git is use_git
    assert paths(result) == ["pkg/build/__init__.py", "pkg/build/wheel.py"]
    assert result.skipped["generated"] == ["build/"]


def test_symlink_loop_and_in_root_dir_link(tmp_path):
    write(tmp_path, "real/a.py")
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    result = walk(tmp_path)
    assert paths(result) == ["real/a.py"]  # the directory link is not followed twice
    assert result.skipped["unreadable"] == ["loop1", "loop2"]


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
def test_uninitialised_submodule_is_an_empty_folder_not_a_loop(tmp_path):
    # A submodule that was never cloned: git lists the gitlink, the folder is empty, and
    # `git ls-files` inside it answers for the enclosing repository with "./".
    git(tmp_path, "init", "-q")
    write(tmp_path, "a/f.py")
    git(tmp_path, "add", "a/f.py")
    git(tmp_path, "update-index", "--add", "--cacheinfo", "160000,1234567890123456789012345678901234567890,sub")
    (tmp_path / "sub").mkdir()
    git(tmp_path, "commit", "-qm", "x")
    assert paths(walk(tmp_path)) == ["a/f.py"]


@pytest.mark.parametrize("where", ["gitignore", "exclude"])
def test_a_hostile_ignore_pattern_outside_git_indexes_in_bounded_time(tmp_path, where):
    """`*?` fourteen times then `Z`, against a 60-character file name: pathspec's regex
    for it backtracks exponentially (the walk froze for minutes, holding the GIL); the
    linear-time matcher answers at once. In a subprocess, so that a regression fails at the
    timeout instead of hanging the suite."""
    import sys

    hostile = "*?" * 14 + "Z"
    repo = tmp_path / "repo"
    write(repo, "a" * 60 + ".py", "def kept():\n    return 1\n")
    write(repo, "b" * 59 + "Z", "dropped\n")
    extra = []
    if where == "gitignore":
        write(repo, ".gitignore", hostile + "\n")
    else:
        extra = ["--exclude", hostile]
    done = subprocess.run(
        [sys.executable, "-c", "from codesearch.cli import main; main()", "index", str(repo), "--model", "none",
         "--multi-model", "none", "-q", *extra],
        capture_output=True, text=True, timeout=90, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    indexed = paths(walk(repo, exclude=extra[1:]))
    assert "a" * 60 + ".py" in indexed and "b" * 59 + "Z" not in indexed


def test_unreadable_ignore_lines_are_dropped_as_git_drops_them(tmp_path):
    # pathspec raised on a trailing backslash (the walk stopped with a traceback).
    write(tmp_path, ".gitignore", "[\nsub\\\n*.log\n")
    write(tmp_path, "a.py")
    write(tmp_path, "b.log")
    assert paths(walk(tmp_path, exclude=["[", "x\\"])) == [".gitignore", "a.py"]
