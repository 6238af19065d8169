"""Command line: ``python -m attnlab <command>``."""

from __future__ import annotations

import argparse
import sys

import torch

from . import build_info
from .functional import scaled_dot_product_attention


def run_demo(args: argparse.Namespace) -> int:
    """Prints attention outputs and weights for two small examples."""
    torch.manual_seed(args.seed)
    torch.set_printoptions(precision=4, sci_mode=False)
    info = build_info()
    print(f"attnlab {info['version']} (torch {info['torch']}, CUDA kernels: {info['cuda']})\n")

    print(f"1. Random query, key and value: sequence length {args.length}, {args.dim} features")
    q, k, v = (torch.randn(args.length, args.dim) for _ in range(3))
    output, weights = scaled_dot_product_attention(q, k, v, need_weights=True)
    print("query\n", q, "\nkey\n", k, "\nvalue\n", v, sep="")
    print("weights = softmax(q kᵀ / sqrt(d)), each row sums to 1\n", weights, sep="")
    print("output = weights @ value\n", output, "\n", sep="")

    print("2. Key-value lookup: keys are 10 × rows of the identity, the last two equal")
    keys = 10 * torch.eye(4)
    keys[3] = keys[2]
    values = torch.arange(16.0).reshape(4, 4)
    queries = torch.stack([keys[0], keys[2]])
    output, weights = scaled_dot_product_attention(queries, keys, values, scale=1.0,
                                                   need_weights=True)
    print("values\n", values, sep="")
    print("query = key 0 picks value 0; query = key 2 matches keys 2 and 3 and averages them")
    print("weights\n", weights, "\noutput\n", output, "\n", sep="")

    print("3. Causal mask: query i sees keys 0..i")
    _, weights = scaled_dot_product_attention(q, k, v, is_causal=True, need_weights=True)
    print(weights)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attnlab",
        description="attnlab: attention cores for PyTorch, and experiments that show the maps.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser("demo", help="print attention outputs and weights of small examples")
    demo.add_argument("--length", type=int, default=3, help="sequence length (default 3)")
    demo.add_argument("--dim", type=int, default=2, help="features per position (default 2)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(handler=run_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "length", 1) < 1 or getattr(args, "dim", 1) < 1:
        parser.error("--length and --dim must be at least 1")
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
