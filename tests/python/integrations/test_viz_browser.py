"""The viewer's page in a real browser: Debian's chromium, driven headless by Playwright (the
system browser; nothing is downloaded). Every page must load with no console error and no
request but its own file, and the controls must change what is drawn.

Set ATTNLAB_VIZ_SCREENSHOTS=DIR to keep the screenshots the tests take."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import viz
from attnlab.viz._colours import head_colours

from browser_page import Page, browser, not_blank, shots  # noqa: F401  (fixtures)

ROW = 20  # the viewer's token row height (viewer.js)


def ink_rows(pixels: np.ndarray, columns: slice) -> np.ndarray:
    """Rows with a strongly coloured (not faint) pixel within ``columns``."""
    return np.nonzero((pixels[:, columns].min(axis=-1) < 200).any(axis=1))[0]


def shifted_maps(layers=2, batch=2, heads=4, n=12, strong=0.9):
    """Head h of layer l, batch entry b: query q gives ``strong`` to key (q + h + l + b) mod n
    and spreads the rest evenly (so the other lines are faint)."""
    maps = []
    for layer in range(layers):
        m = torch.full((batch, heads, n, n), (1 - strong) / (n - 1))
        for b in range(batch):
            for h in range(heads):
                for q in range(n):
                    m[b, h, q, (q + h + layer + b) % n] = strong
        maps.append(m)
    return tuple(maps)


def write(tmp_path, view, name="view.html") -> Path:
    return view.save(tmp_path / name)


@pytest.fixture
def head_page(browser, tmp_path):
    tokens = [[f"a{i}" for i in range(12)], [f"b{i}" for i in range(12)]]
    path = write(tmp_path, viz.head_view(shifted_maps(), tokens, title="shifted heads"))
    page = Page(browser, path)
    yield page
    page.page.close()


def test_head_view_loads_cleanly_and_draws(head_page, shots):
    assert head_page.state() == "ready"
    head_page.check_clean()
    assert not_blank(head_page.save(shots, "head_view.png"))
    assert not_blank(head_page.image(".attnlab-line-canvas"))
    page = head_page.page
    assert page.locator(".attnlab-q .attnlab-token").all_inner_texts() == \
        [f"a{i}" for i in range(12)]
    assert page.locator(".attnlab-k .attnlab-token").count() == 12
    assert page.locator("h1.attnlab-title").inner_text() == "shifted heads"


def test_head_selector_and_all_heads_change_the_lines(head_page, shots):
    page = head_page.page
    colours = [np.array([int(c[i:i + 2], 16) for i in (1, 3, 5)]) for c in head_colours(4)]

    def pixels_like(pixels, colour):
        """Pixels inked in ``colour`` (at any opacity or coverage, over white)."""
        ink, target = 255.0 - pixels, 255.0 - colour
        strength = np.linalg.norm(ink, axis=-1)
        cosine = (ink @ target) / (np.maximum(strength, 1e-9) * np.linalg.norm(target))
        return int(((strength > 40) & (cosine > 0.995)).sum())

    head0 = head_page.image(".attnlab-line-canvas")
    assert pixels_like(head0, colours[0]) > 200
    assert all(pixels_like(head0, c) == 0 for c in colours[1:])
    page.select_option(".attnlab-head select", "2")
    assert page.locator("#attnlab-viz").get_attribute("data-head") == "2"
    head2 = head_page.image(".attnlab-line-canvas")
    assert not np.array_equal(head0, head2)
    assert pixels_like(head2, colours[2]) > 200 and pixels_like(head2, colours[0]) == 0

    page.select_option(".attnlab-head select", "-1")  # all heads
    overlay = head_page.image(".attnlab-line-canvas")
    for colour in colours:
        assert pixels_like(overlay, colour) > 200
    head_page.save(shots, "head_view_all_heads.png")
    page.locator(".attnlab-swatch").nth(3).click()  # a head's swatch selects it
    assert page.locator(".attnlab-head select").input_value() == "3"
    head_page.check_clean()


def test_hovering_a_token_shows_its_links_alone_and_a_click_pins_it(head_page, shots):
    page = head_page.page

    def lines():  # the lines only: the outermost columns may hold a token's outline
        return head_page.image(".attnlab-line-canvas")[:, 3:-3]

    # Pixel columns near the left edge, where the lines leave the queries, and near the right
    # edge, where they reach the keys.
    edge, far = slice(0, 3), slice(-3, None)
    before = lines()
    rows = set(ink_rows(before, edge))
    assert all(rows & set(range(q * ROW, (q + 1) * ROW)) for q in range(12))  # a strong line each

    page.hover(".attnlab-q .attnlab-token >> nth=3")
    hovered = lines()
    # Head 0 of layer 0, example 0: query 3 looks at key 3; nothing else is strong.
    band = range(3 * ROW, 4 * ROW)
    assert set(ink_rows(hovered, edge)) <= set(band) and len(ink_rows(hovered, edge)) > 0
    assert set(ink_rows(hovered, far)) <= set(band)
    assert "query 3 “a3” looks at: a3 (3) 0.900" in head_page.info()
    assert "attnlab-focus" in page.locator(".attnlab-q .attnlab-token >> nth=3") \
        .get_attribute("class")
    key_shades = [page.locator(".attnlab-k .attnlab-token").nth(j)
                  .evaluate("e => getComputedStyle(e).backgroundColor") for j in (3, 4)]
    assert key_shades[0] != key_shades[1]  # the key it looks at is shaded by its weight
    head_page.save(shots, "head_view_hover.png")

    page.mouse.move(5, 5)  # away: everything again
    assert np.array_equal(lines(), before)

    page.click(".attnlab-q .attnlab-token >> nth=3")
    page.hover(".attnlab-q .attnlab-token >> nth=7")
    assert np.array_equal(lines(), hovered)  # pinned
    assert "(pinned)" in head_page.info()
    page.keyboard.press("Escape")
    page.mouse.move(5, 5)
    assert np.array_equal(lines(), before)

    page.hover(".attnlab-k .attnlab-token >> nth=5")  # a key: the queries looking at it
    into_key = lines()
    assert set(ink_rows(into_key, far)) <= set(range(5 * ROW, 6 * ROW))
    assert "key 5 “a5” is looked at by: a5 (5) 0.900" in head_page.info()
    head_page.check_clean()


def test_heat_map_mode_reads_the_cell_under_the_mouse(browser, tmp_path, shots):
    maps = tuple(torch.randn(1, 2, 9, 9, generator=torch.Generator().manual_seed(layer))
                 .mul(2).softmax(-1) for layer in range(2))
    page = Page(browser, write(tmp_path, viz.head_view(maps, [f"w{i}" for i in range(9)])))
    page.page.select_option(".attnlab-mode select", "1")
    assert page.page.locator("#attnlab-viz").get_attribute("data-mode") == "heatmap"
    overlay = page.page.locator(".attnlab-heat-overlay")
    geometry = {k: float(overlay.get_attribute(f"data-{k}"))
                for k in ("left", "top", "cell-width", "cell-height")}
    box = overlay.bounding_box()
    image_before = page.image(".attnlab-heat")
    assert not_blank(image_before)
    for q, k in ((2, 5), (8, 0)):
        page.page.mouse.move(box["x"] + geometry["left"] + (k + 0.5) * geometry["cell-width"],
                             box["y"] + geometry["top"] + (q + 0.5) * geometry["cell-height"])
        text = page.info()
        match = re.search(rf"query {q} “w{q}” → key {k} “w{k}”: ([0-9.]+)", text)
        assert match, text
        expected = float(maps[0][0, 0, q, k])
        assert abs(float(match.group(1)) - expected) <= float(maps[0][0, 0].max()) / 255 + 5e-4
    assert not np.array_equal(page.image(".attnlab-heat"), image_before)  # the crosshair
    page.save(shots, "heat_map_hover.png")
    page.page.select_option(".attnlab-head select", "-1")
    assert "mean of all heads" in page.page.locator(".attnlab-caption").inner_text()
    page.check_clean()


def test_model_view_grid_opens_a_head_on_click(browser, tmp_path, shots):
    page = Page(browser, write(tmp_path, viz.model_view(shifted_maps(layers=3, heads=4),
                                                        [f"t{i}" for i in range(12)])))
    assert page.page.locator("#attnlab-viz").get_attribute("data-view") == "model"
    thumbs = page.page.locator(".attnlab-thumb")
    assert thumbs.count() == 3 * 4
    assert not_blank(page.image(".attnlab-thumb"))
    first, other = page.image(".attnlab-thumb >> nth=0"), page.image(".attnlab-thumb >> nth=6")
    assert not np.array_equal(first, other)  # (q + 0) vs (q + 3): other diagonals
    page.save(shots, "model_view.png")
    thumbs.nth(1 * 4 + 2).click()  # layer 1, head 2
    root = page.page.locator("#attnlab-viz")
    assert (root.get_attribute("data-view"), root.get_attribute("data-layer"),
            root.get_attribute("data-head")) == ("head", "1", "2")
    assert page.page.locator(".attnlab-layer select").input_value() == "1"
    assert page.page.locator(".attnlab-line-canvas").count() == 1
    page.page.click("button[data-view=model]")
    assert page.page.locator(".attnlab-thumb.attnlab-current").count() == 1
    page.check_clean()


def test_example_selector_switches_tokens_and_lines(head_page):
    page = head_page.page
    before = head_page.image(".attnlab-line-canvas")
    page.select_option(".attnlab-batch select", "1")
    assert page.locator(".attnlab-q .attnlab-token").first.inner_text() == "b0"
    assert not np.array_equal(head_page.image(".attnlab-line-canvas"), before)
    head_page.check_clean()


def test_a_long_input_loads_as_a_heat_map(browser, tmp_path, shots):
    n = 1024
    generator = torch.Generator().manual_seed(0)
    position = torch.arange(n).float()
    scores = -(position[:, None] - position[None, :]).abs() / 16
    maps = tuple((scores + torch.randn(1, 2, n, n, generator=generator)).softmax(-1)
                 for _ in range(2))
    path = write(tmp_path, viz.head_view(maps, [f"tok{i}" for i in range(n)]))
    page = Page(browser, path)
    assert page.state() == "ready"
    root = page.page.locator("#attnlab-viz")
    assert root.get_attribute("data-mode") == "heatmap"
    assert page.page.locator(".attnlab-token").count() == 0  # no 2,048 token elements
    heat = page.page.locator(".attnlab-heat-canvas").bounding_box()
    assert heat["width"] >= n and heat["height"] >= n  # a pixel per cell at least
    assert not_blank(page.save(shots, "long_input.png"))
    page.page.mouse.move(heat["x"] + 600, heat["y"] + 600)
    assert re.search(r"query \d+ “tok\d+” → key \d+", page.info())
    page.page.click("button[data-view=model]")
    assert page.page.locator(".attnlab-thumb").count() == 4
    page.check_clean()


def test_a_dense_overlay_keeps_its_strongest_links(browser, tmp_path):
    # 12 heads × 128 × 128 = 196,608 links: the overview draws the strongest 12,000 at most.
    generator = torch.Generator().manual_seed(5)
    maps = (torch.randn(1, 12, 128, 128, generator=generator).mul(2).softmax(-1),)
    page = Page(browser, write(tmp_path, viz.head_view(maps, [f"t{i}" for i in range(128)],
                                                       head="all", precision=16)))
    match = re.search(r"Showing the ([\d,]+) strongest of the ([\d,]+) links \(weights from "
                      r"([\d.]+)\)", page.info())
    assert match, page.info()
    kept, total = (int(g.replace(",", "")) for g in match.groups()[:2])
    threshold = float(match.group(3))
    assert total == 12 * 128 * 128 and 0 < kept <= 12_000
    # The links kept are those from the threshold up (printed to 4 decimals; stored in 16
    # bits), and the next histogram bin down (1/1024) would have been too many.
    weights = maps[0].flatten()
    assert int((weights >= threshold + 1e-4).sum()) <= kept <= int((weights >= threshold - 1e-4)
                                                                   .sum())
    assert int((weights >= threshold - 1 / 1024 + 1e-4).sum()) > 12_000
    page.page.hover(".attnlab-q .attnlab-token >> nth=40")
    assert "query 40" in page.info()
    page.check_clean()


def test_hostile_tokens_are_shown_as_text_and_never_run(browser, tmp_path):
    hostile = ['</script><img src=x onerror="window.pwned=1">', "<svg onload=alert(1)>",
               "<b>bold</b>", "&lt;&amp;", '"\'`', "<!--", "\u2028", "</style><style>*{}"]
    generator = torch.Generator().manual_seed(2)
    maps = (torch.rand(1, 1, len(hostile), len(hostile), generator=generator).softmax(-1),)
    page = Page(browser, write(tmp_path, viz.head_view(maps, hostile,
                                                       title='<img src=x onerror="pwned=2">')))
    assert page.state() == "ready"
    assert page.page.evaluate("window.pwned") is None
    assert page.page.locator("#attnlab-viz img, #attnlab-viz svg, #attnlab-viz b").count() == 0
    texts = page.page.locator(".attnlab-q .attnlab-token").evaluate_all(
        "cells => cells.map(c => c.textContent)")
    assert texts == [t.replace("\u2028", "␤") for t in hostile]  # a line break, shown
    assert page.page.locator("h1.attnlab-title").inner_text() == '<img src=x onerror="pwned=2">'
    assert page.page.title() == '<img src=x onerror="pwned=2">'
    page.page.hover(".attnlab-q .attnlab-token >> nth=0")
    assert hostile[0][:17] in page.info()  # cut to 18 characters with "…"
    page.check_clean()


def test_blank_whitespace_and_multi_line_tokens_stay_visible_on_one_line(browser, tmp_path):
    tokens = ["", " ", "\n", "a b", "\t ", "x\ny", "p\u2028q", "bell\x07"]
    maps = (torch.eye(8)[None, None] * 0.9 + 0.1 / 8,)
    page = Page(browser, write(tmp_path, viz.head_view(maps, tokens)))
    cells = page.page.locator(".attnlab-q .attnlab-token")
    assert cells.all_inner_texts() == ["∅", "␣", "↵", "a b", "⇥␣", "x↵y", "p␤q", "bell␇"]
    # Hovering changes the info line's text, never its height (nothing below may move).
    info = page.page.locator(".attnlab-info")
    heights = {info.bounding_box()["height"]}
    for i in range(8):
        cells.nth(i).hover()
        heights.add(info.bounding_box()["height"])
        assert f"query {i} " in page.info()
    assert len(heights) == 1
    page.check_clean()


def test_a_damaged_page_says_so_instead_of_staying_blank(browser, tmp_path):
    page_text = viz.head_view(shifted_maps(layers=1, batch=1), [str(i) for i in range(12)]).html
    data = re.search(r'"data":"([^"]*)"', page_text).group(1)
    path = tmp_path / "damaged.html"
    path.write_text(page_text.replace(data, data[:len(data) // 2]), encoding="utf-8")
    page = Page(browser, path)
    assert page.state() == "error"
    assert "attnlab viewer:" in page.page.locator(".attnlab-error").inner_text()
    assert len(page.errors) == 1 and page.errors[0].startswith("console.error")


def test_cross_attention_has_separate_query_and_key_tokens(browser, tmp_path, shots):
    maps = tuple(torch.rand(1, 3, 4, 7, generator=torch.Generator().manual_seed(l)).mul(4)
                 .softmax(-1) for l in range(2))
    page = Page(browser, write(tmp_path, viz.head_view(maps, ["q0", "q1", "q2", "q3"],
                                                       [f"k{j}" for j in range(7)], head="all")))
    assert page.page.locator(".attnlab-q .attnlab-token").count() == 4
    assert page.page.locator(".attnlab-k .attnlab-token").count() == 7
    page.page.hover(".attnlab-k .attnlab-token >> nth=6")
    assert "key 6 “k6” is looked at by:" in page.info() and "mean of all heads" in page.info()
    page.save(shots, "cross_attention.png")
    page.page.select_option(".attnlab-mode select", "1")
    overlay = page.page.locator(".attnlab-heat-overlay")
    assert float(overlay.get_attribute("data-cell-width")) * 7 <= 720
    page.check_clean()


def test_two_viewers_in_one_notebook_stay_independent(browser, tmp_path, shots):
    first = viz.head_view(shifted_maps(batch=1), [f"x{i}" for i in range(12)])
    second = viz.model_view(shifted_maps(layers=1, batch=1, heads=2, n=5),
                            [f"y{i}" for i in range(5)])
    notebook = ("<!DOCTYPE html><html><body><h3>Cell 1</h3>" + first._repr_html_() +
                "<h3>Cell 2</h3>" + second._repr_html_() + "</body></html>")
    path = tmp_path / "notebook.html"
    path.write_text(notebook, encoding="utf-8")
    page = Page(browser, path)
    frames = [f for f in page.page.frames if f != page.page.main_frame]
    assert len(frames) == 2
    assert [page.state(f) for f in frames] == ["ready", "ready"]
    # Each frame was resized to its own content by its own message.
    page.page.wait_for_function(
        "() => [...document.querySelectorAll('iframe')].every(f => f.style.height !== '')")
    heights = page.page.locator("iframe").evaluate_all(
        "frames => frames.map(f => f.getBoundingClientRect().height)")
    contents = [f.evaluate("document.getElementById('attnlab-viz').getBoundingClientRect()"
                           ".bottom") for f in frames]
    for height, content in zip(heights, contents):
        assert content <= height <= content + 20
    assert heights[0] != heights[1]
    other_before = page.image(".attnlab-thumb", frames[1])
    frames[0].hover(".attnlab-q .attnlab-token >> nth=2")
    assert "query 2" in page.info(frames[0])
    assert np.array_equal(page.image(".attnlab-thumb", frames[1]), other_before)
    assert "thumbnail" in page.info(frames[1])
    page.save(shots, "notebook_two_viewers.png")
    page.check_clean()


def test_a_page_from_the_command_line_loads(browser, tmp_path):
    maps = shifted_maps(layers=1, batch=1, heads=1, n=6)
    viz.save_maps(tmp_path / viz.FILE_NAME, maps, list("abcdef"), title="from a run")
    from attnlab import cli
    assert cli.main(["view", str(tmp_path)]) == 0
    page = Page(browser, tmp_path / "attention.html")
    assert page.state() == "ready"
    assert page.page.locator("h1.attnlab-title").inner_text() == "from a run"
    data = json.loads(page.page.locator("#attnlab-data").text_content())
    assert data["start"]["mode"] == "lines"
    page.check_clean()
