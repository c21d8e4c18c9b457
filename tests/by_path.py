"""Load a Python file as a module by its path: a script under scripts/, or the root conftest's fixtures.

``from conftest import …`` finds whichever ``conftest`` module pytest loaded last (tests/widgets has one
too), so helpers that need the root fixtures from any test file load tests/conftest.py by path instead.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Iterator

TESTS = Path(__file__).resolve().parent


def module_from_path(name: str, path: Path) -> ModuleType:
    """Execute ``path`` as a fresh module called ``name`` (not registered in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def registered_module(name: str, path: Path) -> Iterator[ModuleType]:
    """``path`` as module ``name``, in ``sys.modules`` while in use (dataclasses look their module up by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


@functools.lru_cache(maxsize=None)
def root_fixtures() -> ModuleType:
    """tests/conftest.py (the tiny-model builders), loaded once under a name of its own."""
    return module_from_path("_trl_root_conftest", TESTS / "conftest.py")
