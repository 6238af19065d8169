import os
import random
import sys
import zlib

# Make `reference` importable from every test module.
sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_configure(config):
    """Under pytest-xdist (``-n auto``, as the README runs the suite), one torch thread per
    worker and per process a test starts (notebook kernels, torchrun, the AVX2 rerun): the
    workers fill the cores, and torch's threads would otherwise wait on each other across cores
    the other workers keep busy."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.fixture
def one_thread():
    """A model this small trains several times faster on one thread than on two busy ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seeded(request):
    """Each test draws the same random inputs however the suite is split or ordered (pytest-xdist
    hands tests to workers in no fixed order): torch's and Python's generators are seeded from
    the test's file and name."""
    name = f"{os.path.basename(str(request.node.path))}::{request.node.name}"
    seed = zlib.crc32(name.encode())
    torch.manual_seed(seed)
    random.seed(seed)
    yield
