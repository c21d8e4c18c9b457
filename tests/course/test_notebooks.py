"""The course notebooks: every one of them is validated by nbval.

``test_course_passes_nbval`` runs nbval twice, with the CPU's own ATen kernels and with the portable ones
(``ATEN_CPU_CAPABILITY=default``; lax mode: only cells tagged
``nbval-check-output`` are compared with their stored outputs, every cell
must run without error) on the whole ``notebooks/`` folder in a subprocess,
with the sanitiser ``notebooks/nbval_sanitize.cfg``. The other tests check
that this run covers every notebook and that the notebooks follow the
course's conventions (stored outputs, python3 kernel, seeds, thread count,
checked cells, exercises that check and reveal nothing).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from notebook_text import stored_output_text

ROOT = Path(__file__).resolve().parents[2]
NB_DIR = ROOT / "notebooks"
SANITIZE = NB_DIR / "nbval_sanitize.cfg"
NOTEBOOKS = sorted(p for p in NB_DIR.glob("*.ipynb"))
#: The nbval cell tag of the cells whose stored outputs are compared (lax mode).
CHECK_TAG = "nbval-check-output"

#: The exact command CI uses (also usable by hand from the repository root).
NBVAL_ARGS = [
    "--nbval-lax",
    "--nbval-current-env",
    "--nbval-sanitize-with",
    str(SANITIZE.relative_to(ROOT)),
    "-p",
    "no:cacheprovider",
    str(NB_DIR.relative_to(ROOT)) + "/",
]


#: ATen's CPU kernels the nbval run is repeated with: the machine's own, and the portable ones that every x86 and
#: ARM CPU has. A checked output that depends on the CPU (float32 round-off of an ill-conditioned method) fails here
#: before it fails on a learner's laptop or on the machine that reviews a submission (docs/TEACHING.md).
KERNELS = {"native": {}, "portable": {"ATEN_CPU_CAPABILITY": "default"}}


def _pytest(*args: str, timeout: int = 1200, **env_vars: str) -> subprocess.CompletedProcess:
    # The stored outputs are the offline path's: ``ONLINE = hub_reachable()`` must be False in this run
    # even on a machine that can reach the hub, or the checked cells would compare other models' numbers.
    env = dict(os.environ, HF_HUB_OFFLINE="1", **env_vars)
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _code(nb: dict) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def test_there_is_a_course():
    assert len(NOTEBOOKS) >= 3, "the course notebooks are missing"
    assert SANITIZE.is_file()


def test_every_notebook_is_part_of_the_nbval_run():
    """Collect with exactly the arguments of the nbval run: each notebook must contribute cells."""
    res = _pytest("--collect-only", "-q", *NBVAL_ARGS, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    collected = {line.split("::")[0] for line in res.stdout.splitlines() if ".ipynb::" in line}
    expected = {str(p.relative_to(ROOT)) for p in NOTEBOOKS}
    missing = expected - collected
    assert not missing, f"notebooks not validated by nbval: {sorted(missing)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_conventions(path: Path):
    nb = _load(path)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    code = _code(nb)
    setup = "\n".join(code[:3])
    assert "torch.set_num_threads(1)" in setup and "manual_seed" in setup, "seed and thread count at the top"
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in cells if "".join(c["source"]).strip()), (
        "store outputs: execute the notebook and save it"
    )
    # checked cells carry the cell tag (metadata), so learners see no test machinery in the code
    assert any(CHECK_TAG in c.get("metadata", {}).get("tags", []) for c in cells), (
        f"no cell carries checked numbers (cell tag {CHECK_TAG!r})"
    )
    assert not any("NBVAL_" in src for src in code), f"nbval markers are cell tags ({CHECK_TAG!r}), not comments"
    for cell in cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", f"{path.name} was saved with an error output"
    text = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert re.search(r"(?i)exercise", text), "each notebook has exercises"
    assert nb["cells"][0]["cell_type"] == "markdown", "prose before code"


def _exercises():
    sys.path.insert(0, str(NB_DIR))
    try:
        import solutions

        return solutions.all_exercises()
    finally:
        sys.path.remove(str(NB_DIR))


def test_every_exercise_is_checked_in_its_notebook():
    """Each notebook's exercises are Exercise objects, each with a check cell; nothing reveals a solution."""
    exercises = _exercises()
    used = set()
    for path in NOTEBOOKS:
        code = "\n".join(_code(_load(path)))
        assert "reveal(" not in code and ".solution(" not in code, f"{path.name} reveals a solution"
        names = set(re.findall(r"\b(ex\d+_\d+)\.check\(", code))
        number = int(path.name[:2])
        own = {n for n in exercises if n.startswith(f"ex{number}_")}
        assert names == own, f"{path.name}: check cells for {sorted(names)}, exercises {sorted(own)}"
        used |= names
    assert used == set(exercises)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_opens_with_goals_prerequisites_and_time(path: Path):
    first = "".join(_load(path)["cells"][0]["source"])
    for word in ("Learning goals", "Prerequisites", "Time"):
        assert f"**{word}" in first, f"{path.name}: the first cell names no {word.lower()}"
    assert re.search(r"\*\*Time\*\* about \d+ min", first), "time in minutes"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_states_its_measured_run_time(path: Path):
    """The header gives the measured execution time, and it is the one of the teacher's table (TEACHING.md)."""
    first = "".join(_load(path)["cells"][0]["source"])
    found = re.search(r"Executing the whole notebook takes about (\d+) s \(measured", first)
    assert found, f"{path.name}: the header states no measured run time"
    teaching = (ROOT / "docs" / "TEACHING.md").read_text(encoding="utf-8")
    row = re.search(rf"^\| {int(path.name[:2])} \| [^|]+ \| (\d+) s \|", teaching, re.M)
    assert row and row.group(1) == found.group(1), f"{path.name}: {found.group(1)} s, TEACHING.md's table differs"


#: a path that leaves the notebook's folder: a parent folder, the repository's docs, an absolute path
OUTSIDE = re.compile(r"""Path\(\s*["']\.\.["']|["']\.\./|["']docs/|["']/(?:work|home|tmp)/""")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_reads_nothing_outside_its_folder(path: Path):
    """A copy of notebooks/ alone (the learner's copy, a hub image) runs and shows everything: the code reads
    files through the package (lrp_core.evaluation.published, lrp_core.data), never ../docs or a fixed path."""
    for cell in _load(path)["cells"]:
        if cell["cell_type"] == "code":
            found = OUTSIDE.search("".join(cell["source"]))
            assert found is None, f"{path.name} cell {cell.get('id')} reads {found.group(0)!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_exercise_cells_are_stored_unattempted(path: Path):
    """The stored check cells say "not attempted yet" and nothing else."""
    nb = _load(path)
    for k, cell in enumerate(nb["cells"]):
        src = "".join(cell["source"])
        if cell["cell_type"] != "code" or not re.search(r"\bex\d+_\d+\.check\(", src):
            continue
        assert re.search(r"= \.\.\.|^\s+\.\.\.", src, re.M), "the stored exercise is a placeholder"
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
        assert "not attempted yet" in text and "✓" not in text and "✗" not in text, text
        # the exercise's text: the nearest markdown cell above the check cell that names it
        # (an earlier page may name the same exercise as an example, e.g. notebook 0's guide)
        markdown = [("".join(c["source"])) for c in nb["cells"][:k] if c["cell_type"] == "markdown"]
        name = re.search(r"\b(ex\d+_\d+)\.check\(", src).group(1)
        intro = next(m for m in reversed(markdown) if f"{name}.hint()" in m)
        assert "difficulty" in intro and re.search(r"about \d+ min", intro) and f"{name}.solution()" in intro


def test_no_solution_code_in_stored_outputs():
    """No line of any reference solution appears in a stored output (the results: tests/course)."""
    import inspect

    outputs = {p.name: stored_output_text(_load(p)) for p in NOTEBOOKS}
    for name, ex in _exercises().items():
        lines = [ln.strip() for ln in inspect.getsource(ex.reference).splitlines()]
        lines = [ln for ln in lines if len(ln) >= 25 and not ln.startswith(("#", '"""'))]
        assert lines, name
        for nb_name, text in outputs.items():
            leaked = [ln for ln in lines if ln in text]
            assert not leaked, f"{nb_name} shows solution code of {name}: {leaked[:2]}"


@pytest.mark.slow
@pytest.mark.parametrize("kernels", KERNELS)
def test_course_passes_nbval(kernels: str):
    res = _pytest(*NBVAL_ARGS, **KERNELS[kernels])
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, f"nbval failed:\n{tail}"
    assert re.search(r"\d+ passed", res.stdout), tail
