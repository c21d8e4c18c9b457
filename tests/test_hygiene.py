"""Structure of the code itself (issue #21 item 6), read from the source with ``ast``: nothing is imported or run."""
from __future__ import annotations

import ast
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
