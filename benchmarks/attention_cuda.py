"""attnlab's CUDA attention against PyTorch's SDPA backends in the same process.

Writes markdown tables (to stdout, and to --out FILE as each table completes):

  1. bfloat16 and float16: TFLOP/s of attnlab (its default FlashAttention-2-style kernels,
     the same with the other number of query rows per warp in the forward than its default
     for the head size (ATTNLAB_CUDA_FLASH_ROWS: 32 by default at D = 64, 16 at D = 128), the
     same in blocks of 8 warps of 16 rows (ATTNLAB_CUDA_FLASH_WARPS=8), and its
     earlier WMMA forward and generic backward, ATTNLAB_CUDA_FLASH=0) and of torch's flash,
     efficient and cudnn backends, each forced with torch.nn.attention.sdpa_kernel; forward and
     forward+backward.
     Target from L = 2048: attnlab ≥ 0.8 × flash forward, ≥ 0.6 × flash forward+backward.
  2. float32: attnlab against the efficient backend. Target from L = 2048: ≥ 1.0 ×.
  3. need_weights=True against plain matmul → softmax → matmul, and against attnlab without
     weights (ms). Targets at L = 4096: ≥ 3 × faster than plain, weights cost ≤ 1.5 ×.
  4. Peak extra GPU memory of one forward+backward without weights, across L
     (torch.cuda.max_memory_allocated after a reset, minus what was allocated before): O(L).

TFLOP/s follow the FlashAttention convention: a forward costs 4·B·H·L²·D, the backward
2.5 times that (so forward+backward 3.5 times), both halved when causal. Shapes keep
B·L = 16k tokens and H·D = 2048. Times are medians of alternating rounds (every
implementation once per round) after warm-up, timed with CUDA events. The header names the
GPU, torch, CUDA and the backend torch's SDPA picks by default.

    python benchmarks/attention_cuda.py [--out results.md] [--tables half float32 weights memory]
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnlab
from common import classify_backend, default_backend, markdown_table  # noqa: F401

TOKENS = 16 * 1024
WIDTH = 2048
TORCH_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION,
                  "efficient": SDPBackend.EFFICIENT_ATTENTION,
                  "cudnn": SDPBackend.CUDNN_ATTENTION}
TABLES = ("half", "float32", "weights", "memory")

# The speed targets: (lowest ratio attnlab / baseline, from which length they apply).
TARGET_FROM_LENGTH = 2048
HALF_TARGETS = {"fwd": 0.8, "fwd+bwd": 0.6}  # against torch's flash backend
FLOAT32_TARGETS = {"fwd": 1.0, "fwd+bwd": 1.0}  # against torch's efficient backend
WEIGHTS_TARGET_LENGTH = 4096
WEIGHTS_SPEEDUP_TARGET = 3.0  # plain matmul-softmax-matmul time / attnlab with weights
WEIGHTS_COST_TARGET = 1.5  # attnlab with weights / attnlab without

def flops(batch, heads, length, head_size, is_causal, backward):
    """Work of one pass with the FlashAttention convention."""
    forward = 4 * batch * heads * length * length * head_size
    total = forward * (3.5 if backward else 1.0)
    return total / 2 if is_causal else total


# ---- the implementations ---------------------------------------------------------------------


KERNEL_SWITCHES = ("ATTNLAB_CUDA_FLASH", "ATTNLAB_CUDA_FLASH_ROWS", "ATTNLAB_CUDA_FLASH_WARPS")


def attnlab_sdpa(q, k, v, is_causal):
    for name in KERNEL_SWITCHES:  # the default kernels (see attnlab_without_flash)
        os.environ.pop(name, None)
    return attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal)[0]


def attnlab_other_rows(q, k, v, is_causal):
    """attnlab's flash forward with the other number of query rows per warp than its default
    for this head size (default 32 at D = 64, 16 at D = 128; ATTNLAB_CUDA_FLASH_ROWS, read at
    every call; attnlab_sdpa removes it)."""
    for name in KERNEL_SWITCHES:
        os.environ.pop(name, None)
    os.environ["ATTNLAB_CUDA_FLASH_ROWS"] = "16" if q.shape[-1] <= 64 else "32"
    return attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal)[0]


def attnlab_eight_warps(q, k, v, is_causal):
    """attnlab's flash forward in blocks of 8 warps of 16 query rows (ATTNLAB_CUDA_FLASH_WARPS=8,
    read at every call; attnlab_sdpa removes it): each K and V tile copied serves 128 rows."""
    for name in KERNEL_SWITCHES:
        os.environ.pop(name, None)
    os.environ["ATTNLAB_CUDA_FLASH_WARPS"] = "8"
    return attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal)[0]


def attnlab_without_flash(q, k, v, is_causal):
    """attnlab with its earlier kernels (WMMA forward, generic backward) instead of the
    FlashAttention-2-style ones: ATTNLAB_CUDA_FLASH=0, read at every call (forward and
    backward; the backward runs inside autograd.grad after this returns, so the variable stays
    set until attnlab_sdpa removes it)."""
    os.environ["ATTNLAB_CUDA_FLASH"] = "0"
    return attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal)[0]


def attnlab_with_weights(q, k, v, is_causal):
    return attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal, need_weights=True)


def torch_sdpa(backend):
    def run(q, k, v, is_causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    run.__name__ = f"torch_{backend.name.lower()}"
    return run


def plain_attention(q, k, v, is_causal):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


OURS = (attnlab_sdpa, attnlab_with_weights)


def pass_runner(fn, q, k, v, is_causal, backward):
    """A no-argument callable: fn forward without autograd, or forward and the gradients of
    q, k, v (torch.autograd.grad: nothing accumulates into .grad between runs)."""
    if not backward:
        def forward():
            with torch.no_grad():
                fn(q, k, v, is_causal)
        return forward
    grad = torch.ones(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)

    def forward_backward():
        out = fn(q, k, v, is_causal)
        out = out[0] if isinstance(out, tuple) else out
        torch.autograd.grad(out, (q, k, v), grad)
    return forward_backward


# ---- measurement (needs a GPU) -----------------------------------------------------------------


class Budget:
    """Wall-clock budget of the whole run: past it, the remaining cases are marked 'skipped'
    instead of measured, so that the tables still come out inside a time limit."""

    def __init__(self, seconds):
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def spent(self):
        return self.deadline is not None and time.monotonic() > self.deadline


def failure_cell(fn, error):
    """What a table shows for an implementation that could not run a case. Only torch's forced
    backends may decline ("n/a"); an error from attnlab is a bug and stops the run."""
    if isinstance(error, torch.OutOfMemoryError):
        torch.cuda.empty_cache()
        return "OOM"
    if fn in OURS:
        raise error
    return "n/a"


def time_alternating(callables, fns, reps, min_sample_ms=1.0):
    """Median milliseconds of each callable, one sample of each per round (so a slow spell of
    the GPU hits all of them alike), after warm-up. A sample repeats a callable until it takes
    about min_sample_ms, so launch overheads do not swamp short kernels. A callable that fails
    gets its failure_cell instead."""
    results, inner = [None] * len(callables), [1] * len(callables)
    for i, (run, fn) in enumerate(zip(callables, fns)):
        try:
            for _ in range(2):
                run()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            inner[i] = max(1, math.ceil(min_sample_ms / max(start.elapsed_time(end), 1e-3)))
        except (RuntimeError, torch.OutOfMemoryError) as error:
            results[i] = failure_cell(fn, error)
    samples = [[] for _ in callables]
    for _ in range(reps):
        for i, run in enumerate(callables):
            if results[i] is not None:
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner[i]):
                run()
            end.record()
            end.synchronize()
            samples[i].append(start.elapsed_time(end) / inner[i])
    return [result if result is not None else statistics.median(times)
            for result, times in zip(results, samples)]


def random_inputs(batch, heads, length, head_size, dtype):
    gen = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(batch, heads, length, head_size, generator=gen, device="cuda",
                        dtype=dtype).requires_grad_() for _ in range(3)]


def shape_for(length, head_size):
    return TOKENS // length, WIDTH // head_size


def measure_speed(dtype, backends, args, budget, variants=()):
    """Records {dtype, batch, heads, length, head_size, causal, pass, times: {name: ms or
    reason}} for attnlab, its other variants ((name, fn) pairs) and the named torch backends."""
    names = ["attnlab", *(name for name, _ in variants), *backends]
    fns = [attnlab_sdpa, *(fn for _, fn in variants),
           *(torch_sdpa(TORCH_BACKENDS[name]) for name in backends)]
    records = []
    for head_size in args.head_sizes:
        for length in args.lengths:
            batch, heads = shape_for(length, head_size)
            q, k, v = random_inputs(batch, heads, length, head_size, dtype)
            for is_causal in (False, True):
                for backward in (False, True):
                    if budget.spent():
                        times = ["skipped"] * len(fns)
                    else:
                        times = time_alternating(
                            [pass_runner(fn, q, k, v, is_causal, backward) for fn in fns], fns,
                            args.reps)
                    records.append(dict(dtype=dtype_name(dtype), batch=batch, heads=heads,
                                        length=length, head_size=head_size, causal=is_causal,
                                        passes="fwd+bwd" if backward else "fwd",
                                        times=dict(zip(names, times))))
                    print(records[-1], file=sys.stderr, flush=True)
            del q, k, v
            torch.cuda.empty_cache()
    return records


def measure_weights(dtype, args, budget):
    """Records with times for attnlab without weights, with weights, and the plain ops."""
    names = ["attnlab", "attnlab + weights", "plain"]
    fns = [attnlab_sdpa, attnlab_with_weights, plain_attention]
    records = []
    for length in args.weights_lengths:
        batch, heads = shape_for(length, 64)
        q, k, v = random_inputs(batch, heads, length, 64, dtype)
        for is_causal in (False, True):
            for backward in (False, True):
                if budget.spent():
                    times = ["skipped"] * len(fns)
                else:
                    times = time_alternating(
                        [pass_runner(fn, q, k, v, is_causal, backward) for fn in fns], fns,
                        args.reps)
                records.append(dict(dtype=dtype_name(dtype), batch=batch, heads=heads,
                                    length=length, head_size=64, causal=is_causal,
                                    passes="fwd+bwd" if backward else "fwd",
                                    times=dict(zip(names, times))))
                print(records[-1], file=sys.stderr, flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return records


def peak_extra_bytes(run):
    """Peak bytes allocated by one call of run beyond what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def measure_memory(args, budget, heads=8, head_size=64, dtype=torch.bfloat16):
    """Records {length, ..., bytes: {name: extra peak bytes or reason}} of one forward+backward
    at (1, heads, L, head_size) without weights. The plain formulation is skipped where its
    L×L tensors would pass --plain-memory-limit."""
    names = ["attnlab", "flash", "efficient", "plain"]
    fns = [attnlab_sdpa, torch_sdpa(SDPBackend.FLASH_ATTENTION),
           torch_sdpa(SDPBackend.EFFICIENT_ATTENTION), plain_attention]
    records = []
    element = torch.finfo(dtype).bits // 8
    for length in args.memory_lengths:
        q, k, v = random_inputs(1, heads, length, head_size, dtype)
        cells = []
        for name, fn in zip(names, fns):
            if budget.spent():
                cells.append("skipped")
                continue
            if name == "plain" and 4 * heads * length * length * element > args.plain_memory_limit:
                cells.append("skipped")
                continue
            run = pass_runner(fn, q, k, v, False, True)
            try:
                run()  # warm-up: workspaces and kernels loaded before the measured call
                cells.append(peak_extra_bytes(run))
            except (RuntimeError, torch.OutOfMemoryError) as error:
                cells.append(failure_cell(fn, error))
        records.append(dict(dtype=dtype_name(dtype), batch=1, heads=heads, length=length,
                            head_size=head_size, input_bytes=3 * q.numel() * element,
                            bytes=dict(zip(names, cells))))
        print(records[-1], file=sys.stderr, flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return records


# ---- tables (pure functions of the records: testable without a GPU) ----------------------------


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def shape_cell(record):
    return f"({record['batch']}, {record['heads']}, {record['length']}, {record['head_size']})"


def work_of(record):
    return flops(record["batch"], record["heads"], record["length"], record["head_size"],
                 record["causal"], record["passes"] == "fwd+bwd")


def tflops_cell(milliseconds, work):
    return milliseconds if isinstance(milliseconds, str) else f"{work / milliseconds / 1e9:.1f}"


def ms_cell(milliseconds):
    return milliseconds if isinstance(milliseconds, str) else f"{milliseconds:.3f}"


def speedup(slow, fast):
    """slow / fast for two times, None when either is missing."""
    if isinstance(slow, str) or isinstance(fast, str) or fast <= 0:
        return None
    return slow / fast


def verdict(value, bound, at_least=True):
    if value is None:
        return "n/a"
    met = value >= bound if at_least else value <= bound
    sign = "≥" if at_least else "≤"
    return f"met ({sign} {bound:g})" if met else f"MISSED ({sign} {bound:g})"


def speed_rows(records, baseline, targets):
    """One row per record: TFLOP/s of every implementation, attnlab's speed relative to
    `baseline` (its TFLOP/s over the baseline's) and the target's verdict (from
    TARGET_FROM_LENGTH on)."""
    rows = []
    for record in records:
        work, times = work_of(record), record["times"]
        ratio = speedup(times[baseline], times["attnlab"])
        target = ("" if record["length"] < TARGET_FROM_LENGTH
                  else verdict(ratio, targets[record["passes"]]))
        rows.append([record["dtype"], shape_cell(record), record["causal"], record["passes"],
                     *(tflops_cell(t, work) for t in times.values()),
                     "n/a" if ratio is None else f"{ratio:.2f}", target])
    return rows


def speed_header(records, baseline):
    names = list(records[0]["times"]) if records else ["attnlab", baseline]
    return ["dtype", "(B, H, L, D)", "causal", "pass",
            *(name if name.startswith("attnlab") else f"torch {name}" for name in names),
            f"attnlab / {baseline}", "target"]


def weights_rows(records):
    """Times with and without weights and of the plain ops; speed-up over plain and the cost of
    the weights, with verdicts at WEIGHTS_TARGET_LENGTH."""
    rows = []
    for record in records:
        times = record["times"]
        fast = speedup(times["plain"], times["attnlab + weights"])
        cost = speedup(times["attnlab + weights"], times["attnlab"])
        judged = record["length"] == WEIGHTS_TARGET_LENGTH
        rows.append([record["dtype"], shape_cell(record), record["causal"], record["passes"],
                     ms_cell(times["attnlab"]), ms_cell(times["attnlab + weights"]),
                     ms_cell(times["plain"]),
                     "n/a" if fast is None else f"{fast:.2f}",
                     "n/a" if cost is None else f"{cost:.2f}",
                     verdict(fast, WEIGHTS_SPEEDUP_TARGET) if judged else "",
                     verdict(cost, WEIGHTS_COST_TARGET, at_least=False) if judged else ""])
    return rows


WEIGHTS_HEADER = ["dtype", "(B, H, L, D)", "causal", "pass", "attnlab (ms)",
                  "attnlab + weights (ms)", "plain (ms)", "plain / attnlab + weights",
                  "weights cost (with / without)", "target ≥ 3 × plain", "target cost ≤ 1.5"]


def mib_cell(value):
    return value if isinstance(value, str) else f"{value / 2**20:.1f}"


def memory_rows(records):
    """Extra peak MiB per implementation, and attnlab's extra bytes per query row (constant
    across L when its extra memory is O(L))."""
    rows = []
    for record in records:
        cells = record["bytes"]
        ours = cells["attnlab"]
        rows_of_queries = record["batch"] * record["heads"] * record["length"]
        per_row = ours if isinstance(ours, str) else f"{ours / rows_of_queries:.0f}"
        rows.append([record["length"], mib_cell(record["input_bytes"]),
                     *(mib_cell(cells[name]) for name in cells), per_row])
    return rows


def memory_header(records):
    names = list(records[0]["bytes"]) if records else ["attnlab"]
    return ["L", "q, k, v (MiB)",
            *(f"{name if name in ('attnlab', 'plain') else 'torch ' + name} extra (MiB)"
              for name in names),
            "attnlab extra bytes per query row"]


def memory_growth(records):
    """'attnlab's extra memory grows a× from L = x to L = y (y/x× longer)', or None."""
    measured = [r for r in records if not isinstance(r["bytes"]["attnlab"], str)]
    if len(measured) < 2:
        return None
    first, last = measured[0], measured[-1]
    growth = last["bytes"]["attnlab"] / max(first["bytes"]["attnlab"], 1)
    return (f"attnlab's extra memory grows {growth:.2f}× from L = {first['length']} to "
            f"L = {last['length']} ({last['length'] / first['length']:g}× longer): "
            + ("linear or better (O(L))" if growth <= 1.1 * last["length"] / first["length"]
               else "FASTER THAN LINEAR"))


def target_summary(rows, label):
    """'label: m of n rows met' from the verdict column (the last one) of table rows."""
    verdicts = [row[-1] for row in rows if row[-1] not in ("", "n/a")]
    if not verdicts:
        return f"- {label}: no row measured at the target lengths"
    met = sum(v.startswith("met") for v in verdicts)
    return f"- {label}: {met} of {len(verdicts)} rows met" + ("" if met == len(verdicts)
                                                              else " (see MISSED rows)")


def speed_section(title, records, baseline, targets):
    rows = speed_rows(records, baseline, targets)
    return (f"## {title}\n\n{markdown_table(speed_header(records, baseline), rows)}\n\n"
            + target_summary(rows, f"{title}, attnlab / {baseline} from L = "
                             f"{TARGET_FROM_LENGTH}") + "\n")


def weights_section(records):
    rows = weights_rows(records)
    lines = ["## need_weights=True against matmul → softmax → matmul (ms)\n",
             markdown_table(WEIGHTS_HEADER, rows), ""]
    judged = [row for row in rows if row[-1]]
    for column, label in ((-2, "≥ 3 × plain"), (-1, "weights cost ≤ 1.5")):
        verdicts = [row[column] for row in judged if row[column] != "n/a"]
        met = sum(v.startswith("met") for v in verdicts)
        lines.append(f"- {label} at L = {WEIGHTS_TARGET_LENGTH}: {met} of {len(verdicts)} rows met")
    return "\n".join(lines) + "\n"


def memory_section(records):
    rows = memory_rows(records)
    growth = memory_growth(records)
    header = ("## Peak extra GPU memory of one forward+backward without weights\n\n"
              f"(1, {records[0]['heads'] if records else '?'}, L, "
              f"{records[0]['head_size'] if records else '?'}), "
              f"{records[0]['dtype'] if records else ''}; torch.cuda.max_memory_allocated after "
              "a reset, minus what was allocated before the call (inputs and the upstream "
              "gradient). The output and the three gradients alone are 4/3 of the q, k, v "
              "column.\n\n")
    return header + markdown_table(memory_header(records), rows) + "\n\n" + \
        (f"- {growth}\n" if growth else "")


def environment_lines(backends_seen):
    """The header: GPU, versions, and torch's default SDPA backend per case."""
    props = torch.cuda.get_device_properties(0)
    info = attnlab.build_info()
    lines = [f"# attnlab CUDA attention benchmark ({datetime.date.today()})", "",
             f"- GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, "
             f"{props.multi_processor_count} SMs, compute capability {props.major}.{props.minor}",
             f"- torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
             f"{torch.backends.cudnn.version()}, attnlab {attnlab.__version__} "
             f"(CUDA archs {info.get('cuda_archs')})",
             f"- TF32 matmuls allowed: {torch.backends.cuda.matmul.allow_tf32} (the plain "
             f"float32 formulation's speed depends on it)",
             "- torch's default SDPA backend (F.scaled_dot_product_attention without "
             "sdpa_kernel), by the aten operator it calls:", ""]
    lines.append(markdown_table(["dtype", "(B, H, L, D)", "causal", "default backend"],
                                backends_seen))
    return lines


def default_backends(head_sizes, length=4096):
    rows = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for head_size in head_sizes:
            batch, heads = shape_for(length, head_size)
            q, k, v = random_inputs(batch, heads, length, head_size, dtype)
            for is_causal in (False, True):
                rows.append([dtype_name(dtype), f"({batch}, {heads}, {length}, {head_size})",
                             is_causal, default_backend(q, k, v, is_causal)])
            del q, k, v
    torch.cuda.empty_cache()
    return rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    parser.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES),
                        help="which tables to measure (default: all)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--head-sizes", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--weights-lengths", type=int, nargs="+", default=[1024, 2048, 4096],
                        help="lengths of the need_weights table (its L×L tensors grow fast); "
                        f"the targets are judged at {WEIGHTS_TARGET_LENGTH}")
    parser.add_argument("--weights-dtypes", nargs="+", default=["bfloat16", "float32"],
                        choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--memory-lengths", type=int, nargs="+",
                        default=[1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--plain-memory-limit", type=float, default=24 * 2**30,
                        help="bytes: skip the plain formulation in the memory table when its "
                        "four L×L tensors would pass this (default 24 GiB)")
    parser.add_argument("--reps", type=int, default=10,
                        help="timed rounds per median (default 10)")
    parser.add_argument("--max-seconds", type=float,
                        help="time budget: cases left when it runs out are marked 'skipped'")
    parser.add_argument("--out", type=Path, help="also write the markdown report to this file "
                        "(rewritten after every table, so a cut-off run leaves the finished ones)")
    args = parser.parse_args(argv)
    for name in ("lengths", "head_sizes", "weights_lengths", "memory_lengths"):
        if min(getattr(args, name)) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("attention_cuda.py: no CUDA device is available; this benchmark needs a GPU")
    if not attnlab.build_info()["cuda"]:
        sys.exit("attention_cuda.py: this attnlab was built without CUDA kernels "
                 "(rebuild with nvcc and a CUDA torch, or ATTNLAB_CUDA=1)")
    budget = Budget(args.max_seconds)
    sections = []

    def emit(section):
        sections.append(section)
        print(section, flush=True)
        if args.out:
            args.out.write_text("\n".join(sections))

    emit("\n".join(environment_lines(default_backends(args.head_sizes))) + "\n")
    if "half" in args.tables:
        records = [r for dtype in (torch.bfloat16, torch.float16)
                   for r in measure_speed(dtype, ["flash", "efficient", "cudnn"], args, budget,
                                          [("attnlab other rows/warp", attnlab_other_rows),
                                           ("attnlab 8 warps", attnlab_eight_warps),
                                           ("attnlab before flash", attnlab_without_flash)])]
        emit(speed_section("bfloat16 and float16, TFLOP/s", records, "flash", HALF_TARGETS))
    if "float32" in args.tables:
        records = measure_speed(torch.float32, ["efficient"], args, budget)
        emit(speed_section("float32, TFLOP/s", records, "efficient", FLOAT32_TARGETS))
    if "weights" in args.tables:
        records = [r for name in args.weights_dtypes
                   for r in measure_weights(getattr(torch, name), args, budget)]
        emit(weights_section(records))
    if "memory" in args.tables:
        emit(memory_section(measure_memory(args, budget)))
    if budget.spent():
        emit(f"- The time budget (--max-seconds {args.max_seconds:g}) ran out: cells marked "
             "'skipped' were not measured.\n")


if __name__ == "__main__":
    main()
