"""One encoder layer, forward+backward on the CPU: attnlab.nn.EncoderBlock against the same
layer written with plain torch ops (nn.Linear, matmul, softmax, LayerNorm), same process.
Ratio = plain time / attnlab time (> 1: attnlab is faster).

Also prints the GEMM floor of each shape: the time of the layer's mandatory matrix products
(the four Linear layers forward, and for each its input and weight gradients) run alone at the
same shapes and threads, as torch.mm and as attnlab's own GEMM (where it runs AVX-512; a BLAS
need not use all of a CPU's vector width), the faster of the two, timed in the same alternating
rounds as the two layers; and attnlab's time as a multiple of it. And the bound below that: the
same products' FLOPs at the CPU's float32 FMA peak (a register-only probe of attnlab's, once
per thread count).

"operators alone" is attnlab's fused forward and backward operators called one after the
other, without the module, autograd or the `.grad` additions, also as a multiple of the floor:
what the layer's own kernels cost. The difference to the EncoderBlock column is what torch's
autograd engine and the Python around it cost per step, which the floor's bare products do not
pay (benchmarks/autograd_overhead_cpu.py measures that cost on its own).

    python benchmarks/encoder_cpu.py [--min-run-time 1.0] [--rounds 10]
"""

import argparse
import math

import torch
from torch import nn

from attnlab.nn import EncoderBlock
from common import (Report, add_json_argument, compare, float32_products, fma_peak_gflops,
                    machine_description)

# (B, L, d, H, d_ff): the reversal and the set-anomaly shapes of the UvA tutorial.
SHAPES = [(128, 16, 32, 1, 64), (64, 10, 256, 4, 512)]


class PlainEncoderBlock(nn.Module):
    """The tutorials' post-norm encoder block in plain torch ops."""

    def __init__(self, d, heads, d_ff):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, d_ff), nn.Linear(d_ff, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x):
        B, L, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(x).reshape(B, L, self.heads, 3 * hd).permute(0, 2, 1, 3).chunk(3, -1)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(hd), dim=-1)
        y = (weights @ v).permute(0, 2, 1, 3).reshape(B, L, d)
        x = self.norm1(x + self.out(y))
        return self.norm2(x + self.ff2(torch.relu(self.ff1(x))))


def gemm_flops(B, L, d, d_ff):
    """The FLOPs of gemm_floor's products: three products of B·L × fan_in × fan_out each."""
    return 3 * 2 * B * L * sum(i * o for i, o in ((d, 3 * d), (d, d), (d, d_ff), (d_ff, d)))


def gemm_floor(B, L, d, d_ff, mm=torch.mm):
    """The layer's mandatory GEMMs at this shape, as one function to time: for each Linear
    (in → out) on B·L rows, the forward X·Wᵀ, the input gradient dY·W and the weight gradient
    dYᵀ·X, each mm(a, b, out) into a preallocated output."""
    rows = B * L
    gen = torch.Generator().manual_seed(0)
    products = []
    for fan_in, fan_out in ((d, 3 * d), (d, d), (d, d_ff), (d_ff, d)):
        x, w = torch.randn(rows, fan_in, generator=gen), torch.randn(fan_out, fan_in, generator=gen)
        dy = torch.randn(rows, fan_out, generator=gen)
        products += [(x, w.t(), torch.empty(rows, fan_out)), (dy, w, torch.empty(rows, fan_in)),
                     (dy.t(), x, torch.empty(fan_out, fan_in))]

    def run():
        for a, b, out in products:
            mm(a, b, out)
    return run


def fused_operators(block, x, grad):
    """A no-argument callable: the block's fused forward and backward operators called one after
    the other on x and grad, without the module, autograd or .grad."""
    x = x.detach()
    params = [p.detach() for p in block._fused_parameters()]
    heads, norm_first = block.self_attn.num_heads, block.norm_first
    eps = (block.norm1.eps, block.norm2.eps)

    def run():
        out, activations = torch.ops.attnlab._encoder_block_forward(
            x, params, heads, None, norm_first, *eps)
        return torch.ops.attnlab._encoder_block_backward(
            grad, x, params, heads, None, norm_first, activations, True)
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-run-time", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=10,
                        help="alternating rounds behind each median (default 10)")
    parser.add_argument("--threads", type=int, nargs="+",
                        default=sorted({1, torch.get_num_threads()}),
                        help="intra-op thread counts to measure (default: 1 and all)")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    report = Report("encoder_cpu", argv)
    print(f"Machine: {machine_description()}\n")
    products = float32_products()
    names = list(products)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        peak = fma_peak_gflops()
        for B, L, d, H, d_ff in SHAPES:
            torch.manual_seed(0)
            x = torch.randn(B, L, d, requires_grad=True)
            grad = torch.randn(B, L, d)
            ours, plain = EncoderBlock(d, H, d_ff), PlainEncoderBlock(d, H, d_ff)

            def run(block):
                return lambda: block(x).backward(grad)

            operators_alone = fused_operators(ours, x, grad)
            torch.set_num_threads(threads)
            # The floor in the same alternating rounds as the layers: timed apart, a slow spell
            # of the machine between them moved the ratio (1.31 and 1.50 in two runs an hour
            # apart on the 2-vCPU Intel Xeon).
            floors = [gemm_floor(B, L, d, d_ff, mm) for mm in products.values()]
            t_ours, t_plain, t_ops, *t_floors = compare(
                [run(ours), run(plain), operators_alone, *floors], args.min_run_time,
                rounds=args.rounds, num_threads=threads)
            floor = min(t_floors)
            rows.append([f"({B}, {L}, {d}, {H}, {d_ff})", threads, f"{t_ours * 1e3:.3f}",
                         f"{t_plain * 1e3:.3f}", f"{t_plain / t_ours:.2f}",
                         f"{floor * 1e3:.3f} ({names[t_floors.index(floor)]})",
                         f"{t_ours / floor:.2f}", f"{t_ops / floor:.2f}",
                         f"{gemm_flops(B, L, d, d_ff) / peak / 1e6:.3f}" if peak else ""])
    torch.set_num_threads(max(args.threads))
    report.table("encoder", "One encoder layer, forward+backward, float32 (ms, median; GEMM "
                            "floor: the layer's mandatory matrix products alone, by the faster "
                            "of the GEMMs named)",
                 ["(B, L, d, H, d_ff)", "threads", "attnlab EncoderBlock", "plain torch ops",
                  "ratio", "GEMM floor", "attnlab / floor", "operators alone / floor",
                  "GEMM FLOPs at FMA peak"], rows)
    if args.json:
        report.save(args.json)


if __name__ == "__main__":
    main()
