"""benchmarks/attention_cuda.py without a GPU: its FLOP convention, the tables and target
verdicts it builds from (fake) timings, the default-backend detection, and its command line."""

import subprocess
import time
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import attention_cuda as bench  # noqa: E402


def record(length, times, passes="fwd", causal=False, head_size=64, dtype="bfloat16"):
    batch, heads = bench.shape_for(length, head_size)
    return dict(dtype=dtype, batch=batch, heads=heads, length=length, head_size=head_size,
                causal=causal, passes=passes, times=times)


def test_flops_follow_the_flash_attention_convention():
    # 4·B·H·L²·D forward; the backward 2.5 times that; both halved when causal.
    assert bench.flops(2, 3, 4, 5, False, False) == 4 * 2 * 3 * 16 * 5
    assert bench.flops(2, 3, 4, 5, False, True) == 3.5 * 4 * 2 * 3 * 16 * 5
    assert bench.flops(2, 3, 4, 5, True, True) == 3.5 * 4 * 2 * 3 * 16 * 5 / 2


def test_shapes_keep_16k_tokens_and_width_2048():
    for length in (512, 2048, 8192):
        for head_size in (64, 128):
            batch, heads = bench.shape_for(length, head_size)
            assert batch * length == 16 * 1024 and heads * head_size == 2048


def test_speed_rows_give_tflops_ratio_and_verdicts():
    records = [
        record(4096, {"attnlab": 2.0, "flash": 1.0, "efficient": "n/a"}),             # 0.50
        record(4096, {"attnlab": 1.0, "flash": 1.1, "efficient": 3.0}, "fwd+bwd"),    # 1.10
        record(4096, {"attnlab": 1.0, "flash": 0.62, "efficient": 3.0}, "fwd+bwd",
               causal=True),                                                            # 0.62
        record(1024, {"attnlab": 5.0, "flash": 1.0, "efficient": 1.0}),               # too short
        record(2048, {"attnlab": "skipped", "flash": 1.0, "efficient": 1.0}),
    ]
    rows = bench.speed_rows(records, "flash", bench.HALF_TARGETS)
    header = bench.speed_header(records, "flash")
    assert header == ["dtype", "(B, H, L, D)", "causal", "pass", "attnlab", "torch flash",
                      "torch efficient", "attnlab / flash", "target"]
    assert all(len(row) == len(header) for row in rows)
    # (4, 32, 4096, 64) forward: 4·4·32·4096²·64 = 5.50e11 FLOP in 2 ms = 274.9 TFLOP/s.
    work = 4 * 4 * 32 * 4096**2 * 64
    assert rows[0][1] == "(4, 32, 4096, 64)"
    assert rows[0][4] == f"{work / 2e-3 / 1e12:.1f}" and rows[0][5] == f"{work / 1e-3 / 1e12:.1f}"
    assert rows[0][6] == "n/a"
    assert rows[0][7] == "0.50" and rows[0][8].startswith("MISSED")
    assert rows[1][4] == f"{3.5 * work / 1e-3 / 1e12:.1f}"
    assert rows[1][7] == "1.10" and rows[1][8].startswith("met")
    assert rows[2][4] == f"{3.5 * work / 2 / 1e-3 / 1e12:.1f}"  # causal: half the work
    assert rows[2][7] == "0.62" and rows[2][8] == "met (≥ 0.6)"  # the fwd+bwd bound
    assert rows[3][8] == ""  # L < 2048: no target
    assert rows[4][4] == "skipped" and rows[4][7] == "n/a" and rows[4][8] == "n/a"
    table = bench.speed_section("half", records, "flash", bench.HALF_TARGETS)
    assert "| bfloat16 | (4, 32, 4096, 64) | False | fwd |" in table
    assert "2 of 3 rows met" in table


def test_weights_rows_judge_speed_and_cost_at_4096_only():
    records = [
        record(4096, {"attnlab": 1.0, "attnlab + weights": 1.4, "plain": 5.0}),  # 3.57, 1.40
        record(4096, {"attnlab": 1.0, "attnlab + weights": 2.0, "plain": 5.0}, "fwd+bwd"),
        record(2048, {"attnlab": 1.0, "attnlab + weights": 9.0, "plain": 1.0}),
        record(4096, {"attnlab": 1.0, "attnlab + weights": 2.0, "plain": "OOM"}, causal=True),
    ]
    rows = bench.weights_rows(records)
    assert all(len(row) == len(bench.WEIGHTS_HEADER) for row in rows)
    assert rows[0][4:] == ["1.000", "1.400", "5.000", "3.57", "1.40", "met (≥ 3)", "met (≤ 1.5)"]
    assert rows[1][7:] == ["2.50", "2.00", "MISSED (≥ 3)", "MISSED (≤ 1.5)"]
    assert rows[2][-2:] == ["", ""]
    assert rows[3][6] == "OOM" and rows[3][7] == "n/a" and rows[3][-2] == "n/a"
    section = bench.weights_section(records)
    assert "≥ 3 × plain at L = 4096: 1 of 2 rows met" in section
    assert "weights cost ≤ 1.5 at L = 4096: 1 of 3 rows met" in section


def memory_record(length, ours, plain):
    return dict(dtype="bfloat16", batch=1, heads=8, length=length, head_size=64,
                input_bytes=3 * 8 * length * 64 * 2,
                bytes={"attnlab": ours, "flash": ours, "efficient": ours, "plain": plain})


def test_memory_rows_and_growth():
    linear = [memory_record(n, 1000 * n, 8 * n * n) for n in (1024, 2048, 4096)]
    rows = bench.memory_rows(linear)
    assert rows[0][0] == 1024 and rows[0][1] == f"{3 * 8 * 1024 * 64 * 2 / 2**20:.1f}"
    assert rows[0][-1] == rows[-1][-1] == f"{1000 / 8:.0f}"  # constant bytes per query row
    assert len(rows[0]) == len(bench.memory_header(linear))
    assert "4.00×" in bench.memory_growth(linear) and "O(L)" in bench.memory_growth(linear)
    quadratic = [memory_record(n, n * n, "skipped") for n in (1024, 4096)]
    assert "FASTER THAN LINEAR" in bench.memory_growth(quadratic)
    assert bench.memory_rows(quadratic)[0][-2] == "skipped"
    assert bench.memory_growth(quadratic[:1]) is None
    assert "O(L)" in bench.memory_section(linear)


def test_classify_backend_by_operator_name():
    assert bench.classify_backend({"aten::_scaled_dot_product_flash_attention"}) == "flash"
    assert bench.classify_backend({"aten::_scaled_dot_product_flash_attention_for_cpu"}) \
        == "flash (CPU)"
    assert bench.classify_backend({"aten::_scaled_dot_product_efficient_attention",
                                   "aten::scaled_dot_product_attention"}) == "efficient"
    assert bench.classify_backend({"aten::_scaled_dot_product_cudnn_attention"}) == "cudnn"
    assert bench.classify_backend({"aten::_scaled_dot_product_attention_math"}) == "math"
    assert bench.classify_backend({"aten::mm"}) == "unknown"


def test_default_backend_is_read_from_a_real_call():
    # On the CPU torch calls its flash kernel or the math fallback: either is a known name.
    q = torch.randn(1, 2, 16, 8)
    assert bench.default_backend(q, q, q) in ("flash (CPU)", "math")


def run_script(*args):
    return subprocess.run([sys.executable, str(BENCHMARKS / "attention_cuda.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_help_describes_the_convention():
    result = run_script("--help")
    assert result.returncode == 0, result.stderr
    assert "FlashAttention convention" in result.stdout and "--max-seconds" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_without_a_gpu_it_says_so():
    result = run_script("--tables", "memory")
    assert result.returncode == 1
    assert "no CUDA device is available" in result.stderr


@pytest.mark.parametrize("args,message", [(["--reps", "0"], "--reps must be at least 1"),
                                          (["--lengths", "0"], "--lengths must be positive"),
                                          (["--tables", "speed"], "invalid choice")])
def test_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(args)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_defaults_cover_the_targets():
    args = bench.parse_args([])
    assert set(args.tables) == set(bench.TABLES)
    assert bench.WEIGHTS_TARGET_LENGTH in args.weights_lengths
    assert any(n >= bench.TARGET_FROM_LENGTH for n in args.lengths)
    assert args.head_sizes == [64, 128]


class FakeEvent:
    """torch.cuda.Event's timing interface on the host clock."""

    def __init__(self, enable_timing=True):
        self.at = None

    def record(self):
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3


def test_time_alternating_medians_and_failures(monkeypatch):
    monkeypatch.setattr(bench.torch.cuda, "Event", FakeEvent)
    calls = []

    def sleeper(name, seconds):
        def run():
            calls.append(name)
            time.sleep(seconds)
        return run

    def declines():
        raise RuntimeError("No available kernel")

    def torch_backend(q, k, v, is_causal):  # stands for a forced torch backend
        pass

    times = bench.time_alternating([sleeper("slow", 0.004), sleeper("fast", 0.001), declines],
                                   [bench.attnlab_sdpa, torch_backend, torch_backend], reps=5,
                                   min_sample_ms=2.0)
    assert times[2] == "n/a"
    assert 3.5 < times[0] < 12 and 0.8 < times[1] < 4 and times[0] > 2 * times[1]
    # Three warm-up calls each, then rounds alternate: one sample of each per round.
    assert calls[:6] == ["slow"] * 3 + ["fast"] * 3
    groups = [name for i, name in enumerate(calls[6:]) if i == 0 or calls[6 + i - 1] != name]
    assert groups == ["slow", "fast"] * 5
    # An error from attnlab is a bug: it is raised, not tabulated.
    with pytest.raises(RuntimeError, match="No available kernel"):
        bench.time_alternating([declines], [bench.attnlab_sdpa], reps=1)


# ---- benchmarks/gpu/ncu_cases.py: the summary of Nsight Compute's CSV, without a GPU ----------

sys.path.insert(0, str(BENCHMARKS / "gpu"))
import ncu_cases  # noqa: E402


def ncu_row(metric, unit, value, section="GPU Speed Of Light Throughput"):
    kernel = "void attnlab::cuda::detail::sdpa_flash_backward_kernel<__nv_bfloat16, 128>(...)"
    return (f'"0","41","python3","host","{kernel}","1","7","(128, 1, 1)","(1024, 1, 1)","0",'
            f'"9.0","{section}","{metric}","{unit}","{value}"')


def test_ncu_summary_reads_the_metrics_and_ranks_the_stalls(tmp_path):
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
              '"Block Size","Grid Size","Device","CC","Section Name","Metric Name",'
              '"Metric Unit","Metric Value"')
    stall = ncu_cases.STALL_METRIC.format
    rows = [header, ncu_row("Duration", "ns", "2,345,678"),
            ncu_row("Compute (SM) Throughput", "%", "61.5"),
            ncu_row("Registers Per Thread", "register/thread", "255", "Launch Statistics"),
            ncu_row(stall("long_scoreboard"), "", "0.4", "Command line profiler metrics"),
            ncu_row(stall("mio_throttle"), "", "2.5", "Command line profiler metrics"),
            ncu_row(stall("barrier"), "", "1.25", "Command line profiler metrics")]
    (tmp_path / "ncu-flash-bwd-d128.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "ncu-f32-fwd-d64.csv").write_text(header + "\n")  # ncu found no launch
    ncu_cases.summarize(tmp_path)
    table = (tmp_path / "ncu.md").read_text().splitlines()
    flash = next(line for line in table if line.startswith("| attnlab flash backward, D 128 |"))
    cells = [cell.strip() for cell in flash.strip("|").split("|")]
    assert cells[1] == "2,345,678 ns" and cells[2] == "61.5" and cells[3] == "—"
    assert cells[4] == "255 register/thread"
    assert cells[-1] == "mio_throttle 2.50, barrier 1.25, long_scoreboard 0.40"
    assert any(line.startswith("| attnlab float32 forward (generic), D 64 |") and "no data" in line
               for line in table)
    assert not any("D 64 | " in line and "flash forward" in line for line in table)


def test_ncu_cases_name_kernels_that_the_sources_define():
    sources = "".join(p.read_text() for p in (BENCHMARKS.parent / "cpp" / "src" / "cuda").glob("*.cuh"))
    for name, case in ncu_cases.CASES.items():
        if case.torch_backend is None:
            assert case.kernel in sources, name
