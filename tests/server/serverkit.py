"""Helpers for server tests: start the real server in a subprocess on an ephemeral
loopback port and read the address it announces."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

START_TIMEOUT_S = 90.0


def server_env(**extra: str) -> dict[str, str]:
    """The test process's environment, offline, without a stray token."""
    env = {k: v for k, v in os.environ.items() if k != "CODESEARCH_TOKEN"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def _readline(stream, timeout: float) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return box[0] if box else ""


@dataclass
class ServerProc:
    """A running `python -m codesearch.server` and what it announced."""

    proc: subprocess.Popen
    info: dict
    stderr_path: Path
    token: str | None = None

    @property
    def url(self) -> str:
        return self.info["url"]

    def client(self, **kwargs) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0, **kwargs)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_idle(self, timeout: float = 60.0, min_runs: int = 0) -> dict:
        """Poll /status until every root is ready and its indexer idle; return the status."""
        deadline = time.monotonic() + timeout
        with self.client() as http:
            while True:
                status = http.get("/status").json()
                roots = status["roots"]
                if all(r["ready"] and r["indexing"]["state"] == "idle" and r["indexing"]["runs"] >= min_runs
                       for r in roots):
                    return status
                if time.monotonic() > deadline:
                    raise AssertionError(f"server not idle after {timeout}s: {status}")
                time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode


def start_server(args: list[str], log_dir: Path, *, env: dict[str, str] | None = None,
                 token: str | None = None) -> ServerProc:
    """Start the server with ``args`` (roots and options; ``--port 0`` is added) and read
    its announce line from stdout."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stderr_path = log_dir / f"server-{time.monotonic_ns()}.err"
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "codesearch.server", *args, "--port", "0"],
            stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True,
            env=env or server_env(),
        )
    line = _readline(proc.stdout, START_TIMEOUT_S)
    if not line:
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"server did not announce itself; stderr:\n{stderr_path.read_text()}")
    return ServerProc(proc, json.loads(line), stderr_path, token)


LEXICAL = ["--model", "none", "--multi-model", "none"]
