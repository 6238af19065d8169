"""Experiments: each module builds a train.Task from its config dataclass."""

from . import anomaly, permutation, reverse, text

TASKS = {"reverse": reverse, "anomaly": anomaly, "permutation": permutation, "text": text}

__all__ = ["TASKS", "anomaly", "permutation", "reverse", "text"]
