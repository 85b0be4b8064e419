"""Where a CPU forward pass spends its time: ours against transformers, op by op.

Both encoders run the same batches (encoder_speed.py's random weights, its length-sorted
batches of <= 16,384 tokens) under ``torch.profiler``; the script prints each one's time per
kind of work (matmuls, attention, elementwise, copies and fills, the rest) and its top ops by
self time, so that a run on a new processor shows which part to look at first. Also printed:
the CPU kind (``lscpu``) and, for bf16 against fp32, one projection-sized matmul per dtype
(what ``runtime.cpu_has_fast_bf16`` decides from).

    python benchmarks/encoder_profile.py --layers 6 --dtype bf16            # chunks of 40 lines
    python benchmarks/encoder_profile.py --shape 17m --dtype fp32 --threads 1 --rows 25
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import encoder_speed as es  # noqa: E402 - benchmarks/ is not a package

KINDS = {  # op name fragments -> kind of work
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "mkldnn", "aten::matmul"),
    "attention": ("scaled_dot_product", "flash_attention"),
    "copies and fills": ("aten::copy_", "aten::fill_", "aten::zero_", "aten::cat", "aten::index", "aten::clone"),
    "elementwise": ("aten::mul", "aten::add", "aten::sub", "aten::gelu", "aten::layer_norm", "aten::native_layer_norm",
                    "aten::addcmul", "aten::neg", "aten::where", "aten::div", "aten::silu", "aten::masked_fill"),
}


def kind_of(name: str) -> str:
    for kind, parts in KINDS.items():
        if any(p in name for p in parts):
            return kind
    return "the rest"


def profile(run, batches, rows: int) -> tuple[float, dict[str, float], str]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    run(batches[-1])  # warm-up
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in batches:
            run(b)
    averages = prof.key_averages()
    by_kind: dict[str, float] = defaultdict(float)
    for e in averages:
        by_kind[kind_of(e.key)] += e.self_cpu_time_total / 1e6
    table = averages.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=48)
    return sum(by_kind.values()), dict(by_kind), table


def matmul_rates(hidden: int, tokens: int = 2048) -> str:
    import time

    import torch
    import torch.nn.functional as F

    out = []
    for dt in (torch.float32, torch.bfloat16):
        a, w = torch.randn(tokens, hidden, dtype=dt), torch.randn(3 * hidden, hidden, dtype=dt)
        F.linear(a, w)
        best = min(_timed(lambda a=a, w=w: F.linear(a, w), time) for _ in range(5))
        out.append(f"{str(dt).removeprefix('torch.')} {2 * tokens * hidden * 3 * hidden / best / 1e9:.0f} GFLOP/s")
    return ", ".join(out)


def _timed(f, time) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=list(es.SHAPES), default="base")
    ap.add_argument("--layers", type=int, help="layer count (default: the shape's)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="fp32")
    ap.add_argument("--workload", choices=[*es.WORKLOADS, "chunks40"], default="chunks40")
    ap.add_argument("--scale", type=float, default=0.1, help="share of encoder_speed.py's full workload")
    ap.add_argument("--threads", type=int, help="intra-op threads (default: torch's)")
    ap.add_argument("--rows", type=int, default=15, help="top ops printed per encoder")
    args = ap.parse_args()

    import json

    import torch
    from transformers import ModernBertModel

    from codesearch.encoder import load
    from codesearch.encoder.runtime import token_batches

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    model_dir = es.build_assets(args.shape, args.layers)
    config = json.loads((model_dir / "config.json").read_text())
    if args.workload == "chunks40":
        seqs = es.build_chunks(model_dir, args.scale)
    else:
        seqs = es.build_workloads(model_dir, args.scale)[args.workload]
    batches = [[seqs[i] for i in b] for b in token_batches([len(s) for s in seqs], es.BATCH_TOKENS)]
    tokens = sum(map(len, seqs))
    print(f"CPU: {es.cpu_kind()}")
    print(f"matmul {config['hidden_size']} -> {3 * config['hidden_size']} on 2048 tokens: "
          f"{matmul_rates(config['hidden_size'])}")
    print(f"{args.shape} shape, {config['num_hidden_layers']} layers, {args.dtype}, workload {args.workload}: "
          f"{len(seqs)} sequences, {tokens} tokens, {len(batches)} batches")

    enc = load(model_dir, device="cpu", dtype=dtype, backend="sdpa")
    hf = ModernBertModel.from_pretrained(str(model_dir), attn_implementation="sdpa", dtype=dtype).eval()
    runs = {
        "ours": lambda b: enc.backbone(b, None),
        "transformers": lambda b: es.hf_forward(hf, b, config["pad_token_id"]),
    }
    results = {name: profile(run, batches, args.rows) for name, run in runs.items()}
    print("\n| kind of work | " + " | ".join(f"{n} s (share)" for n in results) + " |")
    print("|---|" + "---:|" * len(results))
    for kind in [*KINDS, "the rest"]:
        cells = [f"{r[1].get(kind, 0):.2f} ({r[1].get(kind, 0) / r[0]:.0%})" for r in results.values()]
        print(f"| {kind} | " + " | ".join(cells) + " |")
    print("| total (profiled, tok/s) | " + " | ".join(f"{r[0]:.2f} ({tokens / r[0]:,.0f})" for r in results.values())
          + " |")
    for name, (_, _, table) in results.items():
        print(f"\n{name}: top ops by self time\n{table}")


if __name__ == "__main__":
    main()
