"""lrp_core: relevance propagation and attention explanations for Transformers.

>>> from lrp_core import explain, METHODS
>>> exp = explain(model, images, method="transformer_attribution")
>>> exp.scores.shape   # (B, number of patches)
"""
from .errors import InputError, LRPError, UnknownMethodError, UnsupportedModelError
from .explanation import Explanation

__version__ = "0.1.0"

__all__ = [
    "Explanation", "InputError", "LRPError", "UnknownMethodError", "UnsupportedModelError",
]

try:  # the engine (issue 2) lands these
    from .api import METHODS, ConceptTarget, concept_target, explain  # noqa: F401
    __all__ += ["METHODS", "ConceptTarget", "concept_target", "explain"]
except ImportError:  # pragma: no cover - only while the engine is being built
    pass
