"""Walk the stored course in a real browser: each notebook exported to HTML, opened in headless Chromium.

A developer tool for checking what a learner sees (issue #20): it prints, per notebook, the pixel size
of every picture the browser shows, and saves a full-page screenshot per notebook for looking at.

    python scripts/browser_walk.py [--out /tmp/walk] [notebooks/07_cdam.ipynb ...]

Needs Debian's chromium (``make browser``) and the dev extras (playwright, nbconvert). Widget outputs
are shown by the HTML export as their stored still picture or not at all; the widgets themselves are
tested live in ``tests/widgets/test_browser.py``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def export_html(notebooks: list[Path], out: Path) -> list[Path]:
    """Each notebook as it is stored (not re-executed) -> ``out/<name>.html``."""
    for nb in notebooks:
        subprocess.run(
            [sys.executable, "-m", "nbconvert", "--to", "html", "--output-dir", str(out), str(nb)],
            check=True,
            capture_output=True,
        )
    return [out / (nb.stem + ".html") for nb in notebooks]


def walk(pages: list[Path], out: Path, chromium: str = "/usr/bin/chromium") -> dict[str, list[tuple[int, int]]]:
    """Open every page; return the shown (width, height) of its pictures and save a full-page screenshot."""
    from playwright.sync_api import sync_playwright

    shown: dict[str, list[tuple[int, int]]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for html in pages:
            page.goto(html.as_uri())
            page.wait_for_timeout(300)  # let the images decode before measuring them
            boxes = [img.bounding_box() for img in page.query_selector_all("img")]
            shown[html.stem] = [(round(b["width"]), round(b["height"])) for b in boxes if b]
            page.screenshot(path=str(out / (html.stem + ".png")), full_page=True)
        browser.close()
    return shown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook of the course")
    ap.add_argument("--out", type=Path, default=Path("/tmp/browser_walk"))
    args = ap.parse_args(argv)
    notebooks = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    args.out.mkdir(parents=True, exist_ok=True)
    for name, sizes in walk(export_html(notebooks, args.out), args.out).items():
        print(f"{name}: pictures shown (w×h px) {sizes}")
    print(f"screenshots in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
