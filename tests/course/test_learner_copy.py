"""The learner's copy (``scripts/learner_copy.py``, ``make learner-copy``): no solution in plain text, checkers
that still check, and notebooks that pass nbval from the copy."""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "notebooks"))

import learner_copy  # noqa: E402
import solutions  # noqa: E402

EXERCISES = solutions.all_exercises()


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    return learner_copy.write_copy(tmp_path_factory.mktemp("room"))


def _solution_lines() -> set[str]:
    """Every line of every function the solution modules define (reference computations, mistakes, helpers)
    that is specific enough to identify them: 25 characters or more, comments and docstrings included."""
    lines: set[str] = set()
    for path in sorted((ROOT / "notebooks" / "solutions").glob("nb*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        source = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.Lambda)):
                for ln in source[node.lineno - 1 : node.end_lineno]:
                    if len(ln.strip()) >= 25:
                        lines.add(ln.strip())
    return lines


def test_the_copy_has_every_notebook_and_checker(copy):
    assert sorted(p.name for p in copy.glob("*.ipynb")) == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in (copy / "solutions").glob("*.py")) == sorted(
        p.name for p in (ROOT / "notebooks" / "solutions").glob("*.py")
    )


def test_no_solution_code_in_plain_text(copy):
    """No line of any solution function appears in any file of the copy, and the copy's modules define no
    function (their code is only unpacked at import)."""
    lines = _solution_lines()
    assert len(lines) > 300, "the solution modules should give many identifying lines"
    for path in sorted(p for p in copy.rglob("*") if p.is_file()):
        text = {ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()}
        found = sorted(lines & text)
        assert not found, f"{path.relative_to(copy)} shows solution code: {found[:3]}"
    for path in sorted((copy / "solutions").glob("nb*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Lambda, ast.ClassDef))]
        assert not defined, f"{path.name} defines code in plain text"


def test_the_check_finds_solution_code_left_in_plain_text(tmp_path):
    """The plain-text test above fails on a copy that ships a solution module as it is."""
    dest = learner_copy.write_copy(tmp_path, notebooks=[3])
    (dest / "solutions" / "nb03.py").write_text((ROOT / "notebooks" / "solutions" / "nb03.py").read_text())
    with pytest.raises(AssertionError, match="shows solution code"):
        test_no_solution_code_in_plain_text(dest)


_PROBE = textwrap.dedent("""
    import contextlib, io, json, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    import solutions
    from solutions import ex1_1, ex2_3, ex3_3
    out = {"n": len(solutions.all_exercises())}
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        ex3_3.solution()
    out["before"] = buf.getvalue()
    out["right"] = ex3_3.verdict((2.418046712875366, 7.185857772827148))
    out["near"] = ex3_3.verdict((2.418046712875366, 1.4536))
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        ex3_3.solution()
    out["after"] = buf.getvalue()
    out["fn_right"] = ex2_3.verdict(lambda x, W, R: x * ((R / (x @ W.clamp(min=0).T)) @ W.clamp(min=0)))
    out["fn_wrong"] = ex2_3.verdict(lambda x, W, R: x * ((R / (x @ W.T)) @ W))
    out["value_wrong"] = ex1_1.verdict(torch.zeros(1, 4))
    print(json.dumps(out))
""")


def test_the_copy_checks_without_showing_solutions(copy):
    """Imported from the copy alone: all exercises are there, right answers pass, near misses fail with their
    message, and ``solution()`` prints no code — only the discussion, once the exercise is solved."""
    import json

    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's library, the copy's checkers
    res = subprocess.run(
        [sys.executable, "-c", _PROBE, str(copy)], cwd=copy, capture_output=True, text=True, timeout=120, env=env
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["n"] == len(EXERCISES)
    assert out["right"][0] is True
    assert out["near"][0] is False and "rules.add_normalized" in out["near"][1]
    assert "teacher's copy" in out["near"][1] and ".solution()" not in out["near"][1]
    assert out["fn_right"][0] is True
    assert out["fn_wrong"][0] is False and "generic z-rule" in out["fn_wrong"][1]
    assert out["value_wrong"][0] is False and "all zeros" in out["value_wrong"][1]
    assert "teacher's copy" in out["before"] and "def " not in out["before"]
    ex = EXERCISES["ex3_3"]
    assert textwrap.fill(ex.discussion, 100) in out["after"] and "def " not in out["after"]


def test_the_teachers_copy_still_shows_solutions():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        EXERCISES["ex3_3"].solution()
    assert inspect.getsource(EXERCISES["ex3_3"].reference) in out.getvalue()


def test_a_notebook_with_exercises_passes_nbval_from_the_copy(tmp_path):
    """Notebook 3 (three exercises) runs from the learner's copy and its checked cells match (nbval, lax)."""
    dest = learner_copy.write_copy(tmp_path, notebooks=[3])
    (nb,) = dest.glob("03_*.ipynb")
    # the kernel imports this checkout's library (the copy holds only the notebooks and checkers)
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--nbval-lax",
            "--nbval-current-env",
            "--nbval-sanitize-with",
            str(dest / "nbval_sanitize.cfg"),
            "-p",
            "no:cacheprovider",
            str(nb),
        ],
        cwd=dest,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "failed" not in res.stdout


def test_notebook_9_shows_the_published_tables_from_the_copy(tmp_path):
    """Notebook 9 section 4 shows the published tables from a copy of the notebooks alone (no ../docs)."""
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    dest = learner_copy.write_copy(tmp_path, notebooks=[9])
    (path,) = dest.glob("09_*.ipynb")
    nb = nbformat.read(path, as_version=4)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    old = {k: os.environ.get(k) for k in (*env, "HF_HUB_OFFLINE")}
    os.environ.update(env, HF_HUB_OFFLINE="1")
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(dest)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and "published(name)" in c.source]
    shown = ["".join(o["data"]["text/markdown"]) for o in cell.outputs if "text/markdown" in o.get("data", {})]
    assert [m.split(" (")[0] for m in shown] == [
        "**toy-vit**",
        "**dinov2-scenes**",
        "**dinov2-scenes-avg**",
        "**minilm-sentiment**",
    ]
    assert all("| random |" in m for m in shown)


def test_make_has_the_target():
    assert "learner-copy:" in (ROOT / "Makefile").read_text(encoding="utf-8")
    importlib.import_module("learner_copy")
