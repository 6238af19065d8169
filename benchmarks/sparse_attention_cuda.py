"""attnlab's CUDA sparse attention (sparsemax, entmax-1.5, α-entmax) against its softmax
attention, in the same process.

One markdown table (stdout, and --out FILE; with --json PATH also as JSON, benchmarks/common.py's
Report, key "sparse"): per dtype, length and pass (forward, or forward and backward),
milliseconds of the softmax operator and of the sparse operator for each α, and the ratio
sparse / softmax (how much the threshold search and the second pass over the keys cost).
Target, every row: each sparse normalizer ≤ 1.5 × softmax's fused path (the same operator's
softmax kernels: FlashAttention-2-style in half precision at these shapes, the generic tiled
ones in float32). Shapes keep B·L = 16k tokens and H·D = 1024 (D = 64); no mask, not causal
unless --causal. Times are medians of alternating rounds after warm-up, with CUDA events
(attention_cuda's helper). Both operators are called directly (torch.ops.attnlab._sdpa_* and
_sparse_sdpa_*): no autograd bookkeeping on either side.

    python benchmarks/sparse_attention_cuda.py [--lengths 512 2048 4096] [--dtypes bfloat16 float32]
                                               [--alphas 2 1.5 1.25] [--causal] [--out FILE]
                                               [--json FILE] [--max-seconds S]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys

import torch

import attnlab  # noqa: F401  (registers torch.ops.attnlab)
from attention_cuda import Budget, attnlab_sdpa, time_alternating, verdict
from common import Report, add_json_argument, gpu_machine_record, markdown_table

TOKENS = 16 * 1024
HEAD_SIZE = 64
HEADS = 16
COST_TARGET = 1.5  # sparse / softmax, every α, every row


def softmax_pass(q, k, v, is_causal, backward):
    """The softmax operator's forward, or forward then backward, as a no-argument callable."""
    ops = torch.ops.attnlab
    grad = torch.ones_like(q)

    def run():
        output, lse, _ = ops._sdpa_forward(q, k, v, None, is_causal, None, False)
        if backward:
            ops._sdpa_backward(grad, q, k, v, None, is_causal, None, output, lse)
    return run


def sparse_pass(q, k, v, is_causal, backward, alpha):
    """The sparse operator's forward, or forward then backward, as a no-argument callable."""
    ops = torch.ops.attnlab
    grad = torch.ones_like(q)

    def run():
        output, tau, support, _ = ops._sparse_sdpa_forward(q, k, v, None, is_causal, None, False,
                                                           alpha)
        if backward:
            ops._sparse_sdpa_backward(grad, q, k, v, None, is_causal, None, output, tau, support,
                                      alpha)
    return run


# ---- the table (pure functions of the records: testable without a GPU) -------------------------


def header(alphas):
    return ["dtype", "B×H×L", "pass", "softmax ms",
            *(f"α={alpha:g} ms (×)" for alpha in alphas), f"target ≤ {COST_TARGET:g}"]


def row(record):
    """A record {dtype, batch, heads, length, passes, times: [softmax ms, ms per α] (or
    'skipped')} as a table row: the ratio to softmax beside each sparse time, and the verdict
    on the largest ratio."""
    softmax, *sparse = record["times"]
    cells, ratios = [], []
    for t in sparse:
        if isinstance(t, str) or isinstance(softmax, str):
            cells.append(t if isinstance(t, str) else f"{t:.2f}")
            ratios.append(None)
        else:
            cells.append(f"{t:.2f} ({t / softmax:.1f}×)")
            ratios.append(t / softmax)
    worst = None if not ratios or None in ratios else max(ratios)
    return [record["dtype"], f"{record['batch']}×{record['heads']}×{record['length']}",
            record["passes"], softmax if isinstance(softmax, str) else f"{softmax:.2f}", *cells,
            verdict(worst, COST_TARGET, at_least=False)]


def summary(rows):
    verdicts = [r[-1] for r in rows if r[-1] != "n/a"]
    met = sum(v.startswith("met") for v in verdicts)
    return (f"- every α ≤ {COST_TARGET:g} × softmax: {met} of {len(verdicts)} rows met"
            + ("" if met == len(verdicts) else " (see MISSED rows)"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"],
                        choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--alphas", type=float, nargs="+", default=[2.0, 1.5, 1.25])
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--max-seconds", type=float,
                        help="time budget: cases left when it runs out are marked 'skipped'")
    parser.add_argument("--out", help="also write the table to this file")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("sparse_attention_cuda.py: needs a CUDA device")
    budget = Budget(args.max_seconds)

    table_header = header(args.alphas)
    rows = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for length in args.lengths:
            batch = max(1, TOKENS // length)
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(batch, HEADS, length, HEAD_SIZE, generator=gen, device="cuda",
                                   dtype=dtype) for _ in range(3))
            for backward in (False, True):
                if budget.spent():
                    times = ["skipped"] * (1 + len(args.alphas))
                else:
                    runs = [softmax_pass(q, k, v, args.causal, backward)]
                    runs += [sparse_pass(q, k, v, args.causal, backward, alpha)
                             for alpha in args.alphas]
                    # Named as attnlab's own, so that a failure raises instead of becoming "n/a".
                    times = time_alternating(runs, [attnlab_sdpa] * len(runs), args.reps)
                rows.append(row(dict(dtype=dtype_name, batch=batch, heads=HEADS, length=length,
                                     passes="fwd+bwd" if backward else "fwd", times=times)))
                print(markdown_table(table_header, rows[-1:]).splitlines()[-1], flush=True)
            del q, k, v
            torch.cuda.empty_cache()
    notes = [summary(rows)]
    if budget.spent():
        notes.append(f"- The time budget (--max-seconds {args.max_seconds:g}) ran out: cells "
                     "marked 'skipped' were not measured.")
    device = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}{', causal' if args.causal else ''}")
    text = (f"{device}\n\n{markdown_table(table_header, rows)}\n\n"
            + "".join(f"{n}\n" for n in notes))
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text)
    if args.json:
        report = Report("sparse_attention_cuda", argv, machine=gpu_machine_record())
        with contextlib.redirect_stdout(io.StringIO()):  # printed above, in its own layout
            report.table("sparse", f"sparse / softmax, CUDA operator (ms), {device}",
                         table_header, rows)
            for note in notes:
                report.note(note)
        report.save(args.json)


if __name__ == "__main__":
    main()
