"""Evaluation data sets: the containers, the built-in held-out sets, record normalisation.

- :class:`ImageSet`: images with object masks (and labels when known).
- :class:`TextSet`: documents with human rationales (:class:`RationaleRecord`).
- :func:`scene_sets`: held-out toy scenes (:data:`SCENE_SEED`), the built-in
  image data of models whose ``info["evaluation_data"]`` is ``"scenes"``
  (:data:`BUILTIN_IMAGE_SETS`).
- :func:`rationale_set`: the shipped rationale set, the built-in text data.
- :func:`label_id`, :func:`as_record`: labels given by id or name, and records
  from dicts or objects, as the loaders of :mod:`lrp_core.data.folders` read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from .rationales import RationaleRecord, load_rationales

SCENE_SEED = 20_000_003
"""Seed of the held-out one-object scenes (the two-object scenes use ``SCENE_SEED + 1``).

Outside the toy ViT's training seeds (``seed * 10^6 + step * 2 + {0, 1} < 10^7``) and
distinct from its own evaluation seeds (``10_000_019`` …)."""


@dataclass
class ImageSet:
    """Images for perturbation / segmentation (and, with ``n_objects == 2``, class sensitivity).

    Attributes:
        images: (N, 3, H, W) model inputs (normalised).
        labels: (N, k) true classes, or ``None`` when unknown.
        masks: (N, k, H, W) bool object masks (object j has class ``labels[:, j]``).
        removed: (N, k, 3, H, W) model inputs of the same scenes with object j
            left out (everything else identical), or ``None``; the deletion
            check measures the logit drops with them.
    """

    images: Tensor
    labels: Optional[Tensor]
    masks: Tensor
    removed: Optional[Tensor] = None

    def __len__(self) -> int:
        return self.images.shape[0]

    def head(self, n: int) -> "ImageSet":
        """The first ``n`` images (all of them when there are fewer)."""
        return ImageSet(
            self.images[:n],
            None if self.labels is None else self.labels[:n],
            self.masks[:n],
            None if self.removed is None else self.removed[:n],
        )


@dataclass
class TextSet:
    """Documents for the rationale evaluation (``rationale`` as (W,) bool arrays)."""

    records: list[RationaleRecord] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)

    def head(self, n: int) -> "TextSet":
        """The first ``n`` documents (all of them when there are fewer)."""
        return TextSet(self.records[:n])


def scene_sets(
    n: int,
    seed: int = SCENE_SEED,
    size: int = 64,
    inputs: Optional[Callable[[np.ndarray], Tensor]] = None,
) -> tuple[ImageSet, ImageSet]:
    """Held-out scenes: ``n`` one-object and ``n`` two-object scenes (with ``removed``).

    Parameters
    ----------
    n : int
        Number of scenes of each kind.
    seed : int, optional
        Seed of the scenes (default :data:`SCENE_SEED`, held out from training).
    size : int, optional
        side in pixels the scenes are drawn at (64: the toy ViT's input).
    inputs : Optional[Callable[[np.ndarray], Tensor]], optional
        rgb (N, H, W, 3) in [0, 1] -> model inputs (N, 3, H, W); default
        the toy ViT's normalisation (``Scenes.images``).

    Returns
    -------
    tuple[ImageSet, ImageSet]
        ``(one_object, two_object)`` sets; the two-object set holds ``removed``,
        the scenes with each object left out.
    """
    from .scenes import make_scenes

    def draw(k: int, s: int, drop: Optional[int] = None) -> Any:
        sc = make_scenes(n, seed=s, n_objects=k, size=size, drop=drop)
        return sc, (sc.images if inputs is None else inputs(sc.rgb))

    one, x1 = draw(1, seed)
    two, x2 = draw(2, seed + 1)
    removed = torch.stack([draw(2, seed + 1, j)[1] for j in (0, 1)], dim=1)
    return (ImageSet(x1, one.labels, one.masks), ImageSet(x2, two.labels, two.masks, removed))


def dinov2_scene_sets(n: int, seed: int = SCENE_SEED) -> tuple[ImageSet, ImageSet]:
    """The held-out scenes drawn at ``dinov2-scenes``' input size, ImageNet-normalised.

    Parameters
    ----------
    n : int
        Number of scenes of each kind.
    seed : int, optional
        Seed of the scenes (default :data:`SCENE_SEED`).

    Returns
    -------
    tuple[ImageSet, ImageSet]
        ``(one_object, two_object)`` as :func:`scene_sets` returns them.
    """
    from .scenes import DINOV2_SCENE_SIZE, imagenet_normalize

    return scene_sets(n, seed, size=DINOV2_SCENE_SIZE, inputs=imagenet_normalize)


BUILTIN_IMAGE_SETS: dict[str, Callable[[int, int], tuple[ImageSet, ImageSet]]] = {
    "scenes": scene_sets,
    "dinov2-scenes": dinov2_scene_sets,
}
"""Built-in image evaluation data by name: ``(n, seed) -> (one-object set, two-object set)``.

A loaded model names its own in ``info["evaluation_data"]`` (the toy ViT: ``"scenes"``,
the data it was trained on); other image models need user data (``--data``)."""


def rationale_set(labels: Sequence[str]) -> TextSet:
    """The shipped rationale set (:func:`load_rationales`), labels read against ``labels``.

    Parameters
    ----------
    labels : Sequence[str]
        The model's class names, to read the records' labels against.

    Returns
    -------
    TextSet
        The shipped records with their label ids.
    """
    return TextSet([as_record(r, labels) for r in load_rationales()])


def label_id(label: Any, names: Sequence[str]) -> int:
    """Class id from an int or a (case-insensitive, prefix-tolerant) class name.

    Parameters
    ----------
    label : Any
        A class id (int or digit string) or a class name.
    names : Sequence[str]
        The class names.

    Returns
    -------
    int
        The class id.

    Raises
    ------
    InputError
        If ``label`` is neither a class id nor a single class name (exact or prefix).
    """
    if isinstance(label, (int, np.integer)) and not isinstance(label, bool):
        return int(label)
    s = str(label).strip()
    if s.lstrip("-").isdigit():
        return int(s)
    low = [str(n).lower() for n in names]
    if s.lower() in low:
        return low.index(s.lower())
    hits = [i for i, n in enumerate(low) if n.startswith(s.lower()) or s.lower().startswith(n)]
    if len(hits) == 1:  # "POS" -> "positive", "neg" -> "negative"
        return hits[0]
    raise InputError(f"label {label!r} is not a class id or one of {list(names)}")


def as_record(rec: Any, names: Sequence[str]) -> RationaleRecord:
    """A record with a (W,) bool-array rationale from an object or dict.

    Reads ``words``, ``rationale``, ``label`` (id or name in ``names``) and the
    optional ``text`` (default: the words joined by spaces), ``offsets`` and ``id``.

    Parameters
    ----------
    rec : Any
        A record object or a dict with ``words``, ``rationale``, ``label`` (and
        optionally ``text``, ``offsets``, ``id``).
    names : Sequence[str]
        The class names, to read a label given by name.

    Returns
    -------
    RationaleRecord
        The record, with a (W,) bool rationale.

    Raises
    ------
    InputError
        If the rationale or the offsets do not have one entry per word (or the
        label is unknown).
    """
    get = (lambda k, d=None: rec.get(k, d)) if isinstance(rec, dict) else (lambda k, d=None: getattr(rec, k, d))
    words = [str(w) for w in get("words")]
    rationale = np.asarray(get("rationale"), dtype=bool).reshape(-1)
    if len(words) != rationale.shape[0]:
        raise InputError(f"{len(words)} words but {rationale.shape[0]} rationale flags")
    text = get("text") or " ".join(words)
    offsets = get("offsets")
    offsets = [(int(a), int(b)) for a, b in offsets] if offsets is not None else None
    if offsets is not None and len(offsets) != len(words):
        raise InputError(f"{len(words)} words but {len(offsets)} offsets")
    return RationaleRecord(
        text=str(text),
        words=words,
        rationale=rationale,
        label=label_id(get("label"), names),
        offsets=offsets,
        id=str(get("id") or ""),
    )


__all__ = [
    "SCENE_SEED",
    "ImageSet",
    "TextSet",
    "scene_sets",
    "dinov2_scene_sets",
    "BUILTIN_IMAGE_SETS",
    "rationale_set",
    "label_id",
    "as_record",
]
