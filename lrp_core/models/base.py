"""What every loader returns: :class:`LoadedModel`; and the names of the embedded models."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch


@dataclass
class LoadedModel:
    """A model ready to explain.

    Attributes:
        name: the name it was loaded under.
        model: the torch module, in eval mode.
        preprocess: image (PIL / array) -> (1, 3, H, W) normalised tensor, or
            list of texts -> tokenized batch dict (``input_ids``, ``attention_mask``).
        labels: class names, index = class id.
        kind: ``"image"`` or ``"text"``.
        tokenizer: the tokenizer (text models only).
        info: free-form facts (source, licence, accuracy, image size, mean/std...);
            ``evaluation_data`` names the model's built-in evaluation data (a key of
            :data:`lrp_core.data.BUILTIN_IMAGE_SETS`), if it has any; ``probabilities``
            says how the classifier was trained to turn its logits into probabilities
            (one of :data:`PROBABILITIES`; absent means ``"softmax"``).
    """

    name: str
    model: torch.nn.Module
    preprocess: Callable[[Any], Any]
    labels: Sequence[str]
    kind: str
    tokenizer: Any = None
    info: dict[str, Any] = field(default_factory=dict)


PROBABILITIES = ("softmax", "sigmoid")
"""How a classifier's logits become probabilities, as it was trained: ``"softmax"`` (one class per input,
cross-entropy; the probabilities sum to 1) or ``"sigmoid"`` (one-vs-rest logistic losses; each class has its
own probability of being present, and several can be near 1 at once)."""


def logits_to_probabilities(logits: torch.Tensor, probabilities: str = "softmax") -> torch.Tensor:
    """The class probabilities the model was trained to give.

    Parameters
    ----------
    logits : torch.Tensor
        (C,) or (B, C) logits; the classes are the last axis.
    probabilities : str
        ``"softmax"`` or ``"sigmoid"`` (:data:`PROBABILITIES`; a loaded model's ``info["probabilities"]``).

    Returns
    -------
    torch.Tensor
        Same shape as ``logits``: the softmax over the last axis, or the sigmoid of each logit.
    """
    if probabilities == "softmax":
        return torch.softmax(logits, dim=-1)
    if probabilities == "sigmoid":
        return torch.sigmoid(logits)
    from ..errors import InputError

    raise InputError(f"probabilities must be one of {PROBABILITIES}, got {probabilities!r}")


EMBEDDED = (
    "toy-vit",
    "dinov2-s14",
    "dinov2-scenes",
    "dinov2-scenes-avg",
    "minilm-sentiment",
    "tiny-lm",
    "tiny-vlm",
    "tiny-s2s",
)
