"""benchmarks/summaries_cpu.py on short lengths: its tables are well formed (the ratios match
the printed times, one row per length and normalizer) and its memory probe runs. No timed
assertions."""

import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import summaries_cpu as bench  # noqa: E402
from markdown_tables import parse_tables  # noqa: E402


def close(ratio, numerator, denominator):
    """A printed 2-decimal ratio against two printed 1-decimal times (ms)."""
    low = max(numerator - 0.05, 0.0) / (denominator + 0.05)
    high = (numerator + 0.05) / (denominator - 0.05) if denominator > 0.05 else float("inf")
    return low * 0.99 - 0.01 <= ratio <= high * 1.01 + 0.01


def test_tables(capsys, one_thread, tmp_path):
    bench.main(["--lengths", "128", "192", "--memory-length", "256", "--min-run-time", "0.01",
                "--rounds", "1", "--json", str(tmp_path / "s.json")])
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "s.json").read_text())
    assert [t["key"] for t in saved["tables"]] == ["speed", "memory"]
    assert [(t["header"], t["rows"]) for t in saved["tables"]] == parse_tables(out)
    (header, rows), (memory_header, memory_rows) = parse_tables(out)
    assert [(row[0], row[1]) for row in rows] == [
        (f"(1, 1, {length}, 64)", normalizer) for length in (128, 192)
        for normalizer in bench.NORMALIZERS]
    for row in rows:
        summaries, plain, via_weights = (float(cell) for cell in row[2:5])
        assert close(float(row[5]), summaries, plain), row
        assert close(float(row[6]), via_weights, summaries), row
    assert [row[0] for row in memory_rows] == ["plain", "summaries",
                                               "need_weights=True (the weights alone)"]
    assert memory_rows[2][2] == f"{256 * 256 * 4 / 2**20:.1f}"
