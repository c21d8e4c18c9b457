"""Docstrings of the public functions: numpy style with every parameter documented, and no issue numbers."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Modules whose public functions (``__all__``) have numpy-style docstrings. The list grows as the other
#: modules (adapters, tools, the remaining rules, methods and data modules, widgets) are converted.
CONVERTED = [
    "lrp_core.metrics.perturbation",
    "lrp_core.metrics.scenes",
    "lrp_core.metrics.segmentation",
    "lrp_core.metrics.statistics",
    "lrp_core.metrics.text",
    "lrp_core.metrics.alignment",
    "lrp_core.rules.functional",
    "lrp_core.rules.ops",
    "lrp_core.rules.explicit",
    "lrp_core.rules.composites",
    "lrp_core.rules.linear",
    "lrp_core.viz.colours",
    "lrp_core.viz.maps",
    "lrp_core.viz.figures",
    "lrp_core.viz.text",
    "lrp_core.viz.words",
    "lrp_core.runtime.extras",
    "lrp_core.runtime.guard",
    "lrp_core.runtime.memory",
    "lrp_core.runtime.pieces",
    "lrp_core.runtime.precision",
    "lrp_core.runtime.utils",
    "lrp_core.runtime.wrappers",
    "lrp_core.methods.targets",
    "lrp_core.methods.products",
    "lrp_core.methods.registry",
    "lrp_core.methods.options",
    "lrp_core.generation",
    "lrp_core.methods.continuation",
    "lrp_core.methods.prompts",
    "lrp_core.methods.ablation",
    "lrp_core.data.facts",
    "lrp_core.data.folders",
    "lrp_core.data.rationales",
    "lrp_core.data.sets",
    "lrp_core.data.photos",
    "lrp_core.data.scenes",
    "lrp_core.data.vqa",
    "lrp_core.models.tiny_vlm",
    "lrp_core.sources",
    "lrp_core.api",
    "lrp_core.evaluation.batching",
    "lrp_core.evaluation.images",
    "lrp_core.evaluation.lm",
    "lrp_core.evaluation.report",
    "lrp_core.evaluation.run",
    "lrp_core.evaluation.shards",
    "lrp_core.evaluation.sources",
    "lrp_core.evaluation.text",
    "lrp_core.evaluation.vlm",
    "lrp_core.evaluation.bootstrap",
    "lrp_core.evaluation.__main__",
    "lrp_core.methods.baselines",
    "lrp_core.methods.captum_inputs",
    "lrp_core.methods.objects",
    "lrp_core.methods.baselines_vlm",
    "lrp_core.models",
    "lrp_core.models.hub",
    "lrp_core.models.dinov2",
    "lrp_core.models.minilm",
    "lrp_core.models.lm",
    "lrp_core.models.tiny_lm",
    "lrp_core.models.toy_vit",
    "lrp_core.models.dinov2_scenes",
    "lrp_core.adapters",
    "lrp_core.adapters.checks",
    "lrp_core.adapters.kernels",
    "lrp_core.adapters.decoder",
    "lrp_core.adapters.blocks",
    "lrp_core.adapters.attention",
    "lrp_core.adapters.recognise",
    "lrp_core.adapters.vit",
    "lrp_core.adapters.clip",
    "lrp_core.adapters.siglip",
    "lrp_core.adapters.qwen2_5_vl",
    "lrp_core.adapters.modernbert",
    "lrp_core.adapters.vlm_groups",
    "lrp_core.tools.doctor",
    "lrp_core.tools.bench_models",
    "lrp_core.tools.bench_vlm",
    "lrp_core.tools.bench_table",
    "lrp_core.models.reachability",
    "lrp_core.methods.generation_result",
    "lrp_core.tools.bench",
]


def _public_functions(module_name: str):
    module = importlib.import_module(module_name)
    # a module without ``__all__`` (a command-line module): its functions without a leading underscore
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    for name in names:
        obj = getattr(module, name)
        # a function re-exported from another module is checked in its home module
        if inspect.isfunction(obj) and obj.__module__ == module_name:
            yield name, obj


def _parameters_section(doc: str) -> list[str] | None:
    """The lines of the ``Parameters`` section, or None without one."""
    match = re.search(r"^Parameters\n-{3,}\n(.*?)(?=^\w[\w ]*\n-{3,}\n|\Z)", doc, re.M | re.S)
    return None if match is None else match.group(1).rstrip().splitlines()


def _documented_parameters(doc: str) -> set[str] | None:
    """Names listed in the ``Parameters`` section (``name : type`` or ``*args``), or None without the section.

    An entry counts only in numpy form: ``name : type`` (``*args`` / ``**kwargs`` without a type) followed by
    an indented description.
    """
    lines = _parameters_section(doc)
    if lines is None:
        return None
    names: set[str] = set()
    for line, after in zip(lines, lines[1:] + [""]):
        entry = re.match(r"^(\*{1,2}\w+$|\w+(?:\s*,\s*\w+)* : \S.*$)", line)
        if entry and after.startswith("    ") and after.strip():
            names.update(n.strip().lstrip("*") for n in line.split(" : ")[0].split(","))
    return names


@pytest.mark.parametrize("module_name", CONVERTED)
def test_every_parameter_is_documented(module_name: str):
    missing: dict[str, object] = {}
    for name, func in _public_functions(module_name):
        params = [p.name for p in inspect.signature(func).parameters.values()]
        if not params:
            continue
        documented = _documented_parameters(inspect.getdoc(func) or "")
        if documented is None:
            missing[name] = "no Parameters section"
        elif set(params) - documented:
            missing[name] = sorted(set(params) - documented)
    assert missing == {}


def test_the_checks_see_functions():
    """The walk finds functions with parameters, and the parser reads a section it is shown."""
    assert sum(1 for m in CONVERTED for _ in _public_functions(m)) >= len(CONVERTED)
    doc = (
        "Summary.\n\nParameters\n----------\nx : int\n    The x.\n*args\n    More.\n\n"
        "Returns\n-------\nint\n    Twice x.\n"
    )
    assert _documented_parameters(doc) == {"x", "args"}
    assert _documented_parameters("Summary.\n\nArgs:\n    x: the x.\n") is None
    # an entry without a type or without a description does not count
    assert _documented_parameters("Summary.\n\nParameters\n----------\nx : the x.\ny : int\n") == set()


@pytest.mark.parametrize("module_name", CONVERTED)
def test_no_issue_numbers(module_name: str):
    """Docstrings and comments say what the code does, not which issue asked for it."""
    source = Path(importlib.import_module(module_name).__file__).read_text()
    assert [line for line in source.splitlines() if "issue #" in line.lower()] == []
