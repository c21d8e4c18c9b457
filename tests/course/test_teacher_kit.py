"""The teacher's kit stays in step with the way CI installs: Makefile, Dockerfile, environment.yml, docs.

No Docker engine is needed: the Dockerfile is read, not built. What is checked is that it
installs by the Makefile's own `make install`, copies everything that target and the course
need, and starts the course the Makefile's way.
"""

from __future__ import annotations

import fnmatch
import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def make_dry_run(*args: str) -> list[str]:
    """The commands `make -n ARGS` would run (nothing is executed)."""
    if shutil.which("make") is None:
        pytest.fail("`make` is not installed: the README's two commands need it")
    out = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "--no-print-directory", *args], capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def pip_installs(lines: list[str]) -> list[str]:
    """The arguments of each `pip install` line, after pip's own flags."""
    found = []
    for line in lines:
        m = re.search(r"-m pip install (.*)$", line)
        if m:
            args = m.group(1).replace('"', "").split()
            found.append(" ".join(a for a in args if a not in ("--disable-pip-version-check", "-q")))
    return found


# ---------------------------------------------------------------- Makefile
def test_lab_adds_allow_root_only_for_root_and_passes_lab_args():
    as_root = [ln for ln in make_dry_run("lab", "USER_ID=0") if "jupyter lab" in ln]
    as_user = [
        ln for ln in make_dry_run("lab", "USER_ID=1000", "LAB_ARGS=--ip 0.0.0.0 --no-browser") if "jupyter lab" in ln
    ]
    assert len(as_root) == len(as_user) == 1
    assert "--allow-root" in as_root[0].split()
    assert "--allow-root" not in as_user[0].split()
    assert as_user[0].split()[-3:] == ["--ip", "0.0.0.0", "--no-browser"]
    assert "notebooks/00_welcome.ipynb" in as_user[0]


def test_wheelhouse_install_uses_only_the_wheelhouse():
    online = pip_installs(make_dry_run("-B", "install"))
    offline = pip_installs(make_dry_run("-B", "install", "WHEELHOUSE=/media/usb/wheelhouse"))
    assert len(online) == len(offline) == 3  # pip itself, torch pair, the project
    assert not any("--no-index" in a for a in online)
    for on, off in zip(online, offline):
        assert off == f"--no-index --find-links /media/usb/wheelhouse {on}"  # the same steps, offline


def test_wheelhouse_target_downloads_what_install_installs():
    install = pip_installs(make_dry_run("-B", "install"))
    downloads = [
        re.sub(r"^.*pip download .*?-d \S+ ", "", ln).replace('"', "").strip()
        for ln in make_dry_run("-B", "wheelhouse")
        if "pip download" in ln
    ]
    for step in install[1:]:  # -r requirements..., -c ... -e .[dev]
        wanted = step.replace("-e ", "")
        assert wanted in downloads, (wanted, downloads)
    assert any(d.startswith("pip ") and "setuptools" in d and "wheel" in d for d in downloads)  # build backend


# ---------------------------------------------------------------- environment.yml
def environment_pip_lines() -> list[str]:
    text = (ROOT / "environment.yml").read_text(encoding="utf-8")
    block = text.split("- pip:", 1)[1]
    return [ln.strip()[2:].strip() for ln in block.splitlines() if ln.strip().startswith("- ")]


def test_environment_yml_installs_what_the_makefile_installs():
    install = pip_installs(make_dry_run("-B", "install"))[1:]  # without `--upgrade pip`
    make_args = " ".join(install).split()
    env_args = " ".join(environment_pip_lines()).split()
    # the same options and files: -r requirements-torch.txt, -c requirements-torch.txt, -e .[dev]
    pairs = lambda args: sorted(zip(args[::2], args[1::2]))  # noqa: E731
    assert pairs(env_args) == pairs(make_args)


def python_versions() -> dict[str, str]:
    env = re.search(r"^\s*-\s*python=(\d+\.\d+)", (ROOT / "environment.yml").read_text(), flags=re.M).group(1)
    docker = re.search(r"^FROM python:(\d+\.\d+)", (ROOT / "Dockerfile").read_text(), flags=re.M).group(1)
    return {"environment.yml": env, "Dockerfile": docker}


def test_python_versions_agree_and_satisfy_requires_python():
    versions = python_versions()
    assert len(set(versions.values())) == 1, versions
    need = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    low = tuple(int(p) for p in re.search(r">=\s*(\d+\.\d+)", need).group(1).split("."))
    assert tuple(int(p) for p in versions["Dockerfile"].split(".")) >= low


# ---------------------------------------------------------------- Dockerfile
def dockerfile_runs() -> list[str]:
    """The RUN instructions, continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    return [ln[4:].strip() for ln in text.splitlines() if ln.startswith("RUN ")]


def test_dockerfile_installs_with_make_install_as_ci_does():
    runs = dockerfile_runs()
    installs = [r for r in runs if re.search(r"\bmake install\b", r)]
    assert len(installs) == 1
    # no second way of installing the project or torch next to the Makefile's
    for r in runs:
        if "pip install" in r:
            assert "requirements-torch.txt" in r and "-r " not in r and " -e " not in r, r
    # the install runs after the whole repository is copied in
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^COPY .*\. \$\{LAB\}", text, flags=re.M)
    copy = re.search(r"^COPY ", text, flags=re.M).start()
    install = re.search(r"^RUN make install\b", text, flags=re.M).start()
    assert copy < install


def test_dockerfile_starts_the_course_the_makefile_way():
    cmd = re.search(r"^CMD (.*)$", (ROOT / "Dockerfile").read_text(), flags=re.M).group(1)
    assert '"make", "lab"' in cmd and "--ip 0.0.0.0" in cmd and "--no-browser" in cmd


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def excluded(path: str, patterns: list[str]) -> bool:
    """Docker's rule for plain patterns: a path is left out if it or a parent folder matches."""
    parts = path.split("/")
    for pat in patterns:
        for k in range(1, len(parts) + 1):
            head = "/".join(parts[:k])
            if (
                fnmatch.fnmatch(head, pat)
                or fnmatch.fnmatch(head, pat.removeprefix("**/"))
                or (pat.startswith("**/") and fnmatch.fnmatch(parts[k - 1], pat[3:]))
            ):
                return True
    return False


def test_dockerignore_keeps_what_install_and_the_course_need():
    patterns = dockerignore_patterns()
    assert not any(p.startswith("!") for p in patterns)  # the simple matcher above suffices
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:  # not a git checkout: the folders' files
        tracked = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    needed = [
        p
        for p in tracked
        if p in ("pyproject.toml", "requirements-torch.txt", "README.md", "Makefile")
        or p.split("/")[0] in ("lrp_core", "widgets", "notebooks", "scripts")
    ]
    assert "lrp_core/__init__.py" in needed and "notebooks/00_welcome.ipynb" in needed
    assert [p for p in needed if excluded(p, patterns)] == []
    for local in (
        ".venv",
        ".venv/bin/python",
        "wheelhouse/torch.whl",
        ".git/HEAD",
        "results/x.json",
        "lrp_core/__pycache__/api.cpython-311.pyc",
    ):
        assert excluded(local, patterns), local


# ---------------------------------------------------------------- docs
def test_readme_first_screen_has_the_picture_the_two_commands_and_the_course_map():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = readme.split("\n## ", 4)  # the opening and the first sections
    top = "\n## ".join(first[:4])
    for img in re.findall(r"\]\((docs/images/[^)]+\.png)\)", top):
        assert (ROOT / img).is_file(), img
    assert len(re.findall(r"docs/images/[^)]+\.png", top)) >= 2
    assert "make lab" in top and "make test" in top
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert f"notebooks/{nb.name}" in top, f"the course map lacks {nb.name}"


def test_docs_point_to_the_answer_key():
    assert "(docs/ANSWERS.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(ANSWERS.md)" in (ROOT / "docs" / "TEACHING.md").read_text(encoding="utf-8")  # a link beside it


def plan_rows(title: str) -> list[str]:
    """The table rows of one plan of docs/TEACHING.md (the section whose heading contains ``title``)."""
    text = (ROOT / "docs" / "TEACHING.md").read_text(encoding="utf-8")
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    return [ln for ln in section.splitlines() if ln.startswith("|") and not ln.startswith("|---")][1:]


def taught_in() -> dict[str, int]:
    """Each method of the library -> the first notebook (from 1 on) whose *code* uses it."""
    from lrp_core.methods.registry import METHODS

    first: dict[str, int] = {}
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        n = int(nb.name[:2])
        if n == 0:
            continue  # the welcome's map names, not teaches
        code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        for m in METHODS:
            if m not in first and re.search(rf"[\"']{m}[\"']", code):
                first[m] = n
    return first


def methods_of(exercise) -> set[str]:
    """Method names an exercise's reference uses: in its source, or in module constants it names."""
    from lrp_core.methods.registry import METHODS

    src = inspect.getsource(exercise.reference)
    module = sys.modules[exercise.reference.__module__]
    for const in set(re.findall(r"\b[A-Z][A-Z_0-9]{2,}\b", src)):
        value = getattr(module, const, None)
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            src += " ".join(f'"{v}"' for v in value)
    return {m for m in METHODS if re.search(rf"[\"']{m}[\"']", src)}


@pytest.fixture(scope="module")
def course():
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        import solutions

        yield solutions.all_exercises(), taught_in()
    finally:
        sys.path.remove(str(ROOT / "notebooks"))


def test_the_method_map_is_the_courses(course):
    _, first = course
    # spot checks against the notebooks' own learning goals
    assert first["rollout"] == 5 and first["attention_gradcam"] == 6 and first["cdam"] == 7
    assert first["attnlrp"] == 11


@pytest.mark.parametrize("plan", ["A 90-minute taster", "A three-hour workshop", "A full day"])
def test_plans_use_only_what_was_taught_before(plan, course):
    """Every exercise a plan does in class comes after its notebook and the notebooks of its methods."""
    exercises, first = course
    taught: set[int] = set()
    rows = plan_rows(plan)
    assert rows, plan
    done = 0
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        m = re.match(r"(\d+) ·", cells[1])
        if m:
            taught.add(int(m.group(1)))
        in_class = cells[2].split("homework")[0].split("stretch")[0]
        for n, k in re.findall(r"\b(\d+)\.(\d)\b", in_class):
            assert int(n) in taught, f"{plan}: exercise {n}.{k} before notebook {n} ({row})"
            for method in methods_of(exercises[f"ex{n}_{k}"]):
                assert first[method] in taught, (
                    f"{plan}: exercise {n}.{k} uses {method}, taught in notebook {first[method]} ({row})"
                )
            done += 1
    assert done >= 3, f"{plan}: no exercises found in its table"


def test_readme_is_a_front_page():
    """The README is the front page (≤ 250 lines); the reference lives on the documentation site."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, len(lines)
    for page in re.findall(r"\]\((docs/[^)#]+\.md)\)", "\n".join(lines)):
        assert (ROOT / page).is_file(), page


@pytest.mark.slow
def test_readme_examples_run_offline():
    """Every Python example of the README that needs no hub runs as written, on the embedded models."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    offline = [b for b in blocks if "from_pretrained" not in b]
    assert len(offline) >= 3
    scope: dict = {}
    exec(compile("\n".join(offline), "README.md", "exec"), scope)  # noqa: S102 - the README's own examples
    assert scope["exp"].scores.shape[0] == 1 and scope["gen"].scores.shape[:2] == (1, 2)


def test_torch_index_moves_only_the_torch_pair_to_that_index():
    """``TORCH_INDEX=…`` (PyTorch's CPU wheels) changes the torch step of install and wheelhouse, nothing else."""
    cpu = "https://download.pytorch.org/whl/cpu"
    plain = pip_installs(make_dry_run("-B", "install"))
    steps = pip_installs(make_dry_run("-B", "install", f"TORCH_INDEX={cpu}"))
    assert steps[1] == f"{plain[1]} --index-url {cpu}" and "requirements-torch.txt" in steps[1]
    assert steps[0] == plain[0] and steps[2] == plain[2]
    downloads = [ln for ln in make_dry_run("-B", "wheelhouse", f"TORCH_INDEX={cpu}") if "pip download" in ln]
    assert [f"--index-url {cpu}" in d for d in downloads] == [False, True, False]


def _laptop_blocks() -> list[list[str]]:
    """The command lines of each code block in docs/TEACHING.md's "Laptops without `make`" section."""
    text = (ROOT / "docs" / "TEACHING.md").read_text(encoding="utf-8")
    section = text.split("## Laptops without `make`", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:bash|bat)\n(.*?)```", section, flags=re.S)
    return [[ln for ln in b.splitlines() if ln.strip() and not ln.lstrip().startswith(("#", "::"))] for b in blocks]


def test_laptop_commands_run_the_makefiles_pip_steps():
    """Each hand-typed install (macOS/Linux, Windows) runs exactly `make install`'s pip steps, in order,
    with the files they name present, then the doctor and the first notebook."""
    make_steps = pip_installs(make_dry_run("-B", "install"))
    blocks = _laptop_blocks()
    assert len(blocks) == 2
    for lines, python in zip(blocks, (".venv/bin/python", r".venv\Scripts\python")):
        assert re.fullmatch(r"(python3\.11|py -3\.11) -m venv \.venv", lines[0])
        steps = [ln.split(" -m pip install ", 1)[1].replace('"', "") for ln in lines if " -m pip install " in ln]
        assert all(ln.startswith(f"{python} -m ") or "jupyter" in ln for ln in lines[1:]), lines
        assert steps == make_steps
        for name in re.findall(r"-[rc] (\S+)", " ".join(steps)):
            assert (ROOT / name).is_file(), name
        assert any("lrp_core.tools.doctor" in ln for ln in lines)
        assert lines[-1].split()[-1].replace("\\", "/") == "notebooks/00_welcome.ipynb"
        assert (ROOT / "notebooks" / "00_welcome.ipynb").is_file()


def test_the_tasters_closing_demo_shows_the_class_switch():
    """The taster ends on dinov2-scenes, whose two class maps differ (notebook 10's stored correlation), and
    the correlations the plan quotes are the ones notebook 10 printed."""
    nb = json.loads((ROOT / "notebooks" / "10_explore.ipynb").read_text(encoding="utf-8"))
    (cell,) = [c for c in nb["cells"] if "class_map_correlation(maps[0], maps[1])" in "".join(c["source"])]
    printed = "".join("".join(o.get("text", "")) for o in cell["outputs"])
    corr = {m.group(1): float(m.group(2)) for m in re.finditer(r"(\S+): class sensitivity .*? maps (\S+) \(", printed)}
    assert corr["dinov2-scenes"] < 0.5 < corr["toy-vit"], corr  # the switch moves dinov2-scenes' map, not toy-vit's
    text = (ROOT / "docs" / "TEACHING.md").read_text(encoding="utf-8")
    taster = text[text.index("## A 90-minute taster") : text.index("## A three-hour workshop")]
    quoted = re.search(
        r"correlation of the two classes' maps, (\S+) on dinov2-scenes\s+against (\S+) on toy-vit", taster
    )
    assert quoted, "the taster's demo quotes the two correlations"
    assert (float(quoted.group(1)), float(quoted.group(2))) == (corr["dinov2-scenes"], corr["toy-vit"])
    assert "dinov2-scenes" in taster and "RelevanceExplorer(toy" not in taster
