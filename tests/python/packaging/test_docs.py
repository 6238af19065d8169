"""The README and the docs say what is true of this checkout: the README's Python examples run,
its length stays that of a front page, the generated performance tables match the committed
benchmark results, and no tracked file speaks of how the project was built."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"


def tracked_files():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [REPO / name for name in out.stdout.decode().split("\0") if name]


def python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 120
    # The two quick-start commands, as the README's test command section of .ci/run calls them.
    assert "python3 -m attnlab reverse" in text
    assert 'ctest --test-dir build -j "$(nproc)" --output-on-failure && python3 -m pytest -q -n auto' in text
    ci = (REPO / ".ci" / "run").read_text()
    assert 'ctest --test-dir build -j "$(nproc)" --output-on-failure && python3 -m pytest -q -n auto' in ci


def test_readme_links_resolve():
    text = README.read_text()
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if target.startswith(("http://", "https://")):
            continue
        assert (REPO / target).exists(), target


def test_readme_python_examples_run(tmp_path):
    pytest.importorskip("transformers")
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 4
    # The blocks build on one another as a reader runs them in order, in one interpreter.
    script = "\n".join(blocks)
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "attention.html").stat().st_size > 1000


def test_generated_tables_are_current():
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "tables.py"), "--check"],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr


def test_generated_tables_fail_when_a_figure_is_edited_by_hand(tmp_path):
    # A copy of the two pages with one generated figure changed must be reported stale.
    for page in ("README.md", "docs/performance.md"):
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text((REPO / page).read_text())
    page = tmp_path / "docs" / "performance.md"
    text = page.read_text()
    edited = re.sub(r"(\| )(\d+\.\d\d)(×)", lambda m: f"{m[1]}9{m[2]}{m[3]}", text, count=1)
    assert edited != text
    page.write_text(edited)
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "tables.py"), "--check",
                             "--root", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 1 and "docs/performance.md" in result.stderr


def test_no_tracked_file_speaks_of_how_it_was_built():
    pattern = re.compile(r"session [0-9]|\blease", re.I)
    offending = []
    for path in tracked_files():
        if not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        offending += [f"{path.relative_to(REPO)}:{number}"
                      for number, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
    assert not offending, offending
