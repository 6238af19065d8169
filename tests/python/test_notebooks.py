"""Every notebook runs from top to bottom in its small mode (nothing is written back), and every
notebook is the one notebooks/make_notebooks.py writes: its cells are the generator's."""

import importlib.util
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

FOLDER = Path(__file__).parents[2] / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))


def generator():
    spec = importlib.util.spec_from_file_location("make_notebooks", FOLDER / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_notebooks():
    assert NOTEBOOKS


def test_one_generator_writes_every_notebook():
    made = generator()
    assert sorted(made.NOTEBOOKS) == sorted(path.stem for path in NOTEBOOKS)
    assert sorted(FOLDER.glob("*.py")) == [FOLDER / "make_notebooks.py"]  # no second mechanism
    for path in NOTEBOOKS:
        committed = nbformat.read(path, as_version=4)
        written = made.build(path.stem)
        assert [(c.cell_type, c.source) for c in committed.cells] == \
            [(c.cell_type, c.source) for c in written.cells], \
            f"{path.name} differs from make_notebooks.py: run python notebooks/make_notebooks.py " \
            f"{path.stem} --execute"


def test_experiment_notebooks_run_the_tutorials_own_code():
    made = generator()
    modules = {"reverse": "attnlab.tutorials.uvadl", "anomaly": "attnlab.tutorials.uvadl",
               "sparse_and": "attnlab.tutorials.neuromatch",
               "permutation": "attnlab.tutorials.permutation_lab", "text": "attnlab.tutorials.nyu"}
    for name, module in modules.items():
        code = "\n".join(c.source for c in made.build(name).cells if c.cell_type == "code")
        assert f"from {module} import" in code, name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_small_mode(path, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("ATTNLAB_NOTEBOOK_OUT", str(tmp_path / "run"))
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure was drawn"
