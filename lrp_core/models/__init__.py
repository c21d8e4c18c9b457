"""One loader for every model the course uses.

``load(name)`` returns a :class:`LoadedModel`. Embedded names always work
offline; timm and Hugging Face hub names load real pretrained weights when the
hub (or a local cache) can serve them.
"""

from __future__ import annotations

from .base import EMBEDDED, PROBABILITIES, LoadedModel, logits_to_probabilities


def load(name: str, pretrained: str | bool = "auto") -> LoadedModel:
    """Load a model by name: an embedded one, or a timm / Hugging Face hub model.

    Parameters
    ----------
    name : str
        An embedded name (:data:`EMBEDDED`), a timm model name or a Hugging Face repo id ``owner/name``.
    pretrained : str | bool, optional
        ``"auto"`` or ``True``: the trained weights; ``False``: the architecture with random weights.

    Returns
    -------
    LoadedModel
        The model in eval mode with its ``preprocess``, labels and kind.

    Raises
    ------
    InputError
        If the name is not a known model, or ``pretrained`` is not an accepted value.
    HubUnavailableError
        If a hub model's weights are not cached and the hub is unreachable.
    """
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
    if name == "tiny-vlm":
        from .tiny_vlm import load_tiny_vlm

        return load_tiny_vlm(pretrained=pretrained)
    if name == "tiny-s2s":
        from .tiny_s2s import load_tiny_s2s

        return load_tiny_s2s(pretrained=pretrained)
    from .hub import load_hub

    return load_hub(name, pretrained=pretrained)


def hub_reachable(timeout: float = 1.5) -> bool:
    """Whether the Hugging Face hub (``HF_ENDPOINT``) answers; see :func:`.hub.hub_reachable`.

    The notebooks write ``ONLINE = hub_reachable()``.

    Parameters
    ----------
    timeout : float, optional
        Upper bound, in seconds, on the check (about).

    Returns
    -------
    bool
        ``False`` in offline mode or when the hub does not answer; the check never raises.
    """
    from .hub import hub_reachable as _reachable

    return _reachable(timeout)


__all__ = ["LoadedModel", "EMBEDDED", "PROBABILITIES", "logits_to_probabilities", "hub_reachable", "load"]
