"""The package's import rules, read from the source (ast): what each layer may know of the others.

- ``lrp_core.methods`` never imports ``lrp_core.api`` (the methods sit below the entry points).
- No module outside ``lrp_core.adapters`` imports a family's module: the engine, the methods and the
  evaluation reach a model through the adapter seam only (the package, ``base``, ``batches``, ``records``,
  ``readouts``, ``verification``). ``lrp_core.tools`` (the benchmark, which names the families it times) is
  not part of the engine.
- No module outside ``lrp_core.adapters`` (the widgets included) reads a private attribute of an adapter.
- The widgets import no private name of ``lrp_core``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lrp_core"
WIDGETS = ROOT / "widgets"

#: the adapter modules every layer may import: the seam, not a family
SEAM = {
    "lrp_core.adapters",
    "lrp_core.adapters.base",
    "lrp_core.adapters.batches",
    "lrp_core.adapters.records",
    "lrp_core.adapters.readouts",
    "lrp_core.adapters.verification",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, relative ones resolved (a name imported from a
    package counts as its submodule: ``from .. import api`` is ``lrp_core.api``)."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            yield node.lineno, base
            yield from ((node.lineno, f"{base}.{alias.name}") for alias in node.names)


def _files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def _is_module(name: str) -> bool:
    """Whether ``name`` is a module or package of the checkout (not a function or class imported from one)."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_the_walk_sees_the_imports_it_checks():
    """The reader resolves the relative imports these rules are about (a rule that reads nothing passes)."""
    api = {name for _, name in _imports(PACKAGE / "generation.py")}
    assert "lrp_core.api" in api and "lrp_core.methods.continuation" in api
    engine = {name for f in _files(PACKAGE / "runtime") for _, name in _imports(f)}
    assert "lrp_core.adapters.base" in engine and "lrp_core.adapters.batches" in engine
    assert _is_module("lrp_core.adapters.clip") and not _is_module("lrp_core.adapters.clip.CLIPImageAdapter")


def test_methods_never_import_the_api():
    found = [
        f"{f.relative_to(ROOT)}:{line}"
        for f in _files(PACKAGE / "methods")
        for line, name in _imports(f)
        if name == "lrp_core.api" or name.startswith("lrp_core.api.")
    ]
    assert found == []


def test_no_module_outside_the_adapters_imports_a_family():
    outside = [f for f in _files(PACKAGE) if not f.is_relative_to(PACKAGE / "adapters")]
    outside = [f for f in outside if not f.is_relative_to(PACKAGE / "tools")]
    found = [
        f"{f.relative_to(ROOT)}:{line} {name}"
        for f in outside
        for line, name in _imports(f)
        if name.startswith("lrp_core.adapters.") and _is_module(name) and name not in SEAM
    ]
    assert found == []


def _adapter_expression(node: ast.expr) -> bool:
    """``adapter``, ``c.adapter``, ``self.facts.adapter``: an expression that names an adapter."""
    last = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return last == "adapter" or last.endswith("_adapter")


def test_nothing_outside_the_adapters_reads_a_private_adapter_attribute():
    files = [f for f in _files(PACKAGE) if not f.is_relative_to(PACKAGE / "adapters")] + _files(WIDGETS)
    found = [
        f"{f.relative_to(ROOT)}:{node.lineno} .{node.attr}"
        for f in files
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and _adapter_expression(node.value)
    ]
    assert found == []


def test_widgets_import_no_private_name_of_the_library():
    found = []
    for f in _files(WIDGETS):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lrp_core"):
                names = (node.module or "").split(".") + [alias.name for alias in node.names]
                found += [f"{f.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.startswith("_")]
    assert found == []
