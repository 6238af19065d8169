"""Runs the command line in a child process, as a user would."""

import os
import subprocess
import sys


def run_cli(*args, one_thread=False):
    """``python -m attnlab ARGS``; ``one_thread`` sets OMP_NUM_THREADS=1, several times faster
    for the smallest models on a busy 2-core machine."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if one_thread else None
    return subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True,
                          text=True, env=env)
