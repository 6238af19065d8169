"""Shared timing and reporting helpers for the benchmark scripts."""

import platform
import statistics
import subprocess

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer


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
    """Median seconds of each function, measured in alternating rounds so that a slow spell of
    the machine hits all of them alike, on num_threads intra-op threads (default: torch's
    current number; torch.utils.benchmark.Timer would otherwise use one)."""
    num_threads = num_threads or torch.get_num_threads()
    for fn in fns:
        for _ in range(3):
            fn()
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, samples):
            timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=num_threads)
            times.append(timer.blocked_autorange(min_run_time=min_run_time / rounds).median)
    return [statistics.median(times) for times in samples]


def machine_description():
    cpu = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return (f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
            f"CPU capability {torch.backends.cpu.get_cpu_capability()}")


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
