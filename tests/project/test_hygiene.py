"""Structure of the code itself (issue #21 item 6), read from the source with ``ast``: nothing is imported or run."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
    offenders = {
        str(p.relative_to(ROOT)): sorted(m for m in _absolute_imports(p) if m.startswith("lrp_core.models"))
        for p in _sources("lrp_core/data")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    # the check sees imports at all (the toy ViT reads the scenes' constants from the data)
    assert "lrp_core.data.scenes" in _absolute_imports(ROOT / "lrp_core/models/toy_vit.py")


#: Builtin exceptions the package may raise directly, each for a reason that is not an error in the caller's input.
ALLOWED_BUILTIN_RAISES = {
    # an abstract method: a subclass that forgets to override it is a programming error, not an input error
    "NotImplementedError": None,
    # the command lines (``python -m lrp_core.evaluation``, ``lrp_core.evaluation``, the widget bench) exit with a
    # status
    "SystemExit": None,
    # internal assertions: the message says "an engine bug" / the check of a conversion, never a bad input
    "RuntimeError": {
        ("lrp_core/runtime/precision.py", "__torch_function__"),  # a half tensor written in place: engine bug
        ("lrp_core/data/scenes.py", "_place_objects"),
    },  # placement retries exhausted: practically never
    "AssertionError": {("lrp_core/models/dinov2.py", "verify_against_onnx")},  # a verification tool asserting
    # declarations checked at import (an option or result field named but not declared): the contributor's
    # mistake, raised before any call can be made
    "TypeError": {("lrp_core/methods/registry.py", "_check_declarations"), ("lrp_core/explanation.py", "<module>")},
    # a module's ``__getattr__`` must raise AttributeError for names it does not have (the import protocol)
    "AttributeError": {("lrp_core/viz/__init__.py", "__getattr__")},
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


MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 600


def _code_lines(node: ast.AST, lines: list[str], docstrings: set[int]) -> int:
    """Lines of ``node`` (decorators included) that are neither blank, nor comments, nor docstrings."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return sum(
        1
        for i in range(start, node.end_lineno + 1)
        if i not in docstrings and lines[i - 1].strip() and not lines[i - 1].strip().startswith("#")
    )


def _docstring_lines(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.update(range(first.lineno, first.end_lineno + 1))
    return found


def test_no_function_over_60_lines_of_code_and_no_module_over_600_lines():
    """Short functions and modules: a researcher reads one in an evening (the project's standard).

    Docstrings do not count towards either limit: the numpy-style Parameters / Returns sections document every
    argument with its shape, and a module's length in code should not depend on how well it is documented.
    """
    long_functions, long_modules, functions = [], [], 0
    for path in _sources("lrp_core", "widgets"):
        rel, text = str(path.relative_to(ROOT)), path.read_text()
        lines, tree = text.splitlines(), ast.parse(text)
        docstrings = _docstring_lines(tree)
        if len(lines) - len(docstrings) > MAX_MODULE_LINES:
            long_modules.append(f"{rel}: {len(lines) - len(docstrings)} lines besides docstrings")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions += 1
                n = _code_lines(node, lines, docstrings)
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{rel}:{node.lineno} {node.name}(): {n} lines of code")
    assert functions > 500  # the scan sees the package
    assert long_functions == []
    assert long_modules == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(package: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports, at module level or inside functions.

    ``from pkg import sub`` counts as an import of the submodule ``pkg.sub`` only (the package is already being
    imported); ``from pkg import name`` of a non-module name counts as an import of ``pkg``. Imports under
    ``if TYPE_CHECKING:`` never run and do not count.
    """
    paths = {_module_name(p): p for p in _sources(package)}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        skip = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING"
            for n in ast.walk(node)
        }
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in paths)
            elif isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                subs = {f"{target}.{a.name}" for a in node.names} & set(paths)
                deps.update(subs)
                if len(subs) < len(node.names) and target in paths:
                    deps.add(target)
        graph[name] = deps - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    """No module of lrp_core or widgets imports, directly or through others, a module that imports it back."""
    for package in ("lrp_core", "widgets"):
        assert _cycles(_import_graph(package)) == [], package


def test_the_cycle_check_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = _import_graph("lrp_core")
    assert "lrp_core.rules.functional" in graph["lrp_core.rules.explicit"]  # the graph sees relative imports
