"""A new user's first screen, run for real: the README's install and search lines, as parsed
from README.md (never copied here), in a fresh environment.

What it does, in a new temporary folder:

1. copies this checkout (the files git lists: tracked, and untracked ones no ignore rule
   hides) to ``codesearch-src/``, the clone name the README asks for;
2. makes a fresh virtual environment and installs pipx into it (the README assumes the
   user has pipx), with its home, its bin folder and the Hugging Face cache inside the
   temporary folder, so nothing installed or cached on this machine is used;
3. runs each command line of the first ``bash`` block under "## Install and search" with
   bash, from the temporary folder, in order, timing each;
4. checks that the last one printed at least one hit (``path:start-end  score ...``).

pip reads this machine's configuration as a user's pip would (here torch comes from a local
wheel folder and the rest from PyPI). An index the README names that cannot be resolved here
(PyTorch's CPU index, on this machine) gets ``PIP_RETRIES=0``, so pip skips it at once
rather than retrying it five times per package. As that index would give a ``+cpu`` torch,
a constraint pins ``torch==2.13.0+cpu`` (``--cpu-wheel``), which pip finds in the local wheel
folder: the install a user with that index gets, not PyPI's CUDA build (5.8 GB installed).
No model can be downloaded here either, so ``codesearch index`` builds the lexical-only
index the README promises offline, and says so.

Usage: python benchmarks/readme_first_screen.py [--keep] [--json-out FILE] [--cpu-wheel VERSION]
Exit status 0 when a result came back, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Install and search"
HIT_LINE = re.compile(r"^\S+:\d+-\d+  -?\d+\.\d+")


def first_screen_commands(readme: str) -> list[str]:
    """The command lines of the first ```bash block under "## Install and search"
    (comments and blank lines left out; a line ending in a backslash joined to the next)."""
    after = readme.split(f"\n{SECTION}\n", 1)
    if len(after) != 2:
        raise SystemExit(f"README.md has no {SECTION!r} section")
    block = re.search(r"^```bash\n(.*?)^```", after[1].split("\n## ", 1)[0], re.S | re.M)
    if block is None:
        raise SystemExit(f"README.md's {SECTION!r} section has no ```bash block")
    text = block.group(1).replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


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


def _index_hosts(commands: list[str]) -> list[str]:
    return sorted({m.group(1) for line in commands for m in re.finditer(r"https://([^/\s\"']+)", line)})


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def run(line: str, *, cwd: Path, env: dict[str, str]) -> tuple[int, str, str, float]:
    start = time.perf_counter()
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--json-out", type=Path, help="also write the report here")
    parser.add_argument(
        "--cpu-wheel",
        default="2.13.0+cpu",
        help="torch version standing in for PyTorch's CPU index when it cannot be reached "
        "(pip finds it in its configured wheel folder); '' to let pip pick",
    )
    args = parser.parse_args()

    commands = first_screen_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    work = Path(tempfile.mkdtemp(prefix="codesearch-first-screen-"))
    report: dict = {"commands": [], "ok": False, "folder": str(work)}
    out = ""
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
        }
        for name in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "HF_HUB_OFFLINE"):
            env.pop(name, None)
        unreachable = [host for host in _index_hosts(commands) if not _resolves(host)]
        if unreachable:
            # pip retries an index it cannot reach 5 times, with back-off, for every package
            # (minutes in all); once is enough to skip it.
            env["PIP_RETRIES"] = "0"
            report["unreachable_indexes"] = unreachable
            if args.cpu_wheel and "download.pytorch.org" in unreachable:
                # What the CPU index would give (a +cpu torch), from the local wheel: else pip
                # takes PyPI's CUDA build (5.8 GB installed here), which is what the note avoids.
                constraints = work / "constraints.txt"
                constraints.write_text(f"torch=={args.cpu_wheel}\n")
                env["PIP_CONSTRAINT"] = str(constraints)
                report["cpu_index_stand_in"] = f"torch=={args.cpu_wheel} from the local wheel folder"
        for line in commands:
            rc, out, err, seconds = run(line, cwd=work, env=env)
            report["commands"].append({"line": line, "exit": rc, "seconds": round(seconds, 1),
                                       "stderr_tail": err.strip().splitlines()[-6:]})
            print(f"[{seconds:6.1f} s, exit {rc}] {line}", file=sys.stderr)
            if rc != 0:
                print(err[-4000:], file=sys.stderr)
                break
        hits = [line for line in out.splitlines() if HIT_LINE.match(line)]
        report["hits"] = hits
        report["stdout"] = out
        report["ok"] = bool(hits) and all(c["exit"] == 0 for c in report["commands"])
        report["total_s"] = round(sum(c["seconds"] for c in report["commands"]), 1)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(out, end="")
    print(json.dumps({k: v for k, v in report.items() if k != "stdout"}, indent=2), file=sys.stderr)
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
