"""A new user's first screen, run for real: the README's install and search lines, as parsed
from README.md (never copied here), in a fresh environment, on both of the README's routes.

Two scenarios, each in a new temporary folder with its own copy of this checkout (the files
git lists, as ``codesearch-src/``, the clone name the README asks for), a fresh virtual
environment with pipx, and pipx's home, bin folder and the Hugging Face cache inside it:

``reachable``
    PyTorch's CPU index can be reached: the first ``bash`` block under "## Install and
    search" runs as written, except that ``https://download.pytorch.org/whl/cpu`` is served
    by a stand-in on loopback (a PEP 503 index over HTTP holding the CPU wheel of
    ``--cpu-wheel``; this machine reaches no host but PyPI). pip's own configuration is
    switched off there (its wheel folder would hand over the same wheel), a constraint
    ``torch==VERSION`` stands for the newer ``+cpu`` builds the real index has (without it pip
    would take PyPI's newer CUDA build over the stand-in's older CPU one), and the stand-in's
    log must show that pip fetched torch from it.
``unreachable``
    PyTorch's index cannot be reached (its host does not resolve here): the install line is
    the README's fallback (the ``bash`` block with ``--preinstall``), as written, with pip's
    configuration as a user's pip reads it (here a wheel folder in ``find-links`` holds the CPU
    build: the stand-in for a mirror or a company wheel folder).

Each scenario then runs the block's search line and checks that it printed at least one hit
(``path:start-end  score ...``) and that the environment's torch is a CPU build with no
``nvidia-*`` package beside it. No model can be downloaded here, so ``codesearch index``
builds the lexical-only index the README promises offline, and says so.

Usage: python benchmarks/readme_first_screen.py [--scenario reachable|unreachable|both] [--keep]
       [--json-out FILE] [--cpu-wheel FILE]
Exit status 0 when every scenario installed a CPU torch and a result came back, 1 otherwise.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Install and search"
HIT_LINE = re.compile(r"^\S+:\d+-\d+  -?\d+\.\d+")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _section(readme: str) -> str:
    after = readme.split(f"\n{SECTION}\n", 1)
    if len(after) != 2:
        raise SystemExit(f"README.md has no {SECTION!r} section")
    return after[1].split("\n## ", 1)[0]


def _commands(block: str) -> list[str]:
    text = block.replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def first_screen_commands(readme: str) -> list[str]:
    """The command lines of the first ```bash block under "## Install and search"
    (comments and blank lines left out; a line ending in a backslash joined to the next)."""
    blocks = re.findall(r"^\s*```bash\n(.*?)^\s*```", _section(readme), re.S | re.M)
    if not blocks:
        raise SystemExit(f"README.md's {SECTION!r} section has no ```bash block")
    return _commands(blocks[0])


def fallback_commands(readme: str) -> list[str]:
    """The first screen with its install line replaced by the README's route without
    PyTorch's index (the ```bash block of the section that holds ``--preinstall``)."""
    blocks = re.findall(r"^\s*```bash\n(.*?)^\s*```", _section(readme), re.S | re.M)
    fallback = next((b for b in blocks[1:] if "--preinstall" in b), None)
    if fallback is None:
        raise SystemExit(f"README.md's {SECTION!r} section has no install line with --preinstall")
    first = first_screen_commands(readme)
    return [*_commands(fallback), *first[1:]]


def copy_checkout(dest: Path) -> int:
    """Copy the files git lists for this checkout into ``dest``; returns how many."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.split(b"\0")
    count = 0
    for raw in filter(None, listed):
        rel = Path(os.fsdecode(raw))
        src = ROOT / rel
        if not src.is_file():  # deleted in the work tree, not yet in the index
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
        count += 1
    return count


class _Index(http.server.SimpleHTTPRequestHandler):
    """The stand-in CPU index: files under its folder, each request logged."""

    requests: list[str]

    def log_message(self, format: str, *args: object) -> None:
        self.requests.append(f"{self.command} {self.path} {args[1] if len(args) > 1 else ''}".strip())


def serve_cpu_index(folder: Path, wheel: Path) -> tuple[str, list[str], http.server.ThreadingHTTPServer]:
    """A PEP 503 index on loopback holding ``wheel`` as ``torch``: its URL, its request log."""
    project = folder / "torch"
    project.mkdir(parents=True)
    shutil.copy2(wheel, project / wheel.name)
    href = wheel.name.replace("+", "%2B")
    (project / "index.html").write_text(f'<!DOCTYPE html><html><body><a href="{href}">{wheel.name}</a></body></html>\n')
    requests: list[str] = []
    handler = type("Index", (_Index,), {"requests": requests})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", requests, server


def run(line: str, *, cwd: Path, env: dict[str, str]) -> tuple[int, str, str, float]:
    start = time.perf_counter()
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr, time.perf_counter() - start


def _torch_build(work: Path, env: dict[str, str]) -> dict[str, object]:
    """The torch version pipx's environment holds, and any nvidia-* package beside it."""
    venvs = list((work / "pipx" / "venvs").glob("*/bin/python"))
    if not venvs:
        return {"torch": None, "nvidia_packages": []}
    listed = subprocess.run([str(venvs[0]), "-m", "pip", "list", "--format", "json"], env=env,
                            capture_output=True, text=True)
    packages = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout or "[]")}
    return {"torch": packages.get("torch"), "nvidia_packages": sorted(p for p in packages if p.startswith("nvidia"))}


def scenario(name: str, commands: list[str], *, cpu_wheel: Path, keep: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"codesearch-first-screen-{name}-"))
    report: dict = {"scenario": name, "commands": [], "ok": False, "folder": str(work)}
    out = ""
    server = None
    env = dict(os.environ)
    try:
        report["files_copied"] = copy_checkout(work / "codesearch-src")
        venv = work / "venv"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([venv / "bin" / "pip", "install", "-q", "pipx"], check=True)
        report["pipx_setup_s"] = round(time.perf_counter() - start, 1)
        env = {
            **os.environ,
            "PATH": f"{work / 'bin'}:{venv / 'bin'}:{os.environ.get('PATH', '')}",
            "PIPX_HOME": str(work / "pipx"),
            "PIPX_BIN_DIR": str(work / "bin"),
            "PIPX_MAN_DIR": str(work / "man"),
            "HF_HOME": str(work / "hf"),
            # A new user's caches and runtime folder: nothing this machine's runs left behind.
            "XDG_CACHE_HOME": str(work / "cache"),
            "CODESEARCH_CACHE_DIR": str(work / "cache" / "codesearch" / "vectors"),
            "CODESEARCH_RUNTIME_DIR": str(work / "run"),
        }
        for var in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "HF_HUB_OFFLINE"):
            env.pop(var, None)
        requests: list[str] = []
        if name == "reachable":
            url, requests, server = serve_cpu_index(work / "cpu-index", cpu_wheel)
            commands = [line.replace(CPU_INDEX, url) for line in commands]
            # Only PyPI and the stand-in: no wheel folder of this machine's pip configuration.
            env["PIP_CONFIG_FILE"] = os.devnull
            env.pop("PIP_FIND_LINKS", None)
            version = cpu_wheel.name.split("-")[1].split("+")[0]
            constraints = work / "constraints.txt"
            constraints.write_text(f"torch=={version}\n")
            env["PIP_CONSTRAINT"] = str(constraints)
            report["cpu_index_stand_in"] = f"{url} (torch {cpu_wheel.name}), constraint torch=={version}"
        for line in commands:
            rc, out, err, seconds = run(line, cwd=work, env=env)
            report["commands"].append({"line": line, "exit": rc, "seconds": round(seconds, 1),
                                       "stderr_tail": err.strip().splitlines()[-6:]})
            print(f"[{name}: {seconds:6.1f} s, exit {rc}] {line}", file=sys.stderr)
            if rc != 0:
                print(err[-4000:], file=sys.stderr)
                break
        report.update(_torch_build(work, env))
        if name == "reachable":
            report["fetched_from_stand_in"] = [r for r in requests if ".whl" in r]
        hits = [line for line in out.splitlines() if HIT_LINE.match(line)]
        report["hits"] = hits
        report["stdout"] = out
        cpu = bool(report["torch"]) and "+cpu" in str(report["torch"]) and not report["nvidia_packages"]
        served = name != "reachable" or bool(report["fetched_from_stand_in"])
        report["ok"] = bool(hits) and cpu and served and all(c["exit"] == 0 for c in report["commands"])
        report["total_s"] = round(sum(c["seconds"] for c in report["commands"]), 1)
    finally:
        if (work / "bin" / "codesearch").exists():  # a daemon the commands started, if any
            subprocess.run([str(work / "bin" / "codesearch"), "daemon", "stop"], env=env, capture_output=True)
        if server is not None:
            server.shutdown()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return report


def _local_cpu_wheel() -> Path | None:
    """The CPU torch wheel in this machine's pip wheel folder (``PIP_FIND_LINKS``)."""
    for folder in os.environ.get("PIP_FIND_LINKS", "").split():
        found = sorted(Path(folder).glob("torch-*+cpu-*.whl"))
        if found:
            return found[-1]
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=("reachable", "unreachable", "both"), default="both")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folders")
    parser.add_argument("--json-out", type=Path, help="also write the report here")
    parser.add_argument("--cpu-wheel", type=Path, default=_local_cpu_wheel(),
                        help="the CPU torch wheel the stand-in index serves (default: the one in PIP_FIND_LINKS)")
    args = parser.parse_args()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    wanted = ("reachable", "unreachable") if args.scenario == "both" else (args.scenario,)
    if "reachable" in wanted and (args.cpu_wheel is None or not args.cpu_wheel.is_file()):
        raise SystemExit("no CPU torch wheel for the stand-in index (pass --cpu-wheel FILE)")
    reports = []
    for name in wanted:
        commands = first_screen_commands(readme) if name == "reachable" else fallback_commands(readme)
        reports.append(scenario(name, commands, cpu_wheel=args.cpu_wheel, keep=args.keep))
        print(reports[-1]["stdout"], end="")
    print(json.dumps([{k: v for k, v in r.items() if k != "stdout"} for r in reports], indent=2), file=sys.stderr)
    if args.json_out:
        args.json_out.write_text(json.dumps(reports, indent=2) + "\n")
    return 0 if all(r["ok"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
