"""The admitted torch / transformers / timm ranges: stated once, equal to pyproject.toml's, refused outside.

``lrp_core.runtime.versions.ADMITTED`` is the one statement; pyproject.toml's requirements, the doctor and
``scripts/test_versions.py`` (which CI runs through ``make test-versions``) read it or are checked against it here.
A version outside its range is refused at ``explain`` (adapter choice) naming the version and the range.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import tomllib
import torch
import transformers
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.errors import UnsupportedModelError
from lrp_core.runtime import versions

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from by_path import root_fixtures  # noqa: E402
from decoders import make_decoder  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
make_tiny_bert = root_fixtures().make_tiny_bert


def _project_requirements() -> dict[str, SpecifierSet]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    return {r.name: r.specifier for r in reqs}


def test_pyproject_states_the_admitted_ranges():
    """pyproject.toml's torch, transformers and timm requirements are exactly ADMITTED (not wider, not narrower)."""
    reqs = _project_requirements()
    for name, spec in versions.ADMITTED.items():
        assert reqs[name] == SpecifierSet(spec), f"pyproject.toml says {name}{reqs[name]}, versions.py {spec}"


def test_the_pinned_torch_and_the_test_environment_are_admitted():
    """requirements-torch.txt's torch pin, and the torch / transformers running these tests, lie in the ranges."""
    pin = re.search(r"^torch==(\S+)", (ROOT / "requirements-torch.txt").read_text(), re.M)
    assert pin is not None
    assert versions.outside("torch", pin.group(1)) is None
    for name, module in (("torch", torch), ("transformers", transformers)):
        assert versions.outside(name, module.__version__) is None, module.__version__


@pytest.mark.parametrize(
    "name, version, admitted",
    [
        ("transformers", versions.lowest(versions.ADMITTED["transformers"]), True),
        ("transformers", "5.24.0", True),
        ("transformers", "4.57.6", False),  # RoBERTa 0.95 off under transformer attribution, LLaVA a raw error
        ("transformers", "5.9.0", False),  # Gemma 2's right-padded logits 1.5e-3 off
        ("transformers", "5.25.0", False),  # newer than CI has tested
        ("transformers", "5.25.0.dev0", False),
        ("torch", "2.14.1+cpu", True),  # the CPU wheel's local label is ignored, as pip does
        ("torch", "2.14.1+cu130", True),
        ("torch", "2.3.0", False),
        ("torch", "2.15.0", False),
        ("timm", "1.0.28", False),  # its Eva has no qk_norm: 20 EVA tests cannot build their models
        ("timm", "1.0.9", False),
        ("timm", "1.0.31", True),
        ("timm", "0.9.16", False),
        ("timm", "1.1.0", False),
    ],
)
def test_outside_reads_the_range(name, version, admitted):
    """Each range admits its tested ends and refuses older and newer versions, pre-releases of the bound too."""
    reason = versions.outside(name, version)
    assert (reason is None) is admitted
    if not admitted:
        assert version in reason and versions.ADMITTED[name] in reason


@pytest.mark.parametrize("name, version", [("transformers", "4.57.6"), ("torch", "2.3.1"), ("timm", "0.9.16")])
def test_explain_refuses_a_version_outside_the_range(monkeypatch, name, version):
    """explain() on a tiny BERT with an imported package reporting a version outside its range: refused before any
    replay, with the version and the range in the message."""
    model = make_tiny_bert()
    module = pytest.importorskip(name)
    monkeypatch.setattr(module, "__version__", version)
    ids = torch.tensor([[2, 5, 7, 3]])
    with pytest.raises(UnsupportedModelError) as err:
        explain(model, ids, method="attnlrp")
    assert version in str(err.value) and versions.ADMITTED[name] in str(err.value)


def test_a_layout_refusal_names_the_transformers_version():
    """A decoder whose layout the adapter refuses says which transformers it read the layout from."""
    model = make_decoder("llama", "eager")
    del model.model.layers[0].mlp.gate_proj  # not the layout the adapter reads
    with pytest.raises(UnsupportedModelError) as err:
        get_adapter(model)
    assert "Llama layout" in str(err.value)
    assert f"read with transformers {transformers.__version__}" in str(err.value)
