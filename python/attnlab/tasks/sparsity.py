"""The normalizer choice the experiments share, and the fraction of exact zeros in their
attention maps."""

from __future__ import annotations

from collections.abc import Iterable

import torch

# The normalizers the experiments offer (``--normalizer``); the operator also takes "entmax"
# with an alpha, which the experiments leave to the library.
EXPERIMENT_NORMALIZERS = ("softmax", "sparsemax", "entmax15")


def check_experiment_normalizer(normalizer: str) -> None:
    """Raises ValueError naming ``normalizer`` unless it is one of
    :data:`EXPERIMENT_NORMALIZERS`."""
    if normalizer not in EXPERIMENT_NORMALIZERS:
        raise ValueError(f"normalizer must be one of {', '.join(EXPERIMENT_NORMALIZERS)}, got "
                         f"{normalizer!r}")


def normalizer_suffix(normalizer: str) -> str:
    """"" for softmax (the names runs always had), "-sparsemax" or "-entmax15" otherwise: the
    tail of the run's default folder name."""
    return "" if normalizer == "softmax" else f"-{normalizer}"


def checkpoint_task_name(experiment: str, normalizer: str) -> str:
    """``experiment`` for softmax, else e.g. "reverse (sparsemax)": the name a checkpoint is
    written under, so that a run never resumes one trained with another normalizer."""
    return experiment if normalizer == "softmax" else f"{experiment} ({normalizer})"


def attention_zero_counts(maps: Iterable[torch.Tensor],
                          allowed: torch.Tensor | None = None) -> tuple[int, int]:
    """(exactly-zero weights, weights counted) over attention maps ``[..., Q, K]`` (one per
    layer; every head, example and query row counted). ``allowed`` (boolean, broadcastable to
    each map, True = the query may attend to the key) restricts the count to positions a mask
    leaves open: masked positions are zero under every normalizer and are not counted. The
    fraction of exact zeros is the first number divided by the second."""
    zeros = total = 0
    for weights in maps:
        exact_zero = weights == 0
        if allowed is None:
            zeros += int(exact_zero.sum())
            total += exact_zero.numel()
        else:
            open_ = allowed.to(weights.device).expand_as(weights)
            zeros += int((exact_zero & open_).sum())
            total += int(open_.sum())
    return zeros, total
