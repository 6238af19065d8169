"""attnlab's CPU attention against PyTorch in the same process.

Prints markdown tables, each headed by the machine (CPU model and ISA, threads, versions):
- per dtype (float32, bfloat16, float16): median times of attnlab and
  torch.nn.functional.scaled_dot_product_attention at the same dtype (forward, forward+backward;
  causal and not); for float32 also, at L >= 512, the attention's rate (FLOPs 4·B·H·L²·E
  forward, 2.5× that for the backward, halved when causal) as a share of the float32 GEMM
  rate (the faster of torch.mm and attnlab's own GEMM on 2048², both timed in the same
  alternating rounds as the row's attentions) and of the CPU's float32 FMA peak (a
  register-only probe at the start);
- attnlab with need_weights=True against attnlab without weights and against the plain
  matmul → softmax → matmul formulation;
- forward+backward with need_weights=True and a loss on the weights too, against the loss on
  the output alone, per normalizer at L = 512-2048;
- forward+backward with dropout_p = 0.1 against attnlab's own dropout_p = 0 and against torch's
  SDPA with dropout_p = 0.1;
- the peak extra memory at L = 8192.
Ratio = PyTorch time / attnlab time (> 1 means attnlab is faster).

    python benchmarks/attention_cpu.py [--min-run-time 0.5] [--rounds 5]
                                       [--dtypes float32 bfloat16 float16]
                                       [--skip-weights] [--skip-dropout] [--skip-memory]
                                       [--json PATH]
"""

import argparse
import math
import sys

import torch
import torch.nn.functional as F

import attnlab
from common import (Report, add_json_argument, compare, float32_gemms, fma_peak_gflops,
                    machine_description, peak_rss_mib, runner, sgemm_gflops)

SHAPES = [(128, 1, 16, 32), (64, 4, 10, 64), (8, 8, 512, 64), (2, 8, 2048, 64)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def attention_flops(B, H, L, E, is_causal, backward):
    """Multiply-add FLOPs of attention: 4·B·H·L²·E forward, 2.5× that more for the backward,
    halved when causal."""
    flops = 4 * B * H * L * L * E * (3.5 if backward else 1.0)
    return flops / 2 if is_causal else flops


def inputs(B, H, L, E, dtype):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, L, E, generator=gen).to(dtype).requires_grad_() for _ in range(3)]


GEMM_SIZE = 2048


def speed_table(dtype, min_run_time, gemm_share, rounds=5, fma_peak=0.0):
    """attnlab against torch's SDPA at one dtype; with gemm_share, the share of the float32 GEMM
    rate the attention reaches at L >= 512. That rate is the faster of float32_gemms on
    GEMM_SIZE², timed in the same alternating rounds as the row's two attentions, so that a slow
    spell of the machine (they last seconds to minutes on a shared host) slows them all alike.
    And the share of fma_peak (GFLOP/s, measured once; 0: none), the bound of any product."""
    gemms = list(float32_gemms(GEMM_SIZE).values())
    rows = []
    for B, H, L, E in SHAPES:
        q, k, v = inputs(B, H, L, E, dtype)
        with_gemm = gemm_share and L >= 512
        for is_causal in (False, True):
            for backward in (False, True):
                fns = [runner(fn, q, k, v, is_causal, backward)
                       for fn in (attnlab_output, torch_output)]
                if with_gemm:
                    fns += gemms
                ours, theirs, *gemm = compare(fns, min_run_time, rounds)
                row = [f"({B}, {H}, {L}, {E})", is_causal, "fwd+bwd" if backward else "fwd",
                       f"{ours * 1e3:.3f}", f"{theirs * 1e3:.3f}", f"{theirs / ours:.2f}"]
                if gemm_share:
                    share = peak = ""
                    if with_gemm:
                        rate = attention_flops(B, H, L, E, is_causal, backward) / ours
                        share = f"{100 * rate / (2 * GEMM_SIZE ** 3 / min(gemm)):.0f} %"
                        peak = f"{100 * rate / 1e9 / fma_peak:.0f} %" if fma_peak else ""
                    row += [share, peak]
                rows.append(row)
                print(rows[-1], file=sys.stderr, flush=True)
    return rows


def weights_table(min_run_time, rounds=5):
    """need_weights=True against attnlab without weights and the plain formulation (float32)."""
    rows = []
    for B, H, L, E in SHAPES:
        q, k, v = inputs(B, H, L, E, torch.float32)
        for is_causal in (False, True):
            for backward in (False, True):
                with_w, without, plain = compare(
                    [runner(fn, q, k, v, is_causal, backward)
                     for fn in (attnlab_with_weights, attnlab_output, plain_attention)],
                    min_run_time, rounds)
                rows.append([f"({B}, {H}, {L}, {E})", is_causal, "fwd+bwd" if backward else "fwd",
                             f"{with_w * 1e3:.3f}", f"{without * 1e3:.3f}", f"{plain * 1e3:.3f}",
                             f"{with_w / without:.2f}", f"{plain / with_w:.2f}"])
                print(rows[-1], file=sys.stderr, flush=True)
    return rows


WEIGHTS_GRAD_SHAPES = [(8, 4, 512, 64), (2, 4, 1024, 64), (1, 4, 2048, 64)]


def weights_grad_table(min_run_time, rounds=5):
    """Forward+backward with need_weights=True, a loss on the output and the weights against the
    same call with the loss on the output alone (float32, per normalizer)."""
    rows = []
    for B, H, L, E in WEIGHTS_GRAD_SHAPES:
        q, k, v = inputs(B, H, L, E, torch.float32)
        grad_out = torch.ones(B, H, L, E)
        grad_w = torch.randn(B, H, L, L, generator=torch.Generator().manual_seed(1))
        for normalizer in ("softmax", "sparsemax", "entmax15"):
            for is_causal in (False, True):
                def step(loss_on_weights, is_causal=is_causal, normalizer=normalizer):
                    def run():
                        out, w = attnlab.scaled_dot_product_attention(
                            q, k, v, is_causal=is_causal, need_weights=True,
                            normalizer=normalizer)
                        grads = (grad_out, grad_w) if loss_on_weights else (grad_out, None)
                        torch.autograd.backward((out, w) if loss_on_weights else (out,),
                                                grads if loss_on_weights else grads[:1])
                    return run
                with_grad, without = compare([step(True), step(False)], min_run_time, rounds)
                rows.append([f"({B}, {H}, {L}, {E})", normalizer, is_causal,
                             f"{with_grad * 1e3:.3f}", f"{without * 1e3:.3f}",
                             f"{with_grad / without:.2f}"])
                print(rows[-1], file=sys.stderr, flush=True)
    return rows


DROPOUT_P = 0.1


def dropout_table(min_run_time, rounds=5):
    """Forward+backward with dropout on the weights: attnlab at p = DROPOUT_P against attnlab at
    p = 0 and against torch's SDPA at p = DROPOUT_P (float32)."""
    rows = []
    for B, H, L, E in SHAPES:
        q, k, v = inputs(B, H, L, E, torch.float32)
        grad = torch.ones(B, H, L, E)
        for is_causal in (False, True):
            def step(p, ours=True, is_causal=is_causal):
                def run():
                    if ours:
                        out = attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
                                                                   dropout_p=p)[0]
                    else:
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
                                                             dropout_p=p)
                    out.backward(grad)
                return run
            with_dropout, without, torch_time = compare(
                [step(DROPOUT_P), step(0.0), step(DROPOUT_P, ours=False)], min_run_time, rounds)
            rows.append([f"({B}, {H}, {L}, {E})", is_causal, f"{with_dropout * 1e3:.3f}",
                         f"{without * 1e3:.3f}", f"{torch_time * 1e3:.3f}",
                         f"{without / with_dropout:.2f}", f"{torch_time / with_dropout:.2f}"])
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


MEMORY_PROBE = r"""
import sys, torch, attnlab
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
"""


def memory_table(length=8192):
    rows = []
    for which in ("attnlab", "torch", "plain"):
        extra = peak_rss_mib(MEMORY_PROBE, [which, length])
        rows.append([which, length, f"{extra:.1f}"])
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-run-time", type=float, default=0.5,
                        help="seconds of repeated runs behind each median (default 0.5)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating rounds behind each median (default 5; more rounds "
                             "steady the medians on a noisy shared machine)")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES),
                        help="dtypes of the attnlab vs torch SDPA tables (default: all three)")
    parser.add_argument("--skip-weights", action="store_true", help="skip the need_weights table")
    parser.add_argument("--skip-dropout", action="store_true", help="skip the dropout table")
    parser.add_argument("--skip-memory", action="store_true", help="skip the L = 8192 memory probe")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    report = Report("attention_cpu", argv)

    print(f"Machine: {machine_description()}\n")
    fma_peak = fma_peak_gflops()
    report.note(f"float32 FMA peak (registers only, all {torch.get_num_threads()} threads): "
                f"{fma_peak:.0f} GFLOP/s")
    rates = ", ".join(f"{name} {gflops:.0f}" for name, gflops in sgemm_gflops(
        args.min_run_time, GEMM_SIZE).items())
    report.note(f"float32 GEMM rates at the start of this run ({GEMM_SIZE}², median, GFLOP/s): "
                f"{rates}; each row's % of the GEMM rate uses the faster of them as timed in "
                "that row's own rounds\n")
    for name in args.dtypes:
        rows = speed_table(DTYPES[name], args.min_run_time, name == "float32", args.rounds,
                           fma_peak)
        header = ["(B, H, L, E)", "causal", "pass", "attnlab", "torch SDPA", "ratio"]
        report.table(name, f"attnlab vs torch.nn.functional.scaled_dot_product_attention "
                           f"({name}, ms, median)",
                     header + (["% of GEMM rate", "% of FMA peak"] if name == "float32" else []),
                     rows)
    if not args.skip_weights:
        report.table("weights", "attnlab need_weights=True vs without weights and vs matmul → "
                                "softmax → matmul (float32, ms, median)",
                     ["(B, H, L, E)", "causal", "pass", "attnlab + weights", "attnlab", "plain",
                      "cost of weights", "vs plain"],
                     weights_table(args.min_run_time, args.rounds))
        report.table("weights_grad", "attnlab forward+backward with need_weights=True: a loss "
                                     "on the output and the weights vs on the output alone "
                                     "(float32, ms, median)",
                     ["(B, H, L, E)", "normalizer", "causal", "loss on both", "loss on output",
                      "cost of the weights' gradient"],
                     weights_grad_table(args.min_run_time, args.rounds))
    if not args.skip_dropout:
        report.table("dropout", f"attnlab forward+backward with dropout_p={DROPOUT_P} vs "
                                "attnlab with dropout_p=0 and vs torch's SDPA with "
                                f"dropout_p={DROPOUT_P} (float32, ms, median; speed ratios, "
                                "> 1 where attnlab with dropout is faster)",
                     ["(B, H, L, E)", "causal", f"attnlab p={DROPOUT_P}", "attnlab p=0",
                      f"torch SDPA p={DROPOUT_P}", "vs attnlab p=0", "vs torch"],
                     dropout_table(args.min_run_time, args.rounds))
    if not args.skip_memory:
        report.table("memory", "Peak extra memory of one forward+backward after a warm-up run, "
                               "(1, 1, L, 64), no weights (MiB, growth of peak RSS; the output "
                               "and the three gradients alone are 8 MiB)",
                     ["implementation", "L", "extra MiB"], memory_table())
    if args.json:
        report.save(args.json)


if __name__ == "__main__":
    main()
