"""Packaging: the source tree makes an sdist with everything a build needs and a wheel that
installs into a fresh virtual environment (which sees the installed torch) and runs."""

import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not (REPO / "pyproject.toml").is_file(),
                                reason="needs attnlab's source tree")


def run(*args, **kwargs) -> subprocess.CompletedProcess:
    completed = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed


def test_sdist_holds_what_a_build_needs(tmp_path):
    run(sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", tmp_path, REPO)
    (sdist,) = tmp_path.glob("attnlab-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    tracked = run("git", "ls-files", cwd=REPO).stdout.split() \
        if (REPO / ".git").exists() else []
    needed = {"pyproject.toml", "CMakeLists.txt", "README.md", "cmake/TorchFromPython.cmake",
              "cmake/attnlabConfig.cmake.in", "cmake/_build.py.in",
              "python/attnlab/__init__.py"}
    needed |= {name for name in tracked if name.startswith(("cpp/", "python/", "cmake/"))}
    assert needed <= names, sorted(needed - names)
    assert not any(name.startswith(("build/", "build-sanitize/")) or name.endswith(".so")
                   for name in names)


# About 15 s when build/ is up to date with the sources; minutes when it has to recompile.
@pytest.mark.long
def test_wheel_installs_into_a_fresh_environment_and_runs(tmp_path):
    # The wheel reuses the build folder of the install (incremental), as `pip install` does.
    run(sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
        "-w", tmp_path / "dist", REPO)
    (wheel,) = (tmp_path / "dist").glob("attnlab-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(next(n for n in names if n.endswith("dist-info/METADATA")))
    for name in ("attnlab/libattnlab.so", "attnlab/_build.py", "attnlab/include/attnlab/attention.h",
                 "attnlab/share/cmake/attnlab/attnlabConfig.cmake", "attnlab/nn/__init__.py"):
        assert name in names
    # The viewers' pages are built from these files, read as package data at run time.
    for asset in ("common.js", "viewer.js", "viewer.css", "summary.js", "summary.css"):
        assert f"attnlab/viz/{asset}" in names, asset
    assert any(re.fullmatch(r"attnlab/_C\..*\.so", name) for name in names)
    metadata = metadata.decode()
    for extra in ("hf", "lightning", "cifar", "docs", "test"):
        assert f"Provides-Extra: {extra}" in metadata
    assert "Requires-Dist: torch" in metadata and "Classifier: " in metadata

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--system-site-packages", venv)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", wheel)
    check = (
        "import attnlab, torch\n"
        "print(attnlab.__file__)\n"
        "q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64) for _ in range(3))\n"
        "out, w = attnlab.scaled_dot_product_attention(q, k, v, need_weights=True)\n"
        "ref = torch.softmax(q @ k.transpose(-2, -1) / 8 ** 0.5, -1)\n"
        "print(float((w - ref).abs().max()), float((out - ref @ v).abs().max()))\n")
    printed = run(python, "-c", check, cwd=tmp_path).stdout.split()
    assert printed[0].startswith(str(venv))  # the wheel's attnlab, not the one installed here
    assert float(printed[1]) < 1e-12 and float(printed[2]) < 1e-12
    version = run(venv / "bin" / "attnlab", "--version").stdout
    assert version.startswith("attnlab ") and torch.__version__ in version
