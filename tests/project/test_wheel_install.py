"""The built wheel, installed (not editable) into a fresh virtual environment, explains an embedded model.

Offline and quick: the wheel is built from the checkout's files without build isolation (the project venv's
setuptools), and the new environment sees the project venv's packages (torch, timm, …) through a ``.pth`` line
appended after its own site-packages, so ``lrp_core`` is found in the wheel's copy first. The run happens in a
temporary directory outside the repository, so nothing of the checkout can be imported by accident.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _checkout_files() -> list[str]:
    """The files a fresh clone of this working tree would have: tracked and new, not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    return [f for f in out if (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the checkout (so no build folder lands in the repository)."""
    src = tmp_path_factory.mktemp("src")
    for name in _checkout_files():
        if name.split("/")[0] in ("lrp_core", "widgets") or name in ("pyproject.toml", "README.md", "LICENSE"):
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        timeout=600,
    )
    (found,) = out.glob("transformer_relevance_lab-0.1.0-*.whl")
    return found


def test_wheel_holds_every_package_and_asset(wheel):
    """Every module and every data file under ``lrp_core/`` and ``widgets/`` of the checkout is in the wheel."""
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f for f in _checkout_files() if f.split("/")[0] in ("lrp_core", "widgets")}
    assert any(f.startswith("lrp_core/assets/") for f in wanted)  # the embedded models' weights are among them
    assert sorted(wanted - names) == []
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)


def test_installed_wheel_explains_an_embedded_model(wheel, tmp_path):
    """Installed from the wheel into a new venv, ``lrp_core`` comes from that venv (not the checkout) and explains
    the embedded toy ViT exactly as the checkout does."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # the project venv's packages after the new venv's own (a plain path line: its .pth files, the editable
    # install of this checkout among them, are not run)
    (site / "zz_project_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            str(wheel),
        ],
        check=True,
        env=env,
        timeout=300,
    )
    run = tmp_path / "elsewhere"
    run.mkdir()
    # the same thread count as this process: a CPU matrix product's round-off depends on it
    code = (
        f"import torch\ntorch.set_num_threads({torch.get_num_threads()})\n"
        + """
import json, torch
import lrp_core
from lrp_core.models import load
m = load("toy-vit")
size = m.info["image_size"]
x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))  # two normalised images
exp = lrp_core.explain(m.model, x, method="transformer_attribution")
print(json.dumps({"file": lrp_core.__file__, "scores": exp.scores.tolist(), "x": x.tolist()}))
"""
    )
    proc = subprocess.run([str(python), "-c", code], cwd=run, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).resolve() == (site / "lrp_core" / "__init__.py").resolve()
    assert ROOT not in Path(got["file"]).resolve().parents

    import lrp_core
    from lrp_core.models import load

    assert ROOT in Path(lrp_core.__file__).resolve().parents  # the reference: this checkout
    ref = lrp_core.explain(load("toy-vit").model, torch.tensor(got["x"]), method="transformer_attribution")
    assert torch.equal(torch.tensor(got["scores"]), ref.scores)
