"""Exercises of the course, with checkers, hints and solutions.

Every exercise ``exN_k`` (notebook N, exercise k) is an :class:`~solutions.exercise.Exercise`
defined in the module of its notebook (``nb01`` ... ``nb12``)::

    from solutions import ex1_1
    ex1_1.check(my_answer)   # a verdict with specific feedback; True / False
    ex1_1.hint()             # the next hint
    ex1_1.solution()         # the reference code and its result, only when asked

``reveal("ex1_1")`` is the older spelling of ``ex1_1.solution()``.
"""
from __future__ import annotations

import importlib
from typing import Any

from .exercise import NOT_ATTEMPTED, Exercise, Mistake

_MODULES = ("nb00", "nb01", "nb02", "nb03", "nb04", "nb05", "nb06", "nb07", "nb08", "nb09", "nb10", "nb11",
            "nb12", "nb13", "nb14", "nb15")


def _module(mod: str):
    try:
        return importlib.import_module(f"{__name__}.{mod}")
    except ModuleNotFoundError as err:
        if err.name == f"{__name__}.{mod}":
            return None
        raise


def all_exercises() -> dict[str, Exercise]:
    """Every exercise of the course, by name, in course order."""
    out: dict[str, Exercise] = {}
    for mod in _MODULES:
        m = _module(mod)
        if m is None:
            continue
        for name, obj in vars(m).items():
            if isinstance(obj, Exercise):
                out[name] = obj
    return out


def _find(name: str):
    for mod in _MODULES:
        m = _module(mod)
        obj = getattr(m, name, None) if m is not None else None
        if isinstance(obj, Exercise) or callable(obj):
            return obj
    raise KeyError(f"no exercise called {name!r}")


def reveal(name: str, run: bool = True, **ctx: Any) -> Any:
    """Print the solution of exercise ``name`` (same as ``exN_k.solution()``)."""
    ex = _find(name)
    if isinstance(ex, Exercise):
        return ex.solution(run=run, **ctx)
    import inspect  # a plain solution function (not yet an Exercise)
    print(inspect.getsource(ex))
    if run:
        print("--- output ---")
        return ex(**ctx)
    return None


def __getattr__(name: str):  # ``from solutions import ex1_1``
    if name.startswith("ex") and name[2:3].isdigit():
        try:
            return _find(name)
        except KeyError:
            raise AttributeError(name) from None
    raise AttributeError(name)


__all__ = ["Exercise", "Mistake", "NOT_ATTEMPTED", "all_exercises", "reveal"]
