"""attnlab's CUDA attention against PyTorch's SDPA backends in the same process.

Writes markdown tables (to stdout, and to --out FILE as each table completes), and with
--json PATH the same tables as JSON (benchmarks/common.py's Report: keys "backends", "half",
"float32", "weights", "memory"; the docs' tables are generated from such files):

  1. bfloat16 and float16: TFLOP/s of attnlab (its default FlashAttention-2-style kernels, and
     the same forward in blocks of 8 warps of 16 rows, ATTNLAB_CUDA_FLASH_WARPS=8, while that
     is opt-in) and of torch's flash, efficient and cudnn backends, each forced with
     torch.nn.attention.sdpa_kernel; forward and forward+backward, D = 64 and 128.
     Target from L = 1024: attnlab ≥ 1.0 × torch's flash backend, forward and
     forward+backward (attnlab / cudnn is shown too, without a target).
  2. float32: attnlab against the efficient backend. Target from L = 1024: ≥ 1.0 ×.
  3. need_weights=True (ms): attnlab with weights (its default kernels, and the flash forward's
     own weights pass, ATTNLAB_CUDA_FLASH_WEIGHTS=1, while that is opt-in) against attnlab
     without weights, and plain matmul → softmax → matmul for reference. Target, bfloat16
     forward+backward at L = 2048–8192: with weights ≤ 1.2 × without. The forward with
     weights is also set against the time of writing its L² weights at the memory bandwidth
     of a large device-to-device copy measured in the same run (no target: how far from the
     bound it is).
  4. Peak extra GPU memory of one forward+backward without weights, across L
     (torch.cuda.max_memory_allocated after a reset, minus what was allocated before): O(L).

TFLOP/s follow the FlashAttention convention: a forward costs 4·B·H·L²·D, the backward
2.5 times that (so forward+backward 3.5 times), both halved when causal. Shapes keep
B·L = 16k tokens and H·D = 2048. Times are medians of alternating rounds (every
implementation once per round) after warm-up, timed with CUDA events. The header names the
GPU, torch, CUDA and the backend torch's SDPA picks by default.

    python benchmarks/attention_cuda.py [--out results.md] [--json results.json]
                                        [--tables half float32 weights memory]
                                        [--variants 8warps flash-weights]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
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
from common import (Report, add_json_argument, classify_backend, default_backend,  # noqa: F401
                    gpu_machine_record, markdown_table)

TOKENS = 16 * 1024
WIDTH = 2048
TORCH_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION,
                  "efficient": SDPBackend.EFFICIENT_ATTENTION,
                  "cudnn": SDPBackend.CUDNN_ATTENTION}
TABLES = ("half", "float32", "weights", "memory")
# The opt-in kernels timed beside the defaults (--variants): their own columns, so that the
# switch can become the default once they are at least as fast.
VARIANTS = ("8warps", "flash-weights")

# The speed targets: (lowest ratio attnlab / baseline, from which length they apply).
TARGET_FROM_LENGTH = 1024
HALF_TARGETS = {"fwd": 1.0, "fwd+bwd": 1.0}  # against torch's flash backend
FLOAT32_TARGETS = {"fwd": 1.0, "fwd+bwd": 1.0}  # against torch's efficient backend
HALF_ALSO = ("cudnn",)  # attnlab / cudnn shown beside the target's ratio, without a target
# need_weights: forward+backward with weights / without, bfloat16, L in this range (inclusive).
WEIGHTS_TARGET_LENGTHS = (2048, 8192)
WEIGHTS_TARGET_DTYPE = "bfloat16"
WEIGHTS_COST_TARGET = 1.2

def flops(batch, heads, length, head_size, is_causal, backward):
    """Work of one pass with the FlashAttention convention."""
    forward = 4 * batch * heads * length * length * head_size
    total = forward * (3.5 if backward else 1.0)
    return total / 2 if is_causal else total


# ---- the implementations ---------------------------------------------------------------------


# Every switch attnlab's CUDA operator reads (cpp/src/cuda/ops.cpp), set or not in the caller's
# environment: the "attnlab" columns run with none of them.
KERNEL_SWITCHES = ("ATTNLAB_CUDA_FLASH_WARPS", "ATTNLAB_CUDA_FLASH_WEIGHTS")


def default_kernels():
    """Removes every kernel switch (each is read at every call), so that the next call runs
    attnlab's default kernels whatever ran before it in the round."""
    for name in KERNEL_SWITCHES:
        os.environ.pop(name, None)


def attnlab_sdpa(q, k, v, is_causal):
    default_kernels()
    return attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal)[0]


def attnlab_eight_warps(q, k, v, is_causal):
    """attnlab's flash forward in blocks of 8 warps of 16 query rows (ATTNLAB_CUDA_FLASH_WARPS=8,
    read at every call; attnlab_sdpa removes it): each K and V tile copied serves 128 rows."""
    default_kernels()
    os.environ["ATTNLAB_CUDA_FLASH_WARPS"] = "8"
    return attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal)[0]


def attnlab_with_weights(q, k, v, is_causal):
    """need_weights=True with no kernel switch set (the default kernels' weights)."""
    default_kernels()
    return attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal, need_weights=True)


def attnlab_with_flash_weights(q, k, v, is_causal):
    """need_weights=True on the flash forward, whose second pass over the key tiles writes the
    weights (ATTNLAB_CUDA_FLASH_WEIGHTS=1, read at every call; attnlab_sdpa removes it)."""
    default_kernels()
    os.environ["ATTNLAB_CUDA_FLASH_WEIGHTS"] = "1"
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
# Opt-in kernels that have not yet run on a GPU: an error there is shown in its cell ("error"),
# so that the default kernels' and torch's timings still come out.
OPT_IN = (attnlab_eight_warps, attnlab_with_flash_weights)


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
    backends may decline ("n/a"); an error from attnlab's default kernels is a bug and stops the
    run, one from an opt-in kernel shows as "error"."""
    if isinstance(error, torch.OutOfMemoryError):
        torch.cuda.empty_cache()
        return "OOM"
    if fn in OURS:
        raise error
    if fn in OPT_IN:
        print(f"{fn.__name__}: {error}", file=sys.stderr, flush=True)
        return "error"
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


WEIGHTS_VARIANTS = {"attnlab + weights": attnlab_with_weights,
                    "attnlab + flash weights": attnlab_with_flash_weights}


def measure_weights(dtype, args, budget, variants=("attnlab + weights",)):
    """Records with times for attnlab without weights, with weights (each of `variants`, names
    of WEIGHTS_VARIANTS), and the plain ops, and the bytes of the weights a call writes."""
    names = ["attnlab", *variants, "plain"]
    fns = [attnlab_sdpa, *(WEIGHTS_VARIANTS[name] for name in variants), plain_attention]
    element = torch.finfo(dtype).bits // 8
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
                                    weights_bytes=batch * heads * length * length * element,
                                    times=dict(zip(names, times))))
                print(records[-1], file=sys.stderr, flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return records


def copy_bandwidth(gib=2, reps=10):
    """The GPU's memory bandwidth in bytes per second, as a device-to-device copy of `gib` GiB
    moves them (bytes read plus bytes written, per second; median of alternating rounds): the
    rate the weights' L² stores are set against. None if the copy could not run (memory)."""
    size = gib * 2**30
    source = torch.empty(size, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    milliseconds = time_alternating([lambda: target.copy_(source)], [None], reps)[0]
    del source, target
    torch.cuda.empty_cache()
    return None if isinstance(milliseconds, str) else 2 * size / (milliseconds / 1e3)


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


def speed_rows(records, baseline, targets, also=()):
    """One row per record: TFLOP/s of every implementation, attnlab's speed relative to
    `baseline` (its TFLOP/s over the baseline's) and to each backend in `also` (shown, not
    judged), and the target's verdict (from TARGET_FROM_LENGTH on)."""
    rows = []
    for record in records:
        work, times = work_of(record), record["times"]
        ratio = speedup(times[baseline], times["attnlab"])
        others = [speedup(times[name], times["attnlab"]) for name in also]
        target = ("" if record["length"] < TARGET_FROM_LENGTH
                  else verdict(ratio, targets[record["passes"]]))
        rows.append([record["dtype"], shape_cell(record), record["causal"], record["passes"],
                     *(tflops_cell(t, work) for t in times.values()),
                     *("n/a" if r is None else f"{r:.2f}" for r in (ratio, *others)), target])
    return rows


def speed_header(records, baseline, also=()):
    names = list(records[0]["times"]) if records else ["attnlab", baseline]
    return ["dtype", "(B, H, L, D)", "causal", "pass",
            *(name if name.startswith("attnlab") else f"torch {name}" for name in names),
            *(f"attnlab / {name}" for name in (baseline, *also)), "target"]


def weights_judged(record):
    """Whether a weights record is one the target applies to."""
    low, high = WEIGHTS_TARGET_LENGTHS
    return (record["dtype"] == WEIGHTS_TARGET_DTYPE and record["passes"] == "fwd+bwd"
            and low <= record["length"] <= high)


def weights_variants(records):
    names = list(records[0]["times"]) if records else ["attnlab", "attnlab + weights", "plain"]
    return [name for name in names if name.startswith("attnlab + ")]


def weights_header(records):
    """Times of every implementation, then per weights variant: its cost (with / without), the
    forward's time over the bound of writing the weights, and the target's verdict."""
    names = list(records[0]["times"]) if records else ["attnlab", "attnlab + weights", "plain"]
    header = ["dtype", "(B, H, L, D)", "causal", "pass", *(f"{name} (ms)" for name in names)]
    for name in weights_variants(records):
        label = name.removeprefix("attnlab + ")
        header += [f"{label}: with / without", f"{label}: fwd / write bound",
                   f"{label}: target ≤ {WEIGHTS_COST_TARGET:g}"]
    return header


def weights_rows(records, bandwidth=None):
    """Rows of weights_header. The write bound is the weights' bytes over `bandwidth` (bytes per
    second, copy_bandwidth; None: not measured), shown for forward rows; the verdict of the cost
    target where weights_judged."""
    rows = []
    for record in records:
        times = record["times"]
        row = [record["dtype"], shape_cell(record), record["causal"], record["passes"],
               *(ms_cell(t) for t in times.values())]
        bound_ms = (None if bandwidth is None or "weights_bytes" not in record
                    else record["weights_bytes"] / bandwidth * 1e3)
        for name in weights_variants(records):
            cost = speedup(times[name], times["attnlab"])
            to_bound = None
            if record["passes"] == "fwd" and bound_ms and not isinstance(times[name], str):
                to_bound = times[name] / bound_ms
            row += ["n/a" if cost is None else f"{cost:.2f}",
                    "" if record["passes"] != "fwd" else
                    "n/a" if to_bound is None else f"{to_bound:.1f}",
                    verdict(cost, WEIGHTS_COST_TARGET, at_least=False)
                    if weights_judged(record) else ""]
        rows.append(row)
    return rows


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


def target_summary(rows, label, column=-1):
    """'label: m of n rows met' from a verdict column (default the last one) of table rows."""
    verdicts = [row[column] for row in rows if row[column] not in ("", "n/a")]
    if not verdicts:
        return f"- {label}: no row measured at the target lengths"
    met = sum(v.startswith("met") for v in verdicts)
    return f"- {label}: {met} of {len(verdicts)} rows met" + ("" if met == len(verdicts)
                                                              else " (see MISSED rows)")


# A section is (key, title, header, rows, notes): kept as one table of the JSON report, and
# printed as markdown ("## title", the table, the notes as bullet lines).


def section_text(section):
    _, title, header, rows, notes = section
    title = title if title.startswith("#") else f"## {title}"
    return f"{title}\n\n{markdown_table(header, rows)}\n\n" + "".join(f"{n}\n" for n in notes)


def speed_parts(key, title, records, baseline, targets, also=()):
    rows = speed_rows(records, baseline, targets, also)
    return (key, title, speed_header(records, baseline, also), rows,
            [target_summary(rows, f"{title}, attnlab / {baseline} from L = "
                            f"{TARGET_FROM_LENGTH}", column=-1)])


def speed_section(title, records, baseline, targets, also=()):
    return section_text(speed_parts("speed", title, records, baseline, targets, also))


WEIGHTS_TITLE = ("need_weights=True against attnlab without weights and matmul → softmax → matmul "
                 "(ms)")


def weights_parts(records, bandwidth=None):
    header, rows = weights_header(records), weights_rows(records, bandwidth)
    low, high = WEIGHTS_TARGET_LENGTHS
    notes = []
    if bandwidth is not None:
        notes.append(f"- memory bandwidth (device-to-device copy, bytes read + written): "
                     f"{bandwidth / 1e9:.0f} GB/s; write bound = the weights' bytes at that rate")
    for name in weights_variants(records):
        label = name.removeprefix("attnlab + ")
        notes.append(target_summary(
            rows, f"{label}: with / without ≤ {WEIGHTS_COST_TARGET:g}, {WEIGHTS_TARGET_DTYPE} "
            f"forward+backward at L = {low}–{high}",
            column=header.index(f"{label}: target ≤ {WEIGHTS_COST_TARGET:g}")))
    return ("weights", WEIGHTS_TITLE, header, rows, notes)


def weights_section(records, bandwidth=None):
    return section_text(weights_parts(records, bandwidth))


def memory_parts(records):
    first = records[0] if records else {"heads": "?", "head_size": "?", "dtype": ""}
    title = (f"## Peak extra GPU memory of one forward+backward without weights\n\n"
             f"(1, {first['heads']}, L, {first['head_size']}), {first['dtype']}; "
             "torch.cuda.max_memory_allocated after a reset, minus what was allocated before "
             "the call (inputs and the upstream gradient). The output and the three gradients "
             "alone are 4/3 of the q, k, v column.")
    growth = memory_growth(records)
    return ("memory", title, memory_header(records), memory_rows(records),
            [f"- {growth}"] if growth else [])


def memory_section(records):
    return section_text(memory_parts(records))


def json_title(title):
    """A section's title as the JSON report keeps it: one line, no markdown heading."""
    first, _, rest = title.lstrip("# ").partition("\n\n")
    return f"{first}: {rest}" if rest else first


def keep(report, section):
    """Adds a section to the JSON report without printing it: what is printed, and written to
    --out, keeps its markdown layout (headings, paragraphs) while the JSON keeps the table."""
    key, title, header, rows, notes = section
    with contextlib.redirect_stdout(io.StringIO()):
        report.table(key, json_title(title), header, rows)
        for note in notes:
            report.note(note)


BACKENDS_TITLE = ("torch's default SDPA backend (F.scaled_dot_product_attention without "
                  "sdpa_kernel), by the aten operator it calls")


def environment_lines():
    """The header's lines above the default-backend table: GPU and versions."""
    props = torch.cuda.get_device_properties(0)
    info = attnlab.build_info()
    return [f"# attnlab CUDA attention benchmark ({datetime.date.today()})", "",
            f"- GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, "
            f"{props.multi_processor_count} SMs, compute capability {props.major}.{props.minor}",
            f"- torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
            f"{torch.backends.cudnn.version()}, attnlab {attnlab.__version__} "
            f"(CUDA archs {info.get('cuda_archs')})",
            f"- TF32 matmuls allowed: {torch.backends.cuda.matmul.allow_tf32} (the plain "
            f"float32 formulation's speed depends on it)"]


def backends_parts(rows):
    return ("backends", BACKENDS_TITLE, ["dtype", "(B, H, L, D)", "causal", "default backend"],
            rows, [])


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
    parser.add_argument("--variants", nargs="*", choices=VARIANTS, default=list(VARIANTS),
                        help="opt-in kernels timed in their own columns: 8warps (half table), "
                        "flash-weights (weights table); default both, none without a value")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--float32-lengths", type=int, nargs="+",
                        help="lengths of the float32 table (default: --lengths)")
    parser.add_argument("--head-sizes", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--weights-lengths", type=int, nargs="+", default=[2048, 4096, 8192],
                        help="lengths of the need_weights table (its L×L tensors grow fast); "
                        f"the target is judged at L = {WEIGHTS_TARGET_LENGTHS[0]}–"
                        f"{WEIGHTS_TARGET_LENGTHS[1]} in {WEIGHTS_TARGET_DTYPE}")
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
    add_json_argument(parser)
    args = parser.parse_args(argv)
    args.float32_lengths = args.float32_lengths or args.lengths
    for name in ("lengths", "float32_lengths", "head_sizes", "weights_lengths", "memory_lengths"):
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
    report = Report("attention_cuda", argv, machine=gpu_machine_record())
    texts = []

    def emit(text, section=None):
        """Prints a part of the report, rewrites --out, and keeps the section in --json (both
        rewritten after every table, so that a cut-off run leaves the finished ones)."""
        texts.append(text)
        print(text, flush=True)
        if section is not None:
            keep(report, section)
        if args.out:
            args.out.write_text("\n".join(texts))
        if args.json:
            report.save(args.json)

    backends = backends_parts(default_backends(args.head_sizes))
    emit("\n".join([*environment_lines(), f"- {BACKENDS_TITLE}:", "",
                    markdown_table(backends[2], backends[3])]) + "\n", backends)
    if "half" in args.tables:
        variants = [("attnlab 8 warps", attnlab_eight_warps)] if "8warps" in args.variants else []
        records = [r for dtype in (torch.bfloat16, torch.float16)
                   for r in measure_speed(dtype, ["flash", "efficient", "cudnn"], args, budget,
                                          variants)]
        section = speed_parts("half", "bfloat16 and float16, TFLOP/s", records, "flash",
                              HALF_TARGETS, HALF_ALSO)
        emit(section_text(section), section)
    if "float32" in args.tables:
        float32_args = argparse.Namespace(**{**vars(args), "lengths": args.float32_lengths})
        records = measure_speed(torch.float32, ["efficient"], float32_args, budget)
        section = speed_parts("float32", "float32, TFLOP/s", records, "efficient",
                              FLOAT32_TARGETS)
        emit(section_text(section), section)
    if "weights" in args.tables:
        bandwidth = None if budget.spent() else copy_bandwidth()
        variants = ["attnlab + weights"]
        if "flash-weights" in args.variants:
            variants.append("attnlab + flash weights")
        records = [r for name in args.weights_dtypes
                   for r in measure_weights(getattr(torch, name), args, budget, variants)]
        section = weights_parts(records, bandwidth)
        emit(section_text(section), section)
    if "memory" in args.tables:
        section = memory_parts(measure_memory(args, budget))
        emit(section_text(section), section)
    if budget.spent():
        line = (f"- The time budget (--max-seconds {args.max_seconds:g}) ran out: cells marked "
                "'skipped' were not measured.")
        with contextlib.redirect_stdout(io.StringIO()):
            report.note(line)
        emit(line + "\n")


if __name__ == "__main__":
    main()
