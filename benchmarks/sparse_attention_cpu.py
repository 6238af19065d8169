"""Sparse attention (sparsemax, entmax-1.5, α-entmax) on the CPU: attnlab against the entmax package.

The entmax package (``pip install entmax``) is what people use for sparse attention in PyTorch:
its ``sparsemax`` / ``entmax15`` / ``entmax_bisect`` applied to the scores ``q @ kᵀ · scale``,
then ``@ v``. That formulation builds the L × L score and weight matrices (and sorts every row,
or bisects on it 50 times); attnlab's fused operator
``attnlab.scaled_dot_product_attention(q, k, v, normalizer=...)`` does not, unless asked for the
weights (``need_weights=True``).

Prints markdown tables, headed by the machine (CPU model, threads, torch version):

1. per normalizer, at each (B, H, L, E), forward and forward+backward, float32: attnlab against
   the entmax-package path (ratio = entmax time / attnlab time, > 1 means attnlab is faster),
   and attnlab with ``need_weights=True`` against the same path (which has the weights anyway);
2. attnlab sparse against attnlab softmax at the same shape (ratio = sparse / softmax time);
3. the peak extra memory of one forward+backward without weights at (1, 1, L, 64), L = 8192 by
   default, each variant in a fresh process (growth of the peak RSS after a warm-up run).

Times are medians of alternating rounds after a warm-up, in one process (Timer blocks; calls
slower than 0.25 s, the entmax path at L ≥ 512, singly, 3 rounds). Before timing a shape, the
two paths' outputs are compared on its first batch element (a mismatch stops the run: the figures
would not be about the same computation).

Targets (a verdict line is printed for each):

- forward+backward without weights ≥ 3× faster than the entmax path at L ≥ 512, and ≥ 1.5× at
  the tutorial shapes (128, 1, 16, 32) and (64, 4, 10, 64);
- extra memory O(L·E) without weights at L = 8192: attnlab's peak growth at most
  16 L × E float32 tensors (32 MiB at L = 8192, E = 64; the L × L matrix alone is 128 of them),
  and at most 3× its growth at L/2 (linear growth gives 2×, quadratic 4×);
- with weights (``need_weights=True``) ≥ 2× faster than the entmax path, forward and
  forward+backward, every shape;
- sparsemax and entmax-1.5 ≤ 2× attnlab softmax, forward and forward+backward, every shape
  (general α-entmax, which bisects for its threshold, is shown against softmax but not judged).

    python benchmarks/sparse_attention_cpu.py [--min-run-time 0.5] [--skip-memory]
        [--normalizers sparsemax entmax15 entmax] [--alpha 1.25] [--memory-length 8192]
"""

import argparse
import os
import statistics
import sys
import time

import torch

import attnlab
from common import (Report, add_json_argument, compare, machine_description, peak_rss_mib,
                    runner)

try:
    import entmax
except ImportError:  # the benchmark's baseline; the test module skips without it
    entmax = None

SHAPES = [(128, 1, 16, 32), (64, 4, 10, 64), (8, 8, 512, 64), (2, 8, 2048, 64)]
TUTORIAL_SHAPES = {(128, 1, 16, 32), (64, 4, 10, 64)}
NORMALIZERS = ("sparsemax", "entmax15", "entmax")
DEFAULT_ALPHA = 1.25

LONG_FROM = 512          # forward+backward target: ≥ LONG_TARGET × entmax at L ≥ LONG_FROM
LONG_TARGET = 3.0
TUTORIAL_TARGET = 1.5    # forward+backward, at the tutorial shapes
WEIGHTS_TARGET = 2.0     # with weights, every row
SOFTMAX_BOUND = 2.0      # sparse time / softmax time, every row of these normalizers:
SOFTMAX_BOUND_NORMALIZERS = ("sparsemax", "entmax15")
MEMORY_TENSORS_BOUND = 16    # attnlab's extra memory, in L × E float32 tensors
MEMORY_GROWTH_BOUND = 3.0    # extra memory at L over extra memory at L/2 (linear 2, quadratic 4)

SLOW_CALL = 0.25       # seconds: slower calls are timed singly, SLOW_ROUNDS rounds
SLOW_ROUNDS = 3

TIMED = ("attnlab", "attnlab + weights", "entmax", "attnlab softmax")


def require_entmax():
    """Raises SystemExit with the install line when the entmax package is missing."""
    if entmax is None:
        raise SystemExit("benchmarks/sparse_attention_cpu.py compares against the entmax package: "
                         "python3 -m pip install entmax")


def label(normalizer, alpha=DEFAULT_ALPHA):
    """The normalizer's name in the tables."""
    return {"sparsemax": "sparsemax", "entmax15": "entmax-1.5",
            "entmax": f"α-entmax (α = {alpha:g})"}[normalizer]


def attnlab_kwargs(normalizer, alpha=DEFAULT_ALPHA):
    """The keyword arguments of attnlab.scaled_dot_product_attention for the normalizer."""
    if normalizer == "entmax":
        return dict(normalizer="entmax", alpha=alpha)
    return dict(normalizer=normalizer)


def entmax_function(normalizer, alpha=DEFAULT_ALPHA):
    """The entmax package's mapping for the normalizer, over the last dimension (α-entmax by
    bisection with the package's default 50 iterations)."""
    require_entmax()
    if normalizer == "sparsemax":
        return entmax.sparsemax
    if normalizer == "entmax15":
        return entmax.entmax15
    return lambda scores, dim=-1: entmax.entmax_bisect(scores, alpha=alpha, dim=dim)


def implementations(normalizer, alpha=DEFAULT_ALPHA):
    """The four timed callables (q, k, v, is_causal) of TIMED, in that order."""
    kwargs = attnlab_kwargs(normalizer, alpha)
    mapping = entmax_function(normalizer, alpha)

    def ours(q, k, v, is_causal):
        return attnlab.scaled_dot_product_attention(q, k, v, **kwargs)[0]

    def ours_with_weights(q, k, v, is_causal):
        return attnlab.scaled_dot_product_attention(q, k, v, need_weights=True, **kwargs)

    def package(q, k, v, is_causal):
        weights = mapping(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1)
        return weights @ v, weights

    def softmax(q, k, v, is_causal):
        return attnlab.scaled_dot_product_attention(q, k, v)[0]

    return [ours, ours_with_weights, package, softmax]


def inputs(shape, seed=0):
    """q, k, v of the shape, float32, standard normal, requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen).requires_grad_() for _ in range(3)]


def check_agreement(normalizer, alpha, q, k, v, tolerance=1e-4):
    """The fraction of nonzero weights of the entmax path at q, k, v; raises RuntimeError when
    its output differs from attnlab's by more than tolerance (absolute)."""
    ours, _, package, _ = implementations(normalizer, alpha)
    with torch.no_grad():
        expected, weights = package(q, k, v, False)
        got = ours(q, k, v, False)
    diff = (got - expected).abs().max().item()
    if not diff <= tolerance:
        raise RuntimeError(f"{label(normalizer, alpha)} at {tuple(q.shape)}: attnlab and the "
                           f"entmax package differ by {diff:.3g} (> {tolerance})")
    return (weights > 0).float().mean().item()


def alternate_single_calls(fns, rounds=3):
    """Median seconds of each function over rounds of one call each, alternating (for calls too
    slow for torch.utils.benchmark.Timer, whose blocks run each call at least twice per round);
    the caller has run each function once already (the warm-up)."""
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, samples):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in samples]


def time_functions(fns, min_run_time=0.5):
    """Median seconds of each function after a warm-up: common.compare (alternating rounds of
    Timer blocks) when every call takes under SLOW_CALL seconds, else SLOW_ROUNDS alternating
    rounds of single calls."""
    first = []
    for fn in fns:
        start = time.perf_counter()
        fn()
        first.append(time.perf_counter() - start)
    if max(first) < SLOW_CALL:
        return compare(fns, min_run_time)
    return alternate_single_calls(fns, SLOW_ROUNDS)


def measure(normalizers=NORMALIZERS, alpha=DEFAULT_ALPHA, min_run_time=0.5, shapes=None,
            progress=True):
    """Times TIMED for each normalizer, shape of SHAPES (or shapes) and pass; returns records
    dict(normalizer, alpha, shape, passes, nonzero, times={name: seconds}). Before timing a
    shape, the outputs of attnlab and the entmax path are compared on its first batch element."""
    records = []
    for normalizer in normalizers:
        fns = implementations(normalizer, alpha)
        for shape in shapes or SHAPES:
            q, k, v = inputs(shape)
            nonzero = check_agreement(normalizer, alpha, q[:1], k[:1], v[:1])
            for backward in (False, True):
                times = time_functions([runner(fn, q, k, v, False, backward) for fn in fns],
                                       min_run_time)
                records.append(dict(normalizer=normalizer, alpha=alpha, shape=tuple(shape),
                                    passes="fwd+bwd" if backward else "fwd", nonzero=nonzero,
                                    times=dict(zip(TIMED, times))))
                if progress:
                    print(label(normalizer, alpha), shape, records[-1]["passes"],
                          {name: f"{t * 1e3:.3f} ms" for name, t in zip(TIMED, times)},
                          file=sys.stderr, flush=True)
    return records


def speed_target(shape, passes):
    """The forward+backward target ratio (entmax / attnlab) for the shape, or None."""
    if passes != "fwd+bwd":
        return None
    if shape[2] >= LONG_FROM:
        return LONG_TARGET
    if tuple(shape) in TUTORIAL_SHAPES:
        return TUTORIAL_TARGET
    return None


def verdict(value, bound, at_least=True):
    """'met (≥ b)' / 'MISSED (≥ b)' (or ≤ when not at_least); '' when bound is None."""
    if bound is None:
        return ""
    ok = value >= bound if at_least else value <= bound
    return f"{'met' if ok else 'MISSED'} ({'≥' if at_least else '≤'} {bound:g})"


def _ms(seconds):
    return f"{seconds * 1e3:.3f}"


def _shape(shape):
    return "(" + ", ".join(map(str, shape)) + ")"


SPEED_HEADER = ["normalizer", "(B, H, L, E)", "pass", "nonzero %", "attnlab", "entmax pkg",
                "ratio", "target"]
WEIGHTS_HEADER = ["normalizer", "(B, H, L, E)", "pass", "attnlab + weights", "entmax pkg",
                  "ratio", "target"]
SOFTMAX_HEADER = ["normalizer", "(B, H, L, E)", "pass", "attnlab sparse", "attnlab softmax",
                  "sparse / softmax", "target"]


def speed_rows(records):
    """Rows of SPEED_HEADER: attnlab without weights against the entmax path."""
    rows = []
    for r in records:
        t = r["times"]
        ratio = t["entmax"] / t["attnlab"]
        rows.append([label(r["normalizer"], r["alpha"]), _shape(r["shape"]), r["passes"],
                     f"{100 * r['nonzero']:.1f}", _ms(t["attnlab"]), _ms(t["entmax"]),
                     f"{ratio:.2f}", verdict(ratio, speed_target(r["shape"], r["passes"]))])
    return rows


def weights_rows(records):
    """Rows of WEIGHTS_HEADER: attnlab with need_weights=True against the entmax path."""
    rows = []
    for r in records:
        t = r["times"]
        ratio = t["entmax"] / t["attnlab + weights"]
        rows.append([label(r["normalizer"], r["alpha"]), _shape(r["shape"]), r["passes"],
                     _ms(t["attnlab + weights"]), _ms(t["entmax"]), f"{ratio:.2f}",
                     verdict(ratio, WEIGHTS_TARGET)])
    return rows


def softmax_rows(records):
    """Rows of SOFTMAX_HEADER: attnlab sparse against attnlab softmax (no weights)."""
    rows = []
    for r in records:
        t = r["times"]
        ratio = t["attnlab"] / t["attnlab softmax"]
        rows.append([label(r["normalizer"], r["alpha"]), _shape(r["shape"]), r["passes"],
                     _ms(t["attnlab"]), _ms(t["attnlab softmax"]), f"{ratio:.2f}",
                     verdict(ratio, SOFTMAX_BOUND if r["normalizer"] in SOFTMAX_BOUND_NORMALIZERS
                             else None, at_least=False)])
    return rows


def _summary(name, rows, ratio_column, target_column):
    judged = [row for row in rows if row[target_column]]
    if not judged:
        return f"- {name}: no row measured"
    met = sum(row[target_column].startswith("met") for row in judged)
    ratios = [float(row[ratio_column]) for row in judged]
    missed = [f"{row[0]} {row[1]} {row[2]} ({row[ratio_column]})" for row in judged
              if not row[target_column].startswith("met")]
    line = (f"- {name}: {'met' if met == len(judged) else 'MISSED'}, {met} of {len(judged)} rows "
            f"(ratios {min(ratios):.2f}–{max(ratios):.2f})")
    return line + (f"; missed at {', '.join(missed)}" if missed else "")


def speed_verdicts(records):
    """One line per speed target, from the records."""
    speed = speed_rows(records)
    long_rows = [row for row, r in zip(speed, records) if r["shape"][2] >= LONG_FROM]
    tutorial_rows = [row for row, r in zip(speed, records) if r["shape"][2] < LONG_FROM]
    return [
        _summary(f"fwd+bwd ≥ {LONG_TARGET:g}× the entmax path at L ≥ {LONG_FROM}", long_rows,
                 6, 7),
        _summary(f"fwd+bwd ≥ {TUTORIAL_TARGET:g}× the entmax path at the tutorial shapes",
                 tutorial_rows, 6, 7),
        _summary(f"with weights ≥ {WEIGHTS_TARGET:g}× the entmax path", weights_rows(records),
                 5, 6),
        _summary(f"sparsemax and entmax-1.5 ≤ {SOFTMAX_BOUND:g}× attnlab softmax", softmax_rows(records), 5, 6),
    ]


MEMORY_PROBE = r"""
import sys, torch
which, normalizer, alpha, length = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
q, k, v = (torch.randn(1, 1, length, 64, requires_grad=True) for _ in range(3))
grad = torch.ones(1, 1, length, 64)
if which == "attnlab":
    import attnlab
    kwargs = dict(normalizer=normalizer)
    if normalizer == "entmax":
        kwargs["alpha"] = alpha
    def forward():
        return attnlab.scaled_dot_product_attention(q, k, v, **kwargs)[0]
else:
    import entmax
    mapping = {"sparsemax": entmax.sparsemax, "entmax15": entmax.entmax15,
               "entmax": lambda x, dim: entmax.entmax_bisect(x, alpha=alpha, dim=dim)}[normalizer]
    def forward():
        return mapping(q @ k.transpose(-2, -1) * 0.125, dim=-1) @ v
def run():
    forward().backward(grad)
    for t in (q, k, v):
        t.grad = None
"""


def probe_memory(which, normalizer, alpha, length):
    """Peak RSS growth (MiB) of one forward+backward of (1, 1, length, 64), without weights, in
    a fresh process; which is "attnlab" or "entmax" (the package path). Large blocks are
    returned to the system on free (MALLOC_MMAP_THRESHOLD_), so that memory kept by the heap
    after the warm-up run cannot hide the measured run's peak."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    return peak_rss_mib(MEMORY_PROBE, [which, normalizer, alpha, length], env=env)


MEMORY_HEADER = ["normalizer", "L", "attnlab MiB", "attnlab MiB at L/2", "growth L/2 → L",
                 "attnlab in L×E tensors", "entmax pkg MiB", "entmax / attnlab", "target"]


def memory_rows(normalizers=NORMALIZERS, alpha=DEFAULT_ALPHA, length=8192, head_size=64,
                probe=probe_memory):
    """Rows of MEMORY_HEADER: attnlab (at length and length/2) and the entmax path (at length)."""
    rows = []
    tensor_mib = length * head_size * 4 / 2**20
    for normalizer in normalizers:
        ours = probe("attnlab", normalizer, alpha, length)
        half = probe("attnlab", normalizer, alpha, length // 2)
        theirs = probe("entmax", normalizer, alpha, length)
        growth = ours / half if half > 0 else float("inf")
        tensors = ours / tensor_mib
        ok = tensors <= MEMORY_TENSORS_BOUND and growth <= MEMORY_GROWTH_BOUND
        rows.append([label(normalizer, alpha), length, f"{ours:.1f}", f"{half:.1f}",
                     f"{growth:.2f}", f"{tensors:.1f}", f"{theirs:.1f}",
                     f"{theirs / ours:.0f}" if ours > 0 else "inf",
                     f"{'met' if ok else 'MISSED'} (≤ {MEMORY_TENSORS_BOUND} L×E, growth ≤ "
                     f"{MEMORY_GROWTH_BOUND:g})"])
    return rows


def memory_verdict(rows, length):
    """The verdict line of the memory target."""
    met = sum(row[-1].startswith("met") for row in rows)
    status = "met" if met == len(rows) else "MISSED"
    if length != 8192:
        status += f" (measured at L = {length}, not 8192)"
    return (f"- extra memory O(L·E) without weights at L = {length}: {status}, {met} of "
            f"{len(rows)} normalizers (attnlab {', '.join(row[2] for row in rows)} MiB; "
            f"entmax path {', '.join(row[6] for row in rows)} MiB)")


def parse_args(argv=None):
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-run-time", type=float, default=0.5,
                        help="seconds of repeated runs behind each median (default 0.5)")
    parser.add_argument("--skip-memory", action="store_true", help="skip the memory probe")
    parser.add_argument("--normalizers", nargs="+", choices=NORMALIZERS, default=list(NORMALIZERS),
                        help="which sparse normalizers (default: all; 'entmax' is α-entmax "
                             "with --alpha)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help=f"α of 'entmax' (default {DEFAULT_ALPHA}; the entmax package "
                             f"bisects, attnlab too)")
    parser.add_argument("--memory-length", type=int, default=8192,
                        help="L of the memory probe (default 8192; also measured at L/2)")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    if args.min_run_time <= 0:
        parser.error("--min-run-time must be positive")
    if not args.alpha > 1:
        parser.error("--alpha must be > 1")
    if args.memory_length < 2:
        parser.error("--memory-length must be at least 2")
    return args


def main(argv=None):
    """Runs the benchmark and prints its tables and verdicts."""
    args = parse_args(argv)
    require_entmax()
    report = Report("sparse_attention_cpu", argv)
    report.record["machine"]["entmax"] = entmax.__version__
    print(f"Machine: {machine_description()}; entmax {entmax.__version__}\n")
    records = measure(args.normalizers, args.alpha, args.min_run_time)
    report.table("entmax", "attnlab sparse attention vs the entmax package (scores → mapping → "
                           "@ v), no weights (float32, ms, median; ratio = entmax / attnlab; "
                           "nonzero % = weights above 0)",
                 SPEED_HEADER, speed_rows(records))
    report.table("weights", "attnlab need_weights=True vs the entmax package path (float32, "
                            "ms, median; ratio = entmax / attnlab)",
                 WEIGHTS_HEADER, weights_rows(records))
    report.table("softmax", "attnlab sparse vs attnlab softmax, no weights (float32, ms, "
                            "median; ratio = sparse / softmax)",
                 SOFTMAX_HEADER, softmax_rows(records))
    lines = speed_verdicts(records)
    if not args.skip_memory:
        length = args.memory_length
        rows = memory_rows(args.normalizers, args.alpha, length)
        report.table("memory", f"Peak extra memory of one forward+backward after a warm-up "
                               f"run, (1, 1, L, 64), no weights (MiB, growth of peak RSS; one "
                               f"L×E float32 tensor is {length * 64 * 4 / 2**20:g} MiB, the "
                               f"output and the three gradients alone are 4 of them; the L×L "
                               f"matrix is {length * length * 4 / 2**20:g} MiB)",
                     MEMORY_HEADER, rows)
        lines.append(memory_verdict(rows, length))
    print("Targets\n")
    for line in lines:
        report.note(line)
    if args.json:
        report.save(args.json)


if __name__ == "__main__":
    main()
