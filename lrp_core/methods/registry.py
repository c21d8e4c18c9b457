"""The method registry: every fact about a method in one place.

Per method: the function that computes it, the options it accepts (besides
:data:`GENERIC_OPTIONS`, which every method takes; any other option is an
error naming the accepted ones), whether its map depends on the
target class, whether it takes a concept target, its defaults per input
modality, which :class:`~lrp_core.Explanation` fields it fills and its memory
profile (:mod:`lrp_core.runtime.memory`). ``explain``, the widgets, the memory
estimate and the evaluation read this table. The options themselves (name,
default, help, check) are declared once in :mod:`lrp_core.methods.options`; the result
fields in :data:`lrp_core.explanation.RESULT_FIELDS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ..errors import InputError, RuleSetError, UnknownMethodError
from ..explanation import OPTIONAL_FIELDS
from ..rules.ops import EXPLICIT, MODIFIED_GRADIENT
from ..runtime.memory import BACKWARD, GRAPH, MODIFIED, RELPROP, REPLAY_ONLY, Profile
from . import ablation as AB
from . import attention as A
from . import baselines as CB
from . import lrp as LRP
from . import options as O
from . import perturbation as P
from .call import Call, MethodResult, Options
from .options import GENERIC_OPTIONS

#: Every option a method may take, with what it means (for error messages and docs): read from
#: :data:`lrp_core.options.OPTIONS`, where each option is declared.
OPTION_HELP: dict[str, str] = {o.name: o.help for o in O.OPTIONS}


@dataclass(frozen=True)
class MethodSpec:
    """What the engine, the widgets and the evaluation need to know about one method."""

    name: str
    run: Callable[["Call"], "MethodResult"]
    #: elements per sample of its pass (:class:`lrp_core.memory.Profile`), for the memory estimate
    memory: Profile
    #: names of the options it takes besides GENERIC_OPTIONS (each declared in lrp_core.options.OPTIONS)
    options: tuple = ()
    class_agnostic: bool = False
    concept_target: bool = False
    #: option defaults per modality ("image" | "text" | "decoder"), applied when the user does not set them; a
    #: decoder LM reads "text" overridden by "decoder" (:func:`defaults_key`)
    defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Explanation fields the method fills besides scores, target and logits (lrp_core.explanation.OPTIONAL_FIELDS)
    returns: tuple = ()
    #: normalisation of the factors I + Ā_b when this method's ``layers`` are multiplied, where the
    #: method fixes it; methods that take ``rollout_norm`` record theirs in ``Explanation.options``
    product_norm: Optional[str] = None
    #: whether ``scores`` is the readout row of the product with the scored readout tokens' entries replaced
    #: by the row minimum (``TokenLayout.readout_minimum``, docs/METHODS.md §5.6); the widgets' product view
    #: reads it here
    readout_minimum: bool = False
    #: the kind of pass (lrp_core.rules.ops.PASS_KINDS) of the rule set a method that takes ``composite=`` runs
    rule_pass: Optional[str] = None

    def takes(self, option: str) -> bool:
        return option in self.options or option in GENERIC_OPTIONS


_LAYER_PRODUCT = ("start_layer", "end_layer")
#: the reference input of the Captum baselines: text encoders the padding token's embedding; decoder LMs zero
#: vectors (many decoder configs name no padding token — GPT-2, Llama — and zeros always exist); images zeros
_REFERENCE = {"text": {"baseline": "pad"}, "decoder": {"baseline": "zeros"}}

METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        # Chefer et al. (CVPR 2021): Ā_b = mean_h((∇A_b ⊙ R^{A_b})⁺), C = Π (I + Ā_b)
        MethodSpec(
            "transformer_attribution",
            A.transformer_attribution,
            # the replay keeps one H·N² map per block (A) and no gradient or relevance maps: each block's
            # ∇A is made when the top-down pass reaches it; that block's gradient, its
            # backward and its relevance temporaries are the once-counted tmp_att
            Profile(**{**GRAPH, "att": 2}, layers=True, **{**RELPROP, "tmp_att": 8}),
            options=_LAYER_PRODUCT + ("rollout_norm", "use_gradient", "keep_heads"),
            defaults={"image": {"rollout_norm": "none"}, "text": {"rollout_norm": "row"}},
            returns=("layers", "layers_per_head", "token_relevance"),
            readout_minimum=True,
        ),
        # Chefer et al. (ICCV 2021): Ā_b = mean_h((∇A_b ⊙ A_b)⁺), R ← R + Ā_b R
        # (the gradients are made block by block, top-down, like transformer attribution's: the replay's
        # graph keeps A, and one block's gradient and product are the once-counted tmp_att)
        MethodSpec(
            "generic_attention",
            A.generic_attention,
            Profile(**{**GRAPH, "att": 2}, layers=True, **{**BACKWARD, "tmp_att": 4}),
            options=("start_layer", "keep_heads"),
            returns=("layers", "layers_per_head"),
            product_norm="none",
        ),
        # Abnar & Zuidema: row-normalised Π (I + mean_h A_b)
        MethodSpec(
            "rollout",
            A.rollout,
            Profile(**REPLAY_ONLY, layers=True, tmp_att=1),
            options=_LAYER_PRODUCT + ("keep_heads",),
            class_agnostic=True,
            returns=("layers", "layers_per_head"),
            product_norm="row",
        ),
        # the last block's readout attention, head mean
        MethodSpec(
            "raw_attention",
            A.raw_attention,
            Profile(**REPLAY_ONLY, layers=True, tmp_att=1),
            options=("keep_heads",),
            class_agnostic=True,
            returns=("layers", "layers_per_head"),
            product_norm="row",
        ),  # attention maps: their product is rollout's
        # Grad-CAM on the last attention map
        MethodSpec("attention_gradcam", A.attention_gradcam, Profile(**GRAPH, **BACKWARD)),
        # full LRP with the baseline rules down to input space
        MethodSpec(
            "lrp",
            LRP.lrp,
            Profile(**REPLAY_ONLY, kept=1, **RELPROP),
            options=("composite",),
            returns=("pixels", "token_relevance"),
            rule_pass=EXPLICIT,
        ),
        # baseline LRP, the last block's attention relevance
        MethodSpec(
            "partial_lrp",
            LRP.partial_lrp,
            Profile(**REPLAY_ONLY, kept=1, **RELPROP),
            options=("composite",),
            returns=("token_relevance",),
            rule_pass=EXPLICIT,
        ),
        # Brocki & Chung: gradient × tokens entering the last attention
        MethodSpec("cdam", A.cdam, Profile(**GRAPH, **BACKWARD), concept_target=True),
        # y_t(all tokens) − y_t(without token i), batched
        MethodSpec("token_ablation", P.token_ablation, Profile(**REPLAY_ONLY, ablated=True), options=("batch_size",)),
        # Achtibat et al. (ICML 2024): gradient × input, std detached, identity rule, ÷2 at Q·Kᵀ and A·V
        MethodSpec(
            "attnlrp",
            LRP.attnlrp,
            Profile(**MODIFIED, **BACKWARD, fused=True),
            options=("composite",),
            returns=("pixels", "token_relevance", "conservation"),
            rule_pass=MODIFIED_GRADIENT,
        ),
        # Ali et al. (ICML 2022): gradient × input, std detached, Q and K detached
        MethodSpec(
            "cp_lrp",
            LRP.cp_lrp,
            Profile(**MODIFIED, **BACKWARD, fused=True),
            options=("composite",),
            returns=("pixels", "token_relevance", "conservation"),
            rule_pass=MODIFIED_GRADIENT,
        ),
        # Bakish et al. (2025): AttnLRP / CP-LRP with the position encodings (learned, absolute, rotary) as inputs
        MethodSpec(
            "pa_lrp",
            LRP.pa_lrp,
            Profile(**MODIFIED, **BACKWARD, fused=True),
            options=("base",),
            returns=("pixels", "token_relevance", "conservation", "positional"),
        ),
        # --- the field's attribution baselines, computed by Captum at the pixels / word embeddings
        #     (lrp_core.methods.baselines)
        # x ⊙ ∂y_t/∂x
        MethodSpec("input_x_gradient", CB.input_x_gradient, Profile(**GRAPH, **BACKWARD), returns=("pixels",)),
        # Sundararajan et al. (2017): (x − x̄) ⊙ ∫ ∂y_t/∂x along the straight path from the baseline x̄
        MethodSpec(
            "integrated_gradients",
            CB.integrated_gradients,
            Profile(**GRAPH, **BACKWARD, batched=True),
            options=("n_steps", "baseline", "batch_size"),
            defaults=_REFERENCE,
            returns=("pixels", "convergence_delta"),
        ),
        # Smilkov et al. (2017): input × gradient averaged over noisy copies
        MethodSpec(
            "smoothgrad",
            CB.smoothgrad,
            Profile(**GRAPH, **BACKWARD, batched=True),
            options=("n_samples", "stdevs", "seed", "batch_size"),
            defaults={"image": {"stdevs": 0.6}, "text": {"stdevs": 0.02}},
            returns=("pixels",),
        ),
        # y_t(x) − y_t(x with one patch / token replaced by the baseline)
        MethodSpec(
            "occlusion",
            CB.occlusion,
            Profile(**REPLAY_ONLY, batched=True),
            options=("baseline", "batch_size"),
            defaults=_REFERENCE,
            returns=("pixels",),
        ),
        # Lundberg & Lee (2017): Shapley values of the patches / tokens from weighted coalitions
        MethodSpec(
            "kernel_shap",
            CB.kernel_shap,
            Profile(**REPLAY_ONLY, batched=True),
            options=("n_samples", "baseline", "seed", "batch_size"),
            defaults={
                "image": {"n_samples": 256},
                "text": {"n_samples": 256, **_REFERENCE["text"]},
                "decoder": _REFERENCE["decoder"],
            },
            returns=("pixels",),
        ),
    )
}

#: The methods that score sources rather than tokens (docs/METHODS.md §2s): each needs ``sources=`` and a decoder
#: language model; ``explain`` runs them like the others (``registry.get`` finds them), but they are not in
#: :data:`METHOD_NAMES`, the token-map methods every model takes.
SOURCE_METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        # y(full) − y(without source s), one forward pass per source
        MethodSpec(
            "leave_one_out",
            AB.leave_one_out,
            Profile(**REPLAY_ONLY, batched=True, streamed=True),
            options=("batch_size", "filler"),
            returns=("sources",),
        ),
        # Cohen-Wang et al. (NeurIPS 2024): a Lasso surrogate on n random source ablations
        MethodSpec(
            "context_cite",
            AB.context_cite,
            Profile(**REPLAY_ONLY, batched=True, streamed=True),
            options=("n_ablations", "keep_prob", "alpha", "seed", "filler", "batch_size"),
            returns=("sources",),
        ),
    )
}
#: The names of :data:`SOURCE_METHODS`.
SOURCE_METHOD_NAMES: tuple = tuple(SOURCE_METHODS)

#: Method names in the order the course introduces them.
METHOD_NAMES: tuple = tuple(METHODS)
#: Methods whose map does not depend on the target class.
CLASS_AGNOSTIC: tuple = tuple(n for n, s in METHODS.items() if s.class_agnostic)
#: the methods that run on decoder language models
DECODER_METHODS: tuple = tuple(METHODS)  # every method runs on decoder language models


def _check_declarations() -> None:
    """A method that names an undeclared option or result field fails at import, not at its first call."""
    for spec in (*METHODS.values(), *SOURCE_METHODS.values()):
        bad = [o for o in spec.options if o not in O.BY_NAME or o in GENERIC_OPTIONS]
        if bad:
            raise TypeError(
                f"method {spec.name!r} lists option(s) {bad} not declared (or generic) in lrp_core.options.OPTIONS"
            )
        if ("composite" in spec.options) != (spec.rule_pass is not None):
            raise TypeError(
                f"method {spec.name!r}: a method takes the option 'composite' exactly when it names the "
                "kind of pass of its rule set (MethodSpec.rule_pass)"
            )
        bad = [f for f in spec.returns if f not in OPTIONAL_FIELDS]
        if bad:
            raise TypeError(
                f"method {spec.name!r} returns {bad}, not in lrp_core.explanation.RESULT_FIELDS "
                f"(optional: {OPTIONAL_FIELDS})"
            )


_check_declarations()


def filled_by(field: str) -> tuple[str, ...]:
    """The methods that fill the optional :class:`~lrp_core.Explanation` field ``field`` (e.g. ``"pixels"``).

    Parameters
    ----------
    field : str
        Name of an optional :class:`~lrp_core.Explanation` field.

    Returns
    -------
    tuple[str, ...]
        The names of the methods that fill it.
    """
    return tuple(n for n, s in METHODS.items() if field in s.returns)


def get(method: str) -> MethodSpec:
    """The spec of ``method``, or :class:`UnknownMethodError` naming the choices.

    Parameters
    ----------
    method : str
        A method name.

    Returns
    -------
    MethodSpec
        Its specification.

    Raises
    ------
    UnknownMethodError
        If ``method`` is not a known method.
    """
    try:
        return METHODS[method] if method in METHODS else SOURCE_METHODS[method]
    except (KeyError, TypeError):
        raise UnknownMethodError(
            f"unknown method {method!r}; choose one of {', '.join(METHODS)} (or, to score "
            f"sources, {', '.join(SOURCE_METHODS)})"
        ) from None


def product_norm(method: str, options: Mapping[str, Any]) -> Optional[str]:
    """How the factors I + Ā_b of ``method``'s layer product are normalised.

    Read from the options an explanation used (``Explanation.options``); ``None`` for a method without
    per-block matrices.

    Parameters
    ----------
    method : str
        A method name.
    options : Mapping[str, Any]
        The options the explanation used.

    Returns
    -------
    Optional[str]
        ``"none"``, ``"row"``, or ``None`` for a method without per-block matrices.
    """
    spec = get(method)
    return options.get("rollout_norm") if spec.takes("rollout_norm") else spec.product_norm


def defaults_key(adapter: Any) -> str:
    """The key of :attr:`MethodSpec.defaults` an adapter's calls read.

    Its modality ("image" | "text"), or "decoder" for a decoder LM
    (whose defaults are "text"'s, overridden by "decoder"'s where given).

    Parameters
    ----------
    adapter : Any
        The model's adapter.

    Returns
    -------
    str
        ``"image"``, ``"text"`` or ``"decoder"``.
    """
    return "decoder" if adapter.is_decoder else adapter.modality


def parse_options(spec: MethodSpec, options: Mapping[str, Any], num_blocks: int, modality: str) -> "Options":
    """Validate ``options`` for ``spec``; fill the method's defaults for ``modality`` (:func:`defaults_key`).

    Parameters
    ----------
    spec : MethodSpec
        The method's specification.
    options : Mapping[str, Any]
        The options the caller passed.
    num_blocks : int
        Number of blocks L of the model (for the layer options).
    modality : str
        The adapter's modality (``"image"`` or ``"text"``) or ``"decoder"``.

    Returns
    -------
    "Options"
        The validated options with the method's defaults filled in.

    Raises
    ------
    InputError
        If an option is unknown or not taken by the method (or its value is refused).
    """
    unknown = sorted(set(options) - set(O.BY_NAME))
    if unknown:
        raise InputError(f"unknown option(s) {unknown}; {_accepted(spec)}")
    refused = sorted(k for k in options if not spec.takes(k))
    if refused:
        raise InputError(f"method {spec.name!r} does not take option(s) {refused}; {_accepted(spec)}")
    given = {k: v for k, v in options.items() if v is not None or O.BY_NAME[k].none_is_value}
    defaults = (
        {**spec.defaults.get("text", {}), **spec.defaults.get("decoder", {})}
        if modality == "decoder"
        else spec.defaults.get(modality, {})
    )
    for k, v in defaults.items():
        if given.get(k) is None:
            given[k] = v
    values = {o.name: o.check(given.get(o.name, o.default), num_blocks) for o in O.OPTIONS}
    O.check_together(values)
    _check_rule_pass(spec, values["composite"])
    return Options(**values)


_PASS_WORDS = {
    EXPLICIT: ("an explicit relevance pass", "LRP_BASELINE or TRANSFORMER_ATTRIBUTION"),
    MODIFIED_GRADIENT: ("a modified-gradient replay", "ATTNLRP or CP_LRP"),
}


def _check_rule_pass(spec: MethodSpec, composite: Any) -> None:
    """Refuse, before anything runs, a rule set for the other kind of pass than ``spec``'s (:class:`RuleSetError`)."""
    if composite is None or spec.rule_pass is None or composite.serves == spec.rule_pass:
        return
    words, bases = _PASS_WORDS[spec.rule_pass]
    takers = [n for n, s in METHODS.items() if s.rule_pass == composite.serves]
    raise RuleSetError(
        f"method {spec.name!r} runs {words} and takes a composite derived from {bases}; composite "
        f"{composite.name!r} is a rule set for {_PASS_WORDS[composite.serves][0]}: pass it to "
        f"{' or '.join(repr(t) for t in takers)}"
    )


def _accepted(spec: MethodSpec) -> str:
    generic = "; ".join(O.describe(o) for o in GENERIC_OPTIONS)
    if not spec.options:
        return f"method {spec.name!r} accepts no options of its own; like every method it accepts {generic}"
    own = "; ".join(O.describe(o) for o in spec.options)
    return f"method {spec.name!r} accepts: {own}; and, like every method, {generic}"


__all__ = [
    "MethodSpec",
    "METHODS",
    "METHOD_NAMES",
    "SOURCE_METHODS",
    "SOURCE_METHOD_NAMES",
    "CLASS_AGNOSTIC",
    "OPTION_HELP",
    "GENERIC_OPTIONS",
    "get",
    "parse_options",
    "defaults_key",
    "product_norm",
    "filled_by",
]
