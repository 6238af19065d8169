"""What the browser tests of attnlab.viz's pages share: Debian's chromium driven headless by
Playwright (the system browser; nothing is downloaded), a page opened on a file that records
every console error and request, and a check that a picture is not blank.

Importing this module skips the importing test module when Playwright, Pillow or chromium is
missing. Set ATTNLAB_VIZ_SCREENSHOTS=DIR to keep the screenshots the tests take."""

import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is not installed (pip install playwright)")
Image = pytest.importorskip("PIL.Image", reason="Pillow is not installed")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)",
                allow_module_level=True)

@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = os.environ.get("ATTNLAB_VIZ_SCREENSHOTS")
    folder = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Page:
    """A page opened on a file, recording console errors, uncaught exceptions, dialogs and
    every request (any request but the file itself is aborted and recorded)."""

    def __init__(self, browser, path: Path, viewport=(1200, 900)):
        self.url = path.resolve().as_uri()
        self.page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        self.errors, self.requests, self.blocked = [], [], []
        self.page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}")
                     if m.type in ("error", "assert") else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.on("dialog", lambda d: (self.errors.append(f"dialog: {d.message}"),
                                          d.dismiss()))
        self.page.on("request", lambda r: self.requests.append(r.url))

        def route(route):
            if route.request.url == self.url:
                route.continue_()
            else:
                self.blocked.append(route.request.url)
                route.abort()

        self.page.route("**/*", route)
        self.page.goto(self.url)
        self.page.wait_for_function(
            "() => [...document.querySelectorAll('iframe')].map(f => f.contentDocument)"
            ".concat([document]).every(d => !d || !d.getElementById('attnlab-viz') || "
            "d.getElementById('attnlab-viz').dataset.state !== 'loading')", timeout=30_000)

    def check_clean(self):
        assert self.errors == [], self.errors
        assert self.blocked == [] and self.requests == [self.url], (self.blocked, self.requests)

    def state(self, frame=None):
        return (frame or self.page).locator("#attnlab-viz").get_attribute("data-state")

    def image(self, selector, frame=None) -> np.ndarray:
        png = (frame or self.page).locator(selector).first.screenshot()
        return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)

    def save(self, shots, name):
        self.page.screenshot(path=str(shots / name), full_page=True)
        return np.asarray(Image.open(shots / name).convert("RGB")).astype(int)

    def info(self, frame=None):
        return (frame or self.page).locator(".attnlab-info").inner_text()


def not_blank(pixels: np.ndarray) -> bool:
    """Some ink, and not a flat colour."""
    ink = (pixels.min(axis=-1) < 200).mean()
    return pixels.std() > 10 and ink > 0.005
