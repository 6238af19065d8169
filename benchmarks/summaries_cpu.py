"""Summaries of the attention weights from inside attnlab's fused CPU forward (summary=).

Prints markdown tables, each headed by the machine:
- speed: the forward with received, entropy, topk=8 and pool=64 against the plain fused forward
  (no weights) and against need_weights=True followed by the same reductions in torch, per
  normalizer, (1, 1, L, 64) float32 without autograd. Ratios > 1 mean the summaries cost more
  than the plain forward (first ratio) or are faster than the weights and torch (second);
- memory: the peak resident-memory growth of one forward with those summaries and of the plain
  forward, at one length, beside the size of the weights need_weights=True would return.

    python benchmarks/summaries_cpu.py [--lengths 1024 4096 16384] [--memory-length 32768]
                                       [--min-run-time 3.0] [--rounds 3] [--json PATH]
"""

import argparse
import sys

import torch
import torch.nn.functional as F

import attnlab
from common import Report, add_json_argument, compare, machine_description, peak_rss_mib

SUMMARY = dict(received=True, entropy=True, topk=8, pool=64)
NORMALIZERS = ["softmax", "sparsemax", "entmax15"]


def torch_summaries(weights, pool):
    """The same summaries from full weights [..., L, L], in torch ops."""
    return (weights.sum(-2), torch.special.entr(weights).sum(-1), weights.topk(8, dim=-1),
            F.avg_pool2d(weights, pool, ceil_mode=True))


def speed_table(lengths, min_run_time, rounds):
    rows = []
    summary = attnlab.WeightSummary(**SUMMARY)
    for length in lengths:
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 1, length, 64, generator=gen) for _ in range(3))
        for normalizer in NORMALIZERS:
            def plain(normalizer=normalizer):
                with torch.no_grad():
                    attnlab.scaled_dot_product_attention(q, k, v, normalizer=normalizer)

            def summaries(normalizer=normalizer):
                with torch.no_grad():
                    attnlab.scaled_dot_product_attention(q, k, v, normalizer=normalizer,
                                                         summary=summary)

            def weights_then_torch(normalizer=normalizer):
                with torch.no_grad():
                    _, w = attnlab.scaled_dot_product_attention(q, k, v, normalizer=normalizer,
                                                                need_weights=True)
                    torch_summaries(w, SUMMARY["pool"])

            fns = [summaries, plain, weights_then_torch]
            with_summaries, without, via_weights = compare(fns, min_run_time, rounds)
            rows.append([f"(1, 1, {length}, 64)", normalizer, f"{with_summaries * 1e3:.1f}",
                         f"{without * 1e3:.1f}", f"{via_weights * 1e3:.1f}",
                         f"{with_summaries / without:.2f}", f"{via_weights / with_summaries:.2f}"])
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


# peak_rss_mib warms up with run()'s first call: here a short sequence (thread pools and the
# like), so that the measured call's buffers are its own and not reused from the warm-up.
MEMORY_PROBE = r"""
import sys, torch, attnlab
which, length = sys.argv[1], int(sys.argv[2])
gen = torch.Generator().manual_seed(0)
inputs = {n: [torch.randn(1, 1, n, 64, generator=gen) for _ in range(3)] for n in (256, length)}
summary = attnlab.WeightSummary(received=True, entropy=True, topk=8, pool=64)
calls = []
def run():
    q, k, v = inputs[256 if not calls else length]
    calls.append(1)
    with torch.no_grad():
        if which == "summaries":
            attnlab.scaled_dot_product_attention(q, k, v, summary=summary)
        else:
            attnlab.scaled_dot_product_attention(q, k, v)
"""


def memory_table(length):
    extra = {which: peak_rss_mib(MEMORY_PROBE, [which, length])
             for which in ("plain", "summaries")}
    weights_mib = length * length * 4 / 2**20
    rows = [[which, length, f"{mib:.1f}", f"{mib - extra['plain']:.1f}"]
            for which, mib in extra.items()]
    rows.append(["need_weights=True (the weights alone)", length, f"{weights_mib:.1f}",
                 f"{weights_mib:.1f}"])
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384],
                        help="sequence lengths L of the speed table (default 1024 4096 16384)")
    parser.add_argument("--memory-length", type=int, default=32768,
                        help="L of the memory table (default 32768; 0 skips it)")
    parser.add_argument("--min-run-time", type=float, default=3.0,
                        help="seconds of repeated runs behind each median (default 3.0: a "
                             "forward at L = 16384 takes a few tenths of a second)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds behind each median (default 3)")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    report = Report("summaries_cpu", argv)
    print(f"Machine: {machine_description()}\n")
    report.table("speed", "attnlab's forward with summary=WeightSummary(received, entropy, "
                          "topk=8, pool=64) vs the plain fused forward and vs need_weights=True "
                          "then the same reductions in torch (float32, no autograd, ms, median)",
                 ["(B, H, L, E)", "normalizer", "summaries", "plain forward",
                  "weights + torch", "cost over plain", "vs weights + torch"],
                 speed_table(args.lengths, args.min_run_time, args.rounds))
    if args.memory_length:
        report.table("memory", "Peak extra memory of one forward (softmax, (1, 1, L, 64), "
                               "float32; MiB, growth of peak RSS after a warm-up run)",
                     ["forward", "L", "extra MiB", "above the plain forward"],
                     memory_table(args.memory_length))
    if args.json:
        report.save(args.json)


if __name__ == "__main__":
    main()
