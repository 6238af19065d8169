"""attnlab's CUDA attention against PyTorch's SDPA backends in the same process.

Prints markdown tables of TFLOP/s with the FlashAttention convention: a forward costs
4·B·H·L²·D, a backward 2.5 times that, both halved when causal. Shapes keep B·L = 16k tokens
and H·D = 2048. Tables:
  1. bfloat16 and float16: attnlab against torch's flash, efficient and cudnn backends (each
     forced with torch.nn.attention.sdpa_kernel), forward and forward+backward;
     ratio = attnlab / flash.
  2. float32: attnlab against the efficient backend; ratio = attnlab / efficient.
  3. need_weights=True against plain matmul → softmax → matmul (bfloat16, ms);
     ratio = plain time / attnlab time.

    python benchmarks/attention_cuda.py [--lengths 512 1024 ...] [--head-sizes 64 128] [--reps 10]
"""

import argparse
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnlab
from common import markdown_table, runner

TOKENS = 16 * 1024
WIDTH = 2048
TORCH_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION,
                  "efficient": SDPBackend.EFFICIENT_ATTENTION,
                  "cudnn": SDPBackend.CUDNN_ATTENTION}


def gpu_milliseconds(fn, reps):
    """Median time of fn over reps CUDA-event-timed runs, after warm-up runs."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def flops(batch, heads, length, head_size, is_causal, backward):
    forward = 4 * batch * heads * length * length * head_size
    total = forward * (3.5 if backward else 1.0)
    return total / 2 if is_causal else total


def attnlab_sdpa(q, k, v, is_causal):
    return attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal)[0]


def torch_sdpa(backend):
    def run(q, k, v, is_causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    return run


def plain_attention(q, k, v, is_causal):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def attnlab_with_weights(q, k, v, is_causal):
    return attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal, need_weights=True)


def inputs(length, head_size, dtype):
    batch, heads = TOKENS // length, WIDTH // head_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, length, head_size, generator=gen, device="cuda",
                           dtype=dtype).requires_grad_() for _ in range(3))
    return batch, heads, q, k, v


def measure(fn, q, k, v, is_causal, backward, reps):
    """Milliseconds, or the reason the implementation cannot run this case. Only torch's forced
    backends may decline a case ("n/a"); an error from attnlab is a bug and stops the run."""
    try:
        return gpu_milliseconds(runner(fn, q, k, v, is_causal, backward), reps)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return "OOM"
    except RuntimeError:
        if fn in (attnlab_sdpa, attnlab_with_weights):
            raise
        return "n/a"


def tflops_cell(milliseconds, work):
    return milliseconds if isinstance(milliseconds, str) else f"{work / milliseconds / 1e9:.1f}"


def ratio_cell(ours, theirs):
    """theirs / ours for times: how many times faster attnlab is."""
    if isinstance(ours, str) or isinstance(theirs, str):
        return "n/a"
    return f"{theirs / ours:.2f}"


def speed_table(dtype, backends, args):
    rows = []
    for head_size in args.head_sizes:
        for length in args.lengths:
            batch, heads, q, k, v = inputs(length, head_size, dtype)
            for is_causal in (False, True):
                for backward in (False, True):
                    work = flops(batch, heads, length, head_size, is_causal, backward)
                    fns = [attnlab_sdpa] + [torch_sdpa(TORCH_BACKENDS[name]) for name in backends]
                    times = [measure(fn, q, k, v, is_causal, backward, args.reps) for fn in fns]
                    rows.append([str(dtype).removeprefix("torch."),
                                 f"({batch}, {heads}, {length}, {head_size})", is_causal,
                                 "fwd+bwd" if backward else "fwd",
                                 *(tflops_cell(t, work) for t in times),
                                 ratio_cell(times[0], times[1])])
                    print(rows[-1], file=sys.stderr, flush=True)
            del q, k, v
    return rows


def weights_table(args):
    rows = []
    for length in args.weights_lengths:
        batch, heads, q, k, v = inputs(length, 64, torch.bfloat16)
        for is_causal in (False, True):
            for backward in (False, True):
                ours, plain = (measure(fn, q, k, v, is_causal, backward, args.reps)
                               for fn in (attnlab_with_weights, plain_attention))
                cell = lambda t: t if isinstance(t, str) else f"{t:.3f}"  # noqa: E731
                rows.append([f"({batch}, {heads}, {length}, 64)", is_causal,
                             "fwd+bwd" if backward else "fwd", cell(ours), cell(plain),
                             ratio_cell(ours, plain)])
                print(rows[-1], file=sys.stderr, flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--head-sizes", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--weights-lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096],
                        help="lengths of the need_weights table (its L×L tensors grow fast)")
    parser.add_argument("--reps", type=int, default=10, help="timed runs per median (default 10)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("attention_cuda.py: no CUDA device is available; this benchmark needs a GPU")
    if not attnlab.build_info()["cuda"]:
        sys.exit("attention_cuda.py: this attnlab was built without CUDA kernels "
                 "(rebuild with nvcc and a CUDA torch, or ATTNLAB_CUDA=1)")

    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {props.name} ({props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, attnlab {attnlab.__version__}\n")
    header_tail = ["pass", "attnlab", "torch flash", "torch efficient", "torch cudnn",
                   "attnlab / flash"]
    half_rows = [row for dtype in (torch.bfloat16, torch.float16)
                 for row in speed_table(dtype, ["flash", "efficient", "cudnn"], args)]
    print("bfloat16 / float16: TFLOP/s (FlashAttention convention), median\n")
    print(markdown_table(["dtype", "(B, H, L, D)", "causal", *header_tail], half_rows))
    float_rows = speed_table(torch.float32, ["efficient"], args)
    print("\nfloat32: TFLOP/s, median\n")
    print(markdown_table(["dtype", "(B, H, L, D)", "causal", "pass", "attnlab", "torch efficient",
                          "attnlab / efficient"], float_rows))
    print("\nattnlab need_weights=True vs matmul → softmax → matmul (bfloat16, ms, median)\n")
    print(markdown_table(["(B, H, L, D)", "causal", "pass", "attnlab + weights", "plain",
                          "plain / attnlab"], weights_table(args)))


if __name__ == "__main__":
    main()
