"""Sets for the set-anomaly experiment (the UvA tutorial): nine images of one class and, stored last,
one image of another class. The model sees no positions, so storing the anomaly last gives
nothing away."""

from __future__ import annotations

import torch

SET_SIZE = 10


def validation_split(labels: torch.Tensor, fraction: float = 0.1):
    """(train indices, validation indices): the first ``fraction`` of each class, in file
    order, is held out."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    train, val = [], []
    for c in labels.unique():
        members = (labels == c).nonzero().flatten()
        held = int(round(fraction * len(members)))
        val.append(members[:held])
        train.append(members[held:])
    return torch.cat(train).sort().values, torch.cat(val).sort().values


def sample_sets(labels: torch.Tensor, anomalies: torch.Tensor, generator: torch.Generator,
                set_size: int = SET_SIZE) -> torch.Tensor:
    """[len(anomalies), set_size] indices into ``labels``: for each anomaly index, set_size − 1
    distinct images of a class drawn uniformly from the other classes, then the anomaly."""
    classes = labels.unique()
    if len(classes) < 2:
        raise ValueError("sets need at least two classes")
    members = [(labels == c).nonzero().flatten() for c in classes]
    if min(len(m) for m in members) < set_size - 1:
        raise ValueError(f"every class needs at least {set_size - 1} images to fill a set")
    class_of = torch.searchsorted(classes, labels[anomalies])
    # A class other than the anomaly's, uniformly: shift by 1 .. C-1.
    shift = torch.randint(1, len(classes), (len(anomalies),), generator=generator)
    set_class = (class_of + shift) % len(classes)
    sets = torch.empty(len(anomalies), set_size, dtype=torch.long)
    sets[:, -1] = anomalies
    for c, pool in enumerate(members):
        rows = (set_class == c).nonzero().flatten()
        if len(rows) == 0:
            continue
        picks = torch.randint(len(pool), (len(rows), set_size - 1), generator=generator)
        while True:  # redraw the rows that picked an image twice (rare: 9 of thousands)
            ordered = picks.sort(dim=1).values
            repeated = (ordered[:, 1:] == ordered[:, :-1]).any(dim=1)
            if not repeated.any():
                break
            picks[repeated] = torch.randint(len(pool), (int(repeated.sum()), set_size - 1),
                                            generator=generator)
        sets[rows, :-1] = pool[picks]
    return sets
