"""The method registry: name → method class (:mod:`lrp_core.methods.objects`), and the string shorthand.

``explain(..., method="integrated_gradients", n_steps=32)`` is resolved here to
``IntegratedGradients(n_steps=32)`` (:func:`method_of`): a keyword the method does not own is refused with
a message naming the method's options. ``explain``, the widgets, the memory estimate and the evaluation read
the classes' attributes through this table.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

from ..errors import InputError, UnknownMethodError
from ..explanation import OPTIONAL_FIELDS
from . import objects
from .options import SHARED_OPTIONS, Method

#: The token-map methods by name, in the order the course introduces them.
METHODS: dict[str, type[Method]] = {m.name: m for m in objects.TOKEN_MAP}
#: The methods that score sources rather than tokens (docs/METHODS.md §2s): each needs ``sources=`` and a decoder
#: language model; ``explain`` runs them like the others (:func:`get` finds them), but they are not in
#: :data:`METHOD_NAMES`, the token-map methods every model takes.
SOURCE_METHODS: dict[str, type[Method]] = {m.name: m for m in objects.SOURCE}
#: The names of :data:`SOURCE_METHODS`.
SOURCE_METHOD_NAMES: tuple = tuple(SOURCE_METHODS)
#: Method names in the order the course introduces them.
METHOD_NAMES: tuple = tuple(METHODS)
#: Methods whose map does not depend on the target class.
CLASS_AGNOSTIC: tuple = tuple(n for n, s in METHODS.items() if s.class_agnostic)
#: the methods that run on decoder language models
DECODER_METHODS: tuple = tuple(METHODS)  # every method runs on decoder language models
#: Every option any method owns, by name (the options every method takes are :data:`SHARED_OPTIONS`).
METHOD_OPTIONS: frozenset[str] = frozenset(o for m in objects.ALL for o in m.option_names())
#: Every keyword a method name may be given with: the methods' own options and the shared ones.
OPTION_NAMES: frozenset[str] = METHOD_OPTIONS | frozenset(SHARED_OPTIONS)

MethodLike = Union[str, Method, type[Method]]


def _check_declarations() -> None:
    """A method that fills an undeclared result field, or owns a shared option, fails at import."""
    for m in objects.ALL:
        bad = [f for f in m.returns if f not in OPTIONAL_FIELDS]
        if bad:
            raise TypeError(
                f"method {m.name!r} returns {bad}, not in lrp_core.explanation.RESULT_FIELDS "
                f"(optional: {OPTIONAL_FIELDS})"
            )
        own = set(m.option_names())
        if own & set(SHARED_OPTIONS) or ("composite" in own) != (m.rule_pass is not None):
            raise TypeError(f"method {m.name!r}: a shared option, or a composite without its kind of pass")


_check_declarations()


def get(method: str) -> type[Method]:
    """The class of ``method``, or :class:`UnknownMethodError` naming the choices.

    Parameters
    ----------
    method : str
        A method name.

    Returns
    -------
    type[Method]
        Its class.
    """
    try:
        return METHODS[method] if method in METHODS else SOURCE_METHODS[method]
    except (KeyError, TypeError):
        raise UnknownMethodError(
            f"unknown method {method!r}; choose one of {', '.join(METHODS)} (or, to score "
            f"sources, {', '.join(SOURCE_METHODS)})"
        ) from None


def name_of(method: MethodLike) -> str:
    """The name of a method given as a name, a class or an object (a name is checked: :func:`get`).

    Parameters
    ----------
    method : str, Method class or Method
        The method.

    Returns
    -------
    str
        Its name (``Method.name``).
    """
    if isinstance(method, Method) or (isinstance(method, type) and issubclass(method, Method)):
        return method.name
    return get(method).name  # not a name: refused, naming the choices


def method_of(method: MethodLike, options: Mapping[str, Any]) -> Method:
    """The method object of ``method`` (a name, a class or an object) with the method keywords ``options``.

    ``None`` values are "not given". A keyword no method owns, or one ``method`` does not own, is an
    :class:`InputError` naming the accepted options; so is a keyword given with a method object (its options
    are its fields).

    Parameters
    ----------
    method : str, Method class or Method
        The method.
    options : Mapping[str, Any]
        The method keywords given besides the shared ones.

    Returns
    -------
    Method
        The method object, its options checked (not yet bound to a model: :meth:`Method.bind`).
    """
    given = {k: v for k, v in options.items() if v is not None or k not in OPTION_NAMES}  # None: not given
    cls: type[Method]
    if isinstance(method, Method):
        cls = type(method)
    elif isinstance(method, type) and issubclass(method, Method):
        cls = method
    else:
        cls = get(method)
    unknown = sorted(set(given) - OPTION_NAMES)
    if unknown:
        raise InputError(f"unknown option(s) {unknown}; {_accepted(cls)}")
    refused = sorted(k for k in given if not cls.takes(k))
    if refused:
        raise InputError(f"method {cls.name!r} does not take option(s) {refused}; {_accepted(cls)}")
    if isinstance(method, Method):
        if given:
            raise InputError(
                f"method={method!r} carries its own options: give {sorted(given)} to "
                f"{type(method).__name__}(...), not to explain"
            )
        return method
    return cls(**given)


def _accepted(cls: type[Method]) -> str:
    shared = "; ".join(cls.describe(o) for o in SHARED_OPTIONS)
    if not cls.option_names():
        return f"method {cls.name!r} accepts no options of its own; like every method it accepts {shared}"
    own = "; ".join(cls.describe(o) for o in cls.option_names())
    return f"method {cls.name!r} accepts: {own}; and, like every method, {shared}"


def filled_by(field: str) -> tuple[str, ...]:
    """The methods that fill the optional :class:`~lrp_core.Explanation` field ``field``.

    Parameters
    ----------
    field : str
        Name of an optional :class:`~lrp_core.Explanation` field (e.g. ``"pixels"``).

    Returns
    -------
    tuple[str, ...]
        The names of the methods that fill it.
    """
    return tuple(n for n, s in METHODS.items() if field in s.returns)


def product_norm(method: str, options: Mapping[str, Any]) -> Optional[str]:
    """How the factors I + Ā_b of ``method``'s layer product are normalised.

    Parameters
    ----------
    method : str
        A method name.
    options : Mapping[str, Any]
        The options an explanation used (``Explanation.options``).

    Returns
    -------
    Optional[str]
        ``"none"``, ``"row"``, or ``None`` for a method without per-block matrices.
    """
    cls = get(method)
    return options.get("rollout_norm") if cls.takes("rollout_norm") else cls.product_norm


def defaults_key(adapter: Any) -> str:
    """The key of :attr:`Method.defaults` an adapter's calls read.

    Parameters
    ----------
    adapter : Any
        The model's adapter.

    Returns
    -------
    str
        Its modality (``"image"`` | ``"text"``), or ``"decoder"`` for a decoder LM (whose defaults are
        ``"text"``'s, overridden by ``"decoder"``'s where given).
    """
    return "decoder" if adapter.is_decoder else adapter.modality


def bound(method: MethodLike, options: Mapping[str, Any], adapter: Any) -> Method:
    """:func:`method_of`, bound to ``adapter``'s model (its modality's defaults, its number of blocks).

    Parameters
    ----------
    method : str, Method class or Method
        The method.
    options : Mapping[str, Any]
        The method keywords given besides the shared ones.
    adapter : Any
        The model's adapter.

    Returns
    -------
    Method
        The method object with every option set (:meth:`Method.bind`).
    """
    return method_of(method, options).bind(adapter.num_blocks, defaults_key(adapter))


__all__ = [
    "METHODS",
    "METHOD_NAMES",
    "SOURCE_METHODS",
    "SOURCE_METHOD_NAMES",
    "CLASS_AGNOSTIC",
    "DECODER_METHODS",
    "OPTION_NAMES",
    "get",
    "name_of",
    "method_of",
    "bound",
    "defaults_key",
    "product_norm",
    "filled_by",
]
