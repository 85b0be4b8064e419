"""What the default models cost a new user: `codesearch index` wall time per configuration.

Random weights with the exact shapes of the default models (speed depends only on shapes,
never on weight values), built once into a cache folder with the test fixtures' writers
(tests/fixtures/models.py), so nothing is downloaded:

  dense   Alibaba-NLP/gte-modernbert-base's shape: ModernBERT-base (hidden 768, 22 layers,
          12 heads, intermediate 1152, local window 128, a global layer every 3rd, 8192
          positions; 149M parameters), CLS pooling + Normalize (sentence-transformers files)
  multi   lightonai/LateOn-Code-edge's shape: Ettin-17M (hidden 256, 7 layers, 4 heads,
          intermediate 384) with a 48-dim ColBERT `1_Dense` projection (PyLate files)

Both share a 50,368-token byte-level BPE trained with `tokenizers` on Python sources of the
installed site-packages, so token counts are those of a real code tokenizer.

For one repository the script runs `codesearch index` as a user would (a subprocess, a fresh
index folder each time, `--device` as given) for four configurations: lexical only, the 17M
ColBERT model only, the 149M dense model only, and both (the current default), and prints
wall time, chunks, texts and tokens encoded, chunks/s, the ratio to lexical-only, and the
1-minute load average before and after each run (the machine is shared; compare ratios).

    python benchmarks/default_cost.py PATH/TO/REPO
    python benchmarks/default_cost.py PATH --configs lexical,multi     # a subset
    python benchmarks/default_cost.py PATH --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
DEFAULT_CACHE = Path(os.environ.get("CODESEARCH_BENCH_CACHE", Path(tempfile.gettempdir()) / "codesearch-bench"))
VOCAB = 50368  # ModernBERT's vocabulary size

# Shapes of the default checkpoints (their config.json), as fixture keyword arguments.
DENSE_SHAPE = {"hidden_size": 768, "num_layers": 22, "heads": 12, "intermediate_size": 1152}
MULTI_SHAPE = {"hidden_size": 256, "num_layers": 7, "heads": 4, "intermediate_size": 384}
MULTI_DIM = 48  # LateOn-Code-edge's projection
MULTI_DOC_LENGTH = 2048  # its sentence_bert_config max_seq_length is 2047; chunks are <= 512 anyway

CONFIGS = {  # name -> (--model, --multi-model); None -> the built checkpoint of that kind
    "lexical": ("none", "none"),
    "multi": ("none", None),
    "dense": (None, "none"),
    "both": (None, None),
}
LABELS = {
    "lexical": "lexical only (`--model none --multi-model none`)",
    "multi": "17M ColBERT only (LateOn-Code-edge shape)",
    "dense": "149M dense only (gte-modernbert-base shape: chunks + whole files)",
    "both": "both (the current default)",
}


def load1() -> float:
    return os.getloadavg()[0]


def cpu_name() -> str:
    with open("/proc/cpuinfo") as f:
        return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")


def code_corpus(limit: int = 1500) -> list[str]:
    """Python sources of the installed packages: the BPE's training text (deterministic)."""
    files = sorted(p for pkg in ("torch", "transformers", "numpy") for p in (SITE / pkg).rglob("*.py"))
    random.Random(0).shuffle(files)
    out = []
    for f in files[:limit]:
        try:
            out.append(f.read_text(errors="replace"))
        except OSError:
            continue
    return out


def build_models(cache: Path) -> dict[str, Path]:
    """The two random checkpoints of the default shapes, built once into ``cache``."""
    from tests.fixtures.models import make_colbert, make_single_vector, make_tokenizer

    dense, multi = cache / "gte-modernbert-base-shape", cache / "lateon-code-edge-shape"
    bpe = cache / "code-bpe-50k.json"
    if not bpe.is_file():
        print(f"training a {VOCAB}-token code BPE into {bpe} ...", file=sys.stderr, flush=True)
        cache.mkdir(parents=True, exist_ok=True)
        make_tokenizer(vocab_size=VOCAB, corpus=code_corpus()).save(str(bpe))
    from tokenizers import Tokenizer

    if not (dense / "modules.json").is_file():
        print(f"writing random weights of gte-modernbert-base's shape into {dense} ...", file=sys.stderr, flush=True)
        make_single_vector(dense, pooling="cls", normalize=True, tokenizer=Tokenizer.from_file(str(bpe)), **DENSE_SHAPE)
    if not (multi / "modules.json").is_file():
        print(f"writing random weights of LateOn-Code-edge's shape into {multi} ...", file=sys.stderr, flush=True)
        make_colbert(
            multi, out_features=MULTI_DIM, document_length=MULTI_DOC_LENGTH,
            tokenizer=Tokenizer.from_file(str(bpe)), **MULTI_SHAPE,
        )
    return {"dense": dense, "multi": multi}


_ROW = re.compile(r"(chunks|texts encoded|tokens encoded|time \(s\))\W+([\d,.]+)")


def run_index(repo: Path, model: str, multi: str, device: str) -> dict:
    """One `codesearch index` subprocess into a fresh index folder; wall time and summary."""
    with tempfile.TemporaryDirectory(prefix="cs-default-cost-") as index_dir:
        cmd = [
            sys.executable, "-c", "from codesearch.cli import main; main()", "index", str(repo),
            "--index-dir", index_dir, "--model", model, "--multi-model", multi, "--device", device,
        ]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
        before = load1()
        t0 = time.perf_counter()
        r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if r.returncode:
            raise SystemExit(f"codesearch index failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")
    rows = {k: float(v.replace(",", "")) for k, v in _ROW.findall(r.stderr)}
    return {
        "wall_s": wall, "load_before": before, "load_after": load1(),
        "chunks": int(rows.get("chunks", 0)), "texts": int(rows.get("texts encoded", 0)),
        "tokens": int(rows.get("tokens encoded", 0)), "index_s": rows.get("time (s)"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", type=Path, help="repository folder to index")
    ap.add_argument("--out", type=Path, default=DEFAULT_CACHE, help=f"checkpoint cache (default {DEFAULT_CACHE})")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ",".join(CONFIGS))
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown:
        ap.error(f"unknown config {unknown[0]!r}; choose from {', '.join(CONFIGS)}")

    paths = build_models(args.out)
    import torch

    cpu = cpu_name()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"repository {args.repo.resolve()}; device {args.device}; CPU {cpu}, {os.cpu_count()} cores; "
          f"GPU {gpu}; torch {torch.__version__}; load average at start {load1():.2f}", flush=True)
    results = {}
    for name in names:
        model, multi = CONFIGS[name]
        res = run_index(args.repo, model or str(paths["dense"]), multi or str(paths["multi"]), args.device)
        results[name] = res
        print(f"  {name:8s} {res['wall_s']:8.1f} s  {res['chunks']:6d} chunks  {res['texts']:6d} texts  "
              f"{res['tokens']:8d} tokens  load {res['load_before']:.2f} -> {res['load_after']:.2f}", flush=True)

    base = results.get("lexical", {}).get("wall_s")
    print("\n| configuration | wall time | chunks | texts encoded | tokens encoded | chunks/s | x lexical "
          "| load (1 min) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, r in results.items():
        ratio = f"{r['wall_s'] / base:.1f}x" if base else "-"
        print(
            f"| {LABELS[name]} | {r['wall_s']:.1f} s | {r['chunks']} | {r['texts']} | {r['tokens']:,} | "
            f"{r['chunks'] / r['wall_s']:.1f} | {ratio} | {r['load_before']:.2f} -> {r['load_after']:.2f} |"
        )
    print(f"load average at end {load1():.2f}")
    if args.json:
        args.json.write_text(json.dumps({"repo": str(args.repo), "device": args.device, "results": results}, indent=2))


if __name__ == "__main__":
    main()
