"""The workshop slides (``make slides``) open offline in a real browser.

``scripts/make_slides.py`` builds the deck of notebook 6 — the three-hour plan's last — into a temporary
folder, with reveal.js and MathJax from a cached ``npm install`` (``.cache/slides-assets``); headless
Chromium opens it from ``file://`` with every request outside the deck's folder recorded. The deck must
make no such request, reveal.js must run (slides counted, the arrow key moves on), MathJax must typeset the
notebook's formulas and the figures must be there. Needs Debian's chromium (``make browser``), the
playwright package (dev extra) and npm the first time; like the widget browser test, it skips locally
without them and fails when ``CI=true``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import make_slides  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--allow-file-access-from-files",
]
ASSET_CACHE = ROOT / ".cache" / "slides-assets"


def _require(ok: bool, why: str) -> None:
    if ok:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why} (required in CI)")
    pytest.skip(why)


def _chromium() -> str | None:
    for cand in (shutil.which("chromium"), "/usr/bin/chromium", shutil.which("chromium-browser")):
        if cand and Path(cand).exists():
            return cand
    return None


def test_slide_types_follow_headings_and_figures():
    nb = {
        "metadata": {"widgets": {"state": {}}},
        "cells": [
            {"cell_type": "markdown", "source": ["## 2. A section"], "metadata": {}},
            {"cell_type": "markdown", "source": ["prose"], "metadata": {}},
            {"cell_type": "code", "source": [], "metadata": {}, "outputs": [{"data": {"image/jpeg": "..."}}]},
            {"cell_type": "code", "source": [], "metadata": {}, "outputs": [{"text": "numbers"}]},
        ],
    }
    out = make_slides.slide_notebook(nb)
    assert [c["metadata"]["slideshow"]["slide_type"] for c in out["cells"]] == ["slide", "-", "subslide", "-"]
    assert "widgets" not in out["metadata"] and "widgets" in nb["metadata"]  # the input is left as it was


def test_the_plan_deck_opens_offline_in_chromium(tmp_path):
    chromium = _chromium()
    _require(chromium is not None, "Debian chromium is not installed (bash scripts/install_chromium.sh)")
    _require(importlib.util.find_spec("playwright") is not None, "the playwright Python package is not installed")
    have_assets = all((ASSET_CACHE / "node_modules" / p).exists() for p in make_slides.ASSETS.values())
    _require(have_assets or shutil.which("npm") is not None, "npm is needed once to fetch reveal.js and MathJax")
    from playwright.sync_api import sync_playwright

    assert make_slides.main(["--out", str(tmp_path), "--notebooks", "06", "--assets", str(ASSET_CACHE)]) == 0
    deck = tmp_path / "06_explaining_a_vit.slides.html"
    page_text = deck.read_text(encoding="utf-8")
    assert make_slides.external_urls(page_text) == []
    nb = json.loads((ROOT / "notebooks" / "06_explaining_a_vit.ipynb").read_text(encoding="utf-8"))
    headings = sum("".join(c["source"]).lstrip().startswith("#") for c in nb["cells"] if c["cell_type"] == "markdown")
    figures = sum(k.startswith("image/") for c in nb["cells"] for o in c.get("outputs", []) for k in o.get("data", {}))

    outside, failed = [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.on(
                "request",
                lambda r: (
                    None
                    if r.url.startswith(f"file://{tmp_path}") or r.url.startswith("data:")
                    else outside.append(r.url)
                ),
            )
            page.on("requestfailed", lambda r: failed.append(r.url))
            page.goto(deck.as_uri())
            page.wait_for_function("document.querySelector('.reveal.ready') !== null", timeout=60_000)  # reveal.js ran
            assert page.evaluate("document.querySelectorAll('.reveal .slides > section').length") == headings
            assert page.evaluate("document.querySelectorAll('.reveal section img').length") == figures
            first = page.evaluate("document.querySelector('.reveal .slides > section.present h1').textContent")
            assert first.startswith("6 · Explaining a Vision Transformer")
            page.keyboard.press("ArrowRight")
            page.wait_for_function(
                "document.querySelectorAll('.reveal .slides > section')[1].classList.contains('present')",
                timeout=10_000,
            )
            page.wait_for_function("document.querySelectorAll('.MathJax_CHTML').length > 0", timeout=60_000)
            page.screenshot(path=str(tmp_path / "slide.png"))
        finally:
            browser.close()
    assert outside == [], f"the deck reached outside its folder: {outside[:5]}"
    assert failed == [], f"requests that failed: {failed[:5]}"
