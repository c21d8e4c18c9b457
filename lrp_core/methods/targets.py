"""What ``target=`` accepts, checked before any work is done.

A target names the class (or, for CLIP, the prompt / image) each sample is
explained for. Only integers are class ids: Python ints, NumPy integer
scalars and integer arrays, integer tensors. Floats are refused rather than
truncated (``0.7`` is not class 0), bools rather than read as 0 / 1, and an
id outside ``0 … C−1`` is an :class:`~lrp_core.errors.InputError` whatever
its size (``10**20`` included), never an ``OverflowError``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from ..adapters import EmbeddingTarget
from ..errors import InputError
from . import registry
from .call import ConceptTarget, Contrast

#: ``str``: a question-answering head's ``"start"`` / ``"end"`` (read by its adapter: lrp_core.adapters.task_heads)
Target = Union[
    None, int, str, Sequence[int], Sequence[str], Tensor, np.ndarray, ConceptTarget, Contrast, EmbeddingTarget
]

#: the accepted forms, for error messages
ACCEPTED = (
    "target must be None (the predicted class), an integer class id (a Python int or a NumPy integer), "
    "a sequence / 1-D NumPy array / integer tensor of one class id per sample, Contrast(positive, negative), "
    "or — for method='cdam' — a ConceptTarget"
)

_INTEGERS = "targets are integer class ids: a float is not rounded, a bool is not a class"

#: ``resolve(logits (B, C), rows=None) -> (B,)`` long targets; ``rows`` picks the samples of a piece
Resolver = Callable[..., Tensor]


def _is_int(x: Any) -> bool:
    """A Python / NumPy integer (bools excluded) or a 0-dim integer tensor / array."""
    if isinstance(x, (bool, np.bool_)):
        return False
    if isinstance(x, numbers.Integral):  # int and every NumPy integer type
        return True
    if isinstance(x, (Tensor, np.ndarray)) and x.ndim == 0:
        return _integer_dtype(x)
    return False


def _integer_dtype(x: Union[Tensor, np.ndarray]) -> bool:
    if isinstance(x, Tensor):
        return not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)
    return x.dtype.kind in "iu"


def _kind(x: Any) -> str:
    """How to name ``x`` in an error: its type, and its dtype where it has one."""
    dtype = getattr(x, "dtype", None)
    return f"{type(x).__name__} of dtype {dtype}" if dtype is not None else type(x).__name__


def class_ids(target: Any, batch: int) -> list[int]:
    """``target`` (not ``None``) as ``batch`` Python ints, or :class:`InputError` naming the accepted forms.

    A single id, a one-element tensor or a one-element array applies to every sample.

    Parameters
    ----------
    target : Any
        A class id (int, one-element tensor or array) for every sample, or one per
        sample (a sequence, tensor or array of B ints); not ``None``.
    batch : int
        Number of samples B.

    Returns
    -------
    list[int]
        B class ids.

    Raises
    ------
    InputError
        If ``target`` is not one of the accepted forms or has the wrong number of ids.
    """
    if _is_int(target):
        return [int(target)] * batch
    if isinstance(target, (Tensor, np.ndarray)):
        if not _integer_dtype(target):
            raise InputError(f"{ACCEPTED}; got a {_kind(target)} — {_INTEGERS}")
        if target.ndim > 1:
            raise InputError(
                f"{ACCEPTED}; got a {type(target).__name__} of shape {tuple(target.shape)} — "
                f"one class per sample needs shape ({batch},)"
            )
        ids = [int(v) for v in target.reshape(-1).tolist()]
        if len(ids) == 1:
            ids = ids * batch
    elif isinstance(target, (list, tuple, range)):
        bad = [v for v in target if not _is_int(v)]
        if bad:
            raise InputError(
                f"{ACCEPTED}; got a {type(target).__name__} holding {_kind(bad[0])} ({bad[0]!r}) — {_INTEGERS}"
            )
        ids = [int(v) for v in target]
    else:
        raise InputError(f"{ACCEPTED}; got {_kind(target)}")
    if len(ids) != batch:
        raise InputError(
            f"target has {len(ids)} class ids for a batch of {batch} (one per sample, or a single int for all)"
        )
    return ids


def resolver(target: Any, batch: int, num_classes: int) -> Resolver:
    """Validate ``target`` now; return a function that turns the logits (B, C) into targets (B,).

    ``None``: the argmax of each sample's logits, read when the logits exist.

    Parameters
    ----------
    target : Any
        ``None``, a class id for all samples, or one per sample (see :func:`class_ids`).
    batch : int
        Number of samples B.
    num_classes : int
        Number of classes C of the model's readout.

    Returns
    -------
    Resolver
        A function (B, C) logits -> (B,) targets.

    Raises
    ------
    InputError
        If a target is out of range ``0 … C − 1`` (or not an accepted form).
    """
    if target is None:
        return lambda logits, rows=None: logits.argmax(dim=-1)
    ids = class_ids(target, batch)
    bad = list(dict.fromkeys(v for v in ids if not 0 <= v < num_classes))  # Python ints: no overflow
    if bad:
        raise InputError(f"target {bad} out of range: the model has {num_classes} classes (0 … {num_classes - 1})")
    t = torch.tensor(ids, dtype=torch.long)

    def resolve(logits: Tensor, rows: Optional[Tensor] = None) -> Tensor:
        on = t.to(logits.device)
        return on if rows is None else on[rows.to(logits.device)]

    return resolve


@dataclass
class Goal:
    """What a call explains, checked before any work: the target resolver, the contrast class ``negative``
    (B,) of a :class:`Contrast` (else ``None``) and the :class:`ConceptTarget` (else ``None``)."""

    resolve: Resolver
    negative: Optional[Tensor] = None
    concept: Optional[ConceptTarget] = None


def goal(spec: Any, target: Any, batch: int, num_classes: int, model_name: str) -> Goal:
    """Check ``target`` against the method and the batch's readout; :class:`InputError` naming what is accepted.

    Parameters
    ----------
    spec : Any
        The method (its class or object: :mod:`lrp_core.methods.objects`).
    target : Any
        The caller's target (class ids, ``None``, a :class:`Contrast` or a concept target).
    batch : int
        Number of samples B.
    num_classes : int
        Number of classes of the batch's readout; 0 without a classification head.
    model_name : str
        The model's name, for the messages.

    Returns
    -------
    Goal
        What the call explains: the target resolver, the contrast's negative classes (B,) and the
        concept target (each ``None`` when not given).

    Raises
    ------
    InputError
        If the target does not fit the method or the readout: a concept target for
        another method, a class target on a model without classification head, a
        contrast for a class-agnostic method or without its negative class.
    """
    concept = target if isinstance(target, ConceptTarget) else None
    if concept is not None and not spec.concept_target:
        takers = [n for n, s in registry.METHODS.items() if s.concept_target]
        raise InputError(f"a concept target works with method={takers[0]!r} only, not {spec.name!r}")
    if concept is None and num_classes == 0 and not spec.class_agnostic:
        raise InputError(
            f"{model_name} has no classification head: explain it with a class-agnostic "
            f"method ({', '.join(registry.CLASS_AGNOSTIC)}), with target=lrp_core.Projection(v) or "
            "lrp_core.Similarity(e_ref) (its embedding), or with method='cdam' and a concept target "
            "(lrp_core.concept_target)"
        )
    negative = None
    if isinstance(target, Contrast):
        if spec.class_agnostic:
            raise InputError(
                f"{spec.name!r} does not depend on the target class, so a contrast explains nothing; "
                "use a class-sensitive method"
            )
        if target.negative is None:
            raise InputError(
                "Contrast(positive, negative) needs the class to contrast with (negative), e.g. "
                "Contrast(positive=None, negative=3): the prediction rather than class 3"
            )
        negative = resolver(target.negative, batch, num_classes)(torch.empty(0))
        target = target.positive
    return Goal(resolver(target if concept is None else None, batch, num_classes), negative, concept)


__all__ = ["ACCEPTED", "Target", "class_ids", "resolver", "Goal", "goal"]
