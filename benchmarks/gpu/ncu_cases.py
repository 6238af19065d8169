"""Nsight Compute profiles of attnlab's CUDA kernels where the speed targets are missed, beside
torch's own kernels at the same shapes: why a kernel is slow, in the profiler's words.

    python3 benchmarks/gpu/ncu_cases.py --profile OUTDIR [--cases NAME ...]
        runs `ncu` once per case (one launch of the case's kernel, after two warm-up calls),
        writes OUTDIR/ncu-<case>.csv and the summary table OUTDIR/ncu.md
    python3 benchmarks/gpu/ncu_cases.py --run CASE
        what ncu runs: the case's call three times (ncu skips the first two launches)
    python3 benchmarks/gpu/ncu_cases.py --summarize OUTDIR
        ncu.md again from the CSV files there

ncu runs with `--clock-control none` (the GPU's clocks are left as they are). The counters need
a machine whose runtime lets ncu read them (benchmarks/gpu/README.md).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    what: str            # the line shown in the table
    kernel: str          # regex on the kernel's demangled name
    dtype: str
    shape: tuple         # (B, H, L, D)
    backward: bool = False
    causal: bool = False
    need_weights: bool = False
    torch_backend: str | None = None  # None: attnlab; else torch's SDPA backend forced
    env: tuple = ()      # (name, value) pairs set before the call: attnlab's kernel switches


CASES = {
    "flash-fwd-d128": Case("attnlab flash forward, D 128", "sdpa_flash_forward_kernel",
                           "bfloat16", (4, 16, 4096, 128)),
    "torch-flash-fwd-d128": Case("torch flash forward, D 128", "flash_fwd", "bfloat16",
                                 (4, 16, 4096, 128), torch_backend="FLASH_ATTENTION"),
    "flash-bwd-d128": Case("attnlab flash backward, D 128", "sdpa_flash_backward_kernel",
                           "bfloat16", (4, 16, 4096, 128), backward=True),
    "torch-flash-bwd-d128": Case("torch flash backward, D 128", "flash_bwd_dq_dk_dv",
                                 "bfloat16", (4, 16, 4096, 128), backward=True,
                                 torch_backend="FLASH_ATTENTION"),
    "flash-fwd-d64": Case("attnlab flash forward, D 64", "sdpa_flash_forward_kernel",
                          "bfloat16", (4, 32, 4096, 64)),
    "flash-bwd-d64": Case("attnlab flash backward, D 64", "sdpa_flash_backward_kernel",
                          "bfloat16", (4, 32, 4096, 64), backward=True),
    "f32-fwd-d64": Case("attnlab float32 forward (generic), D 64", "sdpa_forward_kernel",
                        "float32", (4, 32, 2048, 64)),
    "torch-f32-fwd-d64": Case("torch efficient float32 forward, D 64", "fmha_cutlassF",
                              "float32", (4, 32, 2048, 64), torch_backend="EFFICIENT_ATTENTION"),
    "f32-dq-d64": Case("attnlab float32 dQ (generic), D 64", "sdpa_grad_query_kernel",
                       "float32", (4, 32, 2048, 64), backward=True),
    "f32-dkdv-d64": Case("attnlab float32 dK, dV (generic), D 64", "sdpa_grad_key_value_kernel",
                         "float32", (4, 32, 2048, 64), backward=True),
    "weights-fwd-d64": Case("attnlab forward with weights, bfloat16, D 64", "sdpa_forward_kernel",
                            "bfloat16", (2, 16, 4096, 64), need_weights=True),
    # Prepared without a GPU (off by default, see benchmarks/gpu/README.md):
    "flash-fwd-d128-8warps": Case("attnlab flash forward, D 128, 8 warps of 16 rows",
                                  "sdpa_flash_forward_kernel", "bfloat16", (4, 16, 4096, 128),
                                  env=(("ATTNLAB_CUDA_FLASH_WARPS", "8"),)),
    "flash-weights-fwd-d64": Case("attnlab flash forward with weights, bfloat16, D 64",
                                  "sdpa_flash_forward_kernel", "bfloat16", (2, 16, 4096, 64),
                                  need_weights=True,
                                  env=(("ATTNLAB_CUDA_FLASH_WEIGHTS", "1"),)),
}

# Sections of the details page, and the warp-stall ratios (cycles a warp spends stalled for
# each reason, per issued instruction) of the WarpStateStats section as raw metrics.
SECTIONS = ["SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats",
            "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis"]
STALLS = ["long_scoreboard", "short_scoreboard", "mio_throttle", "math_pipe_throttle", "wait",
          "barrier", "not_selected", "lg_throttle", "no_instruction", "dispatch_stall",
          "tex_throttle", "membar", "branch_resolving"]
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
# Columns of ncu.md: (header, metric names that ncu has used for it).
COLUMNS = [
    ("duration", ["Duration"]),
    ("SM throughput %", ["Compute (SM) Throughput"]),
    ("memory throughput %", ["Memory Throughput"]),
    ("registers", ["Registers Per Thread"]),
    ("achieved occupancy %", ["Achieved Occupancy"]),
    ("theoretical occupancy %", ["Theoretical Occupancy"]),
    ("cycles per issued instruction", ["Warp Cycles Per Issued Instruction"]),
    ("executed IPC", ["Executed Ipc Active", "Executed Ipc Elapsed"]),
]


def run_case(name: str) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attnlab

    case = CASES[name]
    os.environ.update(dict(case.env))
    dtype = getattr(torch, case.dtype)
    torch.manual_seed(0)
    q, k, v = (torch.randn(*case.shape, device="cuda", dtype=dtype,
                           requires_grad=case.backward) for _ in range(3))
    grad = torch.randn_like(q)

    def call():
        if case.torch_backend is None:
            out, _ = attnlab.scaled_dot_product_attention(q, k, v, is_causal=case.causal,
                                                          need_weights=case.need_weights)
        else:
            with sdpa_kernel(getattr(SDPBackend, case.torch_backend)):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
        if case.backward:
            torch.autograd.grad(out, (q, k, v), grad)

    for _ in range(3):
        call()
    torch.cuda.synchronize()


def profile(outdir: Path, names: list[str]) -> int:
    ncu = shutil.which("ncu")
    if ncu is None:
        print("ncu_cases.py: ncu is not on the PATH", file=sys.stderr)
        return 1
    outdir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in names:
        case = CASES[name]
        command = [ncu, "--clock-control", "none", "--target-processes", "all",
                   "--kernel-name-base", "demangled", "--kernel-name", f"regex:{case.kernel}",
                   "--launch-skip", "2", "--launch-count", "1", "--csv", "--page", "details",
                   "--print-units", "base",
                   "--metrics", ",".join(STALL_METRIC.format(s) for s in STALLS)]
        for section in SECTIONS:
            command += ["--section", section]
        command += [sys.executable, str(Path(__file__).resolve()), "--run", name]
        print(f"== {name}: {case.what}", flush=True)
        result = subprocess.run(command, capture_output=True, text=True)
        rows = [line for line in result.stdout.splitlines() if line.startswith('"')]
        (outdir / f"ncu-{name}.csv").write_text("\n".join(rows) + "\n")
        if result.returncode != 0 or len(rows) < 2:
            failed += 1
            print(f"   ncu exit status {result.returncode}, {max(len(rows) - 1, 0)} metric rows",
                  file=sys.stderr)
            print("\n".join((result.stdout + result.stderr).splitlines()[-15:]), file=sys.stderr)
    summarize(outdir)
    return 1 if failed else 0


def read_metrics(path: Path) -> tuple[str, dict[str, tuple[str, str]]]:
    """(kernel name, {metric name: (value, unit)}) of the one kernel launch in an ncu CSV."""
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    if not rows:
        return "", {}
    metrics = {row["Metric Name"]: (row["Metric Value"], row.get("Metric Unit", ""))
               for row in rows}
    return rows[0].get("Kernel Name", ""), metrics


def summarize(outdir: Path) -> None:
    lines = ["# Nsight Compute, one launch per kernel (`benchmarks/gpu/ncu_cases.py`)", "",
             "| case | " + " | ".join(header for header, _ in COLUMNS) + " | top stalls (cycles per issued instruction) |",
             "|---" * (len(COLUMNS) + 2) + "|"]
    for name, case in CASES.items():
        path = outdir / f"ncu-{name}.csv"
        if not path.exists():
            continue
        kernel, metrics = read_metrics(path)
        if not metrics:
            lines.append(f"| {case.what} | " + " | ".join("—" for _ in COLUMNS) + " | no data |")
            continue
        cells = []
        for _, names in COLUMNS:
            value, unit = next((metrics[n] for n in names if n in metrics), ("—", ""))
            cells.append(value if unit in ("%", "") else f"{value} {unit}")
        stalls = []
        for reason in STALLS:
            value = metrics.get(STALL_METRIC.format(reason), ("", ""))[0]
            try:
                stalls.append((float(value.replace(",", "")), reason))
            except ValueError:
                pass
        top = ", ".join(f"{reason} {value:.2f}" for value, reason in sorted(stalls)[::-1][:4])
        lines.append(f"| {case.what} | " + " | ".join(cells) + f" | {top or '—'} |")
    lines += ["", "Kernels: " + "; ".join(f"{name}: `{CASES[name].kernel}`" for name in CASES
                                          if (outdir / f"ncu-{name}.csv").exists())]
    (outdir / "ncu.md").write_text("\n".join(lines) + "\n")
    print((outdir / "ncu.md").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--profile", type=Path, metavar="OUTDIR")
    action.add_argument("--run", choices=sorted(CASES), metavar="CASE")
    action.add_argument("--summarize", type=Path, metavar="OUTDIR")
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES),
                        metavar="CASE", help=f"default: all ({', '.join(CASES)})")
    args = parser.parse_args()
    if args.run:
        run_case(args.run)
        return 0
    if args.summarize:
        summarize(args.summarize)
        return 0
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return profile(args.profile, args.cases)


if __name__ == "__main__":
    sys.exit(main())
