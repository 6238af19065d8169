"""What torch's autograd engine costs per training step on the CPU, beyond the kernels: the cost
that benchmarks/encoder_cpu.py's GEMM floor does not pay and its EncoderBlock column does.

Two tables, each timed in alternating rounds in one process (benchmarks/common.compare):

1. A stand-in with the fused encoder layer's autograd graph and none of its arithmetic: a
   torch.autograd.Function of the input and the layer's twelve parameters whose forward copies
   the input and whose backward returns thirteen fresh gradients, both after streaming a buffer
   of the given size through the cache (as the layer's kernels do with their activations). The
   same work called directly, without autograd, is the baseline; "autograd" is the difference.
   Where the buffer outgrows the caches, the engine's own code and data are cold after the
   kernels, and the difference grows.
2. The fused EncoderBlock itself: a training step (module, autograd, gradients set to None
   first as an optimizer's zero_grad does, and accumulated into .grad) against its forward and
   backward operators called one after the other.

    python benchmarks/autograd_overhead_cpu.py [--footprints 0 8 32] [--min-run-time 1.0]
"""

import argparse

import torch

from attnlab.nn import EncoderBlock
from common import compare, machine_description, markdown_table
from encoder_cpu import fused_operators

# The set-anomaly shape of the UvA tutorial (B, L, d, H, d_ff), as in encoder_cpu.py.
ANOMALY = (64, 10, 256, 4, 512)


def standin(block, x, grad, megabytes):
    """(direct, through_autograd): the stand-in's work without and with autograd."""
    params = list(block._fused_parameters())
    buffer = torch.ones(max(1, int(megabytes * 2**20) // 4))

    def stream():
        if megabytes:
            buffer.mul_(1.0)

    class Layer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, *weights):
            stream()
            return x.clone()

        @staticmethod
        def backward(ctx, grad_output):
            stream()
            return tuple(torch.empty_like(t) for t in [grad_output, *params])

    def direct():
        stream()
        x.detach().clone()
        stream()
        return [torch.empty_like(t) for t in [grad, *params]]

    def through_autograd():
        return torch.autograd.grad(Layer.apply(x, *params), [x, *params], grad)
    return direct, through_autograd


def layer_step(block, x, grad):
    """(operators alone, training step) for the fused EncoderBlock."""
    params = list(block._fused_parameters())

    def step():
        for p in params:
            p.grad = None
        x.grad = None
        block(x).backward(grad)
    return fused_operators(block, x, grad), step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--footprints", type=float, nargs="+", default=[0, 2, 8, 32],
                        help="MiB streamed by the stand-in's forward and backward each")
    parser.add_argument("--min-run-time", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--shape", type=int, nargs=5, default=list(ANOMALY),
                        metavar=("B", "L", "D", "H", "D_FF"))
    args = parser.parse_args(argv)
    print(f"Machine: {machine_description()}\n")
    B, L, d, H, d_ff = args.shape
    torch.manual_seed(0)
    block = EncoderBlock(d, H, d_ff)
    x = torch.randn(B, L, d, requires_grad=True)
    grad = torch.randn(B, L, d)

    rows = []
    for megabytes in args.footprints:
        t_direct, t_autograd = compare(list(standin(block, x, grad, megabytes)),
                                       args.min_run_time, rounds=args.rounds)
        rows.append([f"{megabytes:g}", f"{t_direct * 1e6:.1f}", f"{t_autograd * 1e6:.1f}",
                     f"{(t_autograd - t_direct) * 1e6:.1f}"])
    print(f"A stand-in with the fused layer's autograd graph at {tuple(args.shape)} (x and 12 "
          "parameters; µs, median)\n")
    print(markdown_table(["MiB streamed each way", "direct", "through autograd", "autograd"],
                         rows))

    t_ops, t_step = compare(list(layer_step(block, x, grad)), args.min_run_time,
                            rounds=args.rounds)
    print(f"\nThe fused EncoderBlock at {tuple(args.shape)} (ms, median)\n")
    print(markdown_table(["operators alone", "training step", "autograd, module and .grad (µs)"],
                         [[f"{t_ops * 1e3:.3f}", f"{t_step * 1e3:.3f}",
                           f"{(t_step - t_ops) * 1e6:.0f}"]]))


if __name__ == "__main__":
    main()
