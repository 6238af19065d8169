"""attnlab's CUDA sparse attention (sparsemax, entmax-1.5, α-entmax) against its softmax
attention, in the same process.

One markdown table (stdout, and --out FILE): per dtype, length and pass (forward, or forward and
backward), milliseconds of the softmax operator and of the sparse operator for each α, and the
ratio sparse / softmax (how much the threshold search and the second pass over the keys cost).
Shapes keep B·L = 16k tokens and H·D = 1024 (D = 64); no mask, not causal unless --causal. Times
are medians of alternating rounds after warm-up, with CUDA events (attention_cuda's helper).
Both operators are called directly (torch.ops.attnlab._sdpa_* and _sparse_sdpa_*): no autograd
bookkeeping on either side.

    python benchmarks/sparse_attention_cuda.py [--lengths 512 2048 4096] [--dtypes bfloat16 float32]
                                               [--alphas 2 1.5 1.25] [--causal] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys

import torch

import attnlab  # noqa: F401  (registers torch.ops.attnlab)
from attention_cuda import attnlab_sdpa, time_alternating
from common import markdown_table

TOKENS = 16 * 1024
HEAD_SIZE = 64
HEADS = 16


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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"],
                        choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--alphas", type=float, nargs="+", default=[2.0, 1.5, 1.25])
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("sparse_attention_cuda.py: needs a CUDA device")

    header = ["dtype", "B×H×L", "pass", "softmax ms",
              *(f"α={alpha:g} ms (×)" for alpha in args.alphas)]
    rows = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for length in args.lengths:
            batch = max(1, TOKENS // length)
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(batch, HEADS, length, HEAD_SIZE, generator=gen, device="cuda",
                                   dtype=dtype) for _ in range(3))
            for backward in (False, True):
                runs = [softmax_pass(q, k, v, args.causal, backward)]
                runs += [sparse_pass(q, k, v, args.causal, backward, alpha)
                         for alpha in args.alphas]
                # Named as attnlab's own, so that a failure raises instead of becoming "n/a".
                times = time_alternating(runs, [attnlab_sdpa] * len(runs), args.reps)
                rows.append([dtype_name, f"{batch}×{HEADS}×{length}",
                             "fwd+bwd" if backward else "fwd", f"{times[0]:.2f}",
                             *(f"{t:.2f} ({t / times[0]:.1f}×)" for t in times[1:])])
                print(markdown_table(header, rows[-1:]).splitlines()[-1], flush=True)
    text = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}"
            f"{', causal' if args.causal else ''}\n\n{markdown_table(header, rows)}\n")
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text)


if __name__ == "__main__":
    main()
