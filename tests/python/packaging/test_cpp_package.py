"""The C++ API from the pip install: headers and a CMake package inside the installed Python
package, used by an out-of-tree CMake project (examples/cpp-consumer) exactly as a LibTorch user
would, and the torch version checks at configure time and at load time."""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import attnlab

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "cpp-consumer"
PACKAGE = Path(attnlab.__file__).resolve().parent
PUBLIC_HEADERS = sorted(p.name for p in (REPO / "cpp" / "include" / "attnlab").glob("*.h"))

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


def prefix_path(*extra: str) -> str:
    return ";".join([torch.utils.cmake_prefix_path, attnlab.cmake_prefix_path(), *extra])


def cmake(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    generator = ["-G", "Ninja"] if shutil.which("ninja") and "-S" in args else []
    return subprocess.run(["cmake", *generator, *args], capture_output=True, text=True, cwd=cwd)


def configure_and_build(source: Path, build: Path, prefix: str) -> None:
    configured = cmake("-S", str(source), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}")
    assert configured.returncode == 0, configured.stdout + configured.stderr
    built = cmake("--build", str(build), "-j", "2")
    assert built.returncode == 0, built.stdout + built.stderr


def parse(stdout: str) -> dict[str, torch.Tensor]:
    """The example's "name: v0 v1 ..." lines as float64 tensors."""
    tensors = {}
    for line in stdout.splitlines():
        name, _, values = line.partition(":")
        if re.fullmatch(r"[a-z_]+", name) and values.strip():
            tensors[name] = torch.tensor([float(v) for v in values.split()], dtype=torch.float64)
    return tensors


def wave(shape, step, cosine=False):
    """The example's inputs, rebuilt in Python: sin or cos of a scaled arange."""
    x = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).mul(step)
    return (x.cos() if cosine else x.sin()).view(shape)


def test_install_ships_public_headers_and_cmake_package():
    assert PUBLIC_HEADERS, "no public headers in cpp/include/attnlab"
    installed = sorted(p.name for p in (PACKAGE / "include" / "attnlab").glob("*"))
    assert installed == PUBLIC_HEADERS  # the public API only: no kernels, no internals
    config = Path(attnlab.cmake_prefix_path()) / "attnlab" / "attnlabConfig.cmake"
    assert config.is_file() and (config.parent / "attnlabConfigVersion.cmake").is_file()
    assert (PACKAGE / "libattnlab.so").is_file()
    printed = subprocess.run([sys.executable, "-m", "attnlab", "--cmake-prefix-path"],
                             capture_output=True, text=True)
    assert printed.returncode == 0 and printed.stdout.strip() == attnlab.cmake_prefix_path()


def test_version_flag_names_attnlab_and_torch():
    printed = subprocess.run([sys.executable, "-m", "attnlab", "--version"], capture_output=True,
                             text=True)
    assert printed.returncode == 0
    assert printed.stdout.startswith(f"attnlab {attnlab.__version__} ")
    assert attnlab.build_info()["torch"] in printed.stdout


@pytest.fixture(scope="module")
def consumer(tmp_path_factory):
    """examples/cpp-consumer configured against the installed packages and built."""
    build = tmp_path_factory.mktemp("consumer-build")
    configure_and_build(EXAMPLE, build, prefix_path())
    return build / "consumer"


@pytest.mark.long  # its fixture configures and builds the CMake example: over 20 s
def test_out_of_tree_example_matches_python(consumer, tmp_path):
    module = attnlab.nn.MultiheadAttention(8, 8, 2).eval()
    attnlab.nn.save_for_cpp(module, tmp_path / "state_dict.pt")
    ran = subprocess.run([str(consumer), str(tmp_path / "state_dict.pt")], capture_output=True,
                         text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"built against torch {attnlab.build_info()['torch']}" in ran.stdout
    printed = parse(ran.stdout)

    query, key, value = wave((2, 3, 5, 4), 0.37), wave((2, 3, 6, 4), 0.23, True), \
        wave((2, 3, 6, 2), 0.11)
    mask = torch.ones(5, 6, dtype=torch.bool).tril(1)
    output, weights = attnlab.scaled_dot_product_attention(query, key, value, attn_mask=mask,
                                                           need_weights=True)
    with torch.no_grad():
        y, maps = module(wave((1, 4, 8), 0.05), return_attention=True)
    # Against Python's attnlab (same kernels: equal to the printed 9 digits) ...
    for name, expected in [("output", output), ("weights", weights), ("module_output", y),
                           ("module_attention", maps)]:
        assert name in printed, ran.stdout
        torch.testing.assert_close(printed[name], expected.double().flatten(), rtol=1e-6,
                                   atol=1e-7)
    # ... and against the float64 reference of the equations, independent of attnlab.
    q, k, v = query.double(), key.double(), value.double()
    scores = (q @ k.transpose(-2, -1) / 2.0).masked_fill(~mask, float("-inf"))
    reference = torch.softmax(scores, -1)
    torch.testing.assert_close(printed["weights"], reference.flatten(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(printed["output"], (reference @ v).flatten(), rtol=1e-5,
                               atol=1e-7)


def test_library_names_another_loaded_torch(consumer, tmp_path):
    """The example run next to a torch folder that says it is another release (the real
    libraries, linked into a tree whose version.py names 9.9.9): libattnlab names both versions
    when it is loaded, and its operators refuse to run."""
    real = Path(torch.__file__).resolve().parent
    fake = tmp_path / "site" / "torch"
    (fake / "lib").mkdir(parents=True)
    for library in (real / "lib").glob("*.so*"):
        (fake / "lib" / library.name).symlink_to(library)
    if (real.parent / "nvidia").is_dir():  # libtorch_cuda finds CUDA's libraries from here
        (fake.parent / "nvidia").symlink_to(real.parent / "nvidia")
    (fake / "version.py").write_text("__version__ = '9.9.9+cpu'\n")
    ran = subprocess.run([str(consumer)], capture_output=True, text=True,
                         env={**os.environ, "LD_LIBRARY_PATH": str(fake / "lib")})
    assert ran.returncode == 1
    built = attnlab.build_info()["torch"]
    expected = f"was built against torch {built} but this process loaded torch 9.9.9+cpu"
    lines = ran.stderr.strip().splitlines()
    assert expected in lines[0]  # printed at load
    assert lines[-1].startswith("consumer: attnlab.scaled_dot_product_attention: attnlab ")
    assert expected in lines[-1]  # and the operator refuses


@pytest.mark.long  # one compiler run per public header: about 20 s on 2 cores
def test_public_headers_compile_on_their_own(tmp_path):
    """Each installed header first in its own translation unit, against the installed
    package only."""
    sources = []
    for header in PUBLIC_HEADERS:
        source = tmp_path / f"only_{header.replace('.', '_')}.cpp"
        source.write_text(f"#include <attnlab/{header}>\n#include <attnlab/{header}>\n")
        sources.append(source.name)
    (tmp_path / "CMakeLists.txt").write_text(textwrap.dedent(f"""
        cmake_minimum_required(VERSION 3.18)
        project(headers CXX)
        find_package(Torch REQUIRED)
        find_package(attnlab REQUIRED)
        add_library(headers OBJECT {' '.join(sources)})
        target_link_libraries(headers PRIVATE attnlab::attnlab)
        """))
    configure_and_build(tmp_path, tmp_path / "build", prefix_path())
    objects = list((tmp_path / "build" / "CMakeFiles" / "headers.dir").glob("*.o"))
    assert len(objects) == len(PUBLIC_HEADERS)


def only_attnlab_project(folder: Path, before: str = "") -> Path:
    (folder / "CMakeLists.txt").write_text(textwrap.dedent(f"""
        cmake_minimum_required(VERSION 3.18)
        project(bad_use CXX)
        {before}
        find_package(attnlab REQUIRED)
        """))
    return folder


def test_missing_torch_is_named_at_configure_time(tmp_path):
    project = only_attnlab_project(tmp_path)
    configured = cmake("-S", str(project), "-B", str(project / "build"),
                       f"-DCMAKE_PREFIX_PATH={attnlab.cmake_prefix_path()}",
                       "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF")
    assert configured.returncode != 0
    message = " ".join((configured.stdout + configured.stderr).split())
    assert "attnlab needs LibTorch" in message
    assert "torch.utils.cmake_prefix_path" in message


def test_another_torch_version_is_named_at_configure_time(tmp_path):
    """A fake Torch package of another release stands in for a mismatched LibTorch."""
    fake = tmp_path / "fake-torch" / "Torch"
    fake.mkdir(parents=True)
    (fake / "TorchConfig.cmake").write_text(
        "add_library(torch INTERFACE IMPORTED)\nset(TORCH_FOUND TRUE)\n")
    (fake / "TorchConfigVersion.cmake").write_text(
        'set(PACKAGE_VERSION "1.2.3")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n')
    project = only_attnlab_project(tmp_path, "find_package(Torch REQUIRED)")
    configured = cmake("-S", str(project), "-B", str(project / "build"),
                       f"-DCMAKE_PREFIX_PATH={fake.parent};{attnlab.cmake_prefix_path()}")
    assert configured.returncode != 0
    message = " ".join((configured.stdout + configured.stderr).split())
    assert f"built against torch {attnlab.build_info()['torch']}" in message
    assert "found torch 1.2.3" in message


def import_attnlab_with(prelude: str) -> subprocess.CompletedProcess:
    code = f"import torch\n{prelude}\nimport attnlab\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def last_line(completed: subprocess.CompletedProcess) -> str:
    return completed.stderr.strip().splitlines()[-1]


def test_python_refuses_another_torch_in_one_line():
    ran = import_attnlab_with("torch.__version__ = '2.99.1+cpu'")
    assert ran.returncode != 0
    line = last_line(ran)
    built = attnlab.build_info()["torch"]
    assert line.startswith("ImportError: attnlab was built against torch " + built)
    assert "torch 2.99.1+cpu is installed" in line and "--no-build-isolation" in line
    assert "undefined symbol" not in ran.stderr


def test_python_refuses_another_cxx_abi():
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    ran = import_attnlab_with(f"torch._C._GLIBCXX_USE_CXX11_ABI = {not abi}")
    assert ran.returncode != 0
    assert f"_GLIBCXX_USE_CXX11_ABI={abi}" in last_line(ran)


def test_loader_error_becomes_one_line():
    """A core that fails to load anyway (e.g. an undefined symbol) is named with the torch it
    needs, not shown as the loader's message alone."""
    prelude = textwrap.dedent("""
        import sys
        class Broken:
            def find_spec(self, name, path=None, target=None):
                if name == "attnlab._C":
                    raise ImportError("libattnlab.so: undefined symbol: _ZN3c104impl3fooEv")
        sys.meta_path.insert(0, Broken())
        """)
    ran = import_attnlab_with(prelude)
    assert ran.returncode != 0
    line = last_line(ran)
    assert line.startswith("ImportError: attnlab's compiled core does not load under torch")
    assert f"built against torch {attnlab.build_info()['torch']}" in line
    assert "During handling of the above exception" not in ran.stderr  # one error, not two


def test_problem_names_each_kind_of_mismatch():
    from attnlab._compat import problem
    assert problem("2.15.0+cu132", 1, True, "2.15.0+cu130", 1, True) is None
    assert problem("2.15.0+cpu", 1, False, "2.15.0+cu132", 1, True) is None
    assert "torch 2.16.0 is installed" in problem("2.15.0", 1, False, "2.16.0", 1, False)
    assert "_GLIBCXX_USE_CXX11_ABI=0" in problem("2.15.0", 0, False, "2.15.0", 1, False)
    assert "has no CUDA" in problem("2.15.0+cu132", 1, True, "2.15.0+cpu", 1, False)
