"""Sets of the set-anomaly experiment."""

import pytest
import torch

from attnlab.tasks.anomaly_sets import sample_sets, validation_split


def labels_of(n_per_class=50, classes=10):
    gen = torch.Generator().manual_seed(0)
    return torch.arange(classes).repeat_interleave(n_per_class)[torch.randperm(n_per_class * classes, generator=gen)]


def test_validation_split_holds_out_the_first_tenth_of_each_class():
    labels = labels_of()
    train, val = validation_split(labels)
    assert len(val) == 50 and len(train) == 450 and not set(train.tolist()) & set(val.tolist())
    for c in range(10):
        members = (labels == c).nonzero().flatten()
        assert set(val[labels[val] == c].tolist()) == set(members[:5].tolist())


def test_sets_have_nine_of_one_class_and_the_anomaly_last():
    labels = labels_of()
    anomalies = torch.arange(len(labels))
    sets = sample_sets(labels, anomalies, torch.Generator().manual_seed(1))
    assert sets.shape == (500, 10) and torch.equal(sets[:, -1], anomalies)
    set_labels = labels[sets]
    assert (set_labels[:, :-1] == set_labels[:, :1]).all()          # nine of one class
    assert (set_labels[:, -1] != set_labels[:, 0]).all()            # the anomaly differs
    assert all(len(set(row.tolist())) == 10 for row in sets)        # no image twice
    # The other class is uniform over the nine candidates (loosely: every one occurs).
    pairs = {(int(a), int(b)) for a, b in zip(set_labels[:, -1], set_labels[:, 0])}
    assert len(pairs) == 90


def test_sets_are_repeatable_by_seed_and_resampled_otherwise():
    labels = labels_of()
    anomalies = torch.arange(100)
    a = sample_sets(labels, anomalies, torch.Generator().manual_seed(7))
    b = sample_sets(labels, anomalies, torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(7)
    c, d = sample_sets(labels, anomalies, gen), sample_sets(labels, anomalies, gen)
    assert torch.equal(a, b) and torch.equal(a, c) and not torch.equal(c, d)


def test_bad_inputs():
    with pytest.raises(ValueError, match="at least two classes"):
        sample_sets(torch.zeros(20, dtype=torch.long), torch.arange(3), torch.Generator())
    with pytest.raises(ValueError, match="at least 9 images"):
        sample_sets(torch.tensor([0] * 5 + [1] * 20), torch.arange(3), torch.Generator())
    with pytest.raises(ValueError, match="fraction must be in"):
        validation_split(torch.zeros(5, dtype=torch.long), fraction=1.0)
