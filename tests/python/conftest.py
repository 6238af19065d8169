import os
import sys

# Make `reference` importable from every test module.
sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def one_thread():
    """A model this small trains several times faster on one thread than on two busy ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
