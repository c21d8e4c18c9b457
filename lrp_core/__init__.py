"""lrp_core: relevance propagation and attention explanations for Transformers.

>>> from lrp_core import explain, IntegratedGradients
>>> exp = explain(model, images, method="transformer_attribution")
>>> exp.scores.shape   # (B, number of patches)
>>> exp = explain(model, images, method=IntegratedGradients(n_steps=32))  # = method="integrated_gradients", n_steps=32
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

from .adapters import Projection, Similarity  # noqa: E402
from .similarity import SimilarityExplanation, bilrp  # noqa: E402

__all__ += ["Projection", "Similarity", "bilrp", "SimilarityExplanation"]

from .generation import explain_generation  # noqa: E402
from .methods.generation_result import GenerationExplanation  # noqa: E402
from .seq2seq_generation import Seq2SeqGenerationExplanation  # noqa: E402

__all__ += ["explain_generation", "GenerationExplanation", "Seq2SeqGenerationExplanation"]

from .methods.objects import (  # noqa: E402
    CDAM,
    CPLRP,
    LRP,
    PALRP,
    AttentionGradCAM,
    AttnLRP,
    ContextCite,
    GenericAttention,
    InputXGradient,
    IntegratedGradients,
    KernelShap,
    LeaveOneOut,
    Occlusion,
    PartialLRP,
    RawAttention,
    Rollout,
    SmoothGrad,
    TokenAblation,
    TransformerAttribution,
)
from .methods.options import Method  # noqa: E402

# the method objects: explain(model, x, method=IntegratedGradients(n_steps=32))
__all__ += [
    "Method",
    "TransformerAttribution",
    "GenericAttention",
    "Rollout",
    "RawAttention",
    "AttentionGradCAM",
    "LRP",
    "PartialLRP",
    "CDAM",
    "TokenAblation",
    "AttnLRP",
    "CPLRP",
    "PALRP",
    "InputXGradient",
    "IntegratedGradients",
    "SmoothGrad",
    "Occlusion",
    "KernelShap",
    "LeaveOneOut",
    "ContextCite",
]
