"""attnlab's CPU attention against PyTorch in the same process.

Prints markdown tables: median times of attnlab and torch.nn.functional.scaled_dot_product_attention
(forward, forward+backward; causal and not), attnlab with need_weights=True against the plain
matmul → softmax → matmul formulation, and the peak extra memory at L = 8192.
Ratio = PyTorch time / attnlab time (> 1 means attnlab is faster).

    python benchmarks/attention_cpu.py [--min-run-time 0.5] [--skip-memory]
"""

import argparse
import json
import math
import subprocess
import sys

import torch
import torch.nn.functional as F

import attnlab
from common import compare, machine_description, markdown_table, runner

SHAPES = [(128, 1, 16, 32), (64, 4, 10, 64), (8, 8, 512, 64), (2, 8, 2048, 64)]


def plain_attention(q, k, v, is_causal):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def attnlab_output(q, k, v, is_causal):
    return attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal)[0]


def attnlab_with_weights(q, k, v, is_causal):
    return attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal, need_weights=True)


def torch_output(q, k, v, is_causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def speed_tables(min_run_time):
    rows_sdpa, rows_weights = [], []
    for B, H, L, E in SHAPES:
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, L, E, generator=gen).requires_grad_() for _ in range(3))
        for is_causal in (False, True):
            for backward in (False, True):
                mode = "fwd+bwd" if backward else "fwd"
                ours, theirs, ours_w, plain = compare(
                    [runner(fn, q, k, v, is_causal, backward)
                     for fn in (attnlab_output, torch_output, attnlab_with_weights,
                                plain_attention)], min_run_time)
                rows_sdpa.append([f"({B}, {H}, {L}, {E})", is_causal, mode, f"{ours * 1e3:.3f}",
                                  f"{theirs * 1e3:.3f}", f"{theirs / ours:.2f}"])
                rows_weights.append([f"({B}, {H}, {L}, {E})", is_causal, mode,
                                     f"{ours_w * 1e3:.3f}", f"{plain * 1e3:.3f}",
                                     f"{plain / ours_w:.2f}"])
                print(rows_sdpa[-1], rows_weights[-1], file=sys.stderr, flush=True)
    return rows_sdpa, rows_weights


MEMORY_PROBE = r"""
import json, sys, torch, attnlab
import torch.nn.functional as F
which, length = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
q, k, v = (torch.randn(1, 1, length, 64, requires_grad=True) for _ in range(3))
grad = torch.ones(1, 1, length, 64)
def run():
    if which == "attnlab":
        out = attnlab.scaled_dot_product_attention(q, k, v)[0]
    elif which == "torch":
        out = F.scaled_dot_product_attention(q, k, v)
    else:
        out = torch.softmax(q @ k.transpose(-2, -1) / 8.0, -1) @ v
    out.backward(grad)
def status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
run()  # warm-up: one-time allocations (thread pools, BLAS buffers) are not the op's
before = status_kib("VmRSS")
with open("/proc/self/clear_refs", "w") as f:  # resets the peak (VmHWM) to the current RSS
    f.write("5")
run()
print(json.dumps({"extra_mib": (status_kib("VmHWM") - before) / 1024}))
"""


def memory_table(length=8192):
    rows = []
    for which in ("attnlab", "torch", "plain"):
        out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, which, str(length)],
                             capture_output=True, text=True, check=True)
        extra = json.loads(out.stdout)["extra_mib"]
        rows.append([which, length, f"{extra:.1f}"])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-run-time", type=float, default=0.5,
                        help="seconds of repeated runs behind each median (default 0.5)")
    parser.add_argument("--skip-memory", action="store_true", help="skip the L = 8192 memory probe")
    args = parser.parse_args()

    print(f"Machine: {machine_description()}\n")
    sdpa, weights = speed_tables(args.min_run_time)
    print("attnlab vs torch.nn.functional.scaled_dot_product_attention (float32, ms, median)\n")
    print(markdown_table(["(B, H, L, E)", "causal", "pass", "attnlab", "torch SDPA",
                          "ratio"], sdpa))
    print("\nattnlab need_weights=True vs matmul → softmax → matmul (float32, ms, median)\n")
    print(markdown_table(["(B, H, L, E)", "causal", "pass", "attnlab + weights", "plain",
                          "ratio"], weights))
    if not args.skip_memory:
        print("\nPeak extra memory of one forward+backward after a warm-up run, (1, 1, L, 64), "
              "no weights (MiB, growth of peak RSS; the output and the three gradients alone are 8 MiB)\n")
        print(markdown_table(["implementation", "L", "extra MiB"], memory_table()))


if __name__ == "__main__":
    main()
