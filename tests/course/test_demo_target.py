"""`make demo` (the projector page, docs/TEACHING.md): the command it runs, checked with `make -n`.

The browser test (tests/widgets/test_demo_page.py) starts Voilà with the same arguments; this test
keeps the two, the template folder and the documentation in step.
"""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

from test_teacher_kit import make_dry_run

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = "notebooks/demo/projector.ipynb"


def voila_line(*args: str) -> list[str]:
    """The words of the one line of `make -n demo ARGS` that starts Voilà."""
    lines = [ln for ln in make_dry_run("-B", "demo", *args) if "/voila " in ln]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def browser_test_args() -> list[str]:
    """VOILA_ARGS of tests/widgets/test_demo_page.py, read from its source (importing it needs playwright)."""
    tree = ast.parse((ROOT / "tests" / "widgets" / "test_demo_page.py").read_text())
    (value,) = [n.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "VOILA_ARGS"]
    return ast.literal_eval(value)


def test_make_demo_runs_voila_on_the_demo_notebook_with_the_port_and_demo_args():
    words = voila_line("DEMO_PORT=9123", "DEMO_ARGS=--Voila.ip=0.0.0.0 --no-browser")
    env, voila = words[0], words[1]
    assert env == f"JUPYTER_PATH={ROOT}/notebooks/demo/share"
    assert voila == ".venv/bin/voila" and words[2] == NOTEBOOK
    assert words[-3:] == ["--port=9123", "--Voila.ip=0.0.0.0", "--no-browser"]
    assert words[3:-3] == browser_test_args()  # what the browser test runs
    assert "--no-browser" not in voila_line()  # on a laptop the page opens in its browser
    assert "--port=8866" in voila_line()


def test_the_demo_template_and_notebook_are_there():
    template = ROOT / "notebooks" / "demo" / "share" / "voila" / "templates" / "projector"
    assert (template / "conf.json").is_file() and (template / "index.html.j2").is_file()
    assert "--template=projector" in browser_test_args()
    assert "from widgets.demo import projector" in (ROOT / NOTEBOOK).read_text()


def test_make_demo_is_documented():
    teaching = (ROOT / "docs" / "TEACHING.md").read_text()
    assert "make demo" in teaching and "DEMO_ARGS" in teaching and "DEMO_PORT" in teaching
    assert "make demo" in (ROOT / "README.md").read_text()
