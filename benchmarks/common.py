"""Shared timing and reporting helpers for the benchmark scripts."""

import json
import platform
import random
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

import attnlab


def runner(fn, q, k, v, is_causal, backward):
    """A no-argument callable running fn(q, k, v, is_causal) forward (without autograd) or
    forward+backward; fn may return (output, weights)."""
    if not backward:
        def run():
            with torch.no_grad():
                fn(q, k, v, is_causal)
        return run
    grad = torch.ones(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)

    def run_backward():
        out = fn(q, k, v, is_causal)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(grad)
    return run_backward


def compare(fns, min_run_time=0.5, rounds=5, num_threads=None):
    """Median seconds of each function, measured in alternating rounds (each round in a new
    order, shuffled with a fixed seed) so that a slow spell of the machine hits all of them
    alike, on num_threads intra-op threads (default: torch's current number;
    torch.utils.benchmark.Timer would otherwise use one)."""
    num_threads = num_threads or torch.get_num_threads()
    for fn in fns:
        for _ in range(3):
            fn()
    samples = [[] for _ in fns]
    order = list(range(len(fns)))
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        # A function that always ran right after the same other one would inherit its
        # after-effects (a plain attention that frees 268 MB just before made attnlab's next
        # forward at (2, 8, 2048, 64) 1.13-1.18x slower instead of 1.01-1.08x, in one process on
        # an Intel Xeon), so the order changes every round.
        shuffle(order)
        for j in order:
            timer = Timer(stmt="fn()", globals={"fn": fns[j]}, num_threads=num_threads)
            samples[j].append(timer.blocked_autorange(min_run_time=min_run_time / rounds).median)
    return [statistics.median(times) for times in samples]


# Instruction-set extensions that decide which code paths the CPU kernels (attnlab's and torch's)
# can take, as /proc/cpuinfo names them.
ISA_FLAGS = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16"]


def cpu_isa():
    """The ISA_FLAGS this CPU has, space-separated (empty where /proc/cpuinfo is missing)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return ""
    return " ".join(flag for flag in ISA_FLAGS if flag in flags)


def machine_description():
    """CPU model and ISA, threads, the versions of torch and attnlab, and where attnlab runs its
    vector kernels and bfloat16 products here: the header of every table. ATTNLAB_CPU_ISA=avx2
    (attnlab's AVX2 paths on an AVX-512 CPU) and ATEN_CPU_CAPABILITY (torch's) show there."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return (f"{cpu} [{cpu_isa()}], {torch.get_num_threads()} threads, torch {torch.__version__} "
            f"(CPU capability {torch.backends.cpu.get_cpu_capability()}), "
            f"attnlab {attnlab.__version__} "
            f"(vector kernels: {attnlab.build_info()['cpu_vector_kernels']}, "
            f"bfloat16 products: {attnlab.build_info()['cpu_bf16_products']})")


def float32_products():
    """The float32 GEMMs the kernels are held to, as mm(a, b, out) functions:
    {"torch.mm": ..., "attnlab": ...}, attnlab's own GEMM (which its kernels run) only where it
    runs AVX-512. A BLAS need not use all of a CPU's vector width: on an AMD Zen 5 MKL's sgemm
    ran at 204 GFLOP/s on 2 threads and attnlab's at 327."""
    from attnlab._gemm import float32_mm
    products = {"torch.mm": lambda a, b, out: torch.mm(a, b, out=out)}
    if attnlab.build_info()["cpu_float32_products"] == "avx512":
        products["attnlab"] = float32_mm
    return products


def float32_gemms(size=2048):
    """float32_products as no-argument callables, each running a size² product."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=gen) for _ in range(2))
    out = torch.empty(size, size)
    return {name: (lambda mm=mm: mm(a, b, out)) for name, mm in float32_products().items()}


def fma_peak_gflops():
    """This CPU's float32 FMA peak (GFLOP/s) on torch's current threads: a register-only probe
    of attnlab's, the best of three (a slow spell of the machine only lowers it)."""
    from attnlab._gemm import float32_fma_peak
    return max(float32_fma_peak(0.05) for _ in range(3))


def sgemm_gflops(min_run_time=0.5, size=2048):
    """The float32 GEMM rates (GFLOP/s) of float32_gemms on a size² product here, now, timed in
    alternating rounds: {name: rate}."""
    gemms = float32_gemms(size)
    seconds = compare(list(gemms.values()), min_run_time)
    return {name: 2 * size ** 3 / t / 1e9 for name, t in zip(gemms, seconds)}


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# Which private aten operator F.scaled_dot_product_attention ran, by the profiler's event names
# (the first match wins: the CPU flash operator's name contains the CUDA one's).
BACKEND_OPERATORS = [
    ("_scaled_dot_product_flash_attention_for_cpu", "flash (CPU)"),
    ("_scaled_dot_product_flash_attention", "flash"),
    ("_scaled_dot_product_efficient_attention", "efficient"),
    ("_scaled_dot_product_cudnn_attention", "cudnn"),
    ("_scaled_dot_product_fused_attention_overrideable", "overrideable"),
    ("_scaled_dot_product_attention_math", "math"),
]


def default_backend(q, k, v, is_causal=False) -> str:
    """The backend F.scaled_dot_product_attention picks by default for these inputs, read from
    the aten operator the profiler sees it call."""
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    names = {event.name for event in prof.events()}
    return classify_backend(names)


def classify_backend(operator_names) -> str:
    """The backend named by a set of profiler event names ("unknown" when none matches)."""
    for fragment, backend in BACKEND_OPERATORS:
        if any(fragment in name for name in operator_names):
            return backend
    return "unknown"


# Appended to a memory probe script that defines run(): one warm-up call, then the growth of the
# peak resident set over one more call, printed as JSON.
_PEAK_RSS_TAIL = r"""
import json as _json
def _status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
run()  # warm-up: one-time allocations (thread pools, BLAS buffers) are not the op's
_before = _status_kib("VmRSS")
with open("/proc/self/clear_refs", "w") as f:  # resets the peak (VmHWM) to the current RSS
    f.write("5")
run()
print(_json.dumps({"extra_mib": (_status_kib("VmHWM") - _before) / 1024}))
"""


def peak_rss_mib(script, args, env=None):
    """Peak resident-memory growth (MiB) of one call of the ``run()`` that ``script`` defines,
    after one warm-up call, in a fresh Python process started with ``args`` as ``sys.argv[1:]``
    (and ``env`` as its environment). Raises RuntimeError with the probe's stderr if it fails."""
    out = subprocess.run([sys.executable, "-c", script + _PEAK_RSS_TAIL, *map(str, args)],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"memory probe {' '.join(map(str, args))} failed:\n{out.stderr}")
    return json.loads(out.stdout)["extra_mib"]
