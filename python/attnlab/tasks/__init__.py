"""Experiments: each module builds a train.Task from its config dataclass."""

from . import anomaly, reverse

TASKS = {"reverse": reverse, "anomaly": anomaly}

__all__ = ["TASKS", "anomaly", "reverse"]
