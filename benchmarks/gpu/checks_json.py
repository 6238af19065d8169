"""The checks of a benchmarks/gpu/run.sh output folder as JSON: each phase's result (PASS, FAIL,
TIMEOUT, PARTIAL, SKIPPED), seconds and note from OUTDIR/results.tsv, and the counts its log
shows: pytest's (passed, failed, skipped, errors, deselected) and the tests that failed,
compute-sanitizer's (errors, hazards), and hypothesis's per property (examples passing, failing
and invalid while generating, and why it stopped).

    python3 benchmarks/gpu/checks_json.py OUTDIR          # writes OUTDIR/checks.json
    python3 benchmarks/gpu/checks_json.py --note LOG      # one line: the log's counts

Needs only the standard library (it runs where torch is missing too)."""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

PYTEST_SUMMARY = re.compile(r"^=+ (?P<body>.*\b(?:passed|failed|error|errors|skipped|deselected|"
                            r"xfailed|xpassed|no tests ran)\b.*) in (?P<seconds>[0-9.]+)s\b")
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)")
VERBOSE_RESULT = re.compile(r"^(?P<test>\S+::\S+) (?P<result>FAILED|ERROR)\b")
SHORT_SUMMARY = re.compile(r"^(?P<result>FAILED|ERROR) (?P<test>\S+::\S+)")
SANITIZER_RUN = re.compile(r"^== compute-sanitizer --tool (?P<tool>\w+)")
ERROR_SUMMARY = re.compile(r"=+ ERROR SUMMARY: (?P<errors>\d+) errors?")
RACECHECK_SUMMARY = re.compile(r"=+ RACECHECK SUMMARY: (?P<hazards>\d+) hazards? displayed "
                               r"\((?P<errors>\d+) errors?, (?P<warnings>\d+) warnings?\)")
HYPOTHESIS_TEST = re.compile(r"^(?P<test>\S+::\S+):$")
HYPOTHESIS_PHASE = re.compile(r"^\s+- during (?P<phase>\w+) phase")
HYPOTHESIS_COUNTS = re.compile(r"^\s+- (?P<passing>\d+) passing, (?P<failing>\d+) failing, and "
                               r"(?P<invalid>\d+) invalid test cases")
HYPOTHESIS_STOP = re.compile(r"^\s+- Stopped because (?P<why>.*)$")
SEGFAULT = re.compile(r"Fatal Python error: (?P<what>.*)")


def pytest_counts(body):
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "deselected": 0}
    for number, word in PYTEST_COUNT.findall(body):
        word = "errors" if word.startswith("error") else word
        counts[word] = counts.get(word, 0) + int(number)
    return counts


def parse_log(text):
    """What a phase's log shows: {"pytest": [counts of each pytest run], "failed_tests": [...],
    "sanitizer": [{tool, errors, hazards?}], "hypothesis": [{test, generate, shrink, stopped}],
    "crashes": [...]}; empty lists where the log has none."""
    found = {"pytest": [], "failed_tests": [], "sanitizer": [], "hypothesis": [], "crashes": []}
    tool = None
    prop = None
    phase = None
    for line in text.splitlines():
        match = PYTEST_SUMMARY.match(line)
        if match:
            counts = pytest_counts(match["body"])
            counts["seconds"] = float(match["seconds"])
            found["pytest"].append(counts)
            continue
        match = VERBOSE_RESULT.match(line) or SHORT_SUMMARY.match(line)
        if match and match["test"] not in found["failed_tests"]:
            found["failed_tests"].append(match["test"])
            continue
        match = SANITIZER_RUN.match(line)
        if match:
            tool = match["tool"]
            continue
        match = RACECHECK_SUMMARY.search(line)
        if match:
            found["sanitizer"].append({"tool": "racecheck", "hazards": int(match["hazards"]),
                                       "errors": int(match["errors"]),
                                       "warnings": int(match["warnings"])})
            continue
        match = ERROR_SUMMARY.search(line)
        if match:
            found["sanitizer"].append({"tool": tool or "memcheck",
                                       "errors": int(match["errors"])})
            continue
        match = SEGFAULT.search(line)
        if match:
            found["crashes"].append(match["what"].strip())
            continue
        match = HYPOTHESIS_TEST.match(line)
        if match:
            prop = {"test": match["test"]}
            found["hypothesis"].append(prop)
            phase = None
            continue
        if prop is None:
            continue
        match = HYPOTHESIS_PHASE.match(line)
        if match:
            phase = match["phase"]
            continue
        match = HYPOTHESIS_COUNTS.match(line)
        if match and phase:
            prop[phase] = {key: int(value) for key, value in match.groupdict().items()}
            continue
        match = HYPOTHESIS_STOP.match(line)
        if match:
            prop["stopped_because"] = match["why"].strip()
    return found


def totals(found):
    """The sums over a log's pytest runs and sanitizer runs."""
    summed = {}
    for counts in found["pytest"]:
        for key, value in counts.items():
            if key != "seconds":
                summed[key] = summed.get(key, 0) + value
    for run in found["sanitizer"]:
        summed["sanitizer_errors"] = summed.get("sanitizer_errors", 0) + run.get("errors", 0)
        if "hazards" in run:
            summed["hazards"] = summed.get("hazards", 0) + run["hazards"]
    return summed


def note(found):
    """One line of a log's counts, for summary.md."""
    parts = []
    summed = totals(found)
    if found["pytest"]:
        parts.append(", ".join(f"{summed.get(key, 0)} {key}" for key in
                               ("passed", "failed", "skipped", "errors")))
    if "sanitizer_errors" in summed:
        parts.append(f"{summed['sanitizer_errors']} sanitizer errors")
    if "hazards" in summed:
        parts.append(f"{summed['hazards']} hazards")
    for prop in found["hypothesis"]:
        generated = prop.get("generate")
        if generated:
            parts.append(f"{prop['test'].rsplit('::', 1)[-1]}: {generated['passing']} passing, "
                         f"{generated['failing']} failing, {generated['invalid']} invalid")
    parts += [f"crash: {what}" for what in found["crashes"]]
    return "; ".join(parts)


def latest_run(text):
    """The part of a phase's log from its last run: run.sh appends each run after a line
    "==== HH:MM:SS phase"."""
    start = text.rfind("\n==== ")
    return text if start < 0 else text[start + 1:]


def read_results(path):
    """The phases of results.tsv (run, phase, result, seconds, exit, note), in order."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) < 6:
            continue
        run, phase, result, seconds, status, text = fields[:6]
        rows.append({"run": run, "phase": phase, "result": result, "seconds": int(seconds),
                     "exit": int(status), "note": text})
    return rows


def git_commit(repo):
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=10", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "diff", "--quiet", "HEAD", "--", "cpp",
                                "python", "tests", "benchmarks"]).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def machine(outdir):
    """The GPU, driver and versions from env.txt (run.sh's env phase), where it is there."""
    env = outdir / "env.txt"
    if not env.exists():
        return {}
    text = env.read_text(errors="replace")
    found = {}
    match = re.search(r"^GPU 0: (?P<name>[^,\n]+)", text, re.M)
    if match:
        found["gpu"] = match["name"].strip()
        found["class"] = "gpu-" + "-".join(found["gpu"].lower().split())
    match = re.search(r"Driver Version: (?P<driver>[0-9.]+)", text)
    if match:
        found["driver"] = match["driver"]
    match = re.search(r"^torch (?P<torch>\S+), CUDA (?P<cuda>[^,]+), cuDNN (?P<cudnn>\S+)", text,
                      re.M)
    if match:
        found.update(torch=match["torch"], cuda=match["cuda"], cudnn=match["cudnn"])
    match = re.search(r"^python (?P<python>\S+)", text, re.M)
    if match:
        found["python"] = match["python"]
    match = re.search(r"^# .*?, (?P<cores>\d+) cores", text, re.M)
    if match:
        found["cores"] = int(match["cores"])
    return found


def build(outdir, repo):
    """checks.json's content for a run.sh output folder: every phase's latest run, with the
    counts of its log, and the runs in order."""
    phases = {}
    runs = []
    for row in read_results(outdir / "results.tsv"):
        if not runs or runs[-1]["started"] != row["run"]:
            runs.append({"started": row["run"], "phases": []})
        runs[-1]["phases"].append(row["phase"])
        log = outdir / f"{row['phase']}.log"
        found = parse_log(latest_run(log.read_text(errors="replace"))) if log.exists() else {}
        phases[row["phase"]] = {**row, "log": log.name if log.exists() else None,
                                **({"counts": totals(found)} if found else {}), **found}
    results = {entry["result"] for entry in phases.values()}
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": git_commit(repo),
        "machine": machine(outdir),
        "overall": "PASS" if results and results <= {"PASS", "PARTIAL"} else "FAIL",
        "phases": phases,
        "runs": runs,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", type=Path)
    parser.add_argument("--note", type=Path, metavar="LOG",
                        help="print one line of LOG's counts instead")
    args = parser.parse_args(argv)
    if args.note:
        text = args.note.read_text(errors="replace") if args.note.exists() else ""
        print(note(parse_log(text)))
        return
    if args.outdir is None:
        parser.error("give OUTDIR or --note LOG")
    record = build(args.outdir, Path(__file__).resolve().parents[2])
    (args.outdir / "checks.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{args.outdir / 'checks.json'}: {record['overall']}, "
          f"{len(record['phases'])} phases", file=sys.stderr)


if __name__ == "__main__":
    main()
