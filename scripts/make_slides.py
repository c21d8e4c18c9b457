"""Slides of the three-hour plan that work offline: ``make slides`` -> build/slides/index.html.

    python scripts/make_slides.py [--out build/slides] [--notebooks 00 01 ...] [--assets DIR]

Each notebook of the plan (docs/TEACHING.md, "A three-hour workshop": notebooks 0-6) becomes a reveal.js
deck (nbconvert's slides exporter) from its *stored* outputs — nothing is executed. Every heading starts a
slide, every figure a sub-slide (below it); long slides scroll. ``index.html`` lists the decks in the
plan's order with their times.

Offline: nbconvert's template loads reveal.js, require.js, jQuery and MathJax from CDNs; here every one
of them points at a local copy in ``<out>/assets`` (from the npm registry, pinned in ``ASSETS``, fetched
once by ``npm install``; ``--assets`` reuses a folder that already has them). The Mermaid import and the
widget loader, which the course's slides do not need, are left out, and the notebooks' widget state is
dropped so that each widget shows its stored still picture. The decks then make no request outside their
folder (``tests/scripts/test_slides.py`` opens one in headless Chromium and checks that).
"""

from __future__ import annotations

import argparse
import copy
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"

#: npm packages (pinned) -> the file or folder of each that the decks load
ASSETS = {
    "reveal.js@4.6.1": "reveal.js",
    "requirejs@2.3.7": "requirejs/require.js",
    "jquery@3.7.1": "jquery/dist/jquery.min.js",
    "mathjax@2.7.7": "mathjax",
}

#: the three-hour plan: (notebook prefix, time slot) — docs/TEACHING.md
PLAN = [
    ("00", "0:00–0:10"),
    ("01", "0:10–0:40"),
    ("02", "0:40–1:00"),
    ("03", "1:00–1:25"),
    ("04", "1:35–2:10"),
    ("05", "2:10–2:35"),
    ("06", "2:35–3:00"),
]


def fetch_assets(dest: Path) -> Path:
    """``npm install`` the pinned packages of ``ASSETS`` into ``dest`` (once); returns its node_modules."""
    modules = dest / "node_modules"
    if all((modules / path).exists() for path in ASSETS.values()):
        return modules
    if shutil.which("npm") is None:
        raise SystemExit(
            "make_slides: npm is needed once to fetch reveal.js and MathJax (apt-get install npm), "
            "or pass --assets with a folder that has them"
        )
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(dest), *ASSETS], check=True
    )
    return modules


def slide_notebook(nb: dict) -> dict:
    """A copy of ``nb`` with reveal.js slide types: a heading starts a slide, a figure a sub-slide."""
    nb = copy.deepcopy(nb)
    nb.get("metadata", {}).pop("widgets", None)  # no widget state: widgets show their stored picture
    for cell in nb["cells"]:
        text = "".join(cell["source"]).lstrip()
        kind = "-"
        if cell["cell_type"] == "markdown" and text.startswith("#"):
            kind = "slide"
        elif any(k.startswith("image/") for out in cell.get("outputs", []) for k in out.get("data", {})):
            kind = "subslide"
        cell.setdefault("metadata", {})["slideshow"] = {"slide_type": kind}
    return nb


def export(nb: dict, assets: str) -> str:
    """The deck's HTML; every script and style sheet from ``assets`` (a path relative to the deck)."""
    import nbformat
    from nbconvert.exporters import SlidesExporter

    # theme "white": its fonts ship with reveal.js ("simple" imports web fonts from the network)
    exporter = SlidesExporter(
        reveal_url_prefix=f"{assets}/reveal.js",
        reveal_scroll=True,
        reveal_theme="white",
        require_js_url=f"{assets}/requirejs/require.js",
        jquery_url=f"{assets}/jquery/dist/jquery.min.js",
        mathjax_url=f"{assets}/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe",
    )
    body, _ = exporter.from_notebook_node(nbformat.reads(json.dumps(nb), as_version=4))
    # the template imports Mermaid from a CDN in a module script; the course has no Mermaid diagram
    body = re.sub(r"<script type=\"module\">\s*import mermaid.*?</script>", "", body, flags=re.S)
    # and it loads the widget renderer from a CDN when it finds widget state (dropped above)
    body = re.sub(r"<script>\s*\(function\(\) \{\s*function addWidgetsRenderer.*?</script>", "", body, flags=re.S)
    return body


def external_urls(page: str) -> list[str]:
    """The http(s) addresses a page would load: ``src=``/``href=`` of scripts, styles and links, and imports."""
    loads = re.findall(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=[\"'](https?://[^\"']+)", page)
    loads += re.findall(r"import [^;]*?from ['\"](https?://[^'\"]+)", page)
    loads += re.findall(r"Src\s*=\s*['\"](https?://[^'\"]+)", page)  # the widget loader's script address
    return loads


def index_page(decks: list[tuple[str, str, str]]) -> str:
    """The plan's table of contents: (time slot, title, file) per deck."""
    rows = "\n".join(
        f'<li><span>{html.escape(slot)}</span> <a href="{html.escape(f)}">{html.escape(title)}</a></li>'
        for slot, title, f in decks
    )
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>Transformer Relevance Lab — slides</title>'
        "<style>body{font-family:sans-serif;max-width:40em;margin:2em auto}li{margin:.4em 0}"
        "span{display:inline-block;width:7em;color:#555}</style></head><body>"
        "<h1>Transformer Relevance Lab</h1><p>The three-hour workshop (docs/TEACHING.md), one deck per notebook. "
        "Arrow keys move between slides; <kbd>↓</kbd> shows a slide's figures.</p>"
        f"<ol>\n{rows}\n</ol></body></html>\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "build" / "slides")
    p.add_argument("--notebooks", nargs="*", default=[n for n, _ in PLAN], help="notebook prefixes (default: the plan)")
    p.add_argument("--assets", type=Path, help="a folder whose node_modules has ASSETS (default: <out>/assets)")
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    modules = fetch_assets(args.assets.resolve() if args.assets else out / "assets")
    local = out / "assets" / "node_modules"
    if modules.resolve() != local.resolve():  # the decks' folder holds its own copy
        shutil.rmtree(local, ignore_errors=True)
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(modules, local)
    slots = dict(PLAN)
    decks = []
    for prefix in args.notebooks:
        path = next(NB_DIR.glob(f"{prefix}_*.ipynb"))
        nb = json.loads(path.read_text(encoding="utf-8"))
        page = export(slide_notebook(nb), "assets/node_modules")
        leaks = external_urls(page)
        if leaks:
            raise SystemExit(f"make_slides: {path.name} would load {leaks[:3]} from the network")
        target = out / f"{path.stem}.slides.html"
        target.write_text(page, encoding="utf-8")
        title = next(
            ("".join(c["source"]).lstrip("# ").splitlines()[0] for c in nb["cells"] if c["cell_type"] == "markdown"),
            path.stem,
        )
        decks.append((slots.get(prefix, ""), title, target.name))
        print(f"{target.relative_to(out)}: {len(page) / 1e6:.1f} MB")
    (out / "index.html").write_text(index_page(decks), encoding="utf-8")
    print(f"open {out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
