"""Every notebook has one source, notebooks/<name>.py in jupytext's percent format, and runs from
top to bottom in its small mode (read into memory, nothing is written back). No .ipynb is
committed: they are built from the sources, so there are no outputs to review or to go stale."""

import shutil
import subprocess
from pathlib import Path

import jupytext
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[3]
FOLDER = REPO / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.py"))


def code_of(path: Path) -> str:
    return "\n".join(c.source for c in jupytext.read(path).cells if c.cell_type == "code")


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_source_is_a_percent_notebook(path):
    notebook = jupytext.read(path)
    assert notebook.metadata["jupytext"]["text_representation"]["format_name"] == "percent"
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    kinds = [cell.cell_type for cell in notebook.cells]
    assert "markdown" in kinds and "code" in kinds, kinds


def test_no_notebook_is_committed():
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    inside = subprocess.run([git, "-C", str(REPO), "rev-parse", "--is-inside-work-tree"],
                            capture_output=True, text=True)
    # A copy of the sources without its .git (an sdist, an export) has no index to check.
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        pytest.skip(f"{REPO} is not inside a git checkout: {inside.stderr.strip()}")
    tracked = subprocess.run([git, "-C", str(REPO), "ls-files", "--", "notebooks/*.ipynb"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert not tracked, f"build these from the .py sources instead of committing them: {tracked}"


def test_experiment_notebooks_run_the_tutorials_own_code():
    modules = {"reverse": "attnlab.tutorials.uvadl", "anomaly": "attnlab.tutorials.uvadl",
               "sparse_and": "attnlab.tutorials.neuromatch",
               "permutation": "attnlab.tutorials.permutation_lab", "text": "attnlab.tutorials.nyu"}
    for name, module in modules.items():
        assert f"from {module} import" in code_of(FOLDER / f"{name}.py"), name


# The anomaly notebook's small mode still trains and evaluates the full-size model of the fast
# configuration (about 45 s on 2 cores, a minute more to train the feature CNN when its cache is
# empty).
LONG_NOTEBOOKS = {"anomaly.py"}


@pytest.mark.parametrize("path", [
    pytest.param(path, id=path.name, marks=[pytest.mark.long] if path.name in LONG_NOTEBOOKS else [])
    for path in NOTEBOOKS])
def test_notebook_runs_in_small_mode(path, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("ATTNLAB_NOTEBOOK_OUT", str(tmp_path / "run"))
    notebook = jupytext.read(path)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure was drawn"
