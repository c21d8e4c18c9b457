"""Pictures of relevance: zero-centred diverging colours, overlays on images, token heat maps.

- :mod:`.colours` — the colour limit, gamma and table (numpy only)
- :mod:`.maps` — maps over a grey photo and PNGs with a legend (numpy and Pillow: the widgets' path)
- :mod:`.figures` — matplotlib figures with colour bars for the notebooks (the ``viz`` extra)
- :mod:`.words` — a tokenizer's pieces as text and words (numpy only)
- :mod:`.text` — token heat maps as HTML and the generation heat map page (numpy only)
- :mod:`.thumbnails` — small image maps for the generation page

The names of :mod:`.maps`, :mod:`.figures` and :mod:`.text` are imported on first use, so that ``import lrp_core``
never loads matplotlib or Pillow.
"""

from __future__ import annotations

from typing import Any

from .colours import DEFAULT_CLIP, DEFAULT_GAMMA, ColourScale, colorize, colour_scale, symmetric_limit

#: name -> the module it is served from, imported when first asked for
_LAZY = {
    **dict.fromkeys(("relevance_cmap", "signed_norm", "show_relevance", "show_methods", "render_png"), "figures"),
    **dict.fromkeys(
        (
            "PHOTO_FLOOR",
            "upsample_map",
            "to_rgb_uint8",
            "grey_photo",
            "overlay",
            "overlay_image",
            "render_overlay_png",
            "tile_pngs",
            "denormalize",
        ),
        "maps",
    ),
    "token_html": "text",
    "merge_wordpieces": "words",
}

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
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
