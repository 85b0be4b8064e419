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

``--suite paired`` (CPU) loads ours and transformers in ONE process, per dtype, and runs
each batch through both back to back (the order alternating), for ``--rounds`` rounds: on
a shared machine a neighbour's load then hits both alike. It prints wall and per-CPU-second
rates (best round and median), the ratio, the CPU kind (``lscpu``: model, family/model,
AVX512/bf16/AMX flags, the instruction-set caps in the environment and whether our bf16 model
computes in bf16 here) and the load average, and the GEMM bound: how fast the model's four
projections alone run in our compute dtype (``gemm_ceiling``), over transformers' rate, the
most any packed path can gain with torch's GEMMs. Other CPU kinds can be stood in for by
capping the instruction sets torch's kernels use, e.g. AVX2 only:

    ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 \
        python benchmarks/encoder_speed.py --suite paired --layers 6 --workloads chunks40 --threads 1

``--shape 17m`` is the default ColBERT model's shape (Ettin-17M: hidden 256, 7 layers, 4 heads,
intermediate 384), ``--layers N`` any layer count, and workload ``chunks40`` the workload of
the outside check on a real Zen 4 (BENCHMARKS.md, 'Encoder against transformers'): code
chunks of 40 lines (400 of them at scale 1).

    python benchmarks/encoder_speed.py --suite paired --layers 6 --workloads chunks40 mixed
    python benchmarks/encoder_speed.py --suite paired --shape 17m --workloads chunks40 --dtypes fp32

On a GPU (``--device cuda``) the comparison is end to end: ``Encoder.encode()`` (tokenizing,
batching, the head, the copy back) with a dense head (CLS pooling + normalisation) and with a
ColBERT head (768 -> 128 projection, skiplist, normalisation), against transformers'
ModernBertModel (sdpa) with the same tokenizer, the same head on the GPU and length-sorted
padded batches of 65536 padded tokens; plus the one-time compile and peak GPU memory.

    python benchmarks/encoder_speed.py --device cuda            # bf16, ~1M tokens per workload
    python benchmarks/encoder_speed.py --device cpu --suite encode --scale 0.02 --workloads short  # on CPU
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
sys.path.insert(0, os.environ.get("CODESEARCH_BENCH_BASELINE", str(ROOT)))  # the baseline worker's checkout

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
# Other model shapes, as changes to BASE_CONFIG (speed depends on shapes, not weight values).
SHAPES = {
    "base": {},
    "17m": {"hidden_size": 256, "num_hidden_layers": 7, "num_attention_heads": 4, "intermediate_size": 384},
}
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
CLS, SEP = 1, 2
WORKLOADS = {"short": (64, 512), "mixed": (64, 2048), "files": (4000, 8190)}
CHUNK_LINES, CHUNKS = 40, 400  # workload "chunks40": code chunks of 40 lines, 400 at scale 1
BATCH_TOKENS = 16384


# ------------------------------------------------------------------------------ assets


def source_files() -> list[Path]:
    files = []
    for pkg in ("torch", "transformers"):
        files += sorted((SITE / pkg).rglob("*.py"))
    return [f for f in files if f.stat().st_size > 0]


def cpu_kind() -> str:
    """The processor as ``lscpu`` names it, with the flags that decide the CPU path's speed."""
    import torch

    info: dict[str, str] = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
        info = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in out.splitlines())}
    except (OSError, subprocess.SubprocessError):
        pass
    flags = set(info.get("Flags", "").split())
    if not flags:
        cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
        flags = set(next((ln.split(":", 1)[1] for ln in cpuinfo.splitlines() if ln.startswith("flags")), "").split())
    from codesearch.encoder.cpu import ISA_CAPS, cpu_has_fast_bf16

    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile")
    has = [f for f in wanted if f in flags] or ["none of " + "/".join(wanted)]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    # a capped CPU still lists every flag: the caps say which instruction sets the kernels use
    caps = " ".join(f"{k}={os.environ[k]}" for k in ISA_CAPS if os.environ.get(k)) or "none"
    return (
        f"{info.get('Model name', '?')} (vendor {info.get('Vendor ID', '?')}, family {info.get('CPU family', '?')} "
        f"model {info.get('Model', '?')}), {cores} cores for this process, flags: {' '.join(has)}; "
        f"instruction-set caps: {caps}; torch {torch.__version__} CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads; "
        f"bf16 fast here (our bf16 models compute in bf16): {'yes' if cpu_has_fast_bf16() else 'no, in fp32'}"
    )


def gemm_ceiling(config: dict, dtype, rows: int = 1024, repeats: int = 3) -> float:
    """Tokens per CPU-second if a forward pass did nothing but its four projections per layer
    (Wqkv, Wo, Wi, MLP Wo) in ``dtype``, on ``rows``-token slices as ``CpuLayers`` runs them.

    Both encoders do these same multiply-adds with torch's own GEMMs, so ``ceiling /
    transformers`` bounds the speed-up any packed path can reach at that compute dtype.
    """
    import torch
    import torch.nn.functional as F

    h, i = config["hidden_size"], config["intermediate_size"]
    g = torch.Generator().manual_seed(0)
    pairs = [
        (torch.randn(rows, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype))
        for k, n in ((h, 3 * h), (h, h), (h, 2 * i), (i, h))
    ]
    best = float("inf")
    with torch.inference_mode():
        for r in range(repeats + 1):  # the first builds oneDNN's kernels
            c0 = time.process_time()
            for x, w in pairs:
                F.linear(x, w)
            if r:
                best = min(best, time.process_time() - c0)
    return rows / (best * config["num_hidden_layers"])


def build_assets(shape: str = "base", layers: int | None = None) -> Path:
    """Random ModernBERT weights of ``shape`` (``layers`` overrides its layer count) and a code
    BPE, built once into CACHE."""
    if shape != "base" or layers not in (None, BASE_CONFIG["num_hidden_layers"]):
        return build_shape(shape, layers)
    model_dir = CACHE / "modernbert-base-random"
    if (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file():
        return model_dir
    import torch
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
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
        vocab_size=50368,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    sample = [f.read_text(errors="replace") for f in source_files()[::7]]
    tok.train_from_iterator(sample, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)]
    )
    tok.save(str(model_dir / "tokenizer.json"))
    return model_dir


def build_shape(shape: str, layers: int | None) -> Path:
    """Random weights of another shape, the base assets' tokenizer beside them."""
    import shutil

    import torch
    from transformers import ModernBertConfig, ModernBertModel

    config = {**BASE_CONFIG, **SHAPES[shape]}
    if layers is not None:
        config["num_hidden_layers"] = layers
    model_dir = CACHE / f"modernbert-{shape}-L{config['num_hidden_layers']}-random"
    if (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file():
        return model_dir
    tokenizer = build_assets() / "tokenizer.json"
    model_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    ModernBertModel(ModernBertConfig(**config)).save_pretrained(str(model_dir), safe_serialization=True)
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(tokenizer, model_dir / "tokenizer.json")
    return model_dir


def cached_tokens(model_dir: Path, name: str, cut):
    """``cut(tokenizer, files, rng)``'s token id lists, built once into ``CACHE/name`` and read
    back after: every workload tokenizes the same shuffled source files with the base BPE."""
    path = CACHE / name
    if path.is_file():
        return json.loads(path.read_text())
    from tokenizers import Tokenizer

    rng = random.Random(0)
    files = source_files()
    rng.shuffle(files)
    out = cut(Tokenizer.from_file(str(model_dir / "tokenizer.json")), files, rng)
    path.write_text(json.dumps(out))
    return out


def build_chunks(model_dir: Path, scale: float) -> list[list[int]]:
    """Workload ``chunks40``: consecutive 40-line chunks of shuffled source files (the shape of
    the outside check on a real Zen 4), as token ids with [CLS] and [SEP]; deterministic."""

    def cut(tok, files, rng) -> list[list[int]]:
        want, texts = max(1, round(CHUNKS * scale)), []
        for f in files:
            lines = f.read_text(errors="replace").splitlines()
            for start in range(0, len(lines) - CHUNK_LINES + 1, CHUNK_LINES):
                texts.append("\n".join(lines[start : start + CHUNK_LINES]))
            if len(texts) >= want:
                break
        return [[CLS, *tok.encode(t, add_special_tokens=False).ids[:8190], SEP] for t in texts[:want]]

    return cached_tokens(model_dir, f"chunks{CHUNK_LINES}-{scale}.json", cut)


def build_workloads(model_dir: Path, scale: float) -> dict[str, list[list[int]]]:
    """Token id lists ([CLS] ... [SEP]) cut from real source files, deterministic."""

    def cut(tok, files, rng) -> dict[str, list[list[int]]]:
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
        return out

    return cached_tokens(model_dir, f"workloads-{scale}.json", cut)


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
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
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
            return hf_forward(model, [seqs[i] for i in batch], BASE_CONFIG["pad_token_id"])

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
        "impl": impl,
        "workload": workload,
        "dtype": dtype_name,
        "variant": variant,
        "sequences": len(seqs),
        "tokens": tokens,
        "seconds": seconds,
        "tok_per_s": tokens / seconds,
        "cpu_seconds": cpu_seconds,
        "tok_per_cpu_s": tokens / cpu_seconds,
        "peak_rss_mb": rss_mb("VmHWM"),
        "base_rss_mb": base,
    }


def spawn(impl: str, workload: str, dtype: str, scale: float, variant: str = "") -> dict:
    cmd = [sys.executable, __file__, "--worker", impl, workload, dtype, str(scale), variant or "-"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"worker {impl}/{workload} failed:\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(
        f"  {impl:12s} {workload:6s} {dtype:4s} {variant or '':10s} {res['tokens']:7d} tok "
        f"{res['seconds']:7.2f} s {res['tok_per_s']:8.0f} tok/s ({res['tok_per_cpu_s']:6.0f}/CPU s)  "
        f"peak {res['peak_rss_mb']:6.0f} MB "
        f"(+{res['peak_rss_mb'] - res['base_rss_mb']:.0f} over loaded model)",
        flush=True,
    )
    return res


# ------------------------------------------------------------------------------ encode() suite (GPU)

HF_BATCH_TOKENS = 65536  # padded tokens per transformers batch (the setting of the reported H100 figures)
COLBERT_DIM = 128


def head_dirs(model_dir: Path) -> dict[str, Path]:
    """The base weights with a dense head (CLS + Normalize) and with a ColBERT head, as the
    sentence-transformers / PyLate files lay them out (weights linked, not copied)."""
    import torch
    from safetensors.torch import save_file

    out = {}
    for head in ("dense", "colbert"):
        d = CACHE / f"modernbert-base-random-{head}"
        out[head] = d
        if (d / "modules.json").is_file():
            continue
        d.mkdir(parents=True, exist_ok=True)
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            if not (d / f).exists():
                (d / f).symlink_to(model_dir / f)
        if head == "dense":
            modules = [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ]
            (d / "1_Pooling").mkdir(exist_ok=True)
            (d / "1_Pooling" / "config.json").write_text(
                json.dumps(
                    {"word_embedding_dimension": 768, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
                )
            )
        else:
            modules = [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
            ]
            (d / "1_Dense").mkdir(exist_ok=True)
            (d / "1_Dense" / "config.json").write_text(
                json.dumps(
                    {
                        "in_features": 768,
                        "out_features": COLBERT_DIM,
                        "bias": False,
                        "activation_function": "torch.nn.modules.linear.Identity",
                    }
                )
            )
            g = torch.Generator().manual_seed(1)
            save_file(
                {"linear.weight": torch.randn(COLBERT_DIM, 768, generator=g) / 768**0.5},
                str(d / "1_Dense" / "model.safetensors"),
            )
            # no prefix tokens: the code BPE has no spare ids; documents up to the model's 8192 tokens
            (d / "config_sentence_transformers.json").write_text(
                json.dumps(
                    {
                        "model_type": "ColBERT",
                        "query_prefix": "",
                        "document_prefix": "",
                        "query_length": 32,
                        "document_length": 8192,
                        "do_query_expansion": True,
                        "attend_to_expansion_tokens": False,
                    }
                )
            )
        (d / "modules.json").write_text(json.dumps(modules))
    return out


def workload_texts(model_dir: Path, scale: float) -> dict[str, list[str]]:
    """The token workloads decoded back to source text (encode() takes text)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return {name: tok.decode_batch([s[1:-1] for s in seqs]) for name, seqs in build_workloads(model_dir, scale).items()}


class _Device:
    """Synchronisation and peak memory, on CUDA or (to run this suite anywhere) the CPU."""

    def __init__(self, name: str):
        import torch

        self.torch, self.dev = torch, torch.device(name)

    def sync(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)

    def reset_peak(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.reset_peak_memory_stats(self.dev)
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                pass

    def peak_mb(self) -> float:
        if self.dev.type == "cuda":
            return self.torch.cuda.max_memory_allocated(self.dev) / 2**20
        return rss_mb("VmHWM")


def encode_worker(impl: str, workload: str, head: str, dtype_name: str, scale: float, device: str) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    model_dir = build_assets()
    head_dir = head_dirs(model_dir)[head]
    texts = workload_texts(model_dir, scale)[workload]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    d = _Device(device)

    if impl == "ours":
        from codesearch.encoder import load

        enc = load(head_dir, device=device, dtype=dtype)

        def run() -> int:
            out = enc.encode(texts, kind="document")
            return sum(len(v) for v in out) if head == "colbert" else len(out)

        info = {"backend": enc.backend, "batch_tokens": enc.batch_tokens}
    else:
        from safetensors.torch import load_file
        from tokenizers import Tokenizer
        from transformers import ModernBertModel

        tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tok.enable_truncation(8192)
        model = ModernBertModel.from_pretrained(str(model_dir), attn_implementation="sdpa", dtype=dtype)
        model = model.to(d.dev).eval()
        proj = skip = None
        if head == "colbert":
            import string

            proj = load_file(str(head_dir / "1_Dense" / "model.safetensors"))["linear.weight"].to(d.dev, dtype)
            skip = np.array(sorted({tok.token_to_id(c) for c in string.punctuation} - {None}))
        pad = BASE_CONFIG["pad_token_id"]

        def run() -> int:
            ids = [e.ids for e in tok.encode_batch(texts)]
            order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
            batches, cur = [], []
            for i in order:  # length-sorted, at most HF_BATCH_TOKENS padded tokens a batch
                if cur and (len(cur) + 1) * len(ids[cur[0]]) > HF_BATCH_TOKENS:
                    batches.append(cur)
                    cur = []
                cur.append(i)
            if cur:
                batches.append(cur)
            rows = 0
            for b in batches:
                L = len(ids[b[0]])
                x = torch.full((len(b), L), pad, dtype=torch.long)
                mask = torch.zeros((len(b), L), dtype=torch.long)
                for j, i in enumerate(b):
                    x[j, : len(ids[i])] = torch.tensor(ids[i])
                    mask[j, : len(ids[i])] = 1
                with torch.inference_mode():
                    h = model(input_ids=x.to(d.dev), attention_mask=mask.to(d.dev)).last_hidden_state
                    if head == "dense":
                        rows += len(F.normalize(h[:, 0].float(), dim=-1).cpu().numpy())
                    else:
                        v = F.normalize(F.linear(h, proj).float(), dim=-1).cpu().numpy()  # (B, L, 128)
                        for j, i in enumerate(b):
                            keep = ~np.isin(np.asarray(ids[i]), skip)
                            rows += len(v[j, : len(ids[i])][keep])
            return rows

        info = {"backend": "transformers-sdpa", "batch_tokens": HF_BATCH_TOKENS}

    t0 = time.perf_counter()
    run()  # warm-up: kernels, allocator, and (ours, CUDA) the one-time compile
    d.sync()
    warm = time.perf_counter() - t0
    d.reset_peak()
    t0 = time.perf_counter()
    rows = run()
    d.sync()
    seconds = time.perf_counter() - t0
    from tokenizers import Tokenizer

    counter = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokens = sum(min(len(e.ids), 8192) for e in counter.encode_batch(texts))
    return {
        "impl": impl,
        "workload": workload,
        "head": head,
        "dtype": dtype_name,
        "texts": len(texts),
        "tokens": tokens,
        "rows": rows,
        "seconds": seconds,
        "tok_per_s": tokens / seconds,
        "warmup_s": warm,
        "peak_mb": d.peak_mb(),
        **info,
    }


def spawn_encode(impl: str, workload: str, head: str, dtype: str, scale: float, device: str) -> dict:
    cmd = [sys.executable, __file__, "--encode-worker", impl, workload, head, dtype, str(scale), device]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"worker {impl}/{workload}/{head} failed:\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(
        f"  {impl:12s} {workload:6s} {head:7s} {res['tokens']:8d} tok {res['seconds']:7.2f} s "
        f"{res['tok_per_s']:9.0f} tok/s  peak {res['peak_mb']:7.0f} MB  warm-up {res['warmup_s']:.1f} s "
        f"({res['backend']}, batches of {res['batch_tokens']})",
        flush=True,
    )
    return res


def main_encode(args) -> None:
    import torch

    scale = args.scale if args.scale is not None else (16.0 if args.device == "cuda" else 0.25)
    model_dir = build_assets()
    head_dirs(model_dir)
    texts = workload_texts(model_dir, scale)
    if args.device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(args.device))
        print(f"device: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    else:
        print(
            f"device: CPU ({os.cpu_count()} cores), torch {torch.__version__}; "
            f"load average at start {os.getloadavg()[0]:.1f}"
        )
    for name, ts in texts.items():
        print(f"workload {name}: {len(ts)} texts, {sum(map(len, ts))} characters")
    print(f"\nencode() end to end, ours vs transformers ModernBertModel (sdpa), {args.dtype}:")
    rows = []
    for workload in args.workloads or WORKLOADS:
        for head in ("dense", "colbert"):
            ours = spawn_encode("ours", workload, head, args.dtype, scale, args.device)
            hf = spawn_encode("transformers", workload, head, args.dtype, scale, args.device)
            rows.append((workload, head, ours, hf))
    print(
        "\n| workload | head | ours tok/s | transformers tok/s | speed-up | ours peak MB | transformers peak MB "
        "| ours warm-up s (compile) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for workload, head, o, h in rows:
        print(
            f"| {workload} | {head} | {o['tok_per_s']:.0f} | {h['tok_per_s']:.0f} | "
            f"{o['tok_per_s'] / h['tok_per_s']:.2f}x | {o['peak_mb']:.0f} | {h['peak_mb']:.0f} | {o['warmup_s']:.1f} |"
        )


# ------------------------------------------------------------------------------ paired suite (CPU)


def hf_forward(model, seqs: list[list[int]], pad: int):
    """transformers' padded forward over one batch of token id lists."""
    import torch

    from codesearch.encoder.runtime import padded_inputs

    ids, mask = padded_inputs(seqs, pad)
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state


class BaselineWorker:
    """Another checkout's encoder (``--baseline DIR``: a folder holding a ``codesearch``
    package, e.g. ``git archive main codesearch | tar -x -C DIR``) in a child process that runs
    one batch per request and reports its own wall and CPU time. The child waits on a pipe
    between requests, so the paired suite can interleave it with the in-process encoders."""

    def __init__(self, root: str, model_dir: Path, dtype: str, threads: int | None):
        env = {**os.environ, "CODESEARCH_BENCH_BASELINE": str(Path(root).resolve())}
        cmd = [sys.executable, __file__, "--baseline-worker", str(model_dir), dtype, str(threads or 0)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.times = (0.0, 0.0)

    def __call__(self, seqs: list[list[int]]) -> None:
        self.proc.stdin.write(json.dumps(seqs) + "\n")
        self.proc.stdin.flush()
        self.times = tuple(json.loads(self.proc.stdout.readline()))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def baseline_worker(model_dir: str, dtype_name: str, threads: int) -> None:
    """The child of :class:`BaselineWorker`: a batch of token ids per stdin line, ``[wall, cpu]``
    seconds per stdout line."""
    import torch

    import codesearch
    from codesearch.encoder import load

    if threads:
        torch.set_num_threads(threads)
    print(f"baseline: {Path(codesearch.__file__).parent}", file=sys.stderr, flush=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    enc = load(model_dir, device="cpu", dtype=dtype, backend="sdpa")
    for line in sys.stdin:
        seqs = json.loads(line)
        t0, c0 = time.perf_counter(), time.process_time()
        enc.backbone(seqs, None)
        print(json.dumps([time.perf_counter() - t0, time.process_time() - c0]), flush=True)


def main_paired(args) -> None:
    """Ours and transformers in one process, batch by batch, on the same weights and dtype;
    optionally the baseline checkout's encoder (``--baseline``) and ours without the thread cap
    under contention (``--uncapped``), interleaved with them."""
    import statistics

    import torch
    from transformers import ModernBertModel

    from codesearch.encoder import load, runtime
    from codesearch.encoder.runtime import token_batches

    scale = 0.25 if args.quick else (args.scale or 1.0)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = build_assets(args.shape, args.layers)
    config = json.loads((model_dir / "config.json").read_text())
    loads = {
        w: build_chunks(model_dir, scale) if w == "chunks40" else build_workloads(model_dir, scale)[w]
        for w in args.workloads or ["chunks40", "mixed"]
    }
    print(f"CPU: {cpu_kind()}")
    print(
        f"model: {args.shape} shape, hidden {config['hidden_size']}, {config['num_hidden_layers']} layers, "
        f"{config['num_attention_heads']} heads, intermediate {config['intermediate_size']} (random weights)"
    )
    for name, seqs in loads.items():
        lens = sorted(map(len, seqs))
        print(
            f"workload {name}: {len(seqs)} sequences, {sum(lens)} tokens, lengths {lens[0]}-{lens[-1]}, "
            f"median {lens[len(lens) // 2]}"
        )

    def uncapped(enc, seqs):
        cap = runtime.CONTENTION.threads
        runtime.CONTENTION.threads = lambda default: default
        try:
            return enc.backbone(seqs, None)
        finally:
            runtime.CONTENTION.threads = cap

    rows = []
    for dtype_name in args.dtypes:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
        enc = load(model_dir, device="cpu", dtype=dtype, backend="sdpa")
        hf = ModernBertModel.from_pretrained(str(model_dir), attn_implementation="sdpa", dtype=dtype).eval()
        fused = enc.backbone.model.fused
        compute = (fused.compute if fused is not None else None) or dtype
        ceiling = gemm_ceiling(config, compute)
        print(
            f"{dtype_name}: ours computes in {str(compute).removeprefix('torch.')}; its GEMMs alone would run "
            f"{ceiling:,.0f} tok per CPU-second ({torch.get_num_threads()} threads)",
            flush=True,
        )
        impls = {
            "ours": lambda seqs, enc=enc: enc.backbone(seqs, None),
            "transformers": lambda seqs, hf=hf: hf_forward(hf, seqs, config["pad_token_id"]),
        }
        if args.uncapped:
            impls["ours uncapped"] = lambda seqs, enc=enc: uncapped(enc, seqs)
        base = BaselineWorker(args.baseline, model_dir, dtype_name, args.threads) if args.baseline else None
        if base:
            impls["baseline"] = base
        for workload, seqs in loads.items():
            batches = [[seqs[i] for i in b] for b in token_batches([len(s) for s in seqs], BATCH_TOKENS)]
            for run in impls.values():  # warm-up: oneDNN kernels, the allocator
                run(batches[-1])
            wall = {k: [[0.0] * args.rounds for _ in batches] for k in impls}
            cpu = {k: [[0.0] * args.rounds for _ in batches] for k in impls}
            load_avg = [os.getloadavg()[0]]
            for r in range(args.rounds):
                for bi, batch in enumerate(batches):
                    names = list(impls)  # each batch in a rotated order, so no one always runs first
                    names = names[(r + bi) % len(names) :] + names[: (r + bi) % len(names)]
                    for k in names:
                        t0, c0 = time.perf_counter(), time.process_time()
                        impls[k](batch)
                        wall[k][bi][r], cpu[k][bi][r] = time.perf_counter() - t0, time.process_time() - c0
                        if k == "baseline":
                            wall[k][bi][r], cpu[k][bi][r] = base.times
                load_avg.append(os.getloadavg()[0])
                print(f"    {workload} {dtype_name}: round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)
            tokens = sum(map(len, seqs))
            res = {}
            for k in impls:
                # per batch: its best round (what the code can do) and its median round
                res[k] = {
                    "best": tokens / sum(min(b) for b in wall[k]),
                    "median": tokens / sum(statistics.median(b) for b in wall[k]),
                    "cpu_best": tokens / sum(min(b) for b in cpu[k]),
                }
            h = res["transformers"]
            for k, o in res.items():
                if k == "transformers":
                    continue
                rows.append((workload, dtype_name, k, tokens, o, h, min(load_avg), max(load_avg), ceiling))
                print(
                    f"  {workload:8s} {dtype_name:4s} {tokens:7d} tok: {k} {o['best']:7.0f} tok/s "
                    f"(median {o['median']:.0f}, {o['cpu_best']:.0f}/CPU s), transformers {h['best']:7.0f} "
                    f"(median {h['median']:.0f}, {h['cpu_best']:.0f}/CPU s): {o['best'] / h['best']:.2f}x "
                    f"(median {o['median'] / h['median']:.2f}x, per CPU s {o['cpu_best'] / h['cpu_best']:.2f}x); "
                    f"GEMM ceiling {ceiling:,.0f}/CPU s: ours at {o['cpu_best'] / ceiling:.0%}, bound "
                    f"{ceiling / h['cpu_best']:.2f}x; load {min(load_avg):.1f}-{max(load_avg):.1f}",
                    flush=True,
                )
        if base:
            base.close()
    print(
        "\n| workload | dtype | encoder | tokens | tok/s best (median; per CPU s) | transformers tok/s best "
        "(median; per CPU s) | speed-up best (median; per CPU s) | GEMM bound | load |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for workload, dt, k, tokens, o, h, lo, hi, ceiling in rows:
        print(
            f"| {workload} | {dt} | {k} | {tokens:,} | {o['best']:,.0f} ({o['median']:,.0f}; {o['cpu_best']:,.0f}) | "
            f"{h['best']:,.0f} ({h['median']:,.0f}; {h['cpu_best']:,.0f}) | **{o['best'] / h['best']:.2f}x** "
            f"({o['median'] / h['median']:.2f}x; {o['cpu_best'] / h['cpu_best']:.2f}x) | "
            f"{ceiling / h['cpu_best']:.2f}x | {lo:.1f}-{hi:.1f} |"
        )


# ------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a quarter of the tokens per workload")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="dtype of the main comparison")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda: cuda runs the encode() suite")
    ap.add_argument(
        "--suite",
        choices=["forward", "encode", "paired"],
        help="forward: the CPU comparison of "
        "forward passes (default on cpu); encode: encode() end to end (default on cuda); paired: "
        "ours and transformers in one process, batch by batch (CPU)",
    )
    ap.add_argument("--shape", choices=list(SHAPES), default="base", help="paired suite: model shape")
    ap.add_argument("--layers", type=int, help="paired suite: layer count (default: the shape's)")
    ap.add_argument(
        "--dtypes",
        nargs="+",
        default=["bf16", "fp32"],
        choices=["bf16", "fp16", "fp32"],
        help="paired suite: dtypes to compare",
    )
    ap.add_argument("--rounds", type=int, default=3, help="paired suite: rounds over the workload")
    ap.add_argument(
        "--baseline",
        metavar="DIR",
        help="paired suite: also run the codesearch package under DIR (another checkout, e.g. main) interleaved",
    )
    ap.add_argument(
        "--uncapped", action="store_true", help="paired suite: also run ours without the thread cap under contention"
    )
    ap.add_argument("--baseline-worker", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, help="paired suite: intra-op threads (default: torch's, one per core)")
    ap.add_argument(
        "--scale",
        type=float,
        help="tokens per workload relative to the CPU run (encode suite; "
        "default 16 on cuda: ~1M tokens short, 1.5M mixed, 0.8M files)",
    )
    ap.add_argument(
        "--workloads",
        nargs="+",
        choices=[*WORKLOADS, "chunks40"],
        help="encode and paired suites: only these workloads (chunks40: paired suite only)",
    )
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--encode-worker", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.baseline_worker:
        baseline_worker(*args.baseline_worker[:2], int(args.baseline_worker[2]))
        return
    if args.encode_worker:
        impl, workload, head, dtype, scale, device = args.encode_worker
        print(json.dumps(encode_worker(impl, workload, head, dtype, float(scale), device)))
        return
    suite = args.suite or ("encode" if args.device.startswith("cuda") else "forward")
    if suite == "encode":
        main_encode(args)
        return
    if suite == "paired":
        main_paired(args)
        return
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
    print(
        f"machine: {cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"{platform.python_version()}; load average at start {os.getloadavg()[0]:.1f}"
    )
    print(f"CPU: {cpu_kind()}")
    for name, seqs in loads.items():
        lens = sorted(len(s) for s in seqs)
        print(
            f"workload {name}: {len(seqs)} sequences, {sum(lens)} tokens, lengths {lens[0]}-{lens[-1]}, "
            f"median {lens[len(lens) // 2]}"
        )

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
    bf16 = (
        next(o for w, o, _ in table if w == "mixed") if args.dtype == "bf16" else spawn("ours", "mixed", "bf16", scale)
    )

    print("\nsummary")
    print(
        "| workload | ours tok/s (per CPU s) | transformers tok/s (per CPU s) | speed-up wall (CPU) "
        "| ours peak MB | transformers peak MB |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for workload, o, h in table:
        print(
            f"| {workload} | {o['tok_per_s']:.0f} ({o['tok_per_cpu_s']:.0f}) | {h['tok_per_s']:.0f} "
            f"({h['tok_per_cpu_s']:.0f}) | {o['tok_per_s'] / h['tok_per_s']:.2f}x "
            f"({o['tok_per_cpu_s'] / h['tok_per_cpu_s']:.2f}x) | {o['peak_rss_mb']:.0f} | {h['peak_rss_mb']:.0f} |"
        )
    print(
        f"8192 tokens: alternating {alt['seconds']:.2f} s ({alt['cpu_seconds']:.2f} CPU s), all global "
        f"{glob['seconds']:.2f} s ({glob['cpu_seconds']:.2f} CPU s): local layers save "
        f"{glob['cpu_seconds'] / alt['cpu_seconds']:.2f}x CPU"
    )
    print(
        f"mixed: fp32 {fp32['tok_per_s']:.0f} tok/s ({fp32['tok_per_cpu_s']:.0f}/CPU s), bf16 "
        f"{bf16['tok_per_s']:.0f} tok/s ({bf16['tok_per_cpu_s']:.0f}/CPU s): bf16 "
        f"{bf16['tok_per_cpu_s'] / fp32['tok_per_cpu_s']:.2f}x per CPU s"
    )
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
