"""Optional dependencies, imported where they are used.

The engine (``import lrp_core``, :func:`lrp_core.explain`) needs torch, numpy and tqdm only; pictures,
widgets, the Captum baselines, the sample photos and the pretrained course models each need packages of their
own, installed with an extra of the distribution (``pyproject.toml``)::

    pip install 'transformer-relevance-lab[baselines]'   # captum
    pip install 'transformer-relevance-lab[viz]'         # matplotlib

:func:`require` imports such a package at the point of use, and when it is missing raises
:class:`~lrp_core.errors.MissingExtraError` naming the feature, the package and the extra to install.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Optional

from ..errors import MissingExtraError

#: the distribution's name on PyPI, as ``pip install`` takes it
DISTRIBUTION = "transformer-relevance-lab"

#: extra -> what it is for (``pyproject.toml``'s ``[project.optional-dependencies]`` has the packages)
EXTRAS = {
    "baselines": "the Captum baselines (input_x_gradient, integrated_gradients, smoothgrad, occlusion, kernel_shap)",
    "viz": "matplotlib figures and the PIL pictures of lrp_core.viz",
    "widgets": "the Jupyter widgets (ipywidgets)",
    "photos": "the sample photos of lrp_core.data.sample_image (scikit-image, scikit-learn)",
    "sources": "the ContextCite surrogate of lrp_core.methods.ablation (scikit-learn's Lasso)",
    "pretrained": "the weights and texts of the course's pretrained models (dinov2-s14, minilm-sentiment)",
    "course": "everything the notebooks use",
    "test-extras": "the offloading and quantisation packages the tests explain models of (accelerate, optimum-quanto, "
    "torchao, bitsandbytes); the library reads their layers without importing them",
}

#: import name -> distribution name, where the two differ
_PACKAGE = {"sklearn": "scikit-learn", "skimage": "scikit-image", "PIL": "pillow"}


def require(module: str, extra: str, what: Optional[str] = None) -> ModuleType:
    """Import ``module`` (e.g. ``"captum.attr"``), or say which extra installs it.

    Parameters
    ----------
    module : str
        The module to import, dotted.
    extra : str
        The package extra that brings it (a key of :data:`EXTRAS`, each an extra of ``pyproject.toml``).
    what : str, optional
        The feature that needs it, for the message (e.g. ``"integrated_gradients"``); default the module.

    Returns
    -------
    ModuleType
        The imported module.

    Raises
    ------
    MissingExtraError
        When ``module``'s top-level package is not installed (or is blocked: ``sys.modules[name] = None``). An
        ``ImportError`` from inside an installed package (a module of its own or of another package missing)
        is raised as it is: installing the extra would not fix it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        top = module.split(".")[0]
        if err.name != top and not (top in sys.modules and sys.modules[top] is None):
            raise  # the package is there but something it imports is not: installing the extra would not help
        package = _PACKAGE.get(top, top)
        missing = MissingExtraError(
            f"{what or module} needs {package}, which is not installed: pip install '{DISTRIBUTION}[{extra}]'"
        )
        missing.name = top
        raise missing from err


__all__ = ["DISTRIBUTION", "EXTRAS", "require"]
