"""The methods as objects: one class per method, its fields its own options.

``explain(model, x, method=IntegratedGradients(n_steps=32))`` is the same call as
``explain(model, x, method="integrated_gradients", n_steps=32)``: the string names the class (``name``) and
its keywords are the class's fields. Each class checks its options when it is constructed; ``run`` is the
function that computes it, ``memory`` its profile for the memory estimate, ``returns`` what it fills
(the class attributes of :class:`~lrp_core.methods.options.Method`). An option left ``None`` takes the
method's default for the model's modality (``defaults``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Union

from ..errors import InputError, RuleSetError
from ..rules.composites import Composite
from ..rules.ops import EXPLICIT, MODIFIED_GRADIENT
from ..runtime.memory import BACKWARD, GRAPH, MODIFIED, RELPROP, REPLAY_ONLY, Profile
from . import ablation as AB
from . import attention as A
from . import baselines as CB
from . import lrp as L
from . import options as O
from . import perturbation as P
from .options import Method, own
from .products import NORMS


def _start_layer() -> int:
    return own(0, "first block in the layer product (0-based; negative counts from the end)", O.block("start_layer"))


def _end_layer() -> Optional[int]:
    return own(None, "last block in the layer product (default: the last)", O.block("end_layer"))


def _keep_heads() -> bool:
    return own(False, "also return the per-head matrices (layers_per_head)", O.flag("keep_heads"))


def _batch_size() -> int:
    return own(64, "sequences per forward pass", O.positive_int("batch_size"))


def _seed() -> int:
    return own(0, "seed of the random draws (noise, coalitions), the same for every sample", O.seed)


def _baseline() -> Union[str, int, None]:
    return own(
        None,
        "reference input: 'zeros' | 'blur' (images), 'zeros' | 'pad' | 'mask' | a token id (text; padding "
        "positions kept); default 'zeros' for images and decoder LMs, 'pad' for text encoders",
        O.baseline,
    )


def _composite() -> Optional[Composite]:
    return own(
        None, "the rule set of the relevance pass (lrp_core.rules.Composite; default: the method's own)", O.composite
    )


def _filler() -> Optional[int]:
    return own(
        None,
        "None removes an ablated source's tokens (later positions follow), a token id replaces them",
        O.filler,
    )


#: the reference input of the Captum baselines: text encoders the padding token's embedding; decoder LMs zero
#: vectors (many decoder configs name no padding token — GPT-2, Llama — and zeros always exist); images zeros
_REFERENCE = {"image": {"baseline": "zeros"}, "text": {"baseline": "pad"}, "decoder": {"baseline": "zeros"}}
_PASS_WORDS = {
    EXPLICIT: ("an explicit relevance pass", "LRP_BASELINE or TRANSFORMER_ATTRIBUTION"),
    MODIFIED_GRADIENT: ("a modified-gradient replay", "ATTNLRP or CP_LRP"),
}


class _LayerRange(Method):
    """A check shared by the methods with a layer range: the last block is not before the first."""

    start_layer: int  # the subclass's fields (typed here for the check; not fields of this class)
    end_layer: Optional[int]

    def check_bound(self) -> None:
        start, end = self.start_layer, self.end_layer
        if end is not None and end < start:
            raise InputError(f"end_layer={end} is before start_layer={start}")


class _RuleSet(Method):
    """A method whose ``composite=`` must be a rule set for its kind of pass (:attr:`Method.rule_pass`)."""

    composite: Optional[Composite]  # the subclass's field

    def check(self) -> None:
        rules = self.composite
        if rules is None or rules.serves == self.rule_pass:
            return
        assert self.rule_pass is not None, "a method that takes a composite names its kind of pass"
        words, bases = _PASS_WORDS[self.rule_pass]
        takers = [m.name for m in ALL if m.rule_pass == rules.serves]
        raise RuleSetError(
            f"method {self.name!r} runs {words} and takes a composite derived from {bases}; composite "
            f"{rules.name!r} is a rule set for {_PASS_WORDS[rules.serves][0]}: pass it to "
            f"{' or '.join(repr(t) for t in takers)}"
        )


# ----------------------------------------------------------------------------
# the attention-product family (lrp_core.methods.attention)
# ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TransformerAttribution(_LayerRange):
    """Chefer et al. (CVPR 2021): ``Ā_b = mean_h((∇A_b ⊙ R^{A_b})⁺)``, ``C = Π (I + Ā_b)`` (docs/METHODS.md §2.1)."""

    name = "transformer_attribution"
    run = staticmethod(A.transformer_attribution)
    # the replay keeps one H·N² map per block (A) and no gradient or relevance maps: each block's ∇A is made when
    # the top-down pass reaches it; that block's gradient, its backward and its relevance temporaries: tmp_att
    memory = Profile(**{**GRAPH, "att": 2}, layers=True, **{**RELPROP, "tmp_att": 8})
    defaults = {"image": {"rollout_norm": "none"}, "text": {"rollout_norm": "row"}}
    returns = ("layers", "layers_per_head", "token_relevance")
    readout_minimum = True

    start_layer: int = _start_layer()
    end_layer: Optional[int] = _end_layer()
    rollout_norm: Optional[Literal["none", "row"]] = own(
        None,
        f"normalisation of each factor I + Ā_b, one of {NORMS} (default: none for images, row for text)",
        O.rollout_norm,
    )
    use_gradient: bool = own(
        True, "weight R^A by ∇A (True) or by A (False, the paper's ablation)", O.flag("use_gradient")
    )
    keep_heads: bool = _keep_heads()


@dataclass(frozen=True)
class GenericAttention(Method):
    """Chefer et al. (ICCV 2021): ``Ā_b = mean_h((∇A_b ⊙ A_b)⁺)``, ``R ← R + Ā_b R`` (docs/METHODS.md §2.2)."""

    name = "generic_attention"
    run = staticmethod(A.generic_attention)
    # the gradients are made block by block, top-down; one block's gradient and product are the tmp_att
    memory = Profile(**{**GRAPH, "att": 2}, layers=True, **{**BACKWARD, "tmp_att": 4})
    returns = ("layers", "layers_per_head")
    product_norm = "none"

    start_layer: int = _start_layer()
    keep_heads: bool = _keep_heads()


@dataclass(frozen=True)
class Rollout(_LayerRange):
    """Abnar & Zuidema (2020): the row-normalised ``Π (I + mean_h A_b)`` (docs/METHODS.md §2.3)."""

    name = "rollout"
    run = staticmethod(A.rollout)
    memory = Profile(**REPLAY_ONLY, layers=True, tmp_att=1)
    returns = ("layers", "layers_per_head")
    class_agnostic = True
    product_norm = "row"

    start_layer: int = _start_layer()
    end_layer: Optional[int] = _end_layer()
    keep_heads: bool = _keep_heads()


@dataclass(frozen=True)
class RawAttention(Method):
    """The last block's readout attention, head mean (docs/METHODS.md §2.4); its product is rollout's."""

    name = "raw_attention"
    run = staticmethod(A.raw_attention)
    memory = Profile(**REPLAY_ONLY, layers=True, tmp_att=1)
    returns = ("layers", "layers_per_head")
    class_agnostic = True
    product_norm = "row"

    keep_heads: bool = _keep_heads()


@dataclass(frozen=True)
class AttentionGradCAM(Method):
    """Grad-CAM on the last attention map (docs/METHODS.md §2.5)."""

    name = "attention_gradcam"
    run = staticmethod(A.attention_gradcam)
    memory = Profile(**GRAPH, **BACKWARD)


@dataclass(frozen=True)
class CDAM(Method):
    """Brocki & Chung: gradient × the tokens entering the last attention; takes a concept target
    (docs/METHODS.md §2.8)."""

    name = "cdam"
    run = staticmethod(A.cdam)
    memory = Profile(**GRAPH, **BACKWARD)
    concept_target = True


@dataclass(frozen=True)
class TokenAblation(Method):
    """``y_t(all tokens) − y_t(without token i)``, batched (docs/METHODS.md §2.9)."""

    name = "token_ablation"
    run = staticmethod(P.token_ablation)
    memory = Profile(**REPLAY_ONLY, ablated=True)

    batch_size: int = _batch_size()


# ----------------------------------------------------------------------------
# the LRP family (lrp_core.methods.lrp)
# ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LRP(_RuleSet):
    """Full LRP with the baseline rules down to input space (docs/METHODS.md §2.6, §1.7); ``composite``: an
    explicit-pass rule set derived from ``LRP_BASELINE``."""

    name = "lrp"
    run = staticmethod(L.lrp)
    memory = Profile(**REPLAY_ONLY, kept=1, **RELPROP)
    returns = ("pixels", "token_relevance", "registers")
    rule_pass = EXPLICIT

    composite: Optional[Composite] = _composite()


@dataclass(frozen=True)
class PartialLRP(_RuleSet):
    """Baseline LRP read at the last block's attention relevance (docs/METHODS.md §2.7)."""

    name = "partial_lrp"
    run = staticmethod(L.partial_lrp)
    memory = Profile(**REPLAY_ONLY, kept=1, **RELPROP)
    returns = ("token_relevance",)
    rule_pass = EXPLICIT

    composite: Optional[Composite] = _composite()


@dataclass(frozen=True)
class AttnLRP(_RuleSet):
    """Achtibat et al. (ICML 2024): gradient × input, std detached, identity rule, ÷2 at Q·Kᵀ and A·V
    (docs/METHODS.md §2b); ``composite``: a modified-gradient rule set derived from ``ATTNLRP``."""

    name = "attnlrp"
    run = staticmethod(L.attnlrp)
    memory = Profile(**MODIFIED, **BACKWARD, fused=True)
    returns = ("pixels", "token_relevance", "conservation", "registers")
    rule_pass = MODIFIED_GRADIENT
    blockwise = True

    composite: Optional[Composite] = _composite()


@dataclass(frozen=True)
class CPLRP(_RuleSet):
    """Ali et al. (ICML 2022): gradient × input, std detached, Q and K detached (docs/METHODS.md §2b)."""

    name = "cp_lrp"
    run = staticmethod(L.cp_lrp)
    memory = Profile(**MODIFIED, **BACKWARD, fused=True)
    returns = ("pixels", "token_relevance", "conservation", "registers")
    rule_pass = MODIFIED_GRADIENT
    blockwise = True

    composite: Optional[Composite] = _composite()


@dataclass(frozen=True)
class PALRP(Method):
    """Bakish et al. (2025): AttnLRP / CP-LRP with the position encodings as inputs (docs/METHODS.md §2e)."""

    name = "pa_lrp"
    run = staticmethod(L.pa_lrp)
    memory = Profile(**MODIFIED, **BACKWARD, fused=True)
    returns = ("pixels", "token_relevance", "conservation", "positional", "registers")

    base: Literal["attnlrp", "cp_lrp", "cp_halved"] = own(
        "attnlrp",
        "the rule set the positional rules are added to, 'attnlrp', 'cp_lrp' or 'cp_halved' (the authors' ViT "
        "rules: CP-LRP with A·V's ÷2 kept; not conservative)",
        O.choice("base", ("attnlrp", "cp_lrp", "cp_halved")),
    )


# ----------------------------------------------------------------------------
# the field's attribution baselines, by Captum at the pixels / word embeddings (lrp_core.methods.baselines)
# ----------------------------------------------------------------------------
@dataclass(frozen=True)
class InputXGradient(Method):
    """``x ⊙ ∂y_t/∂x`` (docs/METHODS.md §2d)."""

    name = "input_x_gradient"
    run = staticmethod(CB.input_x_gradient)
    memory = Profile(**GRAPH, **BACKWARD)
    returns = ("pixels",)


@dataclass(frozen=True)
class IntegratedGradients(Method):
    """Sundararajan et al. (2017): ``(x − x̄) ⊙ ∫ ∂y_t/∂x`` along the straight path from the baseline ``x̄``
    (docs/METHODS.md §2d)."""

    name = "integrated_gradients"
    run = staticmethod(CB.integrated_gradients)
    memory = Profile(**GRAPH, **BACKWARD, batched=True)
    defaults = _REFERENCE
    returns = ("pixels", "convergence_delta")

    n_steps: int = own(50, "integration steps", O.positive_int("n_steps"))
    baseline: Union[str, int, None] = _baseline()
    batch_size: int = _batch_size()


@dataclass(frozen=True)
class SmoothGrad(Method):
    """Smilkov et al. (2017): input × gradient averaged over noisy copies (docs/METHODS.md §2d)."""

    name = "smoothgrad"
    run = staticmethod(CB.smoothgrad)
    memory = Profile(**GRAPH, **BACKWARD, batched=True)
    defaults = {"image": {"stdevs": 0.6}, "text": {"stdevs": 0.02}}
    returns = ("pixels",)

    n_samples: int = own(16, "noisy copies per sample", O.positive_int("n_samples"))
    stdevs: Optional[float] = own(
        None,
        "std of the Gaussian noise, in input units (default 0.6 for normalised pixels, 0.02 for embedding entries)",
        O.positive_float("stdevs", optional=True),
    )
    seed: int = _seed()
    batch_size: int = _batch_size()


@dataclass(frozen=True)
class Occlusion(Method):
    """``y_t(x) − y_t(x with one patch / token replaced by the baseline)`` (docs/METHODS.md §2d)."""

    name = "occlusion"
    run = staticmethod(CB.occlusion)
    memory = Profile(**REPLAY_ONLY, batched=True)
    defaults = _REFERENCE
    returns = ("pixels",)

    baseline: Union[str, int, None] = _baseline()
    batch_size: int = _batch_size()


@dataclass(frozen=True)
class KernelShap(Method):
    """Lundberg & Lee (2017): Shapley values of the patches / tokens from weighted coalitions
    (docs/METHODS.md §2d)."""

    name = "kernel_shap"
    run = staticmethod(CB.kernel_shap)
    memory = Profile(**REPLAY_ONLY, batched=True)
    defaults = _REFERENCE
    returns = ("pixels",)

    n_samples: int = own(256, "coalitions per sample", O.positive_int("n_samples"))
    baseline: Union[str, int, None] = _baseline()
    seed: int = _seed()
    batch_size: int = _batch_size()


# ----------------------------------------------------------------------------
# the source methods (lrp_core.methods.ablation): they score sources=, on decoder language models
# ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LeaveOneOut(Method):
    """``y(full) − y(without source s)``, one forward pass per source (docs/METHODS.md §2s)."""

    name = "leave_one_out"
    run = staticmethod(AB.leave_one_out)
    memory = Profile(**REPLAY_ONLY, batched=True, streamed=True)
    returns = ("sources",)

    batch_size: int = _batch_size()
    filler: Optional[int] = _filler()


@dataclass(frozen=True)
class ContextCite(Method):
    """Cohen-Wang et al. (NeurIPS 2024): a Lasso surrogate on random source ablations (docs/METHODS.md §2s)."""

    name = "context_cite"
    run = staticmethod(AB.context_cite)
    memory = Profile(**REPLAY_ONLY, batched=True, streamed=True)
    returns = ("sources",)

    n_ablations: int = own(64, "random ablation masks per row", O.positive_int("n_ablations"))
    keep_prob: float = own(0.5, "the probability that a source is kept in a mask", O.probability("keep_prob"))
    alpha: float = own(0.01, "the Lasso penalty on the standardised masks (0: least squares)", O.alpha)
    seed: int = _seed()
    filler: Optional[int] = _filler()
    batch_size: int = _batch_size()


#: The token-map methods, in the order the course introduces them.
TOKEN_MAP: tuple[type[Method], ...] = (
    TransformerAttribution,
    GenericAttention,
    Rollout,
    RawAttention,
    AttentionGradCAM,
    LRP,
    PartialLRP,
    CDAM,
    TokenAblation,
    AttnLRP,
    CPLRP,
    PALRP,
    InputXGradient,
    IntegratedGradients,
    SmoothGrad,
    Occlusion,
    KernelShap,
)
#: The methods that score sources rather than tokens.
SOURCE: tuple[type[Method], ...] = (LeaveOneOut, ContextCite)
ALL: tuple[type[Method], ...] = TOKEN_MAP + SOURCE

__all__ = [c.__name__ for c in ALL] + ["TOKEN_MAP", "SOURCE", "ALL"]
