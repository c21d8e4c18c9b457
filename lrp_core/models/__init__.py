"""One loader for every model the course uses.

``load(name)`` returns a :class:`LoadedModel`. Embedded names always work
offline; timm and Hugging Face hub names load real pretrained weights when the
hub (or a local cache) can serve them.
"""
from __future__ import annotations

from .base import EMBEDDED, PROBABILITIES, LoadedModel, logits_to_probabilities


def load(name: str, pretrained: str | bool = "auto") -> LoadedModel:
    """Load an embedded model or a timm / Hugging Face hub model by name."""
    if name == "toy-vit":
        from .toy_vit import load_toy_vit
        return load_toy_vit(pretrained=pretrained)
    if name == "dinov2-s14":
        from .dinov2 import load_dinov2_s14
        return load_dinov2_s14(pretrained=pretrained)
    if name in ("dinov2-scenes", "dinov2-scenes-avg"):
        from .dinov2_scenes import READOUTS, load_dinov2_scenes
        readout = next(r for r, n in READOUTS.items() if n == name)
        return load_dinov2_scenes(pretrained=pretrained, readout=readout)
    if name == "minilm-sentiment":
        from .minilm import load_minilm_sentiment
        return load_minilm_sentiment(pretrained=pretrained)
    if name == "tiny-lm":
        from .tiny_lm import load_tiny_lm
        return load_tiny_lm(pretrained=pretrained)
    from .hub import load_hub
    return load_hub(name, pretrained=pretrained)


def hub_reachable(timeout: float = 1.5) -> bool:
    """Whether the Hugging Face hub answers (``HF_ENDPOINT``; ``False`` offline); see :func:`.hub.hub_reachable`.

    The notebooks' ``ONLINE = hub_reachable()``: never raises, takes at most about ``timeout`` seconds.
    """
    from .hub import hub_reachable as _reachable
    return _reachable(timeout)


__all__ = ["LoadedModel", "EMBEDDED", "PROBABILITIES", "logits_to_probabilities", "hub_reachable", "load"]
