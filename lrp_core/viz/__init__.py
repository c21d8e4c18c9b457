"""Pictures of relevance: zero-centred diverging colours, overlays on images, token heat maps.

- :mod:`.maps` — colour scales, overlays, figures and token HTML
- :mod:`.text` — readable sub-word pieces, words, and the generation heat map
"""
from .maps import (DEFAULT_CLIP, DEFAULT_GAMMA, PHOTO_FLOOR, ColourScale, colorize, colour_scale, denormalize,
                   grey_photo, merge_wordpieces, overlay, overlay_image, relevance_cmap, render_overlay_png,
                   render_png, show_methods, show_relevance, signed_norm, symmetric_limit, tile_pngs, to_rgb_uint8,
                   token_html, upsample_map)

__all__ = [
    "relevance_cmap", "DEFAULT_CLIP", "DEFAULT_GAMMA", "ColourScale", "colour_scale",
    "signed_norm", "symmetric_limit", "colorize", "upsample_map", "to_rgb_uint8", "PHOTO_FLOOR", "grey_photo",
    "overlay", "overlay_image", "render_overlay_png", "tile_pngs", "show_relevance",
    "show_methods", "render_png", "token_html", "merge_wordpieces", "denormalize"]
