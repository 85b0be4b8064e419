"""What a warm ``codesearch query`` imports before it sends its request: the standard
library's cheap parts and codesearch's stdlib-only modules, nothing that costs milliseconds
for what the daemon does (HTTP parsing through the email package, typing, hashing)."""

from __future__ import annotations

import json
import subprocess
import sys

#: Each costs a warm query 3-20 ms of a ~100 ms budget (benchmarks/cli_latency.py).
HEAVY = ("http.client", "email.parser", "typing", "hmac", "hashlib", "importlib.abc",
         "typer", "rich", "numpy", "torch", "pydantic", "asyncio")


def test_the_lean_query_path_imports_nothing_heavy():
    code = ("import sys, json; import codesearch.cli, codesearch.cli.lean, codesearch.server.daemon_client, "
            "codesearch.server.discovery, codesearch.pathnames; "
            f"print(json.dumps(sorted(m for m in {list(HEAVY)!r} if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == []
