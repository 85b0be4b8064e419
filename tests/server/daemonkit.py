"""Helpers for daemon tests: the real ``codesearch`` console script in fresh processes, each
test with a runtime folder of its own, and every daemon started there stopped after."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CLI_TIMEOUT_S = 240.0


def cli_argv() -> list[str]:
    script = shutil.which("codesearch")
    return [script] if script else [sys.executable, "-c", "from codesearch.cli import main; main()"]


def daemon_env(runtime: Path, **extra: str) -> dict[str, str]:
    """This process's environment, offline, with ``runtime`` as the runtime folder and the
    daemon allowed (the suite's default is ``CODESEARCH_NO_DAEMON=1``), CI unset."""
    drop = {"CODESEARCH_TOKEN", "CODESEARCH_NO_DAEMON", "CODESEARCH_DAEMON", "CI"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CODESEARCH_RUNTIME_DIR=str(runtime),
               CODESEARCH_DAEMON_IDLE="600")
    env.update(extra)
    return env


def run_cli(args: list[str], env: dict[str, str], *, check: bool = True, cwd: Path | None = None,
            ) -> subprocess.CompletedProcess:
    done = subprocess.run([*cli_argv(), *args], env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                          cwd=cwd)
    if check and done.returncode != 0:
        raise AssertionError(f"codesearch {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


def same_hits(a: list[dict], b: list[dict]) -> bool:
    """Whether two answers' hits are the same: every field equal but the score, which is equal
    at float32 precision. (A hybrid score sums a vector product computed by FAISS or numpy,
    whose kernels add in another order on an AVX2 CPU than on an AVX-512 one: the last bit
    of a float32 moves between two processes.)"""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if {k: v for k, v in x.items() if k != "score"} != {k: v for k, v in y.items() if k != "score"}:
            return False
        if abs(x["score"] - y["score"]) > 1e-6 * max(1.0, abs(x["score"])):
            return False
    return True


def daemon_pids(runtime: Path) -> list[int]:
    """Live daemon processes of ``runtime`` (from /proc: whatever discovery says)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = next((line for line in (entry / "status").read_text().splitlines()
                          if line.startswith("State:")), "")
        except OSError:
            continue
        if b"codesearch.server.daemon" in argv and str(runtime).encode() in argv and "zombie" not in state:
            out.append(int(entry.name))
    return out


def stop_all(runtime: Path) -> None:
    """Stop the daemon of ``runtime`` and any other daemon process started there (a test's
    race may have started a second one that lost the lock)."""
    from codesearch.server import daemon_client

    daemon_client.stop(runtime)
    for pid in daemon_pids(runtime):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
