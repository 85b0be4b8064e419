"""Encoder speed: our packed ModernBERT against transformers' ModernBertModel (SDPA).

Both run the same random ModernBERT-base weights (config of answerdotai/ModernBERT-base:
hidden 768, 22 layers, 12 heads, intermediate 1152, local_attention 128, vocab 50368,
8192 positions; 149M parameters), the same dtype, and the same length-sorted token-budget
batches, on three workloads of real code tokens (Python sources of torch and transformers,
tokenized with a byte-level BPE of 50368 tokens trained on that code; no real tokenizer is
available offline, and token counts are what matter here):

  short   chunks of 64-512 tokens
  mixed   chunks of 64-2048 tokens
  files   whole files of 4k-8k tokens

Every (implementation, workload) run is a separate subprocess, so its peak RSS (VmHWM, reset
after loading the model) is its own. Also printed: one 8192-token file with ModernBERT's
alternating local/global layers against every layer global (our path both times), and
fp32 against bf16.

    python benchmarks/encoder_speed.py            # full run (~10 min on 2 cores)
    python benchmarks/encoder_speed.py --quick    # a quarter of the tokens
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
CACHE = Path(os.environ.get("CODESEARCH_BENCH_CACHE", "/tmp/codesearch-bench"))
BASE_CONFIG = {
    "architectures": ["ModernBertModel"],
    "model_type": "modernbert",
    "vocab_size": 50368,
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "max_position_embeddings": 8192,
    "hidden_activation": "gelu",
    "norm_eps": 1e-5,
    "norm_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "local_attention": 128,
    "global_attn_every_n_layers": 3,
    "global_rope_theta": 160000.0,
    "local_rope_theta": 10000.0,
    "pad_token_id": 3,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "cls_token_id": 1,
    "sep_token_id": 2,
}
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
CLS, SEP = 1, 2
WORKLOADS = {"short": (64, 512), "mixed": (64, 2048), "files": (4000, 8190)}
BATCH_TOKENS = 16384


# ------------------------------------------------------------------------------ assets


def source_files() -> list[Path]:
    files = []
    for pkg in ("torch", "transformers"):
        files += sorted((SITE / pkg).rglob("*.py"))
    return [f for f in files if f.stat().st_size > 0]


def build_assets() -> Path:
    """Random ModernBERT-base weights and a code BPE, built once into CACHE."""
    model_dir = CACHE / "modernbert-base-random"
    if (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file():
        return model_dir
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import ModernBertConfig, ModernBertModel

    model_dir.mkdir(parents=True, exist_ok=True)
    print("building random ModernBERT-base weights and a 50368-token code BPE in", model_dir, file=sys.stderr)
    torch.manual_seed(0)
    ModernBertModel(ModernBertConfig(**BASE_CONFIG)).save_pretrained(str(model_dir), safe_serialization=True)
    (model_dir / "config.json").write_text(json.dumps(BASE_CONFIG, indent=2))

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=50368, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    sample = [f.read_text(errors="replace") for f in source_files()[::7]]
    tok.train_from_iterator(sample, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)]
    )
    tok.save(str(model_dir / "tokenizer.json"))
    return model_dir


def build_workloads(model_dir: Path, scale: float) -> dict[str, list[list[int]]]:
    """Token id lists ([CLS] ... [SEP]) cut from real source files, deterministic."""
    path = CACHE / f"workloads-{scale}.json"
    if path.is_file():
        return json.loads(path.read_text())
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    rng = random.Random(0)
    files = source_files()
    rng.shuffle(files)
    budgets = {"short": 64_000 * scale, "mixed": 96_000 * scale, "files": 48_000 * scale}
    out: dict[str, list[list[int]]] = {k: [] for k in WORKLOADS}
    used = {k: 0 for k in WORKLOADS}
    for f in files:
        if all(used[k] >= budgets[k] for k in WORKLOADS):
            break
        ids = tok.encode(f.read_text(errors="replace"), add_special_tokens=False).ids
        lo, hi = WORKLOADS["files"]
        if used["files"] < budgets["files"] and lo <= len(ids) + 2 <= hi:
            out["files"].append([CLS, *ids, SEP])
            used["files"] += len(ids) + 2
            continue
        for name in ("short", "mixed"):
            lo, hi = WORKLOADS[name]
            pos = 0
            while used[name] < budgets[name] and len(ids) - pos >= lo - 2:
                n = min(int(lo * (hi / lo) ** rng.random()), len(ids) - pos + 2)  # log-uniform length
                out[name].append([CLS, *ids[pos : pos + n - 2], SEP])
                used[name] += n
                pos += n - 2
            if used[name] < budgets[name]:
                break  # the rest of this file goes to nobody: keep workloads from different files
    path.write_text(json.dumps(out))
    return out


# ------------------------------------------------------------------------------ one run (subprocess)


def rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(impl: str, workload: str, dtype_name: str, scale: float, variant: str) -> dict:
    import torch

    from codesearch.encoder.runtime import token_batches

    model_dir = build_assets()
    seqs = build_workloads(model_dir, scale)[workload]
    if variant in ("one8192", "all_global"):  # one 8192-token input: whole files laid end to end
        stream = [t for s in seqs for t in s[1:-1]]
        while len(stream) < 8190:
            stream += stream
        seqs = [[CLS, *stream[:8190], SEP]]
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    batches = token_batches([len(s) for s in seqs], BATCH_TOKENS)

    if impl == "ours":
        from codesearch.encoder import load

        enc = load(model_dir, device="cpu", dtype=dtype, backend="sdpa")
        if variant == "all_global":  # cost of attending globally in every layer, same path otherwise
            for layer in enc.backbone.model.layers:
                layer.attn.is_local = False

        def run(batch):
            return enc.backbone([seqs[i] for i in batch], None)
    else:
        from transformers import ModernBertModel

        model = ModernBertModel.from_pretrained(str(model_dir), attn_implementation="sdpa", dtype=dtype).eval()

        def run(batch):
            L = max(len(seqs[i]) for i in batch)
            ids = torch.full((len(batch), L), BASE_CONFIG["pad_token_id"])
            mask = torch.zeros((len(batch), L), dtype=torch.long)
            for j, i in enumerate(batch):
                ids[j, : len(seqs[i])] = torch.tensor(seqs[i])
                mask[j, : len(seqs[i])] = 1
            with torch.inference_mode():
                return model(input_ids=ids, attention_mask=mask).last_hidden_state

    run([min(range(len(seqs)), key=lambda i: len(seqs[i]))])  # warm-up: oneDNN kernels, allocator
    base = rss_mb("VmRSS")
    try:  # reset the peak so it measures encoding, not loading
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    t0, c0 = time.perf_counter(), time.process_time()
    for batch in batches:
        run(batch)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(s) for s in seqs)
    return {
        "impl": impl, "workload": workload, "dtype": dtype_name, "variant": variant, "sequences": len(seqs),
        "tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds, "cpu_seconds": cpu_seconds,
        "tok_per_cpu_s": tokens / cpu_seconds,
        "peak_rss_mb": rss_mb("VmHWM"), "base_rss_mb": base,
    }


def spawn(impl: str, workload: str, dtype: str, scale: float, variant: str = "") -> dict:
    cmd = [sys.executable, __file__, "--worker", impl, workload, dtype, str(scale), variant or "-"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"worker {impl}/{workload} failed:\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(
        f"  {impl:12s} {workload:6s} {dtype:4s} {variant or '':10s} {res['tokens']:7d} tok "
        f"{res['seconds']:7.2f} s {res['tok_per_s']:8.0f} tok/s ({res['tok_per_cpu_s']:6.0f}/CPU s)  peak {res['peak_rss_mb']:6.0f} MB "
        f"(+{res['peak_rss_mb'] - res['base_rss_mb']:.0f} over loaded model)",
        flush=True,
    )
    return res


# ------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a quarter of the tokens per workload")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="dtype of the main comparison")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        impl, workload, dtype, scale, variant = args.worker
        print(json.dumps(worker(impl, workload, dtype, float(scale), "" if variant == "-" else variant)))
        return

    import platform

    import torch

    scale = 0.25 if args.quick else 1.0
    model_dir = build_assets()
    loads = build_workloads(model_dir, scale)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"{platform.python_version()}; load average at start {os.getloadavg()[0]:.1f}")
    for name, seqs in loads.items():
        lens = sorted(len(s) for s in seqs)
        print(f"workload {name}: {len(seqs)} sequences, {sum(lens)} tokens, lengths {lens[0]}-{lens[-1]}, "
              f"median {lens[len(lens) // 2]}")

    print(f"\nours vs transformers ModernBertModel (sdpa), {args.dtype}, batches of <= {BATCH_TOKENS} tokens:")
    table = []
    for workload in WORKLOADS:
        ours = spawn("ours", workload, args.dtype, scale)
        hf = spawn("transformers", workload, args.dtype, scale)
        table.append((workload, ours, hf))

    print("\n8192-token file, our path: alternating local/global layers vs every layer global:")
    alt = spawn("ours", "files", args.dtype, scale, "one8192")
    glob = spawn("ours", "files", args.dtype, scale, "all_global")
    print("\nprecision, ours, mixed workload:")
    fp32 = spawn("ours", "mixed", "fp32", scale)
    bf16 = next(o for w, o, _ in table if w == "mixed") if args.dtype == "bf16" else spawn("ours", "mixed", "bf16", scale)

    print("\nsummary")
    print("| workload | ours tok/s (per CPU s) | transformers tok/s (per CPU s) | speed-up wall (CPU) "
          "| ours peak MB | transformers peak MB |")
    print("|---|---:|---:|---:|---:|---:|")
    for workload, o, h in table:
        print(f"| {workload} | {o['tok_per_s']:.0f} ({o['tok_per_cpu_s']:.0f}) | {h['tok_per_s']:.0f} "
              f"({h['tok_per_cpu_s']:.0f}) | {o['tok_per_s'] / h['tok_per_s']:.2f}x "
              f"({o['tok_per_cpu_s'] / h['tok_per_cpu_s']:.2f}x) | {o['peak_rss_mb']:.0f} | {h['peak_rss_mb']:.0f} |")
    print(f"8192 tokens: alternating {alt['seconds']:.2f} s ({alt['cpu_seconds']:.2f} CPU s), all global "
          f"{glob['seconds']:.2f} s ({glob['cpu_seconds']:.2f} CPU s): local layers save "
          f"{glob['cpu_seconds'] / alt['cpu_seconds']:.2f}x CPU")
    print(f"mixed: fp32 {fp32['tok_per_s']:.0f} tok/s ({fp32['tok_per_cpu_s']:.0f}/CPU s), bf16 "
          f"{bf16['tok_per_s']:.0f} tok/s ({bf16['tok_per_cpu_s']:.0f}/CPU s): bf16 "
          f"{bf16['tok_per_cpu_s'] / fp32['tok_per_cpu_s']:.2f}x per CPU s")
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
