"""Shared timing and reporting helpers for the benchmark scripts."""

import datetime
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

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
    return (f"{cpu_model()} [{cpu_isa()}], {torch.get_num_threads()} threads, torch {torch.__version__} "
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


def cpu_model():
    """The CPU's model name as lscpu gives it (the platform's processor name where it cannot)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return cpu


def machine_class():
    """The class of machine a CPU table stands for: "x86-avx512" where attnlab's vector kernels
    run AVX-512 code, "x86-avx2" where they run AVX2 code (an AVX2-only CPU, or ATTNLAB_CPU_ISA=avx2
    on an AVX-512 one, which machine_record says), else the processor's architecture."""
    kernels = attnlab.build_info()["cpu_vector_kernels"]
    if kernels in ("avx512", "avx2"):
        return f"x86-{kernels}"
    return platform.machine()


def git_commit(benchmark=None):
    """The commit of the checkout this script runs from (short hash, "+changes" when the library's
    sources, the build or the benchmark's own code differ from it), or "unknown" outside a git
    checkout."""
    root = Path(__file__).resolve().parent.parent
    sources = ["cpp", "python", "CMakeLists.txt", "benchmarks/common.py"]
    if benchmark:
        sources.append(f"benchmarks/{benchmark}.py")
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=10", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--",
                                *sources]).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def machine_record():
    """The machine a table was measured on, as a dict for the JSON results: the class
    (machine_class), the CPU model and ISA, threads, the versions of Python, torch and attnlab,
    and the code paths attnlab and torch take here."""
    info = attnlab.build_info()
    return {
        "class": machine_class(),
        "cpu": cpu_model(),
        "isa": cpu_isa(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "attnlab": attnlab.__version__,
        "vector_kernels": info["cpu_vector_kernels"],
        "bf16_products": info["cpu_bf16_products"],
        "forced_isa": {name: os.environ[name] for name in
                       ("ATTNLAB_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS",
                        "ONEDNN_MAX_CPU_ISA") if name in os.environ},
    }


class Report:
    """What a benchmark prints, kept for its machine-readable results: the tables and notes go
    to stdout as markdown, and save() writes them, with the machine (machine_record, or what
    the benchmark passes), the command, the commit and the date, as one JSON file. The docs'
    tables are generated from those files (benchmarks/tables.py)."""

    def __init__(self, benchmark, argv=None, machine=None):
        argv = sys.argv[1:] if argv is None else list(argv)
        shown = []
        skip = False
        for arg in argv:  # the command that reproduces the tables, without where they were saved
            if skip:
                skip = False
            elif arg == "--json":
                skip = True
            elif not arg.startswith("--json="):
                shown.append(arg)
        self.record = {
            "benchmark": benchmark,
            "command": " ".join(["python3", f"benchmarks/{benchmark}.py", *map(shlex.quote, shown)]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "commit": git_commit(benchmark),
            "machine": machine if machine is not None else machine_record(),
            "tables": [],
            "notes": [],
        }

    def table(self, key, title, header, rows):
        """Prints a titled markdown table and keeps it under key (a short name that the docs'
        generator looks tables up by). Cells are kept as printed."""
        print(f"{title}\n\n{markdown_table(header, rows)}\n", flush=True)
        self.record["tables"].append({"key": key, "title": title, "header": list(header),
                                      "rows": [[str(cell) for cell in row] for row in rows]})

    def note(self, text):
        """Prints a line (a verdict, a rate measured at the start) and keeps it."""
        print(text, flush=True)
        self.record["notes"].append(text)

    def save(self, path):
        """Writes the record as JSON to path (its folders made as needed)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.record, indent=1, ensure_ascii=False) + "\n")


def add_json_argument(parser):
    """The --json PATH option every benchmark takes."""
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write the tables, the machine, the command, the commit and "
                             "the date to PATH as JSON (the docs' tables are generated from "
                             "such files: benchmarks/tables.py)")


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


def gpu_machine_record():
    """The GPU machine a CUDA table was measured on, as a dict for the JSON results: the class
    ("gpu-" and the device's name in lower case with dashes for spaces, e.g.
    "gpu-nvidia-h100-80gb-hbm3": the results of one kind of card share a folder), the device's
    name, the NVIDIA driver (as nvidia-smi reports it), the CUDA release torch was built with, the
    host CPU and torch's threads, and the versions of Python, torch and attnlab."""
    name = torch.cuda.get_device_name()
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, check=True).stdout.split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        driver = "unknown"
    return {
        "class": "gpu-" + "-".join(name.lower().split()),
        "gpu": name,
        "driver": driver,
        "cuda": torch.version.cuda,
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "attnlab": attnlab.__version__,
    }
