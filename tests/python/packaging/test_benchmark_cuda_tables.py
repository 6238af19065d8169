"""The GPU benchmarks and benchmarks/gpu/run.sh without a GPU: attention_cuda.py's FLOP
convention, the tables, target verdicts and JSON report it builds from (fake) timings, the
default-backend detection and its command line; sparse_attention_cuda.py's table; the GPU
machine record; run.sh's nine-minute plan (--dry-run) and checks_json.py's counts."""

import json
import re
import subprocess
import time
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
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


def test_speed_rows_give_tflops_ratios_and_verdicts():
    records = [
        record(4096, {"attnlab": 2.0, "flash": 1.0, "cudnn": "n/a"}),                 # 0.50
        record(4096, {"attnlab": 1.0, "flash": 1.1, "cudnn": 0.5}, "fwd+bwd"),        # 1.10
        record(4096, {"attnlab": 1.0, "flash": 0.98, "cudnn": 0.5}, "fwd+bwd",
               causal=True),                                                            # 0.98
        record(1024, {"attnlab": 1.0, "flash": 1.0, "cudnn": 1.0}),                   # 1.00
        record(512, {"attnlab": 5.0, "flash": 1.0, "cudnn": 1.0}),                    # too short
        record(2048, {"attnlab": "skipped", "flash": 1.0, "cudnn": 1.0}),
    ]
    rows = bench.speed_rows(records, "flash", bench.HALF_TARGETS, ("cudnn",))
    header = bench.speed_header(records, "flash", ("cudnn",))
    assert header == ["dtype", "(B, H, L, D)", "causal", "pass", "attnlab", "torch flash",
                      "torch cudnn", "attnlab / flash", "attnlab / cudnn", "target"]
    assert all(len(row) == len(header) for row in rows)
    # (4, 32, 4096, 64) forward: 4·4·32·4096²·64 = 5.50e11 FLOP in 2 ms = 274.9 TFLOP/s.
    work = 4 * 4 * 32 * 4096**2 * 64
    assert rows[0][1] == "(4, 32, 4096, 64)"
    assert rows[0][4] == f"{work / 2e-3 / 1e12:.1f}" and rows[0][5] == f"{work / 1e-3 / 1e12:.1f}"
    assert rows[0][6] == "n/a" and rows[0][8] == "n/a"  # no cudnn time, no cudnn ratio
    assert rows[0][7] == "0.50" and rows[0][9] == "MISSED (≥ 1)"
    assert rows[1][4] == f"{3.5 * work / 1e-3 / 1e12:.1f}"
    assert rows[1][7:] == ["1.10", "0.50", "met (≥ 1)"]  # cudnn shown, not judged
    assert rows[2][4] == f"{3.5 * work / 2 / 1e-3 / 1e12:.1f}"  # causal: half the work
    assert rows[2][7] == "0.98" and rows[2][9] == "MISSED (≥ 1)"  # forward+backward: 1.0 too
    assert rows[3][9] == "met (≥ 1)"  # the targets apply from L = 1024
    assert rows[4][9] == ""  # L = 512: no target
    assert rows[5][4] == "skipped" and rows[5][7] == "n/a" and rows[5][9] == "n/a"
    table = bench.speed_section("half", records, "flash", bench.HALF_TARGETS, ("cudnn",))
    assert "| bfloat16 | (4, 32, 4096, 64) | False | fwd |" in table
    assert "from L = 1024: 2 of 4 rows met" in table


def weights_record(length, times, passes="fwd", causal=False, dtype="bfloat16"):
    result = record(length, times, passes, causal, dtype=dtype)
    result["weights_bytes"] = result["batch"] * result["heads"] * length * length * 2
    return result


def test_weights_rows_judge_the_cost_in_bfloat16_forward_backward_from_2048_to_8192():
    both = {"attnlab": 1.0, "attnlab + weights": 1.1, "attnlab + flash weights": 1.5,
            "plain": 5.0}
    records = [
        weights_record(4096, dict(both)),                                        # fwd: no target
        weights_record(2048, dict(both), "fwd+bwd"),                             # judged
        weights_record(8192, {**both, "attnlab + weights": 1.3}, "fwd+bwd", causal=True),
        weights_record(1024, dict(both), "fwd+bwd"),                             # too short
        weights_record(4096, dict(both), "fwd+bwd", dtype="float32"),            # not bfloat16
        weights_record(4096, {**both, "attnlab + flash weights": "error"}, "fwd+bwd"),
    ]
    header = bench.weights_header(records)
    assert header == ["dtype", "(B, H, L, D)", "causal", "pass", "attnlab (ms)",
                      "attnlab + weights (ms)", "attnlab + flash weights (ms)", "plain (ms)",
                      "weights: with / without", "weights: fwd / write bound",
                      "weights: target ≤ 1.2", "flash weights: with / without",
                      "flash weights: fwd / write bound", "flash weights: target ≤ 1.2"]
    # 1 TB/s: the (4, 32, 4096, 64) weights, 4·32·4096²·2 bytes = 4.29 GB, take 4.29 ms.
    rows = bench.weights_rows(records, bandwidth=1e12)
    assert all(len(row) == len(header) for row in rows)
    bound = 4 * 32 * 4096**2 * 2 / 1e12 * 1e3
    assert rows[0][4:8] == ["1.000", "1.100", "1.500", "5.000"]
    assert rows[0][8:] == ["1.10", f"{1.1 / bound:.1f}", "", "1.50", f"{1.5 / bound:.1f}", ""]
    assert rows[1][8:] == ["1.10", "", "met (≤ 1.2)", "1.50", "", "MISSED (≤ 1.2)"]
    assert rows[2][8:] == ["1.30", "", "MISSED (≤ 1.2)", "1.50", "", "MISSED (≤ 1.2)"]
    assert rows[3][10] == rows[3][13] == "" and rows[4][10] == rows[4][13] == ""
    assert rows[5][6] == "error" and rows[5][11] == "n/a" and rows[5][13] == "n/a"
    assert bench.weights_rows(records[:1])[0][9] == "n/a"  # bandwidth not measured
    section = bench.weights_section(records, bandwidth=1e12)
    assert "memory bandwidth (device-to-device copy, bytes read + written): 1000 GB/s" in section
    assert "- weights: with / without ≤ 1.2, bfloat16 forward+backward at L = 2048–8192: " \
           "2 of 3 rows met" in section
    assert "- flash weights: with / without ≤ 1.2, bfloat16 forward+backward at L = " \
           "2048–8192: 0 of 2 rows met" in section
    # Without the opt-in column: the default's columns only.
    plain_only = [weights_record(4096, {"attnlab": 1.0, "attnlab + weights": 1.1, "plain": 2.0})]
    assert len(bench.weights_header(plain_only)) == 4 + 3 + 3


def test_sections_go_to_the_json_report_as_one_line_titles_with_their_verdicts(tmp_path):
    from common import Report
    records = [record(4096, {"attnlab": 1.0, "flash": 1.1, "cudnn": 0.5}, "fwd+bwd")]
    report = Report("attention_cuda", argv=["--tables", "half", "--json", "x.json"],
                    machine={"class": "gpu-test", "gpu": "Test GPU"})
    half = bench.speed_parts("half", "bfloat16 and float16, TFLOP/s", records, "flash",
                             bench.HALF_TARGETS, bench.HALF_ALSO)
    memory = bench.memory_parts([memory_record(n, 1000 * n, 8 * n * n) for n in (1024, 2048)])
    bench.keep(report, half)
    bench.keep(report, memory)
    report.save(tmp_path / "attention_cuda.json")
    saved = json.loads((tmp_path / "attention_cuda.json").read_text())
    assert saved["benchmark"] == "attention_cuda" and saved["machine"]["class"] == "gpu-test"
    assert saved["command"] == "python3 benchmarks/attention_cuda.py --tables half"
    assert [t["key"] for t in saved["tables"]] == ["half", "memory"]
    assert saved["tables"][0]["title"] == "bfloat16 and float16, TFLOP/s"
    assert saved["tables"][0]["header"] == half[2]
    assert saved["tables"][0]["rows"][0][-1] == "met (≥ 1)"
    assert "\n" not in saved["tables"][1]["title"]
    assert saved["tables"][1]["title"].startswith("Peak extra GPU memory of one forward+backward")
    assert saved["notes"][0].startswith("- bfloat16 and float16, TFLOP/s, attnlab / flash")
    assert "O(L)" in saved["notes"][1]
    # The markdown keeps its heading and paragraph.
    assert bench.section_text(memory).startswith("## Peak extra GPU memory")


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
    assert set(args.tables) == set(bench.TABLES) and set(args.variants) == set(bench.VARIANTS)
    low, high = bench.WEIGHTS_TARGET_LENGTHS
    assert low in args.weights_lengths and high in args.weights_lengths
    assert bench.WEIGHTS_TARGET_DTYPE in args.weights_dtypes
    assert bench.TARGET_FROM_LENGTH in args.lengths and args.float32_lengths == args.lengths
    assert args.head_sizes == [64, 128]
    assert bench.parse_args(["--variants"]).variants == []


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


# ---- benchmarks/sparse_attention_cuda.py: its table without a GPU -----------------------------

import sparse_attention_cuda as sparse  # noqa: E402


def test_sparse_rows_give_ratios_and_judge_the_largest():
    alphas = [2.0, 1.5]
    header = sparse.header(alphas)
    assert header == ["dtype", "B×H×L", "pass", "softmax ms", "α=2 ms (×)", "α=1.5 ms (×)",
                      "target ≤ 1.5"]
    rows = [sparse.row(dict(dtype="bfloat16", batch=4, heads=16, length=4096, passes="fwd",
                            times=times))
            for times in ([2.0, 2.4, 3.0], [2.0, 2.4, 3.2], [2.0, "skipped", 2.0],
                          ["skipped"] * 3)]
    assert all(len(row) == len(header) for row in rows)
    assert rows[0] == ["bfloat16", "4×16×4096", "fwd", "2.00", "2.40 (1.2×)", "3.00 (1.5×)",
                       "met (≤ 1.5)"]
    assert rows[1][-1] == "MISSED (≤ 1.5)"  # 1.6× for α = 1.5
    assert rows[2][4] == "skipped" and rows[2][-1] == "n/a"
    assert rows[3][3] == "skipped" and rows[3][-1] == "n/a"
    assert sparse.summary(rows) == \
        "- every α ≤ 1.5 × softmax: 1 of 2 rows met (see MISSED rows)"


def test_sparse_benchmark_says_it_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("checks the message given without a GPU")
    result = subprocess.run([sys.executable, str(BENCHMARKS / "sparse_attention_cuda.py"),
                             "--json", "x.json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "needs a CUDA device" in result.stderr


# ---- benchmarks/common.py: the GPU machine record ----------------------------------------------

def test_gpu_machine_record_names_the_class_after_the_device(monkeypatch):
    import common
    monkeypatch.setattr(common.torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")

    run = subprocess.run

    def nvidia_smi(command, **kwargs):
        if command[0] != "nvidia-smi":  # lscpu, uname: the host's own
            return run(command, **kwargs)
        return subprocess.CompletedProcess(command, 0, stdout="580.159.04\n", stderr="")
    monkeypatch.setattr(common.subprocess, "run", nvidia_smi)
    record = common.gpu_machine_record()
    assert record["class"] == "gpu-nvidia-h100-80gb-hbm3"
    assert record["gpu"] == "NVIDIA H100 80GB HBM3"
    assert record["driver"] == "580.159.04"
    assert set(record) == {"class", "gpu", "driver", "cuda", "cpu", "threads", "python", "torch",
                           "attnlab"}


# ---- benchmarks/gpu/run.sh and checks_json.py, without a GPU -----------------------------------

RUN_SH = BENCHMARKS / "gpu" / "run.sh"
import checks_json  # noqa: E402  (benchmarks/gpu is on the path above)


def dry_run(*args):
    return subprocess.run(["bash", str(RUN_SH), "/tmp/attnlab-gpu-dry-run", "--dry-run", *args],
                          capture_output=True, text=True, timeout=120)


def plan_lines(stdout):
    """{phase or 'side by side:': budget seconds} from the plan table of a dry run."""
    budgets = {}
    for line in stdout.splitlines():
        match = re.match(r"^  (\S.*?)\s+(\d+)s\s+(\d+)s$", line)
        if match:
            budgets[match[1]] = int(match[2])
    return budgets


def test_the_default_plan_fits_nine_minutes_with_every_phase():
    result = dry_run()
    assert result.returncode == 0, result.stderr
    assert not Path("/tmp/attnlab-gpu-dry-run").exists()  # a dry run writes nothing
    budgets = plan_lines(result.stdout)
    assert list(budgets) == ["build", "env", "side by side:", "bench-attention", "bench-sparse"]
    assert all(seconds >= 25 for seconds in budgets.values())
    total = re.search(r"total (\d+) s of 540 s", result.stdout)
    assert total and int(total[1]) <= 540
    for phase in ("tests", "fuzz", "memcheck", "racecheck", "memcheck-optin", "racecheck-optin",
                  "flash-weights", "flash-warps"):
        assert re.search(rf"^    {phase}\s+\d+s$", result.stdout, re.M), phase
    assert "SANITIZER_OPT_IN=1" in result.stdout and "SKIPPED" not in result.stdout
    assert "--json /tmp/attnlab-gpu-dry-run/json/attention_cuda.json" in result.stdout
    assert "--json /tmp/attnlab-gpu-dry-run/json/sparse_attention_cuda.json" in result.stdout
    assert "ATTNLAB_CUDA_FUZZ_EXAMPLES=2000" in result.stdout


def test_fuzz_size_is_its_own_setting_and_the_budget_cuts_later_phases():
    quick = dry_run("--quick", "--fuzz-examples", "300", "--phases", "fuzz,bench-attention")
    assert quick.returncode == 0, quick.stderr
    assert "ATTNLAB_CUDA_FUZZ_EXAMPLES=300" in quick.stdout and "--reps 3" in quick.stdout
    short = dry_run("--budget", "200")
    assert "- bench-sparse: SKIPPED" in short.stdout
    assert plan_lines(short.stdout)["bench-sparse"] == 0
    assert dry_run("--fuzz-examples", "many").returncode == 2
    assert dry_run("--phases", "tests+bench-sparse").returncode == 2


def test_checks_json_reads_pytest_sanitizer_and_hypothesis_counts(tmp_path):
    log = """==== 21:18:05 fuzz
tests/python/operator/test_cuda_vs_cpu_properties.py::test_half_precision_cuda_within_twice_torchs_error FAILED [ 22%]
============================ Hypothesis Statistics =============================
tests/python/operator/test_cuda_vs_cpu_properties.py::test_half_precision_cuda_within_twice_torchs_error:

  - during generate phase (55.57 seconds):
    - Typical runtimes: ~ 4-202 ms, of which ~ 2-5 ms in data generation
    - 379 passing, 6 failing, and 33 invalid test cases
    - Found 1 distinct error in this phase

  - during shrink phase (10.21 seconds):
    - 63 passing, 11 failing, and 123 invalid test cases

  - Stopped because nothing left to do

============= 1 failed, 8 passed, 4 deselected in 92.43s (0:01:32) =============
"""
    sanitizer = """==== 21:18:05 racecheck
== compute-sanitizer --tool racecheck --kernel-name kns=attnlab
=============== 109 passed, 605 deselected in 154.73s (0:02:34) ================
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""
    found = checks_json.parse_log(log)
    assert found["pytest"] == [{"passed": 8, "failed": 1, "skipped": 0, "errors": 0,
                                "deselected": 4, "seconds": 92.43}]
    assert found["failed_tests"] == [
        "tests/python/operator/test_cuda_vs_cpu_properties.py::test_half_precision_cuda_within_twice_torchs_error"]
    prop = found["hypothesis"][0]
    assert prop["generate"] == {"passing": 379, "failing": 6, "invalid": 33}
    assert prop["shrink"]["failing"] == 11 and prop["stopped_because"] == "nothing left to do"
    assert "379 passing, 6 failing, 33 invalid" in checks_json.note(found)
    race = checks_json.parse_log(sanitizer)
    assert race["sanitizer"] == [{"tool": "racecheck", "hazards": 0, "errors": 0, "warnings": 0}]
    assert checks_json.totals(race)["hazards"] == 0
    # An output folder: the latest run of each phase, with its log's counts.
    (tmp_path / "fuzz.log").write_text("==== 20:00:00 fuzz\n=== 3 passed in 1.00s ===\n" + log)
    (tmp_path / "racecheck.log").write_text(sanitizer)
    (tmp_path / "results.tsv").write_text(
        "2026-11-27 21:06:00 UTC\tfuzz\tFAIL\t55\t139\tcrash\n"
        "2026-11-27 21:17:00 UTC\tfuzz\tFAIL\t100\t1\t2000 examples\n"
        "2026-11-27 21:17:00 UTC\tracecheck\tPASS\t162\t0\t109 passed\n")
    record = checks_json.build(tmp_path, BENCHMARKS.parent)
    assert record["overall"] == "FAIL" and [r["phases"] for r in record["runs"]] == [
        ["fuzz"], ["fuzz", "racecheck"]]
    assert record["phases"]["fuzz"]["seconds"] == 100
    assert record["phases"]["fuzz"]["counts"] == {"passed": 8, "failed": 1, "skipped": 0,
                                                  "errors": 0, "deselected": 4}
    assert record["phases"]["racecheck"]["counts"]["hazards"] == 0
