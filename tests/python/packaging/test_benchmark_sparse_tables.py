"""benchmarks/sparse_attention_cpu.py on tiny shapes: its tables are well formed (columns,
positive ratios that match the times), its target verdicts follow from the (fake) figures, the
agreement check stops on a mismatch, and the memory probe runs. No timed assertions."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("entmax", reason="the sparse benchmark's baseline is the entmax package "
                                     "(pip install entmax)")

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import sparse_attention_cpu as bench  # noqa: E402
from markdown_tables import parse_tables  # noqa: E402

TINY = [(3, 1, 16, 8), (1, 2, 24, 16)]


@pytest.fixture
def tiny(monkeypatch):
    """Tiny shapes, where the first counts as a tutorial shape and the second as long."""
    monkeypatch.setattr(bench, "SHAPES", TINY)
    monkeypatch.setattr(bench, "TUTORIAL_SHAPES", {TINY[0]})
    monkeypatch.setattr(bench, "LONG_FROM", 24)


def test_script_prints_well_formed_tables_and_verdicts(tiny, capsys, one_thread):
    bench.main(["--min-run-time", "0.01", "--skip-memory"])
    out = capsys.readouterr().out
    assert out.startswith("Machine: ") and "threads, torch" in out.splitlines()[0]
    tables = parse_tables(out)
    assert [header for header, _ in tables] == [bench.SPEED_HEADER, bench.WEIGHTS_HEADER,
                                                bench.SOFTMAX_HEADER]
    labels = {"sparsemax", "entmax-1.5", "α-entmax (α = 1.25)"}
    for header, rows in tables:
        assert len(rows) == len(labels) * len(TINY) * 2  # normalizers × shapes × passes
        assert {row[0] for row in rows} == labels
        assert {row[2] for row in rows} == {"fwd", "fwd+bwd"}
        assert all(len(row) == len(header) for row in rows)
        ratio = header.index("ratio") if "ratio" in header else header.index("sparse / softmax")
        first, second = ratio - 2, ratio - 1  # the two time columns before the ratio
        for row in rows:
            assert float(row[first]) > 0 and float(row[second]) > 0 and float(row[ratio]) > 0
            # entmax / attnlab, or sparse / softmax, from the unrounded times: the printed ones
            # (3 decimals, ms) are each within 0.0005 of theirs, which at a few µs moves the
            # quotient by far more than its own rounding (1.49 printed against 0.005 / 0.003).
            num, den = ((float(row[first]), float(row[second])) if header == bench.SOFTMAX_HEADER
                        else (float(row[second]), float(row[first])))
            low = max(num - 5e-4, 0.0) / (den + 5e-4)
            high = (num + 5e-4) / (den - 5e-4) if den > 5e-4 else float("inf")
            assert low * 0.99 - 0.01 <= float(row[ratio]) <= high * 1.01 + 0.01
    speed_rows = tables[0][1]
    for row in speed_rows:
        assert 0 < float(row[3]) <= 100  # nonzero %
        expected_target = {("(3, 1, 16, 8)", "fwd+bwd"): "(≥ 1.5)",
                           ("(1, 2, 24, 16)", "fwd+bwd"): "(≥ 3)"}.get((row[1], row[2]), "")
        assert row[-1].endswith(expected_target) and bool(row[-1]) == bool(expected_target)
    assert all(row[-1].endswith("(≥ 2)") for row in tables[1][1])
    for row in tables[2][1]:  # the softmax bound judges sparsemax and entmax-1.5 only
        assert row[-1].endswith("(≤ 2)") == (not row[0].startswith("α-entmax"))
        assert bool(row[-1]) == (not row[0].startswith("α-entmax"))
    verdicts = out.split("\nTargets\n")[1].strip().splitlines()
    assert len(verdicts) == 4
    assert all(line.startswith("- ") and (" met, " in line or " MISSED, " in line)
               for line in verdicts)
    # fwd+bwd rows of 3 normalizers at the long and the tutorial shape; every row with weights;
    # every row of sparsemax and entmax-1.5 against softmax.
    assert [line.split(" rows")[0].split(" of ")[-1] for line in verdicts] == ["3", "3", "12", "8"]


def record(normalizer, shape, passes, attnlab, weights, package, softmax, nonzero=0.25):
    return dict(normalizer=normalizer, alpha=1.25, shape=shape, passes=passes, nonzero=nonzero,
                times={"attnlab": attnlab, "attnlab + weights": weights, "entmax": package,
                       "attnlab softmax": softmax})


def test_verdicts_follow_from_the_figures():
    records = [
        record("sparsemax", (128, 1, 16, 32), "fwd", 1.0, 1.0, 1.2, 1.0),        # no target
        record("sparsemax", (128, 1, 16, 32), "fwd+bwd", 1.0, 0.5, 1.6, 1.0),    # 1.6, 3.2
        record("entmax", (64, 4, 10, 64), "fwd+bwd", 1.0, 1.0, 1.4, 0.4),        # 1.4 < 1.5
        record("entmax15", (8, 8, 512, 64), "fwd+bwd", 2e-3, 4e-3, 7e-3, 1e-3),  # 3.5, 1.75, 2
        record("entmax15", (2, 8, 2048, 64), "fwd+bwd", 1.0, 2.0, 2.5, 1.0),     # 2.5 < 3
    ]
    rows = bench.speed_rows(records)
    assert rows[0][:3] == ["sparsemax", "(128, 1, 16, 32)", "fwd"] and rows[0][-1] == ""
    assert rows[0][3] == "25.0" and rows[0][4:7] == ["1000.000", "1200.000", "1.20"]
    assert rows[1][-1] == "met (≥ 1.5)"
    assert rows[2][0] == "α-entmax (α = 1.25)" and rows[2][-1] == "MISSED (≥ 1.5)"
    assert rows[3][4:] == ["2.000", "7.000", "3.50", "met (≥ 3)"]
    assert rows[4][-1] == "MISSED (≥ 3)"
    weights = bench.weights_rows(records)
    assert weights[3][3:] == ["4.000", "7.000", "1.75", "MISSED (≥ 2)"]
    assert weights[0][-1] == "MISSED (≥ 2)" and weights[1][5:] == ["3.20", "met (≥ 2)"]
    softmax = bench.softmax_rows(records)
    assert softmax[2][3:] == ["1000.000", "400.000", "2.50", ""]  # α-entmax: not judged
    assert softmax[0][-1] == "met (≤ 2)"
    slow = bench.softmax_rows([record("sparsemax", (8, 8, 512, 64), "fwd", 2.5, 1, 1, 1)])
    assert slow[0][-1] == "MISSED (≤ 2)"
    assert softmax[3][-1] == "met (≤ 2)"  # exactly 2 meets "≤ 2"
    lines = bench.speed_verdicts(records)
    assert lines[0].startswith("- fwd+bwd ≥ 3× the entmax path at L ≥ 512: MISSED, 1 of 2 rows")
    assert "(2, 8, 2048, 64) fwd+bwd (2.50)" in lines[0]
    assert lines[1].startswith("- fwd+bwd ≥ 1.5× the entmax path at the tutorial shapes: "
                               "MISSED, 1 of 2 rows (ratios 1.40–1.60)")
    assert lines[2].startswith("- with weights ≥ 2× the entmax path: MISSED, 1 of 5 rows")
    assert lines[3].startswith("- sparsemax and entmax-1.5 ≤ 2× attnlab softmax: met, 4 of 4 rows")
    met = bench.speed_verdicts([record("sparsemax", (8, 8, 512, 64), "fwd+bwd", 1, 1, 4, 1)])
    assert met[0].startswith("- fwd+bwd ≥ 3× the entmax path at L ≥ 512: met, 1 of 1 rows")
    assert met[1].endswith("no row measured")


def test_memory_rows_and_verdict_from_a_fake_probe():
    def linear(which, normalizer, alpha, length):   # attnlab linear, the package quadratic
        return length / 1024 if which == "attnlab" else length * length * 4 * 3 / 2**20

    rows = bench.memory_rows(["sparsemax", "entmax15"], 1.25, 8192, probe=linear)
    assert all(len(row) == len(bench.MEMORY_HEADER) for row in rows)
    # 8 MiB at L = 8192 is 4 tensors of 8192 × 64 float32 (2 MiB each); growth 8 / 4 = 2.
    assert rows[0][:7] == ["sparsemax", 8192, "8.0", "4.0", "2.00", "4.0", "768.0"]
    assert rows[0][7] == "96" and rows[0][8].startswith("met")
    assert bench.memory_verdict(rows, 8192).startswith(
        "- extra memory O(L·E) without weights at L = 8192: met, 2 of 2")

    def quadratic(which, normalizer, alpha, length):
        return length * length / 2**20

    rows = bench.memory_rows(["sparsemax"], 1.25, 4096, probe=quadratic)
    assert rows[0][4] == "4.00" and rows[0][-1].startswith("MISSED")
    line = bench.memory_verdict(rows, 4096)
    assert "MISSED (measured at L = 4096, not 8192)" in line


def test_memory_probe_runs_in_a_subprocess():
    ours = bench.probe_memory("attnlab", "entmax15", 1.25, 256)
    theirs = bench.probe_memory("entmax", "entmax", 1.25, 256)
    assert ours >= 0 and theirs >= 0


def test_agreement_check_catches_a_different_mapping(monkeypatch):
    q, k, v = bench.inputs((1, 2, 12, 8))
    nonzero = bench.check_agreement("sparsemax", 1.25, q, k, v)
    assert 0 < nonzero < 1  # sparsemax zeroes some of 12 keys of standard normal scores
    monkeypatch.setattr(bench, "entmax_function",
                        lambda normalizer, alpha: (lambda x, dim: x.softmax(dim)))
    with pytest.raises(RuntimeError, match="sparsemax at \\(1, 2, 12, 8\\): attnlab and the "
                                           "entmax package differ"):
        bench.check_agreement("sparsemax", 1.25, q, k, v)


def test_slow_calls_are_timed_singly_in_alternating_rounds(monkeypatch):
    monkeypatch.setattr(bench, "SLOW_CALL", 0.0)
    calls = []
    fns = [lambda: calls.append("a"), lambda: calls.append("b")]
    times = bench.time_functions(fns, min_run_time=0.01)
    assert len(times) == 2 and all(t >= 0 for t in times)
    # One warm-up call each, then SLOW_ROUNDS alternating rounds of one call each.
    assert calls == ["a", "b"] * (1 + bench.SLOW_ROUNDS)


@pytest.mark.parametrize("args,message", [(["--min-run-time", "0"], "--min-run-time must be"),
                                          (["--alpha", "1"], "--alpha must be > 1"),
                                          (["--memory-length", "1"], "--memory-length must be"),
                                          (["--normalizers", "softmax"], "invalid choice")])
def test_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(args)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_defaults_cover_the_targets():
    args = bench.parse_args([])
    assert args.normalizers == ["sparsemax", "entmax15", "entmax"] and args.alpha == 1.25
    assert args.memory_length == 8192 and not args.skip_memory
    assert bench.TUTORIAL_SHAPES <= set(bench.SHAPES)
    assert any(shape[2] >= bench.LONG_FROM for shape in bench.SHAPES)
