"""Structure of the code itself (issue #21 item 6), read from the source with ``ast``: nothing is imported or run."""
from __future__ import annotations

import ast
import builtins
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _sources(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def _absolute_imports(path: Path) -> set[str]:
    """The modules ``path`` imports, relative imports resolved against its package (e.g. ``lrp_core.models``)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def test_data_does_not_import_models():
    """``lrp_core.data`` is below ``lrp_core.models``: the models read the data's conventions, never the reverse."""
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in _absolute_imports(p) if m.startswith("lrp_core.models"))
                 for p in _sources("lrp_core/data")}
    assert {k: v for k, v in offenders.items() if v} == {}
    # the check sees imports at all (the toy ViT reads the scenes' constants from the data)
    assert "lrp_core.data.scenes" in _absolute_imports(ROOT / "lrp_core/models/toy_vit.py")


#: Builtin exceptions the package may raise directly, each for a reason that is not an error in the caller's input.
ALLOWED_BUILTIN_RAISES = {
    # an abstract method: a subclass that forgets to override it is a programming error, not an input error
    "NotImplementedError": None,
    # the command lines (``python -m lrp_core.evaluation``, ``lrp_core.evaluate``, the widget bench) exit with a status
    "SystemExit": None,
    # internal assertions: the message says "an engine bug" / the check of a conversion, never a bad input
    "RuntimeError": {("lrp_core/precision.py", "__torch_function__"),  # a half tensor written in place: engine bug
                     ("lrp_core/data/scenes.py", "_render_chunk")},  # placement retries exhausted: practically never
    "AssertionError": {("lrp_core/models/dinov2.py", "verify_against_onnx")},  # a verification tool asserting
}
_BUILTIN_EXCEPTIONS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}


def _raise_sites(path: Path) -> list[tuple[str, str, int]]:
    """``(innermost function, exception name, line)`` of every ``raise Name(...)`` / ``raise Name`` in ``path``."""
    sites: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, func: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name):
                sites.append((func, exc.id, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(ast.parse(path.read_text()), "<module>")
    return sites


def test_the_package_raises_no_bare_builtin_exception():
    """Every error the engine and the widgets raise is an ``LRPError`` (or on the allow-list above, with its reason).

    The ``LRPError`` subclasses also derive from the builtin they replace (``ValueError``, ``TypeError``,
    ``KeyError``, ``FileNotFoundError``), so a caller catching the builtin still catches them.
    """
    bad, seen = set(), 0
    for path in _sources("lrp_core", "widgets"):
        rel = str(path.relative_to(ROOT))
        for func, exc, line in _raise_sites(path):
            seen += 1
            if exc not in _BUILTIN_EXCEPTIONS:
                continue
            allowed = ALLOWED_BUILTIN_RAISES.get(exc, set())
            if allowed is None or (rel, func) in allowed:
                continue
            bad.add(f"{rel}:{line} {func}() raises {exc}")
    assert seen > 100  # the scan sees the package's raise statements (it raises LRPErrors in many places)
    assert sorted(bad) == []


def test_every_exception_class_of_the_package_is_an_lrp_error():
    """Exception classes the package defines derive from ``LRPError`` (warnings from ``LRPWarning``)."""
    import importlib

    from lrp_core.errors import LRPError, LRPWarning
    bad = []
    for path in _sources("lrp_core", "widgets"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and (node.name.endswith("Error") or node.name.endswith("Warning")):
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                cls = getattr(importlib.import_module(module), node.name)
                base = LRPWarning if issubclass(cls, Warning) else LRPError
                if not issubclass(cls, base):
                    bad.append(f"{module}.{node.name}")
    assert bad == []
