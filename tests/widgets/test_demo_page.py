"""The projector demo (``make demo``) in a real browser: Voilà + headless Chromium.

Voilà is started on a free localhost port with the arguments of ``make demo`` on
``notebooks/demo/projector.ipynb``; Debian's Chromium, driven by Playwright, opens the page.
The test waits for the first tab's RelevanceExplorer (toy-vit), moves its layer slider
and checks from screenshots that the picture changed; opens the sentence tab and changes
the class, and checks that the tokens' values changed; opens the translation tab, which
shows the explorer or its "not available yet" notice. Throughout: no code cell on the
page, no error in the widgets or the browser's console, and not one request to another
host than the local server (the page works offline).

Chromium comes from ``scripts/install_chromium.sh`` (``make browser``), as for
``test_browser.py``, whose helpers this file uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from test_browser import CHANGE_S, CHROMIUM_ARGS, _chromium, _differs, _free_port, _require, _shot, _stop, _wait

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = "notebooks/demo/projector.ipynb"
TEMPLATES = "notebooks/demo/share"
#: the arguments `make demo` gives Voilà after the notebook (tests/course/test_teacher_kit.py checks the Makefile)
VOILA_ARGS = [
    "--template=projector",
    "--strip_sources=True",
    "--VoilaConfiguration.extension_allowlist=@voila-dashboards/widgets-manager8",
    "--VoilaConfiguration.extension_allowlist=@jupyter-widgets/jupyterlab-manager",
]
SERVER_START_S = 120
PAGE_S = 300  # kernel start, imports, the first explorer (a loaded 2-core machine)
LOCAL = {"127.0.0.1", "localhost"}


def start_voila(port: int, log: Path, home: Path) -> subprocess.Popen:
    """Voilà on ``port`` serving the demo notebook, in its own process group (stopped by ``_stop``)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["JUPYTER_PATH"] = str(ROOT / TEMPLATES)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipy")):
        env[var] = str(home / sub)
    cmd = [sys.executable, "-m", "voila", NOTEBOOK, *VOILA_ARGS, f"--port={port}", "--no-browser"]
    cmd += ["--Voila.ip=127.0.0.1", "--Voila.port_retries=0"]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "voila/static/voila.js", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def _open_tab(page: Any, title: str) -> None:
    page.locator(".lm-TabBar-tab", has_text=title).first.click()


def _token_values(page: Any) -> list[str]:
    """The visible coloured tokens' tooltips ("'piece': value")."""
    return page.locator("span.trl-token[title]:visible").evaluate_all("ss => ss.map(s => s.title)")


def test_demo_page_in_chromium(tmp_path: Path) -> None:
    chromium = _chromium()
    _require(chromium is not None, "Debian chromium is not installed (bash scripts/install_chromium.sh)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _require(False, "the playwright Python package is not installed")
    pytest.importorskip("voila")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    log = tmp_path / "voila.log"
    t_start = time.perf_counter()
    proc = start_voila(port, log, tmp_path)
    requests: list[str] = []
    console: list[str] = []
    timings: dict[str, float] = {}
    try:
        _wait(lambda: _up(url) or proc.poll() is not None, SERVER_START_S, "Voilà")
        assert proc.poll() is None, f"Voilà exited:\n{log.read_text()[-3000:]}"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: console.append(f"page error: {e}"))
            try:
                page.goto(url, timeout=PAGE_S * 1000)
                img = page.locator("img.trl-image:visible").first
                img.wait_for(state="visible", timeout=PAGE_S * 1000)
                _wait(lambda: img.evaluate("e => e.complete && e.naturalWidth > 0"), CHANGE_S, "the picture")
                timings["page"] = time.perf_counter() - t_start
                assert page.locator(".lm-TabBar-tab").count() == 6
                # no code: Voilà strips the sources; the notebook's code appears nowhere on the page
                assert page.locator(".jp-CodeCell .jp-InputArea:visible, .jp-CodeMirrorEditor:visible").count() == 0
                assert "from widgets.demo" not in page.content() and "projector()" not in page.inner_text("body")

                # 1. toy-vit: one block down on the layer slider, the picture follows
                time.sleep(1.0)
                first = _shot(img)
                handle = page.locator(".trl-layer-slider:visible .noUi-handle").first
                handle.focus()
                handle.press("ArrowLeft")
                _wait(lambda: _differs(_shot(img), first), CHANGE_S, "the picture to follow the slider")

                # 2. the sentence tab: another class, the tokens' values follow
                t0 = time.perf_counter()
                _open_tab(page, "sentence")
                before = _wait(lambda: _token_values(page), PAGE_S, "the sentence's tokens")
                timings["sentence tab"] = time.perf_counter() - t0
                select = page.locator(".trl-class-selector:visible select").first
                current = select.input_value()
                other = next(
                    v for v in select.locator("option").evaluate_all("os => os.map(o => o.value)") if v != current
                )
                select.select_option(value=other)
                after = _wait(
                    lambda: (lambda v: v if v and v != before else None)(_token_values(page)),
                    CHANGE_S,
                    "the tokens to follow the class",
                )
                assert [t.rsplit(": ", 1)[0] for t in after] == [t.rsplit(": ", 1)[0] for t in before]

                # 3. the translation tab: its explorer, or the notice while tiny-s2s is refused
                t0 = time.perf_counter()
                _open_tab(page, "translation")
                shown = page.locator(".trl-generation-explorer:visible, .trl-demo-notice:visible").first
                shown.wait_for(state="visible", timeout=PAGE_S * 1000)
                timings["translation tab"] = time.perf_counter() - t0
                if page.locator(".trl-demo-notice:visible").count():
                    assert "not available yet" in shown.inner_text()

                assert page.locator(".trl-demo-error, .trl-error").count() == 0
            finally:
                try:
                    page.screenshot(path=str(tmp_path / "demo.png"))
                except Exception:  # noqa: BLE001 - only a diagnostic
                    pass
                browser.close()
    finally:
        _stop(proc)
    remote = sorted({u for u in requests if urlparse(u).scheme in ("http", "https", "ws", "wss")} - _local(requests))
    assert not remote, f"requests to other hosts: {remote}"
    assert not console, "errors in the browser's console:\n" + "\n".join(console)
    print("demo page: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))


def _local(urls: list[str]) -> set[str]:
    return {u for u in urls if urlparse(u).hostname in LOCAL}
