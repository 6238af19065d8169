"""The summaries page (attnlab.viz.summary_view) in a real browser: Debian's chromium, driven
headless by Playwright. The page must load with no console error and no request but its own
file, show its four views, zoom into a block whose weights it carries (and say how to get the
others), draw a query's top-k arcs and read exact values under the mouse.

Set ATTNLAB_VIZ_SCREENSHOTS=DIR to keep the screenshots the tests take."""

import math
import re

import numpy as np
import pytest
import torch

import attnlab
from attnlab import viz
from attnlab.interpret import summarize

from browser_page import Page, browser, not_blank, shots  # noqa: F401  (fixtures)

LENGTH, POOL, TOPK, LAYERS, HEADS = 640, 64, 6, 2, 3


def number(text: str) -> float:
    return float(text.replace("≈", ""))


@pytest.fixture(scope="module")
def recorded():
    """Two causal layers of three heads over 640 tokens; key 0 is an attention sink."""
    generator = torch.Generator().manual_seed(0)
    calls = []
    with summarize(received=True, entropy=True, topk=TOPK, pool=POOL,
                   keep_inputs=True) as summaries:
        for _ in range(LAYERS):
            query = torch.randn(1, HEADS, LENGTH, 16, generator=generator) + 1
            key = torch.randn(1, HEADS, LENGTH, 16, generator=generator)
            key[:, :, 0] = 3.0
            value = torch.randn(1, HEADS, LENGTH, 16, generator=generator)
            attnlab.scaled_dot_product_attention(query, key, value, is_causal=True)
            calls.append((query, key, value))
    return summaries, calls


TOKENS = [f"tok{i}" for i in range(LENGTH)]
ZOOMED = (1, 2, 7, 3)  # layer, head, q_block, k_block


@pytest.fixture(scope="module")
def page_file(recorded, tmp_path_factory):
    summaries, _ = recorded
    view = viz.summary_view(summaries, TOKENS, zoom=["auto", ZOOMED], title="summaries")
    return view.save(tmp_path_factory.mktemp("summaries") / "summaries.html")


@pytest.fixture
def page(browser, page_file):
    opened = Page(browser, page_file, viewport=(1200, 1000))
    yield opened
    opened.page.close()


def root_data(page, name):
    return page.page.locator("#attnlab-viz").get_attribute(f"data-{name}")


def click_cell(page, selector, row, col, click=True):
    """Moves to (and clicks) a cell of a heat map by the geometry its overlay publishes."""
    overlay = page.page.locator(f"{selector} .attnlab-heat-overlay")
    overlay.scroll_into_view_if_needed()
    geometry = {k: float(overlay.get_attribute(f"data-{k}"))
                for k in ("left", "top", "cell-width", "cell-height")}
    box = overlay.bounding_box()
    x = box["x"] + geometry["left"] + (col + 0.5) * geometry["cell-width"]
    y = box["y"] + geometry["top"] + (row + 0.5) * geometry["cell-height"]
    page.page.mouse.move(x, y)
    if click:
        page.page.mouse.click(x, y)


def plot_x(page, selector, position, window):
    """The page x of a position in a sequence plot showing positions window = (from, to)."""
    canvas = page.page.locator(selector)
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    left, width = 70, 1000  # summary.js: PLOT_LEFT, PLOT_WIDTH
    first, end = window
    return box, box["x"] + left + (position - first + 0.5) * width / (end - first)


def test_page_loads_cleanly_with_its_four_views(page, shots):
    assert page.state() == "ready"
    page.check_clean()
    assert page.page.locator("h1.attnlab-title").inner_text() == "summaries"
    for selector in (".attnlab-pooled-map .attnlab-heat-canvas", ".attnlab-received",
                     ".attnlab-entropy", ".attnlab-arcs"):
        assert page.page.locator(selector).count() == 1, selector
        assert not_blank(page.image(selector)), selector
    cells = page.page.locator(".attnlab-entropy-cell")
    assert cells.count() == LAYERS * HEADS
    assert page.page.locator(".attnlab-entropy-cell.attnlab-current").count() == 1
    blocks = math.ceil(LENGTH / POOL)
    overlay = page.page.locator(".attnlab-pooled-map .attnlab-heat-overlay")
    assert (overlay.get_attribute("data-rows"), overlay.get_attribute("data-cols")) == \
        (str(blocks), str(blocks))
    # The last query starts selected, with its top-k keys drawn and listed.
    assert root_data(page, "query") == str(LENGTH - 1)
    assert page.page.locator(".attnlab-arcs").get_attribute("data-arcs") == str(TOPK)
    assert page.page.locator(".attnlab-topk-item").count() == TOPK
    page.save(shots, "summaries.png")


def test_the_entropy_grid_shows_each_head_s_mean_and_selects_it(page, recorded):
    summaries, _ = recorded
    cell = page.page.locator(".attnlab-entropy-cell[data-layer='1'][data-head='2']")
    expected = summaries[1].entropy[0, 2].double().mean().item()
    assert abs(number(cell.inner_text()) - expected) <= 1e-3 * expected
    before = page.image(".attnlab-pooled-map .attnlab-heat-canvas")
    cell.click()
    assert (root_data(page, "layer"), root_data(page, "head")) == ("1", "2")
    assert page.page.locator(".attnlab-layer select").input_value() == "1"
    assert not np.array_equal(page.image(".attnlab-pooled-map .attnlab-heat-canvas"), before)
    page.page.select_option(".attnlab-head select", "0")
    assert root_data(page, "head") == "0"
    page.check_clean()


def grid_colours(browser, path, summaries):
    """The entropy grid's cell colours [cells, 3] and its caption, on a page of summaries."""
    opened = Page(browser, viz.summary_view(summaries).save(path))
    try:
        colours = opened.page.locator(".attnlab-entropy-cell").evaluate_all(
            "cells => cells.map(c => getComputedStyle(c).backgroundColor)")
        caption = opened.page.locator(".attnlab-grid-panel").inner_text()
        opened.check_clean()
    finally:
        opened.page.close()
    return np.array([[int(x) for x in re.findall(r"\d+", c)[:3]] for c in colours]), caption


def test_the_entropy_grid_colours_on_the_entropy_s_own_range(browser, tmp_path):
    # Four nearly uniform heads (means within 1e-3 nats of ln 128) look alike, and light; a
    # head that puts its weight on one key is dark.
    generator = torch.Generator().manual_seed(3)
    query = 0.01 * torch.randn(1, 4, 128, 16, generator=generator)
    key = torch.randn(1, 4, 128, 16, generator=generator)
    with summarize(entropy=True) as uniform:
        attnlab.scaled_dot_product_attention(query, key, key)
    means = uniform[0].entropy[0].double().mean(-1)
    assert (means - math.log(128)).abs().max() < 1e-3 and means.std() > 0
    rgb, caption = grid_colours(browser, tmp_path / "uniform.html", uniform)
    assert np.abs(rgb - rgb[0]).max() <= 3 and rgb[0].sum() > 400, rgb
    assert "coloured from 0 (dark) to ln 128 (light)" in caption
    query[:, 3], key[:, 3, 5] = 1.0, 40.0
    with summarize(entropy=True) as sharp:
        attnlab.scaled_dot_product_attention(query, key, key)
    assert sharp[0].entropy[0, 3].mean() < 0.1
    rgb, _ = grid_colours(browser, tmp_path / "sharp.html", sharp)
    assert rgb[3].sum() < 250 and np.abs(rgb[:3] - rgb[0]).max() <= 3, rgb


def test_clicking_a_block_with_weights_shows_them(page, recorded, shots):
    summaries, _ = recorded
    layer, head, q_block, k_block = ZOOMED
    page.page.select_option(".attnlab-layer select", str(layer))
    page.page.select_option(".attnlab-head select", str(head))
    click_cell(page, ".attnlab-pooled-map", q_block, k_block)
    assert root_data(page, "block") == f"{q_block},{k_block}"
    assert root_data(page, "zoom") == "embedded"
    assert not_blank(page.image(".attnlab-zoom-map .attnlab-heat-canvas"))
    weights = summaries.block_weights(layer, 0, head, q_block, k_block).double()
    mean = re.search(r"mean of these 64 × 64 weights ([0-9.e-]+) \(pooled map: ([0-9.e-]+)\)",
                     page.page.locator(".attnlab-zoom-mean").inner_text())
    assert mean, page.page.locator(".attnlab-zoom-mean").inner_text()
    assert abs(float(mean.group(1)) - weights.mean().item()) <= 1e-3 * weights.mean().item()
    assert abs(float(mean.group(2)) - weights.mean().item()) <= 1e-3 * weights.mean().item()
    # One weight under the mouse: 8 bits of a log scale, a few per cent (and its rounding).
    for row, col in ((5, 40), (63, 0)):
        click_cell(page, ".attnlab-zoom", row, col, click=False)
        text = page.info()
        q, k = q_block * POOL + row, k_block * POOL + col
        match = re.search(rf"query {q} “tok{q}” → key {k} “tok{k}”: weight (≈?[0-9.e-]+)",
                          text)
        assert match, text
        assert abs(number(match.group(1)) - weights[row, col].item()) <= \
            0.1 * weights[row, col].item()
    page.save(shots, "summaries_zoom.png")
    page.check_clean()


def test_a_block_without_weights_says_how_to_get_them(page):
    page.page.select_option(".attnlab-layer select", "0")
    page.page.select_option(".attnlab-head select", "1")
    click_cell(page, ".attnlab-pooled-map", 9, 8)  # near the diagonal: never chosen by "auto"
    assert root_data(page, "zoom") == "missing"
    text = page.page.locator(".attnlab-zoom-missing").inner_text()
    assert "zoom=[(0, 1, 9, 8)]" in text
    assert page.page.locator(".attnlab-zoom-map").count() == 0
    # The blocks the page does carry for this head are one click away.
    buttons = page.page.locator(".attnlab-zoom-block")
    assert buttons.count() == 2
    buttons.first.click()
    assert root_data(page, "zoom") == "embedded"
    page.check_clean()


def test_choosing_a_query_draws_its_k_arcs(page, recorded, shots):
    summaries, _ = recorded
    arcs_before = page.image(".attnlab-arcs")
    page.page.fill(".attnlab-query-input", "300")
    page.page.press(".attnlab-query-input", "Enter")
    assert root_data(page, "query") == "300"
    arcs = page.page.locator(".attnlab-arcs")
    assert arcs.get_attribute("data-arcs") == str(TOPK)
    assert not np.array_equal(page.image(".attnlab-arcs"), arcs_before)
    keys = summaries[0].topk_indices[0, 0, 300].tolist()
    weights = summaries[0].topk_weights[0, 0, 300].tolist()
    items = page.page.locator(".attnlab-topk-item")
    assert [int(k) for k in items.evaluate_all("items => items.map(i => i.dataset.key)")] == keys
    for item, key, weight in zip(items.all_inner_texts(), keys, weights):
        assert item.startswith(f"key {key} “tok{key}”: ")
        shown = number(item.split(": ")[1].split(" ")[0])
        # 8 bits of a log scale for all but the first, and the digits that leaves.
        assert abs(shown - weight) <= 0.1 * weight
    page.save(shots, "summaries_query_300.png")

    # A click on the entropy plot chooses the query under it.
    box, x = plot_x(page, ".attnlab-entropy", 100, (0, LENGTH))
    page.page.mouse.click(x, box["y"] + 60)
    assert root_data(page, "query") == "100"
    assert page.page.locator(".attnlab-query-slider").input_value() == "100"
    assert arcs.get_attribute("data-arcs") == str(TOPK)
    assert page.page.locator(".attnlab-topk-item").first.get_attribute("data-key") == \
        str(summaries[0].topk_indices[0, 0, 100, 0].item())
    page.check_clean()


def query_mark_height(page, selector):
    """The CSS-pixel height of the red mark in a heat map's left margin (None: no mark)."""
    return page.page.locator(f"{selector} .attnlab-heat-overlay").evaluate("""canvas => {
        const ratio = canvas.width / canvas.clientWidth;
        const x = Math.round((Number(canvas.dataset.left) - 4) * ratio);
        const pixels = canvas.getContext("2d").getImageData(x, 0, 1, canvas.height).data;
        const rows = [];
        for (let y = 0; y < canvas.height; ++y) {
            const [r, g, b, a] = pixels.slice(4 * y, 4 * y + 4);
            if (a > 128 && r > 180 && g < 90 && b < 90) rows.push(y);
        }
        return rows.length ? (rows[0] + rows[rows.length - 1] + 1) / 2 / ratio : null;
    }""")


def test_the_chosen_query_is_marked_beside_both_maps(page):
    layer, head, q_block, k_block = ZOOMED
    page.page.select_option(".attnlab-layer select", str(layer))
    page.page.select_option(".attnlab-head select", str(head))
    click_cell(page, ".attnlab-pooled-map", q_block, k_block)
    query = q_block * POOL + 12
    page.page.fill(".attnlab-query-input", str(query))
    page.page.press(".attnlab-query-input", "Enter")
    for selector, row in ((".attnlab-pooled-map", (query + 0.5) / POOL),
                          (".attnlab-zoom-map", query - q_block * POOL + 0.5)):
        overlay = page.page.locator(f"{selector} .attnlab-heat-overlay")
        expected = float(overlay.get_attribute("data-top")) + \
            row * float(overlay.get_attribute("data-cell-height"))
        height = query_mark_height(page, selector)
        assert height is not None and abs(height - expected) <= 1.5, (selector, height, expected)
    # A query outside the zoomed block: marked beside the pooled map only.
    page.page.fill(".attnlab-query-input", "100")
    page.page.press(".attnlab-query-input", "Enter")
    assert query_mark_height(page, ".attnlab-zoom-map") is None
    assert query_mark_height(page, ".attnlab-pooled-map") is not None
    page.check_clean()


def test_hovering_reads_exact_values_and_dragging_zooms_into_positions(page, recorded):
    summaries, _ = recorded
    received = summaries[0].received[0, 0].double()
    # Zoomed out (640 positions, 1000 pixels): each position has its pixels already.
    box, x = plot_x(page, ".attnlab-received", 0, (0, LENGTH))
    page.page.mouse.move(x, box["y"] + 60)
    match = re.search(r"key 0 “tok0” receives ([0-9.e+-]+)", page.info())
    assert match, page.info()
    assert abs(float(match.group(1)) - received[0].item()) <= 1e-3 * received[0].item()
    assert received.argmax().item() == 0  # the sink is the spike

    # Drag from position 200 to 260: the plots show those positions only.
    _, start = plot_x(page, ".attnlab-received", 200, (0, LENGTH))
    _, end = plot_x(page, ".attnlab-received", 260, (0, LENGTH))
    page.page.mouse.move(start, box["y"] + 60)
    page.page.mouse.down()
    page.page.mouse.move(end, box["y"] + 60, steps=5)
    page.page.mouse.up()
    first, last = int(root_data(page, "from")), int(root_data(page, "to"))
    assert abs(first - 200) <= 1 and abs(last - 261) <= 1
    assert re.search(rf"Positions {first}–{last - 1} of {LENGTH}",
                     page.page.locator(".attnlab-window").inner_text())
    box, x = plot_x(page, ".attnlab-received", 230, (first, last))
    page.page.mouse.move(x, box["y"] + 60)
    match = re.search(r"key 230 “tok230” receives ([0-9.e+-]+)", page.info())
    assert match, page.info()
    value = received[230].item()
    assert abs(float(match.group(1)) - value) <= 1e-3 * value  # four digits
    entropy = summaries[0].entropy[0, 0].double()
    box, x = plot_x(page, ".attnlab-entropy", 250, (first, last))
    page.page.mouse.move(x, box["y"] + 60)
    match = re.search(r"query 250 “tok250”: entropy ([0-9.e+-]+) nats", page.info())
    assert match, page.info()
    assert abs(float(match.group(1)) - entropy[250].item()) <= 1e-3 * entropy[250].item()
    page.page.mouse.dblclick(x, box["y"] + 60)
    assert (root_data(page, "from"), root_data(page, "to")) == ("0", str(LENGTH))
    page.page.click(".attnlab-window-fit")  # the query and its keys
    keys = summaries[0].topk_indices[0, 0, int(root_data(page, "query"))]
    assert int(root_data(page, "from")) <= keys.min().item()
    page.check_clean()


def test_a_16384_token_page_loads_and_answers(browser, tmp_path, shots):
    generator = torch.Generator().manual_seed(1)
    length = 16384
    with torch.no_grad(), summarize(received=True, entropy=True, topk=8, pool=256,
                                    keep_inputs=True) as summaries:
        for _ in range(2):
            query, key, value = (torch.randn(1, 2, length, 32, generator=generator)
                                 for _ in range(3))
            attnlab.scaled_dot_product_attention(query, key, value, is_causal=True)
    path = viz.summary_view(summaries).save(tmp_path / "long.html")
    page = Page(browser, path, viewport=(1200, 1000))
    assert page.state() == "ready"
    assert page.page.locator(".attnlab-arcs").get_attribute("data-arcs") == "8"
    page.page.locator(".attnlab-zoom-block").first.click()
    assert root_data(page, "zoom") == "embedded"
    box, x = plot_x(page, ".attnlab-received", 5000, (0, length))
    page.page.mouse.move(x, box["y"] + 60)
    # Zoomed out, a pixel holds 16 or 17 positions: the largest value among them, and where.
    match = re.search(r"keys (\d+)–(\d+): most received by key (\d+): ([0-9.e+-]+)", page.info())
    assert match, page.info()
    first, last, key = (int(match.group(i)) for i in (1, 2, 3))
    received = summaries[0].received[0, 0].double()
    assert first <= 5000 <= last and last - first + 1 in (16, 17)
    assert key == first + received[first:last + 1].argmax().item()
    assert abs(float(match.group(4)) - received[key].item()) <= 1e-3 * received[key].item()
    page.save(shots, "summaries_16k.png")
    page.check_clean()
