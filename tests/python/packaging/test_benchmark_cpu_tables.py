"""benchmarks/attention_cpu.py and benchmarks/encoder_cpu.py on tiny shapes: the tables are well
formed, each ratio matches its times, and the rate columns (% of the GEMM rate, % of the FMA
peak, the GEMM floors) are filled where they apply and agree with one another. No timed
assertions: only relations that hold whatever the machine's speed."""

import json
import re
import sys
from pathlib import Path

import pytest
import torch

import attnlab

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import attention_cpu  # noqa: E402
import encoder_cpu  # noqa: E402
from markdown_tables import parse_tables  # noqa: E402

HAS_OWN_GEMM = attnlab.build_info()["cpu_float32_products"] == "avx512"


def matches_rounded(ratio, numerator, denominator):
    """Whether a printed 2-decimal ratio fits two printed 3-decimal times (ms)."""
    low = max(numerator - 5e-4, 0.0) / (denominator + 5e-4)
    high = (numerator + 5e-4) / (denominator - 5e-4) if denominator > 5e-4 else float("inf")
    return low * 0.99 - 0.01 <= ratio <= high * 1.01 + 0.01


def test_attention_tables(monkeypatch, capsys, one_thread, tmp_path):
    # A short shape, and one long enough (L >= 512) for the rate columns.
    monkeypatch.setattr(attention_cpu, "SHAPES", [(1, 1, 8, 16), (1, 1, 512, 16)])
    monkeypatch.setattr(attention_cpu, "GEMM_SIZE", 128)
    monkeypatch.setattr(attention_cpu, "WEIGHTS_GRAD_SHAPES", [(1, 2, 40, 16)])
    attention_cpu.main(["--min-run-time", "0.01", "--rounds", "1", "--dtypes", "float32",
                        "bfloat16", "--skip-memory", "--json", str(tmp_path / "a.json")])
    out = capsys.readouterr().out
    # The JSON results hold the same tables as printed, and the command that makes them.
    saved = json.loads((tmp_path / "a.json").read_text())
    assert [(t["header"], t["rows"]) for t in saved["tables"]] == parse_tables(out)
    assert [t["key"] for t in saved["tables"]] == ["float32", "bfloat16", "weights",
                                                   "weights_grad", "dropout"]
    assert saved["command"] == ("python3 benchmarks/attention_cpu.py --min-run-time 0.01 "
                                "--rounds 1 --dtypes float32 bfloat16 --skip-memory")
    assert saved["machine"]["threads"] == 1 and saved["machine"]["torch"] == torch.__version__
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", saved["date"])
    assert out.startswith("Machine: ") and "threads, torch" in out.splitlines()[0]
    peak = float(re.search(r"float32 FMA peak \(registers only, all 1 threads\): (\d+) GFLOP/s",
                           out).group(1))
    assert ("attnlab" in out.split("GEMM rates")[1].splitlines()[0]) == HAS_OWN_GEMM
    float32, bfloat16, weights, weights_grad, dropout = parse_tables(out)
    assert float32[0][-2:] == ["% of GEMM rate", "% of FMA peak"]
    assert "% of GEMM rate" not in bfloat16[0]
    for header, rows in (float32, bfloat16):
        assert len(rows) == 2 * 2 * 2  # shapes × causal × passes
        ratio = header.index("ratio")
        for row in rows:
            ours, theirs = float(row[3]), float(row[4])
            assert ours > 0 and theirs > 0
            assert matches_rounded(float(row[ratio]), theirs, ours), row
    for row in float32[1]:
        share, of_peak = row[-2], row[-1]
        if row[0] == "(1, 1, 8, 16)":
            assert share == "" and of_peak == ""
            continue
        assert share.endswith(" %") and float(share[:-2]) > 0
        if peak > 0:
            # The share of the peak, from the printed time and FLOPs (to the rounding).
            causal, backward = row[1] == "True", row[2] == "fwd+bwd"
            flops = attention_cpu.attention_flops(1, 1, 512, 16, causal, backward)
            expected = 100 * flops / (float(row[3]) * 1e-3) / 1e9 / peak
            assert float(of_peak[:-2]) == pytest.approx(expected, rel=0.05, abs=1.0)
    header, rows = weights
    assert header[-2:] == ["cost of weights", "vs plain"] and len(rows) == 8
    for row in rows:
        assert matches_rounded(float(row[-2]), float(row[3]), float(row[4])), row
        assert matches_rounded(float(row[-1]), float(row[5]), float(row[3])), row
    header, rows = weights_grad
    assert header[-1] == "cost of the weights' gradient"
    assert [row[1] for row in rows] == ["softmax"] * 2 + ["sparsemax"] * 2 + ["entmax15"] * 2
    for row in rows:
        assert matches_rounded(float(row[-1]), float(row[3]), float(row[4])), row
    header, rows = dropout
    assert header[-2:] == ["vs attnlab p=0", "vs torch"] and len(rows) == 2 * 2  # × causal
    for row in rows:
        with_dropout, without, torch_time = (float(cell) for cell in row[2:5])
        assert matches_rounded(float(row[-2]), without, with_dropout), row
        assert matches_rounded(float(row[-1]), torch_time, with_dropout), row


def test_encoder_table(monkeypatch, capsys):
    shape = (4, 6, 32, 2, 48)
    monkeypatch.setattr(encoder_cpu, "SHAPES", [shape])
    threads = torch.get_num_threads()
    try:
        encoder_cpu.main(["--min-run-time", "0.02", "--rounds", "1", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    (header, rows), = parse_tables(capsys.readouterr().out)
    assert header[-4:] == ["GEMM floor", "attnlab / floor", "operators alone / floor",
                           "GEMM FLOPs at FMA peak"]
    (row,) = rows
    assert row[0] == str(shape) and row[1] == "1"
    ours, plain = float(row[2]), float(row[3])
    assert matches_rounded(float(row[4]), plain, ours)
    floor, by = re.fullmatch(r"([\d.]+) \((torch\.mm|attnlab)\)", row[5]).groups()
    assert by in (["torch.mm", "attnlab"] if HAS_OWN_GEMM else ["torch.mm"])
    assert matches_rounded(float(row[6]), ours, float(floor))
    assert float(row[7]) > 0  # the operators' time over the same floor
    # 3 products per Linear: 2·rows·fan_in·fan_out FLOPs each.
    B, L, d, _, d_ff = shape
    assert encoder_cpu.gemm_flops(*shape[:3], d_ff) == 3 * 2 * B * L * (
        d * 3 * d + d * d + d * d_ff + d_ff * d)
    if row[8]:
        assert float(row[8]) > 0


def test_autograd_overhead_tables(capsys):
    import autograd_overhead_cpu
    threads = torch.get_num_threads()
    try:
        autograd_overhead_cpu.main(["--footprints", "0", "1", "--min-run-time", "0.02",
                                    "--rounds", "1", "--shape", "4", "6", "32", "2", "48"])
    finally:
        torch.set_num_threads(threads)
    (header, rows), (step_header, step_rows) = parse_tables(capsys.readouterr().out)
    assert header == ["MiB streamed each way", "direct", "through autograd", "autograd"]
    assert [row[0] for row in rows] == ["0", "1"]
    for row in rows:
        direct, through, overhead = (float(c) for c in row[1:])
        assert overhead == pytest.approx(through - direct, abs=0.11)
    assert step_header[:2] == ["operators alone", "training step"]
    (row,) = step_rows
    ops, step, overhead = (float(c) for c in row)
    # Each time is printed to 0.5 µs and the overhead to 0.5 µs: 1.5 µs apart at most.
    assert overhead == pytest.approx((step - ops) * 1e3, abs=1.5)
