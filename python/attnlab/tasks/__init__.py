"""Experiments: each module builds a train.Task from its config dataclass."""

from . import reverse

TASKS = {"reverse": reverse}

__all__ = ["TASKS", "reverse"]
