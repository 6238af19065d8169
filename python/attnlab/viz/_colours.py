"""Colours shared by the HTML viewer and the static figures."""

from __future__ import annotations

from matplotlib import colormaps


def head_colours(count: int) -> list[str]:
    """One colour per head, as ``#rrggbb``: matplotlib's tab10 up to 10 heads, tab20 up to 20,
    then evenly spaced hues."""
    if count <= 10:
        colours = [colormaps["tab10"](i) for i in range(count)]
    elif count <= 20:
        colours = [colormaps["tab20"](i) for i in range(count)]
    else:
        colours = [colormaps["hsv"](i / count) for i in range(count)]
    return ["#%02x%02x%02x" % tuple(round(255 * c) for c in colour[:3]) for colour in colours]
