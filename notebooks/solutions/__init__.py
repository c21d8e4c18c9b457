"""Solutions to the course exercises.

Every exercise ``exN_k`` (notebook N, exercise k) is a function in the module
of its notebook. ``reveal("ex1_2")`` prints its source and runs it, so a
learner can compare with their own attempt; nbval runs the reveal cells too,
so every solution is checked in CI.

>>> from solutions import reveal
>>> reveal("ex1_1")          # prints the code, then runs it
>>> reveal("ex1_1", run=False)
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any

_MODULES = ("nb00", "nb01", "nb02", "nb03", "nb04", "nb05", "nb06", "nb07", "nb08", "nb09", "nb10")


def _find(name: str):
    for mod in _MODULES:
        try:
            m = importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as err:
            if err.name == f"{__name__}.{mod}":
                continue
            raise
        if hasattr(m, name):
            return getattr(m, name)
    raise KeyError(f"no solution called {name!r}")


def reveal(name: str, run: bool = True, **kwargs: Any) -> Any:
    """Print the solution ``name`` and (by default) run it, returning its result."""
    fn = _find(name)
    print(inspect.getsource(fn))
    if run:
        print("--- output ---")
        return fn(**kwargs)
    return None


def __getattr__(name: str):  # ``from solutions import ex1_1``
    if name.startswith("ex"):
        return _find(name)
    raise AttributeError(name)


__all__ = ["reveal"]
