"""lrp_core: relevance propagation and attention explanations for Transformers.

>>> from lrp_core import explain, METHODS
>>> exp = explain(model, images, method="transformer_attribution")
>>> exp.scores.shape   # (B, number of patches)
"""

from .errors import InputError, LRPError, UnknownMethodError, UnsupportedModelError
from .explanation import Explanation

__version__ = "0.1.0"

__all__ = [
    "Explanation",
    "InputError",
    "LRPError",
    "UnknownMethodError",
    "UnsupportedModelError",
]

from .api import METHODS, AttentionParts, ConceptTarget, Contrast, attention_parts, concept_target, explain

__all__ += ["METHODS", "AttentionParts", "ConceptTarget", "Contrast", "attention_parts", "concept_target", "explain"]

from .generation import explain_generation  # noqa: E402
from .methods.generation_result import GenerationExplanation  # noqa: E402

__all__ += ["explain_generation", "GenerationExplanation"]
