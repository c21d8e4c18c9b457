"""Every method option, declared once: its name, type, default, help text and check.

The declaration is the dataclass :class:`Options` (the parsed options a method
receives as ``call.opt``): each field's name is the keyword ``explain`` takes, its
annotation the type of the checked value, its default the default, and its
metadata the help text and the check (written with :func:`_option`). Type
checkers and editors see the fields; everything else reads them:

- :data:`OPTIONS` (one :class:`Option` per field, in field order) is derived
  from ``dataclasses.fields(Options)``;
- :func:`lrp_core.methods.registry.parse_options` (``explain``'s option parsing)
  runs each option's ``check`` and names the ``help`` texts in its errors;
- a method takes an option when its :class:`~lrp_core.methods.registry.MethodSpec`
  lists the name (``MethodSpec.options``); the widgets ask the registry;
- :func:`lrp_core.explain` has one keyword-only parameter per option (typed by
  what it accepts, ``None`` meaning the method's default); a test checks that its
  signature and docstring name every field.

Adding an option: one field of :class:`Options` here, its name in the
``options`` of the methods that take it (``lrp_core/methods/registry.py``), a
parameter of ``explain`` (``lrp_core/api.py``), and the method code that reads
``call.opt.<name>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional, TypeVar, Union, get_type_hints

import torch
from torch import Tensor

from ..errors import InputError
from ..rules.composites import Composite
from ..runtime import memory
from ..runtime.precision import check_dtype
from .products import NORMS


@dataclass(frozen=True)
class Option:
    """One method option.

    Attributes:
        name: the keyword ``explain`` takes.
        default: its value when not given (a method's per-modality defaults, ``MethodSpec.defaults``, come first).
        help: what it means, for error messages and docs.
        check: ``(value, num_blocks) -> value``: raises :class:`~lrp_core.errors.InputError` naming what is
            accepted, else returns the value normalised (e.g. a negative block counted from the end).
        none_is_value: ``explain(..., name=None)`` means ``None`` itself, not "use the default".
        generic: every method takes it (how the call runs, not what it computes).
        type: the annotation of its field of :class:`Options` (the type of the checked value).
    """

    name: str
    default: Any
    help: str
    check: Callable[[Any, int], Any]
    none_is_value: bool = False
    generic: bool = False
    type: Any = Any


T = TypeVar("T")


def _block(name: str) -> Callable[[Any, int], Optional[int]]:
    """A check for a block index: an int in -L … L-1, returned as 0 … L-1 (``None`` passes)."""

    def check(v: Any, L: int) -> Optional[int]:
        if v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool):
            raise InputError(f"{name} must be an int, got {type(v).__name__}")
        if not -L <= v < L:
            raise InputError(
                f"{name}={v} is out of range: the model has {L} blocks, so use 0 … {L - 1} (or -{L} … -1 from the end)"
            )
        return v % L

    return check


def _flag(name: str) -> Callable[[Any, int], bool]:
    def check(v: Any, L: int) -> bool:
        if not isinstance(v, bool):
            raise InputError(f"{name} must be True or False, got {v!r}")
        return v

    return check


def _positive_int(name: str, what: str = "", optional: bool = False) -> Callable[[Any, int], Optional[int]]:
    def check(v: Any, L: int) -> Optional[int]:
        if optional and v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InputError(f"{name} must be a positive int{what}, got {v!r}")
        return v

    return check


def _positive_float(name: str) -> Callable[[Any, int], float]:
    def check(v: Any, L: int) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v == float("inf"):
            raise InputError(f"{name} must be a positive number, got {v!r}")
        return float(v)

    return check


def _seed(v: Any, L: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise InputError(f"seed must be an int >= 0, got {v!r}")
    return v


#: The reference inputs of the Captum baselines (lrp_core.methods.baselines): images, text, or a token id (text).
BASELINES = ("zeros", "blur", "pad", "mask")


def _baseline(v: Any, L: int) -> Any:
    """A name of :data:`BASELINES` or a token id (an int >= 0); which fits the modality, the method checks."""
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    if v not in BASELINES:
        raise InputError(
            f"baseline must be one of {BASELINES} (images: 'zeros', 'blur'; text: 'zeros', 'pad', "
            f"'mask') or a token id (an int >= 0, text), got {v!r}"
        )
    return v


def _norm(v: Any, L: int) -> Optional[str]:
    if v is not None and v not in NORMS:
        raise InputError(f"rollout_norm must be one of {NORMS}, got {v!r}")
    return v


def _choice(name: str, choices: tuple) -> Callable[[Any, int], Any]:
    """A check for one of ``choices``."""

    def check(v: Any, L: int) -> Any:
        if v not in choices:
            raise InputError(f"{name} must be one of {choices}, got {v!r}")
        return v

    return check


def _composite(v: Any, L: int) -> Optional[Composite]:
    """A rule set (:class:`~lrp_core.rules.Composite`); which kind of pass it must serve, the registry checks."""
    if v is not None and not isinstance(v, Composite):
        raise InputError(
            f"composite must be a rule set (lrp_core.rules.Composite, e.g. "
            f"ATTNLRP.with_rules(by_kind={{LINEAR: GammaGradient(0.25)}})), got {type(v).__name__}"
        )
    return v


def _progress(v: Any, L: int) -> Optional[bool]:
    if v is not None and not isinstance(v, bool):
        raise InputError(
            f"progress must be True (a progress bar), False (none) or None (only for long runs), got {v!r}"
        )
    return v


def _position(v: Any, L: int) -> Any:
    """An int or a sequence / 1-D integer tensor of ints (whether each is a real token: the adapter checks)."""
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    try:
        t = torch.as_tensor(v)
    except (TypeError, ValueError, RuntimeError):
        t = None
    if t is None or t.dim() != 1 or t.dtype not in (torch.int64, torch.int32):
        raise InputError(f"position must be an int or one int per row (a list or 1-D integer tensor), got {v!r}")
    return t.long()


def _sources(v: Any, L: int) -> Optional[Tensor]:
    """Token spans of the context's sources, as (R, S, 2) (:func:`lrp_core.sources.as_spans`); ``None`` passes."""
    from ..sources import as_spans  # late: lrp_core.sources is a leaf, but keeps this module's imports small

    return None if v is None else as_spans(v)


def _probability(name: str) -> Callable[[Any, int], float]:
    def check(v: Any, L: int) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
            raise InputError(f"{name} must be a number strictly between 0 and 1, got {v!r}")
        return float(v)

    return check


def _alpha(v: Any, L: int) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
        raise InputError(f"alpha must be a finite number >= 0 (0: least squares, no penalty), got {v!r}")
    return float(v)


def _filler(v: Any, L: int) -> Optional[int]:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise InputError(
            f"filler must be None (remove the source's tokens) or a token id (an int >= 0) that "
            f"replaces them, got {v!r}"
        )
    return v


def _option(
    default: T, help: str, check: Callable[[Any, int], Any], none_is_value: bool = False, generic: bool = False
) -> T:
    """A field of :class:`Options`: its ``default``, with ``help`` and ``check`` (and the flags of :class:`Option`)
    kept in the field's metadata. Typed as its default, as :func:`dataclasses.field` is, so a type checker
    checks the default against the field's annotation."""
    meta = {"help": help, "check": check, "none_is_value": none_is_value, "generic": generic}
    return field(default=default, metadata=meta)  # typed _T by dataclasses, as its default


@dataclass
class Options:
    """The parsed options a method reads (``call.opt.start_layer``, ...): every option any method takes, each
    already checked (a negative block counted from the end, ``max_memory`` in bytes), with its default.

    This class is the declaration of the options: each field's annotation is the type of the checked value,
    its default the default, its metadata the help text and the check (:func:`_option`). :data:`OPTIONS` is
    read from these fields. Which method takes which option is ``MethodSpec.options`` in
    :mod:`lrp_core.methods.registry`; per-modality defaults (``MethodSpec.defaults``) come before these.

    Each field's help text, written next to it, says what it means (:func:`describe` quotes it in error
    messages); :func:`lrp_core.explain`'s docstring documents every option for the user, with the methods
    that take it and their per-modality defaults.
    """

    start_layer: int = _option(
        0, "first block in the layer product (0-based; negative counts from the end)", _block("start_layer")
    )
    end_layer: Optional[int] = _option(
        None, "last block in the layer product (default: the last)", _block("end_layer"), none_is_value=True
    )
    rollout_norm: Optional[str] = _option(
        None, f"normalisation of each factor I + Ā_b, one of {NORMS}", _norm, none_is_value=True
    )
    use_gradient: bool = _option(
        True, "weight R^A by ∇A (True) or by A (False, the paper's ablation)", _flag("use_gradient")
    )
    progress: Optional[bool] = _option(
        None, "show a progress bar (None: only for long runs)", _progress, none_is_value=True, generic=True
    )
    keep_heads: bool = _option(False, "also return the per-head matrices (layers_per_head)", _flag("keep_heads"))
    batch_size: int = _option(64, "sequences per forward pass", _positive_int("batch_size"))
    position: Union[None, int, Tensor] = _option(
        None,
        "decoder language models: the token whose prediction is explained, an int or one per row (default: "
        "each row's last real token; negative counts from the end)",
        _position,
        none_is_value=True,
        generic=True,
    )
    # the Captum baselines (lrp_core.methods.baselines); their per-method defaults are in the registry
    n_steps: int = _option(50, "integration steps of Integrated Gradients", _positive_int("n_steps"))
    baseline: Union[str, int] = _option(
        "zeros",
        "reference input: 'zeros' | 'blur' (images), 'zeros' | 'pad' | "
        "'mask' | a token id (text; padding positions kept)",
        _baseline,
    )
    n_samples: int = _option(
        16, "noisy copies (smoothgrad) or coalitions (kernel_shap) per sample", _positive_int("n_samples")
    )
    stdevs: float = _option(
        0.6,
        "std of SmoothGrad's Gaussian noise, in input units (normalised pixels, embedding entries)",
        _positive_float("stdevs"),
    )
    seed: int = _option(0, "seed of the random draws (noise, coalitions), the same for every sample", _seed)
    base: str = _option(
        "attnlrp",
        "pa_lrp: the rule set the positional rules are added to, 'attnlrp', 'cp_lrp' "
        "or 'cp_halved' (the authors' ViT rules: CP-LRP with A·V's ÷2 kept; not conservative)",
        _choice("base", ("attnlrp", "cp_lrp", "cp_halved")),
    )
    # sources as units (lrp_core.sources) and the ablation methods on them (lrp_core.methods.ablation)
    sources: Optional[Tensor] = _option(
        None,
        "token spans (start, end) of the context's sources, counted from each row's first real token: one "
        "list for every row or one per row; fills Explanation.sources (B, S)",
        _sources,
        none_is_value=True,
        generic=True,
    )
    n_ablations: int = _option(64, "context_cite: random ablation masks per row", _positive_int("n_ablations"))
    keep_prob: float = _option(
        0.5, "context_cite: the probability that a source is kept in a mask", _probability("keep_prob")
    )
    alpha: float = _option(0.01, "context_cite: the Lasso penalty on the standardised masks (0: least squares)", _alpha)
    filler: Optional[int] = _option(
        None,
        "leave_one_out, context_cite: None removes an ablated source's tokens "
        "(later positions follow), a token id replaces them",
        _filler,
        none_is_value=True,
    )
    # how the call is split into pieces (lrp_core.runtime.memory; read by ``explain``, not by the methods)
    composite: Optional[Composite] = _option(
        None,
        "the rule set of the relevance pass (lrp_core.rules.Composite; default: the method's own): lrp, "
        "partial_lrp take an explicit-pass one (from LRP_BASELINE), attnlrp, cp_lrp a modified-gradient one "
        "(from ATTNLRP, CP_LRP)",
        _composite,
    )
    max_memory: Optional[float] = _option(
        None,
        "bytes or '2GB' a call may use, else it runs in pieces; None/'auto': half the free memory, 'none': never split",
        lambda v, L: memory.parse_max_memory(v),
        generic=True,
    )
    chunk_size: Optional[int] = _option(
        None,
        "samples per piece, instead of max_memory",
        _positive_int("chunk_size", " (samples per piece)", optional=True),
        generic=True,
    )
    # the precision every pass is computed in (lrp_core.runtime.precision; entered by ``explain``'s call guard)
    dtype: Optional[torch.dtype] = _option(
        None,
        "torch.float64 computes every pass in float64 without copying the model (None: the model's own "
        "precision, half models in float32)",
        lambda v, L: check_dtype(v),
        none_is_value=True,
        generic=True,
    )
    # the end-to-end check of every call (lrp_core.adapters.verification; read by ``explain``, not by the methods)
    unverified: bool = _option(
        False,
        "True skips the check that the replay reproduces the model's own output on these inputs (benchmarks): "
        "a model the replay misreads is then explained wrongly, silently",
        _flag("unverified"),
        generic=True,
    )


def _declared() -> tuple[Option, ...]:
    """:data:`OPTIONS`, read from the fields of :class:`Options`."""
    hints = get_type_hints(Options)
    return tuple(
        Option(
            f.name,
            f.default,
            f.metadata["help"],
            f.metadata["check"],
            f.metadata["none_is_value"],
            f.metadata["generic"],
            hints[f.name],
        )
        for f in fields(Options)
    )


#: Every option any method takes, in the order they are checked: the fields of :class:`Options`.
OPTIONS: tuple[Option, ...] = _declared()
#: The options by name.
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
#: Options every method takes: how the call runs, not what it computes (a progress bar, pieces).
GENERIC_OPTIONS: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.generic)


def check_together(values: dict) -> None:
    """The checks that involve two options (``values``: every option, already checked one by one).

    Parameters
    ----------
    values : dict
        Every option by name, each already checked on its own.

    Raises
    ------
    InputError
        If ``end_layer`` is before ``start_layer``, or both ``chunk_size`` and
        ``max_memory`` are given.
    """
    if values["end_layer"] is not None and values["end_layer"] < values["start_layer"]:
        raise InputError(f"end_layer={values['end_layer']} is before start_layer={values['start_layer']}")
    if values["chunk_size"] is not None and values["max_memory"] is not None:
        raise InputError(
            "give chunk_size (samples per piece) or max_memory (a budget the pieces are sized to), not both"
        )


def describe(name: str) -> str:
    """``name (help)`` for error messages.

    Parameters
    ----------
    name : str
        An option's name.

    Returns
    -------
    str
        ``"name (help)"``.
    """
    return f"{name} ({BY_NAME[name].help})"


__all__ = ["Option", "Options", "OPTIONS", "BY_NAME", "GENERIC_OPTIONS", "check_together", "describe"]
