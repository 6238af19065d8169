"""attnlab.viz on the Python side: the page it writes (self-contained, the weights and tokens
it embeds, escaping), its input checks, the static figures, attention_maps.pt and
`python -m attnlab view`. What the page does in a browser: test_viz_browser.py."""

import base64
import hashlib
import html
import io
import json
import re
import zlib
from importlib import resources

import matplotlib
import numpy as np
import pytest
import torch
from PIL import Image, ImageStat

from attnlab import cli, viz
from attnlab.viz import static
from cli_runner import run_cli


def softmax_maps(layers=2, batch=2, heads=3, queries=6, keys=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    keys = queries if keys is None else keys
    return tuple(torch.randn(batch, heads, queries, keys, generator=generator).mul(3).softmax(-1)
                 for _ in range(layers))


def tokens_for(n, prefix="t"):
    return [f"{prefix}{i}" for i in range(n)]


def embedded_spec(page: str) -> dict:
    """The JSON the page carries, read back the way a browser would (no code under test)."""
    match = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', page,
                      re.S)
    assert match, "the page has no data element"
    return json.loads(match.group(1))


def decoded_weights(spec: dict) -> np.ndarray:
    raw = zlib.decompress(base64.b64decode(spec["data"]))
    dtype = "<u2" if spec["bits"] == 16 else "u1"
    quantized = np.frombuffer(raw, dtype=dtype).astype(np.float64)
    b, l, h, q, k = spec["shape"]
    top = 2 ** spec["bits"] - 1
    scales = np.asarray(spec["scales"], dtype=np.float64)
    return (quantized.reshape(b * l * h, q * k) * (scales[:, None] / top)).reshape(b, l, h, q, k)


def reference_stack(maps):
    """[batch, layers, heads, queries, keys] in float64, straight from the input."""
    return torch.stack([m.double() for m in maps], 1).numpy()


# ---- the page ---------------------------------------------------------------------------

def test_page_is_self_contained_and_its_policy_admits_only_its_own_script_and_style():
    page = viz.head_view(softmax_maps(), tokens_for(6)).html
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<script") == 2  # the data block and the inline viewer
    assert not re.search(r"<script[^>]*\bsrc=", page)
    assert not re.search(r"<link[^>]*stylesheet", page)
    assert not re.search(r"https?://", page), "a URL in the page"
    assert re.findall(r'\b(?:src|href)="([^"]*)"', page) == ["data:,"]  # the empty favicon
    assert "@import" not in page and "url(" not in page
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    script = re.search(r"<script>(.*)</script>", page, re.S).group(1)
    style = re.search(r"<style>(.*)</style>", page, re.S).group(1)

    def digest(text):
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"

    assert "default-src 'none'" in policy
    assert f"script-src {digest(script)};" in policy
    assert f"style-src {digest(style)};" in policy
    assets = resources.files("attnlab.viz")
    # The helpers both viewers share, then the viewer itself, as one script.
    assert script == (assets.joinpath("common.js").read_text() + "\n" +
                      assets.joinpath("viewer.js").read_text())
    assert style == resources.files("attnlab.viz").joinpath("viewer.css").read_text()


@pytest.mark.parametrize("precision", [8, 16])
def test_embedded_weights_match_the_input_to_the_stored_precision(precision):
    maps = softmax_maps(layers=3, batch=2, heads=4, queries=7, keys=5, seed=1)
    page = viz.head_view(maps, tokens_for(7), tokens_for(5, "k"), precision=precision).html
    spec = embedded_spec(page)
    expected = reference_stack(maps)
    assert spec["shape"] == [2, 3, 4, 7, 5]
    got = decoded_weights(spec)
    # Each map is quantized to 1/(2^bits − 1) of its own largest weight: half a step at most.
    per_map_max = expected.max(axis=(3, 4), keepdims=True)
    assert np.all(np.abs(got - expected) <= per_map_max * 0.5 / (2 ** precision - 1) + 1e-7)
    assert spec["scale"] == pytest.approx(expected.max(), rel=1e-6)


def test_selected_batch_layers_and_heads_keep_their_original_numbers():
    maps = softmax_maps(layers=4, batch=3, heads=5, queries=4)
    spec = embedded_spec(viz.model_view(maps, tokens_for(4), batch=2, layers=[3, 1],
                                        heads=[4, 0], layer=1, head=0).html)
    assert (spec["batch"], spec["layers"], spec["heads"]) == ([2], [3, 1], [4, 0])
    expected = reference_stack(maps)[[2]][:, [3, 1]][:, :, [4, 0]]
    np.testing.assert_allclose(decoded_weights(spec), expected, atol=0.5 / 255)
    assert spec["start"] == {"view": "model", "batch": 0, "layer": 1, "head": 1,
                             "mode": "lines"}
    all_heads = embedded_spec(viz.head_view(maps, tokens_for(4), head="all").html)
    assert all_heads["start"]["head"] == -1 and all_heads["start"]["view"] == "head"
    with pytest.raises(ValueError, match="layer 2 is not among the layers kept"):
        viz.head_view(maps, tokens_for(4), layers=[0, 1], layer=2)


def test_each_head_keeps_its_colour_when_only_some_heads_are_shown():
    maps = softmax_maps(heads=4)
    every = embedded_spec(viz.head_view(maps, tokens_for(6)).html)["head_colours"]
    some = embedded_spec(viz.head_view(maps, tokens_for(6), heads=[3, 1]).html)["head_colours"]
    assert len(set(every)) == 4 and some == [every[3], every[1]]


def test_tokens_cannot_end_the_data_element_and_come_back_unchanged():
    hostile = ["</script><img src=x onerror=alert(1)>", "<!--", "]]>", "&amp;", "\u2028",
               '"\'', "</SCRIPT >", "<script>alert(2)</script>"]
    maps = softmax_maps(batch=1, queries=len(hostile))
    page = viz.head_view(maps, hostile, title="<b>title</b> </script>").html
    data = re.search(r'id="attnlab-data">(.*?)</script>', page, re.S).group(1)
    assert "<" not in data and ">" not in data and "&" not in data
    spec = json.loads(data)
    assert spec["query_tokens"] == [hostile] and spec["key_tokens"] == [hostile]
    assert spec["title"] == "<b>title</b> </script>"
    assert page.count("<script") == 2 and page.lower().count("</script") == 2
    assert "<title>&lt;b&gt;title&lt;/b&gt; &lt;/script&gt;</title>" in page


def test_auto_mode_draws_lines_up_to_the_threshold_and_a_heat_map_above():
    def start_mode(n, **options):
        maps = (torch.full((1, 1, n, n), 1.0 / n),)
        return embedded_spec(viz.head_view(maps, tokens_for(n), **options).html)["start"]["mode"]

    assert start_mode(256) == "lines"
    assert start_mode(257) == "heatmap"
    assert start_mode(20, threshold=10) == "heatmap"
    assert start_mode(300, mode="lines") == "lines"
    assert start_mode(4, mode="heatmap") == "heatmap"


def test_max_tokens_pools_queries_by_mean_and_keys_by_sum():
    maps = softmax_maps(layers=1, batch=1, heads=2, queries=10, seed=3)
    spec = embedded_spec(viz.head_view(maps, tokens_for(10), max_tokens=4, precision=16).html)
    # ceil(10 / 4) = 3 positions per block: blocks [0, 3), [3, 6), [6, 9), [9, 10).
    weights = maps[0].double()[0]
    blocks = [(0, 3), (3, 6), (6, 9), (9, 10)]
    expected = torch.stack([torch.stack([weights[:, a:b, c:d].sum(-1).mean(-1)
                                         for c, d in blocks], -1) for a, b in blocks], -2)
    got = decoded_weights(spec)[0, 0]
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-4)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-3)
    assert spec["query_tokens"] == [["t0…t2", "t3…t5", "t6…t8", "t9"]]
    assert spec["key_tokens"] == spec["query_tokens"]


def test_long_inputs_over_max_values_are_refused_with_the_ways_out():
    # Expanded views: 12 layers of [1, 12, 1024, 1024] without the 600 MB.
    maps = tuple(torch.full((1, 1, 1, 1), 1 / 1024).expand(1, 12, 1024, 1024) for _ in range(12))
    with pytest.raises(ValueError, match=r"1 × 12 × 12 × 1024 × 1024 = 150,994,944 weights.*"
                                         r"max_tokens="):
        viz.head_view(maps, tokens_for(1024))
    page = viz.head_view(maps, tokens_for(1024), layers=11, heads=[0])  # one map: fine
    assert embedded_spec(page.html)["start"]["mode"] == "heatmap"
    pooled = embedded_spec(viz.model_view(maps, tokens_for(1024), max_tokens=64).html)
    assert pooled["shape"] == [1, 12, 12, 64, 64]


def test_hugging_face_output_attentions_go_in_unchanged():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3,
                                     num_attention_heads=4, intermediate_size=64,
                                     attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(50, (2, 9))
    with torch.no_grad():
        attentions = model(ids, output_attentions=True).attentions
    assert isinstance(attentions, tuple) and attentions[0].shape == (2, 4, 9, 9)
    tokens = [[f"w{i}" for i in row] for row in ids.tolist()]
    spec = embedded_spec(viz.model_view(attentions, tokens).html)
    assert spec["shape"] == [2, 3, 4, 9, 9] and spec["query_tokens"] == tokens
    np.testing.assert_allclose(decoded_weights(spec), reference_stack(attentions),
                               atol=0.5 / 255)


def test_size_of_a_12_layer_12_head_128_token_page():
    # Near-uniform maps (a randomly initialised model's) are the hardest to compress.
    maps = softmax_maps(layers=12, batch=1, heads=12, queries=128, seed=4)
    maps = tuple(m.pow(0.05) / m.pow(0.05).sum(-1, keepdim=True) for m in maps)
    size8 = len(viz.head_view(maps, tokens_for(128)).html.encode())
    size16 = len(viz.head_view(maps, tokens_for(128), precision=16).html.encode())
    values = 12 * 12 * 128 * 128
    assert size8 < 1.4 * values + 100_000  # at most base64's 4/3 byte per weight, plus code
    assert size16 < 2.7 * values + 100_000


# ---- the notebook display ---------------------------------------------------------------

def test_repr_html_is_a_sandboxed_iframe_holding_the_page_with_its_own_id():
    view = viz.head_view(softmax_maps(), tokens_for(6))
    first, second = view._repr_html_(), view._repr_html_()
    frame = re.search(r'<iframe id="(attnlab-viewer-[0-9a-f]+)"[^>]*'
                      r'sandbox="allow-scripts"[^>]*srcdoc="([^"]*)"', first)
    assert frame, first[:300]
    assert html.unescape(frame.group(2)) == view.html
    assert frame.group(1) != re.search(r'<iframe id="([^"]+)"', second).group(1)
    assert f"getElementById({json.dumps(frame.group(1))})" in first


def test_save_writes_the_page(tmp_path):
    view = viz.model_view(softmax_maps(), tokens_for(6))
    path = view.save(tmp_path / "attention.html")
    assert path.read_text(encoding="utf-8") == view.html
    assert "AttentionViewer(" in repr(view)


# ---- bad input --------------------------------------------------------------------------

def with_nan(tensor, index):
    tensor = tensor.clone()
    tensor[index] = float("nan")
    return tensor


GOOD = softmax_maps(layers=2, batch=1, heads=2, queries=3)
TOKENS = ["a", "b", "c"]


@pytest.mark.parametrize("call, error, message", [
    (lambda: viz.head_view(GOOD[0], TOKENS), TypeError, "tuple or list.*for one layer pass"),
    (lambda: viz.head_view({"a": GOOD[0]}, TOKENS), TypeError, "tuple or list"),
    (lambda: viz.head_view((), TOKENS), ValueError, "maps is empty"),
    (lambda: viz.head_view(("x",), TOKENS), TypeError, r"maps\[0\] must be a torch.Tensor"),
    (lambda: viz.head_view((GOOD[0][0],), TOKENS), ValueError, r"maps\[0\] must have 4 dim"),
    (lambda: viz.head_view((GOOD[0], GOOD[1][:, :1]), TOKENS), ValueError,
     r"same shape.*maps\[1\] is \[1, 1, 3, 3\]"),
    (lambda: viz.head_view((GOOD[0][:, :, :0],), []), ValueError, "empty dimension"),
    (lambda: viz.head_view((GOOD[0].to(torch.complex64),), TOKENS), TypeError, "real numbers"),
    (lambda: viz.head_view(GOOD, ["a", "b"]), ValueError, "tokens has 2 tokens but the maps "
                                                          "have 3 queries"),
    (lambda: viz.head_view(GOOD, None), TypeError, "tokens is required"),
    (lambda: viz.head_view(GOOD, "abc"), TypeError, "tokens must be a list of strings"),
    (lambda: viz.head_view(GOOD, ["a", 2, "c"]), TypeError, r"tokens\[1\] must be a str"),
    (lambda: viz.head_view(GOOD, [TOKENS, TOKENS]), ValueError, "2 lists but the maps have "
                                                                "batch size 1"),
    (lambda: viz.head_view((torch.rand(1, 1, 3, 4),), TOKENS), ValueError,
     "3 queries but 4 keys.*key_tokens"),
    (lambda: viz.head_view((torch.rand(1, 1, 3, 4),), TOKENS, ["k"] * 3), ValueError,
     "key_tokens has 3 tokens but the maps have 4 keys"),
    (lambda: viz.head_view((GOOD[0], with_nan(GOOD[1], (0, 1, 2, 0))), TOKENS), ValueError,
     r"maps\[1\] holds a non-finite value \(nan\) at batch 0, head 1, query 2, key 0"),
    (lambda: viz.head_view((GOOD[0] + torch.tensor(float("inf")),), TOKENS), ValueError,
     "non-finite value \\(inf\\)"),
    (lambda: viz.head_view((GOOD[0] - 1,), TOKENS), ValueError, "negative values"),
    (lambda: viz.head_view(GOOD, TOKENS, batch=1), ValueError, "batch index 1 is out of range"),
    (lambda: viz.head_view(GOOD, TOKENS, layers=[0, 0]), ValueError, "layers lists an index "
                                                                     "twice"),
    (lambda: viz.head_view(GOOD, TOKENS, heads=[]), TypeError, "heads must be an index or a "
                                                               "non-empty list"),
    (lambda: viz.head_view(GOOD, TOKENS, layer=2), ValueError, "layer 2 is out of range"),
    (lambda: viz.head_view(GOOD, TOKENS, head="first"), TypeError, 'head must be an index into '
                                                                   'the maps or "all"'),
    (lambda: viz.head_view(GOOD, TOKENS, mode="circles"), ValueError, "mode must be one of"),
    (lambda: viz.head_view(GOOD, TOKENS, precision=32), ValueError, "precision must be 8 or 16"),
    (lambda: viz.head_view(GOOD, TOKENS, max_tokens=1), ValueError, "max_tokens must be"),
    (lambda: viz.head_view(GOOD, TOKENS, max_values=0), ValueError, "max_values must be"),
    (lambda: viz.head_view(GOOD, TOKENS, threshold=0), ValueError, "threshold must be"),
    (lambda: viz.head_view(GOOD, TOKENS, title=3), TypeError, "title must be a str"),
    (lambda: static.head_view_figure(GOOD, TOKENS, layer="0"), TypeError, "layer must be an "
                                                                           "index"),
    (lambda: static.head_view_figure(GOOD, TOKENS, mode="x"), ValueError, "mode must be one of"),
    (lambda: static.model_view_figure(GOOD, ["a"]), ValueError, "tokens has 1 tokens"),
    (lambda: viz.save_maps("unused.pt", (GOOD[0] * float("nan"),), TOKENS), ValueError,
     "non-finite"),
])
def test_bad_input_is_refused_with_a_message_naming_it(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_numpy_maps_and_tensors_needing_grad_or_in_half_precision_are_accepted():
    maps = softmax_maps(layers=2, batch=1, heads=2, queries=3)
    as_numpy = tuple(m.numpy() for m in maps)
    needing_grad = tuple(m.clone().requires_grad_() for m in maps)
    half = tuple(m.half() for m in maps)
    expected = decoded_weights(embedded_spec(viz.head_view(maps, TOKENS).html))
    for variant in (as_numpy, needing_grad):
        np.testing.assert_array_equal(
            decoded_weights(embedded_spec(viz.head_view(variant, TOKENS).html)), expected)
    np.testing.assert_allclose(decoded_weights(embedded_spec(viz.head_view(half, TOKENS).html)),
                               reference_stack(half), atol=0.5 / 255)


# ---- static figures ---------------------------------------------------------------------

def rendered(fig, format="png"):
    buffer = io.BytesIO()
    fig.savefig(buffer, format=format, dpi=60)
    return buffer.getvalue()


def not_blank(png: bytes) -> bool:
    image = Image.open(io.BytesIO(png)).convert("L")
    return ImageStat.Stat(image).stddev[0] > 5


def test_head_view_figure_draws_one_line_collection_per_shown_head():
    maps = softmax_maps(layers=2, batch=2, heads=3, queries=5)
    fig = static.head_view_figure(maps, tokens_for(5), batch=1, layer=1, head=2)
    assert len(fig.axes) == 1
    (lines,) = fig.axes[0].collections
    segments = lines.get_segments()
    weights = maps[1][1, 2].double()
    strong = int((weights >= 1 / 512).sum())
    assert len(segments) == strong
    # Line from query q (x = 0, y = −q) to key k (x = 1, y = −k), opacity its weight.
    alphas = lines.get_colors()[:, 3]
    for (start, end), alpha in zip(segments, alphas):
        q, k = int(-start[1]), int(-end[1])
        assert (start[0], end[0]) == (0, 1)
        assert alpha == pytest.approx(float(weights[q, k]), rel=1e-5)
    scaled = static.head_view_figure((maps[0] * 4,), tokens_for(5))  # weights up to 4
    assert scaled.axes[0].collections[0].get_colors()[:, 3].max() == pytest.approx(1.0)
    assert fig.axes[0].get_title() == "layer 1, head 2"
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert set(tokens_for(5)) <= texts
    assert not_blank(rendered(fig))

    overlay = static.head_view_figure(maps, tokens_for(5), head="all")
    assert len(overlay.axes[0].collections) == 3
    assert len(overlay.axes[0].get_legend().get_texts()) == 3


def test_figure_labels_keep_tokens_on_one_line_and_visible():
    tokens = ["", "  ", "a\nb", "tab\there", "x" * 30]
    fig = static.head_view_figure((torch.full((1, 1, 5, 5), 0.2),), tokens, mode="heatmap")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["∅", "␣␣", "a↵b", "tab⇥here", "x" * 17 + "…"]


def test_head_view_figure_heat_map_shows_the_map_or_the_mean_of_the_heads():
    maps = softmax_maps(layers=1, batch=1, heads=3, queries=4, keys=7)
    keys = tokens_for(7, "k")
    fig = static.head_view_figure(maps, tokens_for(4), keys, head=1, mode="heatmap")
    assert len(fig.axes) == 2  # the map and its colour bar
    image = fig.axes[0].images[0].get_array()
    np.testing.assert_allclose(image, maps[0][0, 1].numpy(), rtol=1e-6)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == keys
    mean = static.head_view_figure(maps, tokens_for(4), keys, head="all", mode="heatmap")
    np.testing.assert_allclose(mean.axes[0].images[0].get_array(),
                               maps[0][0].double().mean(0).numpy(), rtol=1e-5)
    long = tuple(torch.full((1, 1, 300, 300), 1 / 300) for _ in range(1))
    assert len(static.head_view_figure(long, tokens_for(300)).axes) == 2  # auto: heat map


def test_model_view_figure_has_a_panel_per_layer_and_head():
    maps = softmax_maps(layers=3, batch=2, heads=4, queries=5)
    fig = static.model_view_figure(maps, batch=1, title="model")
    panels = [ax for ax in fig.axes if ax.images]
    assert len(fig.axes) == len(panels) == 12
    for index, ax in enumerate(panels):
        layer, head = divmod(index, 4)
        np.testing.assert_allclose(ax.images[0].get_array(), maps[layer][1, head].numpy())
    assert panels[0].get_title() == "head 0" and panels[4].get_ylabel() == "layer 1"
    some = static.model_view_figure(maps, layers=[2], heads=[3, 0])
    assert len(some.axes) == 2 and some.axes[0].get_title() == "head 3"
    assert not_blank(rendered(fig))


def test_figures_save_as_png_svg_and_pdf_without_pyplot_state():
    import matplotlib.pyplot as plt
    before = plt.get_fignums()
    maps = softmax_maps()
    figures = [static.head_view_figure(maps, tokens_for(6)),
               static.head_view_figure(maps, tokens_for(6), mode="heatmap"),
               static.model_view_figure(maps, tokens_for(6))]
    assert plt.get_fignums() == before
    for fig in figures:
        assert all(isinstance(fig, matplotlib.figure.Figure) for fig in figures)
        assert rendered(fig, "png").startswith(b"\x89PNG")
        svg = rendered(fig, "svg")
        assert svg.lstrip().startswith(b"<?xml") and b"<svg" in svg
        assert rendered(fig, "pdf").startswith(b"%PDF")


# ---- attention_maps.pt and the command line ---------------------------------------------

def test_save_and_load_maps_round_trip(tmp_path):
    maps = softmax_maps(layers=2, batch=1, heads=2, queries=3, keys=4)
    path = viz.save_maps(tmp_path / viz.FILE_NAME, maps, TOKENS, ["w", "x", "y", "z"],
                         title="t")
    for source in (path, tmp_path):
        loaded = viz.load_maps(source)
        assert loaded["tokens"] == [TOKENS] and loaded["key_tokens"] == [["w", "x", "y", "z"]]
        assert loaded["title"] == "t"
        for got, expected in zip(loaded["maps"], maps, strict=True):
            assert torch.equal(got, expected)
    assert not (tmp_path / (viz.FILE_NAME + ".tmp")).exists()


def test_load_maps_explains_a_missing_or_foreign_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no attention_maps.pt.*run the same "
                                                "experiment command again"):
        viz.load_maps(tmp_path)
    (tmp_path / "foreign.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="not an attention-maps file"):
        viz.load_maps(tmp_path / "foreign.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not an attention-maps file"):
        viz.load_maps(tmp_path / "other.pt")
    torch.save({"format": "attnlab-attention-maps", "maps": [torch.zeros(1, 1, 2, 3)],
                "tokens": [["a", "b"]]}, tmp_path / "damaged.pt")
    with pytest.raises(ValueError, match="damaged maps: .*key_tokens"):
        viz.load_maps(tmp_path / "damaged.pt")


@pytest.fixture(scope="module")
def reverse_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reverse")
    result = run_cli("reverse", "--fast", "--epochs", "1", "--quiet", "--out", str(out),
                     one_thread=True)
    assert result.returncode == 0, result.stderr
    return out


def test_an_experiment_writes_its_attention_maps(reverse_run):
    loaded = viz.load_maps(reverse_run)
    (layer,) = loaded["maps"]
    assert layer.shape == (1, 1, 16, 16)
    torch.testing.assert_close(layer.sum(-1), torch.ones(1, 1, 16), rtol=0, atol=1e-5)
    (tokens,) = loaded["tokens"]
    assert len(tokens) == 16 and all(t.isdigit() for t in tokens)
    assert loaded["key_tokens"] is None and loaded["title"].startswith("reverse")


def test_running_an_older_run_again_adds_its_maps(reverse_run):
    # What load_maps tells the owner of a run folder from before experiments wrote the maps.
    (reverse_run / viz.FILE_NAME).unlink()
    result = run_cli("reverse", "--fast", "--epochs", "1", "--quiet", "--out", str(reverse_run),
                     one_thread=True)
    assert result.returncode == 0, result.stderr
    assert viz.load_maps(reverse_run)["maps"][0].shape == (1, 1, 16, 16)


def view_in_process(capsys, *args):
    """``python -m attnlab view ARGS`` in this process (a child process costs seconds of
    imports each): (exit status, stdout, stderr)."""
    try:
        code = cli.main(["view", *map(str, args)])
    except SystemExit as exit_:  # usage errors
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_view_command_writes_html_and_figures(reverse_run, tmp_path, capsys):
    result = run_cli("view", str(reverse_run))  # once as a user runs it
    assert result.returncode == 0, result.stderr
    page = (reverse_run / "attention.html").read_text(encoding="utf-8")
    spec = embedded_spec(page)
    assert spec["shape"] == [1, 1, 1, 16, 16] and spec["start"]["view"] == "head"
    assert "attention.html" in result.stdout

    code, _, err = view_in_process(capsys, reverse_run / viz.FILE_NAME, "--view", "model",
                                   "--out", tmp_path / "model.html", "--precision", "16")
    assert code == 0, err
    spec = embedded_spec((tmp_path / "model.html").read_text(encoding="utf-8"))
    assert spec["start"]["view"] == "model" and spec["bits"] == 16

    for name, magic in (("head.svg", b"<?xml"), ("model.pdf", b"%PDF"), ("head.png", b"\x89PNG")):
        args = ["--view", "model"] if name.startswith("model") else ["--head", "all"]
        code, out, err = view_in_process(capsys, reverse_run, "--out", tmp_path / name, *args)
        assert code == 0, err
        assert (tmp_path / name).read_bytes().lstrip().startswith(magic)
        assert name in out


@pytest.mark.parametrize("args, status, message", [
    (["--out", "x.txt"], 1, "--out must end in .html, .png, .svg or .pdf"),
    (["--layer", "3"], 1, "layer 3 is out of range"),
    (["--head", "two"], 2, "argument --head: invalid head value: 'two'"),
])
def test_view_command_bad_arguments_give_one_line(reverse_run, capsys, args, status, message):
    code, _, err = view_in_process(capsys, reverse_run, *args)
    assert code == status
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_view_command_on_a_folder_without_maps_says_how_to_get_them(tmp_path, capsys):
    code, _, err = view_in_process(capsys, tmp_path)
    assert code == 1
    assert "has no attention_maps.pt" in err and len(err.strip().splitlines()) == 1
