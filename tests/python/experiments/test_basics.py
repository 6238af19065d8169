"""The figures of the basics notebook (the tutorials' small demonstrations)."""

import pytest
import torch

from attnlab import plot
from attnlab.nn import sinusoidal_table


def test_positional_encoding_figure_shows_the_table_and_the_chosen_dimensions():
    table = sinusoidal_table(96, 48)
    fig = plot.positional_encoding(table, dims=(1, 2, 3, 4))
    heat_map, curves = fig.axes[0], fig.axes[1]
    assert heat_map.images[0].get_array().shape == (48, 96)  # dimensions × positions
    assert len(curves.lines) == 4
    assert curves.lines[1].get_ydata().tolist() == table[:, 1].tolist()
    with pytest.raises(ValueError, match=r"table \[positions, d\], got \[96\]"):
        plot.positional_encoding(table[:, 0])


def test_lr_factor_figure_marks_the_end_of_the_warm_up():
    fig = plot.lr_factors([i / 10 for i in range(10)] + [1.0] * 5, warmup=10)
    ax = fig.axes[0]
    assert len(ax.lines) == 2 and ax.lines[1].get_xdata()[0] == 10


def test_weight_bars_has_one_panel_per_kind():
    weights = {"a": torch.tensor([0.5, 0.5]), "b": torch.tensor([1.0, 0.0]),
               "c": torch.tensor([0.2, 0.8])}
    fig = plot.weight_bars(weights, keys=["k0", "k1"])
    assert [ax.get_title() for ax in fig.axes] == ["a", "b", "c"]
    assert [p.get_height() for p in fig.axes[1].patches] == [1.0, 0.0]
