"""Pictures of relevance: zero-centred diverging colours, overlays on images, token heat maps.

- :mod:`.colours` — the colour limit, gamma and table (numpy only)
- :mod:`.maps` — overlays, figures and token HTML (matplotlib: the ``viz`` extra)
- :mod:`.text` — readable sub-word pieces, words, and the generation heat map (numpy only)

The names of :mod:`.maps` are imported on first use, so that ``import lrp_core`` (whose generation heat map
reads :mod:`.text`) never loads matplotlib.
"""

from __future__ import annotations

from typing import Any

from .colours import DEFAULT_CLIP, DEFAULT_GAMMA, ColourScale, colorize, colour_scale, symmetric_limit

#: names served from :mod:`.maps`, imported when first asked for
_FROM_MAPS = (
    "relevance_cmap",
    "PHOTO_FLOOR",
    "signed_norm",
    "upsample_map",
    "to_rgb_uint8",
    "grey_photo",
    "overlay",
    "overlay_image",
    "render_overlay_png",
    "tile_pngs",
    "show_relevance",
    "show_methods",
    "render_png",
    "token_html",
    "merge_wordpieces",
    "denormalize",
)

__all__ = [
    "relevance_cmap",
    "DEFAULT_CLIP",
    "DEFAULT_GAMMA",
    "ColourScale",
    "colour_scale",
    "signed_norm",
    "symmetric_limit",
    "colorize",
    "upsample_map",
    "to_rgb_uint8",
    "PHOTO_FLOOR",
    "grey_photo",
    "overlay",
    "overlay_image",
    "render_overlay_png",
    "tile_pngs",
    "show_relevance",
    "show_methods",
    "render_png",
    "token_html",
    "merge_wordpieces",
    "denormalize",
]


def __getattr__(name: str) -> Any:
    if name in _FROM_MAPS:
        from . import maps

        return getattr(maps, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
