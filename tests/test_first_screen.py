"""What a new user runs first: the README's own lines, and a clone that shadows the package.

The install and search lines of the README's first screen run in a fresh environment in
`benchmarks/readme_first_screen.py` (minutes: a real pip install); here, fast, the README's
Python example runs as written on a copy of this repository, `.ci/run` installs and tests as
the README says, and a clone named `codesearch` stops an import with one line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    body = README.split(f"\n## {title}\n", 1)[1]
    return body.split("\n## ", 1)[0]


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def _copy_package(dest: Path) -> None:
    """This repository's package sources and README: what the example indexes (lexical, in
    about a second), without writing an index into the checkout."""
    shutil.copytree(ROOT / "codesearch", dest / "codesearch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "README.md", dest / "README.md")


def test_readme_python_example_runs_on_its_own_repository(tmp_path):
    code = _blocks(_section("Python API"), "python")[0]
    repo = tmp_path / "clone"
    _copy_package(repo)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}  # no model: lexical only
    done = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # cs.search's hits, then the lexical query's mode and indexes, then the status document.
    assert re.match(r"codesearch/\S+\.py:\d+-\d+ ", lines[0]), done.stdout
    mode_line = next(line for line in lines if line.startswith("lexical "))
    assert "'lexical'" in mode_line
    assert "'indexed': True" in lines[-1] and "'python'" in lines[-1]


def test_ci_installs_and_tests_exactly_as_the_readme_says():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    contributor = _blocks(_section("Work on it (contributors)"), "bash")[0].splitlines()
    install = next(line for line in contributor if line.startswith("pip install"))
    for step in install.split(" && "):  # each README step, as .ci/run runs it (quietly)
        assert step.replace("pip install ", "pip install -q ", 1) in ci, step
    assert "python -m pytest -q" in contributor and "python -m pytest -q" in ci


def test_readme_first_screen_comes_before_the_contributor_set_up():
    install = README.index("\n## Install and search\n")
    assert install < README.index("\n## Work on it (contributors)\n")
    first = _blocks(_section("Install and search"), "bash")[0]
    assert first.startswith("pipx install ") and "download.pytorch.org/whl/cpu" in first
    assert "codesearch index " in first and "codesearch query " in first


def _shadowing_folder(tmp_path: Path) -> Path:
    """A folder holding this clone as ./codesearch, as a user who cloned it there has."""
    holder = tmp_path / "work"
    holder.mkdir()
    (holder / "codesearch").symlink_to(ROOT, target_is_directory=True)
    return holder


def test_a_clone_named_codesearch_stops_the_import_with_one_line(tmp_path):
    holder = _shadowing_folder(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # -S: no site-packages, so this Python has no codesearch installed (a pipx user's Python).
    done = subprocess.run([sys.executable, "-S", "-c", "from codesearch import CodeSearch"], cwd=holder, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: 'codesearch' here is the cloned repository "), done.stderr
    assert "unknown location" not in done.stderr
    assert f"pip install {holder / 'codesearch'}" in last and "codesearch-src" in last


def test_a_clone_named_codesearch_leaves_an_installed_package_working(tmp_path):
    holder = _shadowing_folder(tmp_path)
    code = "import codesearch; from codesearch import CodeSearch, __version__; print(codesearch.__file__)"
    done = subprocess.run([sys.executable, "-c", code], cwd=holder, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # The installed package (PYTHONPATH here, or the environment's), not the clone's root.
    assert Path(done.stdout.strip()).parent.name == "codesearch"
    assert Path(done.stdout.strip()).resolve() != (ROOT / "__init__.py").resolve()
