"""What the CPU the encoder runs on can do, and how many of its cores to use.

Two decisions, both made from what the process sees rather than from a table of processors:

- whether bf16 pays (:func:`cpu_has_fast_bf16`): AMX-bf16 does, no bf16 instructions do not,
  and AVX512-bf16 without AMX is measured, because it goes both ways;
- how many intra-op threads a pass gets: :func:`threads_at_most` caps the process-wide count
  for one pass and nests, and :class:`CpuContention` leaves out the cores other processes
  keep busy on large passes (``runtime.PackedBackbone.forward``; short passes are decided by
  ``runtime.machine_busy``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import threading
import time

import torch

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# Does bf16 pay on this CPU?
# --------------------------------------------------------------------------------------------


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# Settings that cap the instruction sets torch's kernels use (oneDNN for bf16 matmuls, MKL for
# fp32 ones, ATen's own): the same CPU under another cap is another kind of CPU.
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")

# bf16 counts as fast when its matmuls run at least this much faster than fp32 ones: below it
# the bf16 model's other ops (conversions, RoPE and attention on bf16) eat the difference.
BF16_FAST_RATIO = 1.15


def bf16_matmul_speedup(size: tuple[int, int, int] = (256, 768, 768), repeats: int = 3) -> float:
    """Throughput of a bf16 matmul over an fp32 one on this CPU, both through torch's kernels.

    Each dtype's best of ``repeats`` runs, taken alternately, so that a neighbour's load hits
    both alike (~20-60 ms on 2 cores, by load). The shape is an encoder projection on a 256-token slice.
    """
    import time

    m, k, n = size
    g = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    pairs = {dt: (a32.to(dt), b32.to(dt)) for dt in (torch.float32, torch.bfloat16)}
    best = dict.fromkeys(pairs, float("inf"))
    with torch.inference_mode():
        for a, b in pairs.values():  # first calls build oneDNN's kernels
            torch.nn.functional.linear(a, b)
        for _ in range(repeats):
            for dt, (a, b) in pairs.items():
                t0 = time.perf_counter()
                torch.nn.functional.linear(a, b)
                best[dt] = min(best[dt], time.perf_counter() - t0)
    return best[torch.float32] / best[torch.bfloat16]


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """True when this CPU multiplies bf16 matrices clearly faster than fp32 ones.

    AMX-bf16 (Sapphire Rapids and later Xeons): yes without measuring (bf16 3.3x fp32 for the
    whole model, BENCHMARKS.md, 'Encoder against transformers'), unless an instruction-set cap
    (:data:`ISA_CAPS`) is set, which is measured. No bf16 instructions at all: no (bf16 is
    emulated). AVX512-bf16 without AMX is measured once per machine
    (:func:`bf16_matmul_speedup`; ``CODESEARCH_CPU_BF16=1`` or ``0`` decides instead), because
    it goes both ways: on Zen 4 its dot-product instruction doubles the fp32 rate, while on a
    Xeon whose hypervisor hides AMX (Emerald Rapids, 2 cores) oneDNN's bf16 kernels ran at
    0.55-0.65x of MKL's fp32 ones (BENCHMARKS.md, 'How to read the figures').
    """
    # With the instruction sets capped (ISA_CAPS) AMX is no verdict: an AMX CPU whose oneDNN may
    # use only AVX2 emulates bf16, so it is measured like any other.
    capped = any(os.environ.get(name) for name in ISA_CAPS)
    try:
        if not capped and "AMX" in str(torch.backends.cpu.get_cpu_capability()).upper():
            return True
    except Exception:  # noqa: BLE001 - older torch without the probe
        pass
    flags = _cpu_flags()
    if "amx_bf16" in flags and not capped:
        return True
    if "avx512_bf16" not in flags and "amx_bf16" not in flags:
        return False
    forced = os.environ.get("CODESEARCH_CPU_BF16", "").strip().lower()
    if forced in ("1", "0", "true", "false", "yes", "no"):
        return forced in ("1", "true", "yes")
    return _measured_once_per_machine(flags)


def _measured_once_per_machine(flags: set[str]) -> bool:
    """The probe's verdict, measured by the first process on this machine and read back by the
    others: a daemon, the CLI and a worker then compute a model with the same numerics, and a
    score does not depend on how busy the machine was when a process started (the probe is a
    timing, noisy under load). The file is keyed by the CPU's flags, torch's version and the
    instruction sets the kernels may use (:data:`ISA_CAPS`): a process whose oneDNN is capped
    to AVX2 emulates bf16 on the same CPU (0.19x fp32 measured, Emerald Rapids), so it must not
    read the verdict of an uncapped one."""
    import hashlib
    import json

    base = os.environ.get("CODESEARCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "codesearch")
    caps = [f"{name}={os.environ.get(name, '')}" for name in ISA_CAPS if os.environ.get(name)]
    with contextlib.suppress(Exception):  # older torch without the probe
        caps.append(f"aten={torch.backends.cpu.get_cpu_capability()}")
    ident = "|".join([torch.__version__, " ".join(sorted(flags)), *caps])
    key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    path = os.path.join(base, f"cpu-bf16-{key}.json")
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        with open(path, encoding="utf-8") as fh:
            return bool(json.load(fh)["fast"])
    speedup = bf16_matmul_speedup()
    fast = speedup >= BF16_FAST_RATIO
    log.info("bf16 matmuls on this CPU: %.2fx fp32 (bf16 counts as fast from %.2fx)", speedup, BF16_FAST_RATIO)
    with contextlib.suppress(OSError):  # no writable cache: this process keeps its own verdict
        os.makedirs(base, exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"fast": fast, "speedup": round(speedup, 3)}, fh)
        os.replace(tmp, path)
    return fast


# --------------------------------------------------------------------------------------------
# Threads: a cap per pass, and the cores other processes hold
# --------------------------------------------------------------------------------------------

_threads_lock = threading.Lock()
_threads_limits: list[int] = []  # the limits of the passes now inside threads_at_most()
_threads_saved = 1  # the thread count to restore when the last one leaves


@contextlib.contextmanager
def threads_at_most(n: int):
    """Run the body with at most ``n`` intra-op threads, restoring the count afterwards.

    The thread count is process-wide, so overlapping users are tracked: while several are
    inside, the smallest limit holds, and the last one out restores the count; a pass that
    starts meanwhile in another thread runs under that limit until then.
    """
    global _threads_saved
    with _threads_lock:
        if not _threads_limits:
            _threads_saved = torch.get_num_threads()
        _threads_limits.append(n)
        _set_threads(min(min(_threads_limits), _threads_saved))
    try:
        yield
    finally:
        with _threads_lock:
            _threads_limits.remove(n)
            _set_threads(min(_threads_limits, default=_threads_saved))


def _set_threads(n: int) -> None:
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


@contextlib.contextmanager
def single_thread(enabled: bool = True):
    """Run the body with ``torch.set_num_threads(1)`` (:func:`threads_at_most`), or as it is
    when ``enabled`` is False."""
    if not enabled:
        yield
        return
    with threads_at_most(1):
        yield


# --------------------------------------------------------------------------------------------
# Threads for large inputs: leave the cores other processes hold
# --------------------------------------------------------------------------------------------

# Passes at least this large are measured and may run on fewer threads: long enough (~0.1 s
# and more) for /proc/stat's 10 ms ticks, and never a search query.
CONTENTION_MIN_TOKENS = 4096


class CpuContention:
    """How many of this process's CPUs other processes keep busy, measured over our own passes.

    Why: every op of a multi-threaded pass ends at an OpenMP barrier, so a pass runs at the pace
    of its slowest thread. When another process holds one of the cores, the thread sharing
    that core makes every barrier wait for the scheduler: with one CPU-bound process beside it
    on 2 cores, a 2-thread pass of the 17M model ran at 4,534 tok/s and a 1-thread pass at
    10,849 (Emerald Rapids); at load 13-20, the 6-layer base shape ran at 432 tok/s capped and
    194 uncapped (bf16), 412 and 109 (fp32; ``benchmarks/encoder_speed.py --suite paired``).
    So a pass leaves one thread out per core that others kept busy during the previous passes.
    On a quiet machine others are ~0 and every thread stays.

    "Busy" is read from ``/proc/stat`` for the CPUs this process may run on (a container's
    cpuset, not the host), less this process's own CPU time, per second of the pass; hypervisor
    steal counts as busy. A core's worth of others costs one thread once they keep more than
    half a core busy; averaged over passes so that one burst does not decide.
    """

    def __init__(self) -> None:
        try:
            self.cpus: set[int] | None = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not Linux
            self.cpus = None
        try:
            self.tick = 1.0 / os.sysconf("SC_CLK_TCK")
        except (AttributeError, OSError, ValueError):
            self.tick = 0.01
        self.others = 0.0  # cores' worth of other processes' work, averaged over passes
        self.measured = False

    def busy_seconds(self) -> float | None:
        """CPU seconds spent on our CPUs by anyone since boot (None where unreadable)."""
        if not self.cpus:
            return None
        total, seen = 0, 0
        try:
            with open("/proc/stat", encoding="ascii") as f:
                for line in f:
                    if not line.startswith("cpu") or line.startswith("cpu "):
                        continue
                    name, *fields = line.split()
                    if int(name[3:]) in self.cpus:
                        v = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
                        total += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
                        seen += 1
        except (OSError, ValueError):
            return None
        return total * self.tick if seen == len(self.cpus) else None

    def threads(self, default: int) -> int:
        """Threads for the next pass: ``default`` less one per core others kept busy."""
        return max(1, default - math.ceil(self.others - 0.5))

    @contextlib.contextmanager
    def measure(self):
        """Measure the body (one forward pass) and fold what others did meanwhile into
        :attr:`others`."""
        busy0, own0, wall0 = self.busy_seconds(), time.process_time(), time.perf_counter()
        yield
        busy1, own1, wall = self.busy_seconds(), time.process_time(), time.perf_counter() - wall0
        if busy0 is None or busy1 is None or wall < 20 * self.tick:
            return
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / wall
        self.others = others if not self.measured else 0.5 * (self.others + others)
        self.measured = True


CONTENTION = CpuContention()
