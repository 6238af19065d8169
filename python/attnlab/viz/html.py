"""The interactive viewer: one self-contained HTML page (script, style and data inline, no
network) with a head view and a model view of attention maps."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import uuid
import zlib
from importlib import resources
from pathlib import Path

import numpy as np
from matplotlib import colormaps

from ._colours import head_colours
from ._data import HEATMAP_THRESHOLD, MODES, AttentionData, prepare, resolve_mode

DEFAULT_MAX_VALUES = 1 << 24  # weights embedded in one page, at most (about 45 MB of HTML)


def _colour_map_hex(name: str) -> str:
    cmap = colormaps[name].resampled(256)
    return "".join("%02x%02x%02x" % tuple(round(255 * c) for c in cmap(i)[:3])
                   for i in range(256))


def _script_json(value) -> str:
    """JSON that can sit inside <script type="application/json">: no '<', '>' or '&' appear
    literally, so no token can end the element or open another."""
    return (json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            .replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def pack(values: np.ndarray, groups: int = 1, *, bits: int = 8, quantization: str = "linear",
         planes: bool = False) -> dict:
    """An array as the pages embed it: ``values`` split into ``groups`` equal runs (in C
    order), each quantized to ``bits`` (8, 16 or 32) of its own range, little-endian,
    deflate-compressed, base64. ``quantization``:

    - ``"linear"``: steps of 1/(2^bits − 1) of the run's largest value (``scales``), for
      values ≥ 0 shown on a linear scale;
    - ``"log"``: 0 stays exactly 0; positive values take 1 .. 2^bits − 1, spaced evenly in
      log between the run's smallest and largest positive value (``lows``, ``highs``): a
      relative error of at most half a step, ln(high/low)/(2·(2^bits − 2)), over any range,
      for values that span decades (received attention, pooled maps);
    - ``"int"``: integers, stored as signed integers of ``bits``, unchanged.

    ``planes=True`` (16 and 32 bits) stores the values' lowest bytes first, then the next
    bytes, and so on: neighbouring values share their high bytes, which then compress to
    almost nothing (about 15% less for summaries along a sequence). common.js reads them back
    (``integers``, ``floats``)."""
    if bits not in (8, 16, 32):
        raise ValueError(f"bits must be 8, 16 or 32, got {bits!r}")
    flat = np.asarray(values).reshape(groups, -1)
    top = (1 << bits) - 1
    packed = {"bits": bits, "quantization": quantization, "compression": "deflate"}
    if quantization == "int":
        if flat.size and (flat.min() < -(1 << (bits - 1)) or flat.max() >= 1 << (bits - 1)):
            raise ValueError(f"integers from {flat.min()} to {flat.max()} do not fit {bits} bits")
        stored = flat.astype(f"<i{bits // 8}")
    elif quantization == "linear":
        scales = flat.max(axis=1).astype(np.float32) if flat.size else np.ones(groups, np.float32)
        scales[scales <= 0] = 1.0  # an all-zero run: nothing to normalise
        stored = np.rint(flat * (top / scales[:, None]))
        packed["scales"] = [float(f"{s:.7g}") for s in scales.tolist()]
    elif quantization == "log":
        flat = flat.astype(np.float64)
        positive = np.where(flat > 0, flat, np.inf)
        lows = positive.min(axis=1)
        highs = flat.max(axis=1)
        lows[~np.isfinite(lows)] = highs[~np.isfinite(lows)] = 1.0  # a run of zeros
        # Rounded as the JSON carries them, so that Python's and the page's steps agree.
        lows = np.array([float(f"{v:.9g}") for v in lows])
        highs = np.maximum(lows, [float(f"{v:.9g}") for v in highs])
        span = np.log(highs) - np.log(lows)
        step = np.where(span > 0, span / (top - 1), 1.0)
        with np.errstate(divide="ignore"):
            level = 1 + np.rint((np.log(positive) - np.log(lows)[:, None]) / step[:, None])
        stored = np.where(flat > 0, np.clip(level, 1, top), 0)
        packed["lows"], packed["highs"] = lows.tolist(), highs.tolist()
    else:
        raise ValueError(f"quantization must be linear, log or int, got {quantization!r}")
    if quantization != "int":
        stored = stored.astype({8: "u1", 16: "<u2", 32: "<u4"}[bits])
    raw = stored.tobytes()
    if planes and bits > 8:
        raw = np.frombuffer(raw, np.uint8).reshape(-1, bits // 8).T.tobytes()
        packed["planes"] = True
    packed["data"] = base64.b64encode(zlib.compress(raw, 6)).decode("ascii")
    return packed


def encode(data: AttentionData, *, precision: int = 8) -> dict:
    """The embedded form of the weights: each [queries, keys] map quantized to ``precision``
    bits (8 or 16) of its own largest weight (``scales``, one per batch entry × layer × head,
    in that order), little-endian, deflate-compressed, base64 (:func:`pack`). ``scale`` is the
    largest weight of all."""
    if precision not in (8, 16):
        raise ValueError(f"precision must be 8 or 16 (bits per weight), got {precision!r}")
    batch, layers, heads = data.weights.shape[:3]
    return {"shape": list(data.weights.shape), "scale": float(data.weights.max()) or 1.0,
            **pack(data.weights, batch * layers * heads, bits=precision)}


class AttentionViewer:
    """An interactive view of attention maps: one self-contained HTML page.

    ``html`` is the page; ``save(path)`` writes it; in Jupyter the object displays itself
    inline (in an ``<iframe srcdoc>``, so several viewers in one notebook stay independent).
    Build it with :func:`head_view` or :func:`model_view`."""

    def __init__(self, page: str, *, height: int = 600):
        self._page = page
        self.height = height

    @property
    def html(self) -> str:
        """The whole page as a string (open it in any browser; it loads nothing else)."""
        return self._page

    def save(self, path) -> Path:
        """Writes the page to ``path`` (UTF-8) and returns the path."""
        path = Path(path)
        path.write_text(self._page, encoding="utf-8")
        return path

    def _repr_html_(self) -> str:
        # The page runs in a sandboxed iframe (scripts, but no access to the notebook); it
        # reports its height by postMessage and the small script below resizes the frame.
        # Each viewer gets its own id, and answers only its own frame's messages.
        frame = f"attnlab-viewer-{uuid.uuid4().hex}"
        return (f'<iframe id="{frame}" class="attnlab-viewer" sandbox="allow-scripts" '
                f'style="width:100%;height:{self.height}px;border:1px solid #ddd" '
                f'srcdoc="{html.escape(self._page, quote=True)}"></iframe>'
                "<script>(function(){var f=document.getElementById(" + json.dumps(frame) + ");"
                "if(!f)return;window.addEventListener('message',function(e){"
                "if(e.source===f.contentWindow&&e.data&&typeof e.data.attnlabHeight==='number')"
                "{f.style.height=Math.min(4000,Math.max(150,e.data.attnlabHeight+6))+'px';}});"
                "})();</script>")

    def __repr__(self) -> str:
        return f"AttentionViewer({len(self._page):,} characters of HTML; .save(path) writes it)"


def _page(spec: dict, title: str, scripts: tuple[str, ...] = ("common.js", "viewer.js"),
          styles: tuple[str, ...] = ("viewer.css",)) -> str:
    """The page: ``spec`` as its data block, the ``scripts`` (in order) as one inline script and
    the ``styles`` as one inline style, each admitted by its hash in the page's
    Content-Security-Policy and nothing else."""
    script = "\n".join(_asset(name) for name in scripts)
    style = "\n".join(_asset(name) for name in styles)
    policy = (f"default-src 'none'; script-src {_csp_hash(script)}; "
              f"style-src {_csp_hash(style)}; img-src data:")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{policy}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{html.escape(title)}</title>\n<link rel=\"icon\" href=\"data:,\">\n"
        f"<style>{style}</style>\n</head>\n<body>\n"
        "<div id=\"attnlab-viz\" class=\"attnlab-viz\" data-state=\"loading\">"
        "<noscript>This attention viewer needs JavaScript.</noscript></div>\n"
        f"<script type=\"application/json\" id=\"attnlab-data\">{_script_json(spec)}</script>\n"
        f"<script>{script}</script>\n</body>\n</html>\n")


def _view(start_view: str, maps, tokens, key_tokens, *, batch, layer, head, layers, heads,
          mode, threshold, max_tokens, precision, max_values, title) -> AttentionViewer:
    if threshold is None or isinstance(threshold, bool) or not isinstance(threshold, int) \
            or threshold < 1:
        raise ValueError(f"threshold must be a positive integer, got {threshold!r}")
    if max_values is not None and (isinstance(max_values, bool) or
                                   not isinstance(max_values, int) or max_values < 1):
        raise ValueError(f"max_values must be a positive integer or None, got {max_values!r}")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__}")
    if precision not in (8, 16):
        raise ValueError(f"precision must be 8 or 16 (bits per weight), got {precision!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    data = prepare(maps, tokens, key_tokens, batch=batch, layers=layers, heads=heads,
                   max_tokens=max_tokens, max_values=max_values)
    _, n_layers, n_heads, queries, keys = data.weights.shape
    drawn = resolve_mode(mode, queries, keys, threshold)

    def position(value, kept, name):
        if value == "all" and name == "head":
            return -1
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            also = ' or "all"' if name == "head" else ""
            raise TypeError(f"{name} must be an index into the maps{also}, got {value!r}")
        total = {"layer": len(maps), "head": maps[0].shape[1]}[name]
        if not -total <= value < total:
            raise ValueError(f"{name} {value} is out of range: the maps have {total}")
        value = int(value) % total
        if value not in kept:
            raise ValueError(f"{name} {value} is not among the {name}s kept ({kept})")
        return kept.index(value)

    layer_pos = position(data.layers[0] if layer is None else layer, data.layers, "layer")
    head_pos = position(data.heads[0] if head is None else head, data.heads, "head")
    spec = {
        "version": 1,
        "title": title or "",
        "batch": data.batch, "layers": data.layers, "heads": data.heads,
        "query_tokens": data.query_tokens, "key_tokens": data.key_tokens,
        "cross": data.cross,
        "head_colours": [head_colours(maps[0].shape[1])[h] for h in data.heads],
        "colour_map": _colour_map_hex("viridis"),
        "threshold": threshold,
        "start": {"view": start_view, "batch": 0, "layer": layer_pos, "head": head_pos,
                  "mode": drawn},
        **encode(data, precision=precision),
    }
    rows = max(queries, keys)
    height = (min(900, 140 + 20 * rows) if start_view == "head" and drawn == "lines"
              else 820 if start_view == "head" else min(900, 160 + n_layers * 100))
    return AttentionViewer(_page(spec, title or "attnlab attention viewer"), height=height)


_VIEW_DOC = """
    ``maps`` is what a Hugging Face model returns with ``output_attentions=True``: a tuple (or
    list) with one tensor (or numpy array) of shape ``[batch, heads, queries, keys]`` per
    layer. ``tokens`` names the query positions: a list of strings (for every batch entry),
    or a list of such lists, one per batch entry; ``key_tokens`` names the keys in the same
    way when they differ from the queries (cross-attention; queries ≠ keys is allowed).

    Layers, heads and batch entries are numbered from 0 as in ``maps[layer][batch, head]``.
    ``batch``, ``layers`` and ``heads`` (an index or a list; default all) choose what the page
    holds; the page has selectors for the batch entry, layer and head (or all heads at once),
    and starts at ``layer`` and ``head`` (``"all"`` overlays every head).

    ``mode`` is ``"lines"`` (token-to-token lines, their opacity the weight), ``"heatmap"``
    (a queries × keys image) or ``"auto"``: the heat map when either side has more than
    ``threshold`` tokens (256). The page can switch between them. ``max_tokens`` pools long
    inputs to at most that many positions (neighbouring queries averaged, neighbouring keys
    summed, so each row still sums to 1; labels ``first…last``).

    Each head's map is stored in ``precision`` bits (8: steps of 1/255 of its largest weight,
    as fine as a screen shows colour and opacity; 16 for readouts exact to 4 digits, about
    twice the size), compressed; a page holds at most ``max_values`` weights (2**24 by
    default; a clear error names the options otherwise). The page loads nothing from the
    network. Raises TypeError or ValueError naming the argument when the input is not as
    described (not a tuple of 4-D tensors, shapes that differ between layers, token counts
    that do not match, NaN, inf or negative weights, empty maps, indices out of range).

    Returns an :class:`AttentionViewer`: ``.html``, ``.save(path)``, and inline display in
    Jupyter."""


def head_view(maps, tokens, key_tokens=None, *, batch=None, layer=None, head=None, layers=None,
              heads=None, mode: str = "auto", threshold: int = HEATMAP_THRESHOLD,
              max_tokens: int | None = None, precision: int = 8,
              max_values: int | None = DEFAULT_MAX_VALUES,
              title: str | None = None) -> AttentionViewer:
    """Opens on the head view: the attention of one layer and head (or all heads overlaid)
    as lines from each query token (left) to each key token (right), or as a heat map.
    Hovering over a token shows its links alone and lists its largest weights; a click pins
    it. The model view (layers × heads thumbnails) is one click away.
    """
    return _view("head", maps, tokens, key_tokens, batch=batch, layer=layer, head=head,
                 layers=layers, heads=heads, mode=mode, threshold=threshold,
                 max_tokens=max_tokens, precision=precision, max_values=max_values, title=title)


def model_view(maps, tokens, key_tokens=None, *, batch=None, layer=None, head=None,
               layers=None, heads=None, mode: str = "auto", threshold: int = HEATMAP_THRESHOLD,
               max_tokens: int | None = None, precision: int = 8,
               max_values: int | None = DEFAULT_MAX_VALUES,
               title: str | None = None) -> AttentionViewer:
    """Opens on the model view: a grid with a row per layer and a column per head, each cell
    a thumbnail of that head's map (queries down, keys across, scaled to its own maximum).
    Clicking a thumbnail opens it in the head view (drawn as ``mode`` says).
    """
    return _view("model", maps, tokens, key_tokens, batch=batch, layer=layer, head=head,
                 layers=layers, heads=heads, mode=mode, threshold=threshold,
                 max_tokens=max_tokens, precision=precision, max_values=max_values, title=title)


head_view.__doc__ += _VIEW_DOC
model_view.__doc__ += _VIEW_DOC
