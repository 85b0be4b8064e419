"""The CPU path: CpuLayers against the modules, the bf16 decision, threads under contention."""

from __future__ import annotations

import math
import os
import time
from types import SimpleNamespace

import pytest
import torch

from codesearch.encoder import cpu, load, runtime
from codesearch.encoder.attention import SdpaBackend
from codesearch.encoder.cpu import CpuContention, threads_at_most
from codesearch.encoder.modernbert import LOCAL, CpuLayers, ModernBert, ModernBertConfig, PackedBatch

# lengths that take every attention path of a local layer (window 8): whole, banded, blocked
SIZES = [3, 11, 70, 300, 1, 26]


def _batch(sizes: list[int], vocab: int) -> PackedBatch:
    g = torch.Generator().manual_seed(sum(sizes))
    return PackedBatch.from_ids([torch.randint(5, vocab, (n,), generator=g).tolist() for n in sizes])


def _random_model(bias: bool, activation: str = "gelu") -> ModernBert:
    """A small ModernBERT with random weights, biases everywhere when ``bias`` (no released
    checkpoint has them; the CPU layers must still add them)."""
    cfg = ModernBertConfig(
        vocab_size=300, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=2, max_position_embeddings=512,
        layer_types=("global", LOCAL, LOCAL), local_attention=16, norm_bias=bias, attention_bias=bias, mlp_bias=bias,
        activation=activation,
    )
    model = ModernBert(cfg).eval().requires_grad_(False)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.1 if "norm" not in name else 1.0))
    model.init_rope()
    model.use_backend(SdpaBackend(torch.float32))
    return model


@pytest.mark.parametrize("chunk", [1024, 7])  # one slice; many slices with a ragged last one
@pytest.mark.parametrize("bias,activation", [(False, "gelu"), (True, "gelu_pytorch_tanh"), (True, "silu")])
def test_cpu_layers_compute_what_the_modules_do(chunk, bias, activation):
    model = _random_model(bias, activation)
    batch = _batch(SIZES, 300)
    with torch.inference_mode():
        modules = model(batch)
        model.use_fused(CpuLayers(model, chunk=chunk))
        try:
            cpu = model(batch)
        finally:
            model.use_fused(None)
    assert (cpu - modules).abs().max().item() <= 1e-5


def test_bf16_computed_in_fp32_stays_a_bf16_model_closer_to_fp32():
    """bf16 weights and stream, fp32 matmuls and attention: within bf16 rounding of the bf16
    modules, and no farther from the fp32 model than they are."""
    model = _random_model(bias=True)
    batch = _batch(SIZES, 300)
    with torch.inference_mode():
        fp32 = model(batch)
        model.to(torch.bfloat16).init_rope()
        model.use_backend(SdpaBackend(torch.bfloat16))
        bf16 = model(batch).float()
        model.use_fused(CpuLayers(model, compute=torch.float32))
        mixed = model(batch)
    assert mixed.dtype == torch.bfloat16
    mixed = mixed.float()
    assert (mixed - bf16).abs().max().item() <= 0.1
    assert (mixed - fp32).abs().mean().item() <= (bf16 - fp32).abs().mean().item()


def test_cpu_encoder_runs_through_cpu_layers(modernbert_dir, monkeypatch):
    enc = load(modernbert_dir, device="cpu", dtype="float32")
    assert isinstance(enc.backbone.model.fused, CpuLayers) and enc.backbone.model.fused.compute is None
    for fast, compute in ((True, None), (False, torch.float32)):
        monkeypatch.setattr(runtime, "cpu_has_fast_bf16", lambda fast=fast: fast)
        enc = load(modernbert_dir, device="cpu", dtype="bfloat16")
        assert enc.dtype == torch.bfloat16 and enc.backbone.model.fused.compute == compute


# ---------------------------------------------------------------- does bf16 pay on this CPU?


@pytest.mark.parametrize(
    "capability,flags,speedup,fast",
    [
        ("AMX", set(), None, True),  # AMX-bf16: fast without measuring
        ("AVX512", {"amx_bf16", "avx512_bf16"}, None, True),
        ("AVX512", {"avx512f"}, None, False),  # no bf16 instructions: emulated
        ("AVX512", {"avx512_bf16"}, 0.6, False),  # a Xeon whose hypervisor hides AMX (measured 0.55-0.65x)
        ("AVX512", {"avx512_bf16"}, 1.9, True),  # Zen 4: the dot-product instruction doubles the rate
    ],
)
def test_avx512_bf16_without_amx_is_measured(monkeypatch, capability, flags, speedup, fast):
    measured = []

    def fake_speedup():
        measured.append(1)
        return speedup

    monkeypatch.delenv("CODESEARCH_CPU_BF16", raising=False)  # the suite pins it (conftest)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(cpu, "bf16_matmul_speedup", fake_speedup)
    runtime.cpu_has_fast_bf16.cache_clear()
    try:
        assert runtime.cpu_has_fast_bf16() is fast
        assert runtime.resolve_dtype("auto", torch.device("cpu")) == (torch.bfloat16 if fast else torch.float32)
        assert len(measured) == (speedup is not None)  # measured once, then cached
    finally:
        runtime.cpu_has_fast_bf16.cache_clear()


def test_bf16_verdict_is_kept_per_instruction_set_cap(monkeypatch, tmp_path):
    """A verdict measured with every instruction set is not read back by a process whose
    oneDNN is capped below AVX512-bf16 (there bf16 is emulated), nor the other way round."""
    speedups = {"": 1.9, "AVX2": 0.19}
    measured = []

    def fake_speedup():
        cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "")
        measured.append(cap)
        return speedups[cap]

    monkeypatch.setenv("CODESEARCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu, "bf16_matmul_speedup", fake_speedup)
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)
    flags = {"avx512f", "avx512_bf16"}
    assert cpu._measured_once_per_machine(flags) is True
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cpu._measured_once_per_machine(flags) is False
    assert cpu._measured_once_per_machine(flags) is False  # read back, not measured again
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert cpu._measured_once_per_machine(flags) is True
    assert measured == ["", "AVX2"]


def test_an_amx_cpu_under_an_instruction_set_cap_is_measured(monkeypatch, tmp_path):
    """ONEDNN_MAX_CPU_ISA=AVX2 on an AMX Xeon: oneDNN emulates bf16, so AMX in the flags (or in
    torch's capability) is no verdict; the matmuls are timed."""
    monkeypatch.delenv("CODESEARCH_CPU_BF16", raising=False)
    monkeypatch.setenv("CODESEARCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512_AMX")
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    monkeypatch.setattr(cpu, "bf16_matmul_speedup", lambda: 0.19)
    runtime.cpu_has_fast_bf16.cache_clear()
    try:
        assert runtime.cpu_has_fast_bf16() is False
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
        runtime.cpu_has_fast_bf16.cache_clear()
        assert runtime.cpu_has_fast_bf16() is True  # uncapped: AMX, no timing
    finally:
        runtime.cpu_has_fast_bf16.cache_clear()


def test_bf16_matmul_speedup_is_a_positive_ratio():
    """A ratio of two measured times, finite and positive. (Its size is not asserted: a
    64x64x64 product takes microseconds, and one preemption of either side on a loaded
    machine moved the ratio to 88 in a full-suite run.)"""
    ratio = cpu.bf16_matmul_speedup(size=(64, 64, 64), repeats=3)
    assert math.isfinite(ratio) and ratio > 0


# ---------------------------------------------------------------- threads under contention


@pytest.mark.parametrize("others,threads", [(0.0, 8), (0.5, 8), (0.6, 7), (1.4, 7), (1.6, 6), (30.0, 1)])
def test_one_thread_less_per_core_others_keep_busy(others, threads):
    c = CpuContention()
    c.others = others
    assert c.threads(8) == threads


def test_others_are_the_busy_time_that_is_not_ours(monkeypatch):
    """busy_seconds counts everyone on our CPUs; what this process did itself is subtracted.
    The clocks are the test's own: under load a real 0.3 s spin drifted 10% between them."""
    c = CpuContention()
    c.cpus = {0, 1}
    clock = {"busy": 1000.0, "wall": 50.0, "own": 7.0}
    monkeypatch.setattr(c, "busy_seconds", lambda: clock["busy"])
    fake = SimpleNamespace(perf_counter=lambda: clock["wall"], process_time=lambda: clock["own"])
    monkeypatch.setattr(cpu, "time", fake)
    for others_per_s in (1.0, 0.0):
        with c.measure():
            clock["wall"] += 0.3
            clock["own"] += 0.3  # our own work: one core, 0.3 s
            clock["busy"] += 0.3 + others_per_s * 0.3  # another process kept one core busy
        if others_per_s:
            assert c.others == pytest.approx(1.0) and c.threads(2) == 1
    assert c.others == pytest.approx(0.5)  # averaged over passes: one burst does not decide


@pytest.mark.skipif(CpuContention().busy_seconds() is None, reason="no /proc/stat for this process's CPUs")
def test_busy_seconds_count_our_own_work():
    c = CpuContention()
    b0, t0 = c.busy_seconds(), time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        pass
    assert c.busy_seconds() - b0 >= 0.2


def test_a_large_pass_leaves_the_cores_others_hold(modernbert_dir, monkeypatch):
    enc = load(modernbert_dir, device="cpu", dtype="float32")
    batch = enc.backbone.prepare([[5] * 300] * 14, None)  # 4,200 tokens: above CONTENTION_MIN_TOKENS
    assert sum(batch.lengths) >= runtime.CONTENTION_MIN_TOKENS
    seen = []
    handle = enc.backbone.model.register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    contention = CpuContention()
    monkeypatch.setattr(runtime, "CONTENTION", contention)
    monkeypatch.setattr(contention, "busy_seconds", lambda: None)  # keep `others` as set here
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for others, want in ((0.0, 2), (1.0, 1)):
            contention.others = others
            enc.backbone.forward(batch)
            assert seen[-1] == want and torch.get_num_threads() == 2
        small = enc.backbone.prepare([[5] * 300], None)  # below the threshold: all threads
        enc.backbone.forward(small)
        assert seen[-1] == 2
    finally:
        handle.remove()
        torch.set_num_threads(before)


def test_threads_at_most_nests_to_the_smallest_limit_and_restores():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        with threads_at_most(3):
            assert torch.get_num_threads() == 3
            with threads_at_most(1):
                assert torch.get_num_threads() == 1
            assert torch.get_num_threads() == 3
            with threads_at_most(8):  # a limit above the count adds no thread
                assert torch.get_num_threads() == 3
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(before)


def test_bf16_residual_adds_round_the_product_first_as_the_modules_do():
    """A bf16 stream gets ``x + F.linear(h, w, b)`` exactly as the modules compute it: adding
    inside the GEMM (``x.addmm_``) drifted past the parity test's tolerance against fp32."""
    g = torch.Generator().manual_seed(3)
    x, h = torch.randn(64, 48, generator=g).bfloat16(), torch.randn(64, 32, generator=g).bfloat16()
    w, b = torch.randn(48, 32, generator=g).bfloat16(), torch.randn(48, generator=g).bfloat16()
    want = x + torch.nn.functional.linear(h, w, b)
    CpuLayers._add_linear(x, h, w, b, torch.empty(64, 48, dtype=torch.bfloat16))
    assert torch.equal(x, want)
