"""What a method object is: :class:`Method` (the base of every method class), the checks its options run, and
:class:`Shared`, the options every call takes (how it runs, not what it computes).

A method is a frozen dataclass (:mod:`lrp_core.methods.objects`) whose fields are its own options, each
declared with :func:`own` (default, help text, check). Constructing one checks every value
(:class:`~lrp_core.errors.InputError` naming what is accepted); :meth:`Method.bind` then fills the defaults
of the model's modality (``None`` means "the method's default") and checks the block indices against the
model's depth. The class attributes say what the engine, the memory estimate and the widgets need to know
about the method (its function, its memory profile, what it returns).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Optional, TypeVar, Union

import torch
from torch import Tensor

from ..errors import InputError
from ..rules.composites import Composite
from ..runtime import memory
from ..runtime.precision import check_dtype
from .products import NORMS

if TYPE_CHECKING:
    from .call import Call, MethodResult

#: ``check(value, num_blocks)``: the value normalised, or an InputError; ``num_blocks`` is ``None`` before the
#: model is known (a block index is then only type-checked).
Check = Callable[[Any, Optional[int]], Any]
T = TypeVar("T")
M = TypeVar("M", bound="Method")

#: The reference inputs of the Captum baselines (lrp_core.methods.baselines): images, text, or a token id (text).
BASELINES = ("zeros", "blur", "pad", "mask")


def own(default: T, help: str, check: Check) -> T:
    """A field of a method class (or of :class:`Shared`), typed as its default (as :func:`dataclasses.field` is).

    Parameters
    ----------
    default : T
        The option's default (``None``: the method's default for the modality, :attr:`Method.defaults`).
    help : str
        What it means, for error messages.
    check : Check
        ``(value, num_blocks) -> value``: the value normalised, or an InputError naming what is accepted.

    Returns
    -------
    T
        The dataclass field.
    """
    return field(default=default, metadata={"help": help, "check": check})  # typed T by dataclasses


# ----------------------------------------------------------------------------
# the checks (each returns the value normalised)
# ----------------------------------------------------------------------------
def block(name: str) -> Check:
    """An int in -L … L-1, returned as 0 … L-1 once L is known (``None`` passes)."""

    def check(v: Any, L: Optional[int]) -> Optional[int]:
        if v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool):
            raise InputError(f"{name} must be an int, got {type(v).__name__}")
        if L is None:
            return v
        if not -L <= v < L:
            raise InputError(
                f"{name}={v} is out of range: the model has {L} blocks, so use 0 … {L - 1} (or -{L} … -1 from the end)"
            )
        return v % L

    return check


def flag(name: str) -> Check:
    def check(v: Any, L: Optional[int]) -> bool:
        if not isinstance(v, bool):
            raise InputError(f"{name} must be True or False, got {v!r}")
        return v

    return check


def _low_memory(v: Any) -> Optional[bool]:
    if v is not None and not isinstance(v, bool):
        raise InputError(f"low_memory must be None (decided by the memory plan), True or False, got {v!r}")
    return v


def positive_int(name: str, what: str = "", optional: bool = False) -> Check:
    def check(v: Any, L: Optional[int]) -> Optional[int]:
        if optional and v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InputError(f"{name} must be a positive int{what}, got {v!r}")
        return v

    return check


def positive_float(name: str, optional: bool = False) -> Check:
    def check(v: Any, L: Optional[int]) -> Optional[float]:
        if optional and v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v == float("inf"):
            raise InputError(f"{name} must be a positive number, got {v!r}")
        return float(v)

    return check


def probability(name: str) -> Check:
    def check(v: Any, L: Optional[int]) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
            raise InputError(f"{name} must be a number strictly between 0 and 1, got {v!r}")
        return float(v)

    return check


def choice(name: str, choices: tuple, optional: bool = False) -> Check:
    """One of ``choices`` (or ``None`` where ``optional``)."""

    def check(v: Any, L: Optional[int]) -> Any:
        if not (optional and v is None) and v not in choices:
            raise InputError(f"{name} must be one of {choices}, got {v!r}")
        return v

    return check


def seed(v: Any, L: Optional[int]) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise InputError(f"seed must be an int >= 0, got {v!r}")
    return v


def baseline(v: Any, L: Optional[int]) -> Any:
    """A name of :data:`BASELINES` or a token id (an int >= 0); which fits the modality, the method checks."""
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
        return v
    if v not in BASELINES:
        raise InputError(
            f"baseline must be one of {BASELINES} (images: 'zeros', 'blur'; text: 'zeros', 'pad', "
            f"'mask') or a token id (an int >= 0, text), got {v!r}"
        )
    return v


def rollout_norm(v: Any, L: Optional[int]) -> Optional[str]:
    if v is not None and v not in NORMS:
        raise InputError(f"rollout_norm must be one of {NORMS}, got {v!r}")
    return v


def composite(v: Any, L: Optional[int]) -> Optional[Composite]:
    """A rule set (:class:`~lrp_core.rules.Composite`); which kind of pass it must serve, the method checks."""
    if v is not None and not isinstance(v, Composite):
        raise InputError(
            f"composite must be a rule set (lrp_core.rules.Composite, e.g. "
            f"ATTNLRP.with_rules(by_kind={{LINEAR: GammaGradient(0.25)}})), got {type(v).__name__}"
        )
    return v


def filler(v: Any, L: Optional[int]) -> Optional[int]:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise InputError(
            f"filler must be None (remove the source's tokens) or a token id (an int >= 0) that "
            f"replaces them, got {v!r}"
        )
    return v


def alpha(v: Any, L: Optional[int]) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
        raise InputError(f"alpha must be a finite number >= 0 (0: least squares, no penalty), got {v!r}")
    return float(v)


def _progress(v: Any, L: Optional[int]) -> Optional[bool]:
    if v is not None and not isinstance(v, bool):
        raise InputError(
            f"progress must be True (a progress bar), False (none) or None (only for long runs), got {v!r}"
        )
    return v


def _position(v: Any, L: Optional[int]) -> Any:
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


def _sources(v: Any, L: Optional[int]) -> Optional[Tensor]:
    """Token spans of the context's sources, as (R, S, 2) (:func:`lrp_core.sources.as_spans`); ``None`` passes."""
    from ..sources import as_spans  # late: lrp_core.sources is a leaf, but keeps this module's imports small

    return None if v is None else as_spans(v)


def _checked(obj: Any, num_blocks: Optional[int]) -> dict[str, Any]:
    """Every field of the dataclass ``obj`` run through its check."""
    return {f.name: f.metadata["check"](getattr(obj, f.name), num_blocks) for f in fields(obj)}


def _normalise(obj: Any) -> None:
    """Store each field of a frozen dataclass as its check returns it (a list of positions as a tensor, ...)."""
    for name, value in _checked(obj, None).items():
        object.__setattr__(obj, name, value)


# ----------------------------------------------------------------------------
# the options every call takes
# ----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Shared:
    """How a call runs, whatever the method: ``explain``'s keyword-only parameters (each checked here)."""

    progress: Optional[bool] = own(None, "show a progress bar (None: only for long runs)", _progress)
    position: Union[None, int, Tensor] = own(
        None,
        "decoder language models: the token whose prediction is explained, an int or one per row (default: "
        "each row's last real token; negative counts from the end)",
        _position,
    )
    sources: Optional[Tensor] = own(
        None,
        "token spans (start, end) of the context's sources, counted from each row's first real token: one "
        "list for every row or one per row; fills Explanation.sources (B, S)",
        _sources,
    )
    max_memory: Optional[float] = own(
        None,
        "bytes or '2GB' a call may use, else it runs in pieces; None/'auto': half the free memory, 'none': never split",
        lambda v, L: memory.parse_max_memory(v),
    )
    chunk_size: Optional[int] = own(
        None, "samples per piece, instead of max_memory", positive_int("chunk_size", " (samples per piece)", True)
    )
    dtype: Optional[torch.dtype] = own(
        None,
        "torch.float64 computes every pass in float64 without copying the model (None: the model's own "
        "precision, half models in float32; a half model's own dtype: the fast half mode)",
        lambda v, L: check_dtype(v),
    )
    low_memory: Optional[bool] = own(
        None,
        "AttnLRP / CP-LRP: True runs the blockwise relevance pass (one block's graph at a time, attention in query "
        "chunks), False the full pass; None: blockwise where the full pass's predicted peak exceeds max_memory",
        lambda v, L: _low_memory(v),
    )
    unverified: bool = own(
        False,
        "True skips the check that the replay reproduces the model's own output on these inputs (benchmarks): "
        "a model the replay misreads is then explained wrongly, silently",
        flag("unverified"),
    )

    def __post_init__(self) -> None:
        if self.unverified is None:  # explain's keyword: None is the default
            object.__setattr__(self, "unverified", False)
        _normalise(self)
        if self.chunk_size is not None and self.max_memory is not None:
            raise InputError(
                "give chunk_size (samples per piece) or max_memory (a budget the pieces are sized to), not both"
            )


#: The options every method takes (the fields of :class:`Shared`).
SHARED_OPTIONS: tuple[str, ...] = tuple(f.name for f in fields(Shared))


# ----------------------------------------------------------------------------
# the base of every method
# ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Method:
    """A method and its own options (the fields of a subclass); the class attributes describe the method.

    ``run(call)`` computes it (a :class:`~lrp_core.methods.call.Call` carrying the bound method object);
    ``memory`` is its profile for the memory estimate (:mod:`lrp_core.runtime.memory`); ``returns`` the
    optional :class:`~lrp_core.Explanation` fields it fills; ``defaults`` the values of options left ``None``,
    per modality (``"image"`` | ``"text"`` | ``"decoder"``; a decoder reads ``"text"`` overridden by
    ``"decoder"``); ``class_agnostic``: its map does not depend on the target; ``concept_target``: it takes a
    :class:`~lrp_core.methods.call.ConceptTarget`; ``product_norm``: the normalisation of its layer product
    where it fixes one; ``readout_minimum``: docs/METHODS.md §5.6; ``rule_pass``: the kind of pass of the
    rule set it takes as ``composite=``.
    """

    name: ClassVar[str]
    memory: ClassVar[memory.Profile]
    returns: ClassVar[tuple[str, ...]] = ()
    defaults: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    class_agnostic: ClassVar[bool] = False
    concept_target: ClassVar[bool] = False
    product_norm: ClassVar[Optional[str]] = None
    readout_minimum: ClassVar[bool] = False
    rule_pass: ClassVar[Optional[str]] = None
    #: it has the blockwise relevance pass (``low_memory``: lrp_core.adapters.blockwise)
    blockwise: ClassVar[bool] = False

    @staticmethod
    def run(c: "Call[Any]") -> "MethodResult":
        """The function that computes the method on one call."""
        raise NotImplementedError

    def __post_init__(self) -> None:
        _normalise(self)
        self.check()

    def check(self) -> None:
        """Checks that involve two options or the rule set (a subclass's; the base has none)."""

    def check_bound(self) -> None:
        """Checks on the bound values (block indices counted from 0); the base has none."""

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The method's own options, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def takes(cls, option: str) -> bool:
        """Whether ``explain(..., method=cls.name, <option>=...)`` accepts ``option``."""
        return option in cls.option_names() or option in SHARED_OPTIONS

    @classmethod
    def describe(cls, option: str) -> str:
        """``option (help)`` for error messages."""
        owner: Any = Shared if option in SHARED_OPTIONS else cls
        return f"{option} ({next(f for f in fields(owner) if f.name == option).metadata['help']})"

    def bind(self: M, num_blocks: int, key: str) -> M:
        """This method with the defaults of ``key`` filled for the options left ``None`` (see :attr:`defaults`)
        and its block indices checked against the model's ``num_blocks`` (negative ones counted from the end).
        """
        given = self.defaults.get(key, {})
        if key == "decoder":
            given = {**self.defaults.get("text", {}), **given}
        filled = replace(self, **{k: v for k, v in given.items() if getattr(self, k) is None})
        bound = replace(filled, **_checked(filled, num_blocks))
        bound.check_bound()
        return bound

    def keywords(self) -> dict[str, Any]:
        """The options as the keywords of the string form: ``explain(m, x, method=o.name, **o.keywords())`` is
        ``explain(m, x, method=o)``."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def memory_knobs(self) -> dict[str, Any]:
        """The options the memory estimate reads (``keep_heads``, ``batch_size``), where the method has them."""
        return {k: getattr(self, k) for k in ("keep_heads", "batch_size") if k in self.option_names()}


__all__ = ["Method", "Shared", "SHARED_OPTIONS", "BASELINES", "own"]
