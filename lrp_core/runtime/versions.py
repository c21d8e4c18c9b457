"""The torch, transformers and timm versions the engine admits: the one place that states them.

``pyproject.toml``'s requirements equal :data:`ADMITTED` (``tests/runtime/test_versions.py``), CI runs the
coverage tests at the lowest and the newest admitted version of each (``make test-versions``,
``scripts/test_versions.py``), and :func:`check_versions` refuses, at adapter choice, an imported package whose
version lies outside its range — the replay reads each family's layout from the installed code, and outside the
tested versions that reading has been measured wrong (docs/CONTRACTS.md, "Versions").
"""

from __future__ import annotations

import functools
import sys

from ..errors import LRPError, UnsupportedModelError

#: distribution name -> the PEP 440 range admitted; pyproject.toml's dependencies say exactly this
ADMITTED: dict[str, str] = {
    "torch": ">=2.14.1,<2.15",
    "transformers": ">=5.24.0,<5.25",
    "timm": ">=1.0.31,<1.1",
}


def lowest(spec: str) -> str:
    """The version after ``>=`` in ``spec`` (e.g. ``"5.24.0"`` for ``">=5.24.0,<5.25"``)."""
    for clause in spec.split(","):
        clause = clause.strip()
        if clause.startswith(">="):
            return clause[2:].strip()
    raise LRPError(f"{spec!r} has no lower bound (>=)")


@functools.lru_cache(maxsize=None)
def outside(name: str, version: str) -> str | None:
    """Why ``version`` of package ``name`` is not admitted, or ``None`` when it is.

    A local label (``2.14.1+cpu``, ``+cu130``) is ignored, as pip does when it matches a range; a pre-release of an
    admitted version (``5.25.0.dev0``, ``5.17.0rc1``) is outside, as in PEP 440.
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    spec = ADMITTED[name]
    try:
        public = Version(Version(version).public)
    except InvalidVersion:
        return f"{name} {version} is not a version this check can read; admitted: {name}{spec}"
    if SpecifierSet(spec).contains(public, prereleases=False):
        return None
    return (
        f"{name} {version} is installed; this release of lrp_core admits {name}{spec} only (the range CI tests: "
        f"the replay reads each family's layout from {name}'s code, and outside that range it has been measured "
        f'wrong). Install an admitted one: pip install "{name}{spec}"'
    )


def check_versions() -> None:
    """Refuse when an imported torch, transformers or timm is outside :data:`ADMITTED`.

    Only packages already imported are checked (a BERT explained without timm never imports timm); the versions
    are the imported modules' ``__version__``, i.e. the code that runs, whatever ``sys.path`` order picked it.

    Raises
    ------
    UnsupportedModelError
        Naming the installed version and the admitted range.
    """
    for name in ADMITTED:
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None)
        if isinstance(version, str):
            reason = outside(name, version)
            if reason is not None:
                raise UnsupportedModelError(reason)


def installed(name: str) -> str | None:
    """The imported module's ``__version__`` of package ``name``, or ``None`` when it is not imported."""
    version = getattr(sys.modules.get(name), "__version__", None)
    return version if isinstance(version, str) else None
