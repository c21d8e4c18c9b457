"""Every module, dotted name and repository path the docs name exists.

Read from README.md, every Markdown page under docs/ and mkdocs.yml: a dotted name ``lrp_core.a.b`` must import
as a module or be an attribute of one (``lrp_core.explain``, ``lrp_core.rules.composites.ATTNLRP``); a path that
starts with a top-level folder of the repository (``lrp_core/``, ``tests/``, ``scripts/`` …) must be a file or a
folder of the checkout (a ``*`` in it must match something); any other ``name.py`` / ``folder/name.py`` must be
the end of a file's path (``adapters/blocks.py``); mkdocs.yml's pages must be under docs/. A module is named by
its own path: ``lrp_core.utils`` does not pass for ``lrp_core.runtime.utils`` re-exported by the package.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import types
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), ROOT / "mkdocs.yml"])
FOLDERS = ("lrp_core", "widgets", "tests", "scripts", "docs", "notebooks", ".ci")
#: other projects' files that docs/METHODS.md cites (Chefer et al., LXT, PA-LRP, ContextCite)
ELSEWHERE = {
    "models/model.py",
    "modules/layers_ours.py",
    "NLP/lxt/models/llama_PE.py",
    "NLP_demo.py",
    "context_cite/context_citer.py",
    "solver.py",
}

DOTTED = re.compile(r"(?<![\w./-])lrp_core(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./-])(?:" + "|".join(re.escape(f) for f in FOLDERS) + r")/[\w.*/-]*")
PY_FILE = re.compile(r"(?<![\w./-])[\w/]*\w\.py\b")


def dotted_names(text: str) -> set[str]:
    """The ``lrp_core.…`` names in ``text`` (a trailing ``.`` of a sentence dropped)."""
    return {m.group(0).rstrip(".") for m in DOTTED.finditer(text)}


def paths(text: str) -> set[str]:
    """The repository paths in ``text``: ``tests/a/test_b.py``, ``docs/guide/``, ``notebooks/*.ipynb``."""
    return {m.group(0).rstrip(".") for m in PATH.finditer(text)}


def py_files(text: str) -> set[str]:
    """The ``name.py`` and ``folder/name.py`` in ``text`` that do not start with a top-level folder."""
    return {m.group(0) for m in PY_FILE.finditer(text) if m.group(0).split("/")[0] not in FOLDERS}


def tracked() -> list[str]:
    """The checkout's files: tracked and new, not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.splitlines()


def resolves(name: str) -> bool:
    """``name`` is a module, or an attribute chain below the longest module prefix of it."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for depth, attr in enumerate(parts[cut:], start=cut + 1):
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
            if isinstance(obj, types.ModuleType) and obj.__name__ != ".".join(parts[:depth]):
                return False  # a module re-exported under another name
        return True
    return False


def exists(path: str) -> bool:
    """``path`` is a file or folder of the checkout (a glob: one match at least)."""
    if "*" in path:
        return any(ROOT.glob(path.rstrip("/")))
    return (ROOT / path).exists()


def _mkdocs_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node] if node.endswith((".md", ".ipynb")) else []
    items = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    return [p for item in items for p in _mkdocs_pages(item)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_and_path_a_page_names_exists(page: Path):
    text = page.read_text(encoding="utf-8")
    missing = sorted(n for n in dotted_names(text) if not resolves(n))
    missing += sorted(p for p in paths(text) if not exists(p))
    files = tracked()
    ours = py_files(text) - ELSEWHERE
    missing += sorted(f for f in ours if not any(t == f or t.endswith("/" + f) for t in files))
    assert missing == [], f"{page.relative_to(ROOT)} names what does not exist: {missing}"


def test_every_mkdocs_page_is_under_docs():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    pages = _mkdocs_pages(config["nav"])
    assert len(pages) > 10
    assert [p for p in pages if not (ROOT / "docs" / p).is_file()] == []


def test_the_checks_catch_a_stale_name_and_path():
    text = "see `lrp_core.utils`, `lrp_core.rules.explicit_rules` and `tests/test_gone.py`; `lrp_core.explain`."
    assert dotted_names(text) == {"lrp_core.utils", "lrp_core.rules.explicit_rules", "lrp_core.explain"}
    stale = [n for n in sorted(dotted_names(text)) if not resolves(n)]
    assert stale == ["lrp_core.rules.explicit_rules", "lrp_core.utils"]
    assert py_files("`explicit_rules.py` and `adapters/blocks.py`") == {"explicit_rules.py", "adapters/blocks.py"}
    assert paths(text) == {"tests/test_gone.py"} and not exists("tests/test_gone.py")
    assert exists("tests/docs/") and exists("docs/*.md") and resolves("lrp_core.rules.composites.ATTNLRP")
