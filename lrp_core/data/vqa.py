"""Questions about procedural scenes whose answer is fixed by one known object: the VLM evidence task.

Every record is one scene of :func:`lrp_core.data.make_scenes` (two objects of different shapes, drawn at
:data:`~lrp_core.data.scenes.DINOV2_SCENE_SIZE` = 112 px, solid colours from the named :data:`PALETTE`, a
cluttered background) and one question whose one-word answer is decided by one object of the scene. The
*deciding object* — whose exact visible pixels are the record's ``mask`` — is, per question kind
(:data:`KINDS`):

- ``"where"``: "what is left of the ring ?" (also ``right of``, ``above``, ``below``): the answer is the
  shape of the *other* object, and the deciding object is that answered object (the ring only locates it).
  The direction is the axis along which the two objects' mask centroids are farthest apart, so the relation
  always holds by a clear margin (at least 16 px at 112 px).
- ``"which"``: "which shape is red ?": the answer is the shape of the red object, the deciding object.
- ``"colour"``: "what colour is the cross ?": the answer is the cross's colour name; the cross decides.
- ``"exists"``: "is there a cross ?": ``yes`` (the cross decides) or ``no``. A ``no`` has no deciding object:
  its ``mask`` is all ``False`` and ``has_evidence`` is ``False``, so evidence evaluations leave it out
  (``[r for r in records if r.has_evidence]``).

Text is lower-case words and a final ``?`` separated by spaces, so a word-level tokenizer maps each word
(and each answer) onto one token (:func:`vocabulary`). Every record is generated from a seed: one seed,
identical records; the embedded ``tiny-vlm`` is trained on seeds below
:data:`lrp_core.models.tiny_vlm.HELD_OUT_SEED` only, so held-out sets are seeds from there on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from .scenes import CLASS_NAMES, DINOV2_SCENE_SIZE, make_scenes

__all__ = ["PALETTE", "COLOUR_NAMES", "KINDS", "VQARecord", "make_vqa", "vocabulary"]

#: the named object colours (RGB in [0, 1]); object colours are exactly these (no texture)
PALETTE: dict[str, tuple[float, float, float]] = {
    "red": (0.86, 0.08, 0.08),
    "green": (0.10, 0.65, 0.15),
    "blue": (0.10, 0.25, 0.90),
    "yellow": (0.95, 0.88, 0.10),
    "white": (0.97, 0.97, 0.97),
    "black": (0.05, 0.05, 0.05),
}
COLOUR_NAMES: tuple[str, ...] = tuple(PALETTE)
#: the question kinds, in the order make_vqa cycles through them
KINDS: tuple[str, ...] = ("where", "which", "colour", "exists")
_DIRECTIONS = {
    "left": "what is left of the {s} ?",
    "right": "what is right of the {s} ?",
    "above": "what is above the {s} ?",
    "below": "what is below the {s} ?",
}
_QUESTION_SEED = 7_654_321  # mixed with the record seed: the questions' generator differs from the scenes'


@dataclass
class VQARecord:
    """One question about one scene.

    Attributes:
        image: the scene, a PIL RGB image of 112 x 112 px.
        question: lower-case words ending in ``" ?"``.
        answer: one word of :func:`vocabulary` (a shape, a colour name, ``yes`` or ``no``).
        mask: (H, W) bool numpy array at the image's size, the deciding object's visible pixels; all
            ``False`` when there is none (``has_evidence`` False).
        kind: one of :data:`KINDS`.
        has_evidence: whether one object decides the answer (every kind except a ``no`` of ``"exists"``).
        shapes, colours: the scene's two objects' shape and colour names, in drawing order.
        masks: (2, H, W) bool, both objects' visible pixels (disjoint).
        seed: the seed of the set; index: the scene's index in the set.
    """

    image: Any
    question: str
    answer: str
    mask: np.ndarray
    kind: str
    has_evidence: bool
    shapes: tuple = ()
    colours: tuple = ()
    masks: np.ndarray = field(default_factory=lambda: np.zeros((2, 0, 0), dtype=bool))
    seed: int = 0
    index: int = 0


def vocabulary() -> list[str]:
    """The words of every question and answer, in a fixed order (the tokenizer's vocabulary after its specials).

    Returns
    -------
    list[str]
        Question words, then the shapes (:data:`~lrp_core.data.scenes.CLASS_NAMES`), the colour names
        (:data:`COLOUR_NAMES`), ``yes`` and ``no``.
    """
    words = [
        "what",
        "which",
        "is",
        "of",
        "the",
        "there",
        "a",
        "shape",
        "colour",
        "left",
        "right",
        "above",
        "below",
        "?",
    ]
    return words + list(CLASS_NAMES) + list(COLOUR_NAMES) + ["yes", "no"]


def _centroids(masks: np.ndarray) -> np.ndarray:
    """(k, 2) (row, column) centroids of (k, H, W) masks."""
    rows, cols = np.mgrid[0 : masks.shape[1], 0 : masks.shape[2]]
    area = masks.sum((1, 2)).astype(np.float64)
    return np.stack([(masks * rows).sum((1, 2)) / area, (masks * cols).sum((1, 2)) / area], axis=1)


def _scene_questions(shapes: list[str], colours: list[str], masks: np.ndarray) -> list[tuple[str, str, str, int]]:
    """Every question of a two-object scene: ``(kind, question, answer, deciding object or -1)``."""
    out: list[tuple[str, str, str, int]] = []
    c = _centroids(masks)
    d_row, d_col = c[1] - c[0]  # object 1 relative to object 0
    for anchor, other in ((0, 1), (1, 0)):
        sign = 1.0 if other == 1 else -1.0
        if abs(d_col) >= abs(d_row):
            direction = "right" if sign * d_col > 0 else "left"
        else:
            direction = "below" if sign * d_row > 0 else "above"
        out.append(("where", _DIRECTIONS[direction].format(s=shapes[anchor]), shapes[other], other))
    for j in range(2):
        out.append(("which", f"which shape is {colours[j]} ?", shapes[j], j))
        out.append(("colour", f"what colour is the {shapes[j]} ?", colours[j], j))
        out.append(("exists", f"is there a {shapes[j]} ?", "yes", j))
    for s in CLASS_NAMES:
        if s not in shapes:
            out.append(("exists", f"is there a {s} ?", "no", -1))
    return out


def make_vqa(n: int, seed: int = 0, *, every_question: bool = False) -> list[VQARecord]:
    """Draw ``n`` scenes with a question each, deterministically for a given ``seed``.

    Parameters
    ----------
    n : int
        Number of scenes (at least 1).
    seed : int, optional
        Seed of the scenes and of the questions (a non-negative integer).
    every_question : bool, optional
        ``False``: one question per scene, the kinds in turn (scene ``i`` gets ``KINDS[i % 4]``; an
        ``"exists"`` question is ``yes`` or ``no`` with equal chance), so ``n`` records. ``True``: every
        question of every scene (2 ``where``, 2 ``which``, 2 ``colour``, 2 ``yes`` and 6 ``no``: 14 records per
        scene, sharing the scene's image), for training.

    Returns
    -------
    list[VQARecord]
        The records, scene by scene.

    Raises
    ------
    InputError
        If ``n`` or ``seed`` is not a non-negative integer (``n`` at least 1).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"n must be a positive integer, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    from PIL import Image

    palette = np.array(list(PALETTE.values()))
    scenes = make_scenes(int(n), int(seed), 2, size=DINOV2_SCENE_SIZE, textures=False, palette=palette)
    masks = scenes.masks.numpy()
    colour_ids = np.abs(scenes.colors[:, :, None, :] - palette[None, None].astype(np.float32)).sum(-1).argmin(-1)
    pixels = np.round(scenes.rgb * 255.0).astype(np.uint8)
    rng = np.random.default_rng([int(seed), _QUESTION_SEED])
    records: list[VQARecord] = []
    for i in range(int(n)):
        shapes = [CLASS_NAMES[int(c)] for c in scenes.labels[i]]
        colours = [COLOUR_NAMES[int(c)] for c in colour_ids[i]]
        image = Image.fromarray(pixels[i])  # (H, W, 3) uint8: RGB
        candidates = _scene_questions(shapes, colours, masks[i])
        kind = KINDS[i % len(KINDS)]
        pool = [q for q in candidates if q[0] == kind]
        if kind == "exists":  # yes or no with equal chance, then one of those
            answer = "yes" if rng.uniform() < 0.5 else "no"
            pool = [q for q in pool if q[2] == answer]
        pick = rng.integers(0, len(pool))
        chosen = candidates if every_question else [pool[pick]]
        for kind_, question, answer, j in chosen:
            mask = masks[i, j].copy() if j >= 0 else np.zeros(masks.shape[2:], dtype=bool)
            records.append(
                VQARecord(
                    image=image,
                    question=question,
                    answer=answer,
                    mask=mask,
                    kind=kind_,
                    has_evidence=j >= 0,
                    shapes=tuple(shapes),
                    colours=tuple(colours),
                    masks=masks[i].copy(),
                    seed=int(seed),
                    index=i,
                )
            )
    return records
