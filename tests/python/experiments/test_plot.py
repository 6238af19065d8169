"""Plot functions return figures laid out as promised, and refuse empty input."""

import pytest
import torch

from attnlab import plot


def test_attention_grid_has_layers_by_heads_panels_with_token_ticks():
    maps = [torch.rand(2, 3, 5, 5).softmax(-1) for _ in range(2)]
    fig = plot.attention_grid(maps, tokens=list("abcde"), index=1, title="t")
    images = [ax for ax in fig.axes if ax.images]
    assert len(images) == 6  # 2 layers × 3 heads (colour bars are extra axes)
    assert [t.get_text() for t in images[0].get_xticklabels()] == list("abcde")
    assert images[0].images[0].origin == "lower"
    with pytest.raises(ValueError, match="at least one layer"):
        plot.attention_grid([])


def test_image_sets_frames_the_anomaly_and_the_wrong_pick():
    images = torch.randint(0, 255, (2, 10, 28, 28), dtype=torch.uint8)
    probabilities = torch.full((2, 10), 0.05)
    probabilities[0, 9], probabilities[1, 3] = 0.55, 0.55
    fig = plot.image_sets(images, probabilities, [["x"] * 10, ["y"] * 10])
    axes = [ax for ax in fig.axes if ax.images]
    assert len(axes) == 20
    visible = [any(s.get_visible() for s in ax.spines.values()) for ax in axes]
    assert visible[9] and visible[19] and visible[13] and sum(visible) == 3
    with pytest.raises(ValueError, match="at least one set"):
        plot.image_sets(images[:0], probabilities[:0], [])


def test_training_curves():
    fig = plot.training_curves([{"epoch": 1, "train_loss": 1.0, "accuracy": 0.5},
                                {"epoch": 2, "train_loss": 0.5, "accuracy": 0.9}])
    assert len(fig.axes) == 2
    assert len(fig.axes[1].lines) == 1  # validation only
    with_train = plot.training_curves([{"epoch": 1, "train_loss": 1.0, "accuracy": 0.5,
                                        "train_accuracy": 0.4},
                                       {"epoch": 2, "train_loss": 0.5, "accuracy": 0.9,
                                        "train_accuracy": 0.8}])
    train_line = with_train.axes[1].lines[1]
    assert list(train_line.get_ydata()) == [0.4, 0.8]
