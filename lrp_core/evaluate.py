"""Compatibility module: the evaluation runner now lives in :mod:`lrp_core.evaluation`.

``from lrp_core import evaluate`` and ``python -m lrp_core.evaluate ...`` keep
working: this module re-exports the package's public API and runs its command
line.
"""
from .evaluation import *  # noqa: F401,F403  (the public API, unchanged names)
from .evaluation import __all__ as _api
from .evaluation.__main__ import main

__all__ = [*_api, "main"]

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
