"""The method registry: every fact about a method in one place.

Per method: the function that computes it, the options it accepts (besides
:data:`GENERIC_OPTIONS`, which every method takes; any other option is an
error naming the accepted ones), whether its map depends on the
target class, whether it takes a concept target, its defaults per input
modality, and which :class:`~lrp_core.Explanation` fields it fills.
``explain``, the widgets and the evaluation read this table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from . import memory
from . import methods as M
from .errors import InputError, UnknownMethodError
from .rollout import NORMS

#: Every option a method may take, with what it means (for error messages and docs).
OPTION_HELP: dict[str, str] = {
    "start_layer": "first block in the layer product (0-based; negative counts from the end)",
    "end_layer": "last block in the layer product (default: the last)",
    "rollout_norm": f"normalisation of each factor I + Ā_b, one of {NORMS}",
    "use_gradient": "weight R^A by ∇A (True) or by A (False, the paper's ablation)",
    "keep_heads": "also return the per-head matrices (layers_per_head)",
    "batch_size": "sequences per forward pass",
    "progress": "show a progress bar (None: only for long runs)",
    "max_memory": "bytes or '2GB' a call may use, else it runs in pieces; None/'auto': half the free memory, "
                  "'none': never split",
    "chunk_size": "samples per piece, instead of max_memory",
}
#: Options every method takes: how the call runs, not what it computes (a progress bar, pieces).
GENERIC_OPTIONS: tuple = ("progress", "max_memory", "chunk_size")


@dataclass(frozen=True)
class MethodSpec:
    """What the engine, the widgets and the evaluation need to know about one method."""

    name: str
    run: Callable[["M.Call"], "M.MethodResult"]
    summary: str
    options: tuple = ()
    class_agnostic: bool = False
    concept_target: bool = False
    #: option defaults per modality ("image" | "text"), applied when the user does not set them
    defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Explanation fields the method fills besides scores, target and logits
    returns: tuple = ()
    #: normalisation of the factors I + Ā_b when this method's ``layers`` are multiplied, where the
    #: method fixes it; methods that take ``rollout_norm`` record theirs in ``Explanation.options``
    product_norm: Optional[str] = None
    #: whether ``scores`` is the readout row of the product with the scored readout tokens' entries replaced
    #: by the row minimum (``TokenLayout.readout_minimum``, docs/METHODS.md §5.6); the widgets' product view
    #: reads it here
    readout_minimum: bool = False

    def takes(self, option: str) -> bool:
        return option in self.options or option in GENERIC_OPTIONS


_LAYER_PRODUCT = ("start_layer", "end_layer")

METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    MethodSpec("transformer_attribution", M.transformer_attribution,
               "Chefer et al. (CVPR 2021): Ā_b = mean_h((∇A_b ⊙ R^{A_b})⁺), C = Π (I + Ā_b)",
               options=_LAYER_PRODUCT + ("rollout_norm", "use_gradient", "keep_heads"),
               defaults={"image": {"rollout_norm": "none"}, "text": {"rollout_norm": "row"}},
               returns=("layers", "layers_per_head", "token_relevance"), readout_minimum=True),
    MethodSpec("generic_attention", M.generic_attention,
               "Chefer et al. (ICCV 2021): Ā_b = mean_h((∇A_b ⊙ A_b)⁺), R ← R + Ā_b R",
               options=("start_layer", "keep_heads"), returns=("layers", "layers_per_head"), product_norm="none"),
    MethodSpec("rollout", M.rollout, "Abnar & Zuidema: row-normalised Π (I + mean_h A_b)",
               options=_LAYER_PRODUCT + ("keep_heads",), class_agnostic=True,
               returns=("layers", "layers_per_head"), product_norm="row"),
    MethodSpec("raw_attention", M.raw_attention, "the last block's readout attention, head mean",
               options=("keep_heads",), class_agnostic=True, returns=("layers", "layers_per_head"),
               product_norm="row"),  # attention maps: their product is rollout's
    MethodSpec("attention_gradcam", M.attention_gradcam, "Grad-CAM on the last attention map"),
    MethodSpec("lrp", M.lrp, "full LRP with the baseline rules down to input space",
               returns=("pixels", "token_relevance")),
    MethodSpec("partial_lrp", M.partial_lrp, "baseline LRP, the last block's attention relevance",
               returns=("token_relevance",)),
    MethodSpec("cdam", M.cdam, "Brocki & Chung: gradient × tokens entering the last attention",
               concept_target=True),
    MethodSpec("token_ablation", M.token_ablation, "y_t(all tokens) − y_t(without token i), batched",
               options=("batch_size",)),
    MethodSpec("attnlrp", M.attnlrp,
               "Achtibat et al. (ICML 2024): gradient × input, std detached, identity rule, ÷2 at Q·Kᵀ and A·V",
               returns=("pixels", "token_relevance", "conservation")),
    MethodSpec("cp_lrp", M.cp_lrp, "Ali et al. (ICML 2022): gradient × input, std detached, Q and K detached",
               returns=("pixels", "token_relevance", "conservation")),
)}

#: Method names in the order the course introduces them.
METHOD_NAMES: tuple = tuple(METHODS)
#: Methods whose map does not depend on the target class.
CLASS_AGNOSTIC: tuple = tuple(n for n, s in METHODS.items() if s.class_agnostic)


def get(method: str) -> MethodSpec:
    """The spec of ``method``, or :class:`UnknownMethodError` naming the choices."""
    try:
        return METHODS[method]
    except (KeyError, TypeError):
        raise UnknownMethodError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}") from None


def product_norm(method: str, options: Mapping[str, Any]) -> Optional[str]:
    """How the factors I + Ā_b of ``method``'s layer product are normalised, given the options an
    explanation used (``Explanation.options``); ``None`` for a method without per-block matrices."""
    spec = get(method)
    return options.get("rollout_norm") if spec.takes("rollout_norm") else spec.product_norm


def parse_options(spec: MethodSpec, options: Mapping[str, Any], num_blocks: int, modality: str) -> "M.Options":
    """Validate ``options`` for ``spec``; fill the method's defaults for ``modality``."""
    unknown = sorted(set(options) - set(OPTION_HELP))
    if unknown:
        raise InputError(f"unknown option(s) {unknown}; {_accepted(spec)}")
    refused = sorted(k for k in options if not spec.takes(k))
    if refused:
        raise InputError(f"method {spec.name!r} does not take option(s) {refused}; {_accepted(spec)}")
    given = {k: v for k, v in options.items() if v is not None or k in ("rollout_norm", "progress", "end_layer")}
    for k, v in spec.defaults.get(modality, {}).items():
        if given.get(k) is None:
            given[k] = v
    opt = M.Options(**given)
    L = num_blocks

    def block(name: str, v):
        if v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool):
            raise InputError(f"{name} must be an int, got {type(v).__name__}")
        if not -L <= v < L:
            raise InputError(f"{name}={v} is out of range: the model has {L} blocks, so use 0 … {L - 1} "
                             f"(or -{L} … -1 from the end)")
        return v % L

    opt.start_layer = block("start_layer", opt.start_layer)
    opt.end_layer = block("end_layer", opt.end_layer)
    if opt.end_layer is not None and opt.end_layer < opt.start_layer:
        raise InputError(f"end_layer={opt.end_layer} is before start_layer={opt.start_layer}")
    if opt.rollout_norm is not None and opt.rollout_norm not in NORMS:
        raise InputError(f"rollout_norm must be one of {NORMS}, got {opt.rollout_norm!r}")
    if not isinstance(opt.use_gradient, bool):
        raise InputError(f"use_gradient must be True or False, got {opt.use_gradient!r}")
    if opt.progress is not None and not isinstance(opt.progress, bool):
        raise InputError(f"progress must be True (a progress bar), False (none) or None (only for long runs), "
                         f"got {opt.progress!r}")
    if not isinstance(opt.keep_heads, bool):
        raise InputError(f"keep_heads must be True or False, got {opt.keep_heads!r}")
    if not isinstance(opt.batch_size, int) or isinstance(opt.batch_size, bool) or opt.batch_size < 1:
        raise InputError(f"batch_size must be a positive int, got {opt.batch_size!r}")
    if opt.chunk_size is not None and (not isinstance(opt.chunk_size, int) or isinstance(opt.chunk_size, bool)
                                       or opt.chunk_size < 1):
        raise InputError(f"chunk_size must be a positive int (samples per piece), got {opt.chunk_size!r}")
    opt.max_memory = memory.parse_max_memory(opt.max_memory)
    if opt.chunk_size is not None and opt.max_memory is not None:
        raise InputError("give chunk_size (samples per piece) or max_memory (a budget the pieces are sized to), "
                         "not both")
    return opt


def _accepted(spec: MethodSpec) -> str:
    generic = "; ".join(f"{o} ({OPTION_HELP[o]})" for o in GENERIC_OPTIONS)
    if not spec.options:
        return f"method {spec.name!r} accepts no options of its own; like every method it accepts {generic}"
    own = "; ".join(f"{o} ({OPTION_HELP[o]})" for o in spec.options)
    return f"method {spec.name!r} accepts: {own}; and, like every method, {generic}"


__all__ = ["MethodSpec", "METHODS", "METHOD_NAMES", "CLASS_AGNOSTIC", "OPTION_HELP", "GENERIC_OPTIONS", "get",
           "parse_options", "product_norm"]
