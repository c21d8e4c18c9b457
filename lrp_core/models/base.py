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
            :data:`lrp_core.data.BUILTIN_IMAGE_SETS`), if it has any.
    """

    name: str
    model: torch.nn.Module
    preprocess: Callable[[Any], Any]
    labels: Sequence[str]
    kind: str
    tokenizer: Any = None
    info: dict[str, Any] = field(default_factory=dict)


EMBEDDED = ("toy-vit", "dinov2-s14", "dinov2-scenes", "dinov2-scenes-avg", "minilm-sentiment", "tiny-lm")
