"""``ConceptBuilder``: pick example images that define a concept, see its CDAM on a query."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import ipywidgets as W
import numpy as np
import torch
import torch.nn.functional as F

from lrp_core.errors import InputError
from lrp_core.viz import render_overlay_png, to_rgb_uint8

from . import _engine, views
from ._common import (
    MIN_PICTURE_PX,
    MIN_TILE_PX,
    RelevanceWidget,
    check_kind,
    describe_error,
    error_html,
    image_rgb,
    png_bundle,
    prepare_images,
    readable_size,
    resolve_model,
)


def _encode(rgb: np.ndarray, size: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    img = Image.fromarray(rgb)
    scale = size / max(img.size)
    img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.Resampling.NEAREST).save(
        buf, format="PNG"
    )
    return buf.getvalue()


def model_image_size(module: torch.nn.Module) -> Optional[tuple[int, int]]:
    """The (H, W) a ViT takes, where it is fixed."""
    pe = getattr(module, "patch_embed", None)
    if pe is not None and getattr(pe, "img_size", None) is not None:
        return tuple(int(v) for v in pe.img_size)  # type: ignore[return-value]
    size = getattr(getattr(module, "config", None), "image_size", None)
    return (int(size), int(size)) if isinstance(size, int) else None


def stack_crops(module: torch.nn.Module, crops: Sequence[Any]) -> torch.Tensor:
    """Normalised crops (3, h, w) of any sizes, resized bilinearly to the model's input size."""
    if not crops:
        raise InputError("no example images given: pass at least one candidate image or crop")
    size = model_image_size(module)
    out = []
    for i, c in enumerate(crops):
        c = torch.as_tensor(c, dtype=torch.float32)
        if c.dim() == 4 and c.shape[0] == 1:
            c = c[0]
        if c.dim() != 3 or c.shape[0] != 3 or min(c.shape[1:]) < 1:
            raise InputError(f"crop {i} must be a normalised (3, h, w) tensor; got {tuple(c.shape)}")
        target = size or tuple(c.shape[1:])
        out.append(F.interpolate(c[None], size=target, mode="bilinear", align_corners=False)[0])
    return torch.stack(out)


class ConceptBuilder(RelevanceWidget):
    """Define a concept by ticking example images; show its CDAM on a query image.

    The concept is ``lrp_core.concept_target(model, examples)`` (the mean of the ticked
    examples' final embeddings as the model's readout pools them: the [CLS] state, the
    patch mean, …); the map is
    ``explain(model, query, method="cdam", target=concept)``: red patches move the
    query's embedding towards the concept, blue ones away from it.

    Args:
        model: an image model (or ``LoadedModel``); it needs no classification head.
        candidate_images: (K, 3, H, W) normalised example images to choose from, or a
            list of normalised crops (3, h, w) of any size (resized to the model's input).
        query_image: (3, H, W) or (Q, 3, H, W) normalised image(s) to explain.
        candidate_rgb, query_rgb: RGB pictures to draw (default: de-normalised inputs).
        selected: indices ticked at the start (default: none).
        display_size, tile_size: px of the query picture (at least 320) and of each
            example thumbnail (at least 96); each checkbox label ("example 3") is
            given room to be read in full.

    Controls: ``checkboxes`` (one per candidate), ``query_selector`` (Q > 1),
    ``sign_toggle``, ``opacity``; the picture is ``image``, the values ``displayed_map``.
    """

    def __init__(
        self,
        model: Any,
        candidate_images: Any,
        query_image: Any,
        candidate_rgb: Any = None,
        query_rgb: Any = None,
        selected: Optional[list[int]] = None,
        display_size: int = 320,
        tile_size: int = 96,
    ) -> None:
        super().__init__()
        self.display_size = readable_size(display_size, MIN_PICTURE_PX)
        self.tile_size = readable_size(tile_size, MIN_TILE_PX)
        self.image = W.Image(format="png", layout=W.Layout(width=f"{self.display_size}px"))
        self.sign_toggle = W.ToggleButtons(
            options=[("signed", True), ("positive", False)], value=True, style={"button_width": "80px"}
        )
        self.opacity = W.FloatSlider(description="opacity", min=0.0, max=1.0, step=0.05, value=0.7)
        self.query_selector = W.Dropdown(description="query", options=[("0", 0)], layout=W.Layout(width="160px"))
        self.info = W.HTML(value="")
        self.checkboxes: list[W.Checkbox] = []
        self.displayed_map: Optional[np.ndarray] = None
        self.concept: Any = None
        self.explanation: Any = None
        self._cache: dict[tuple, Any] = {}
        try:
            self.facts = resolve_model(model, "ConceptBuilder")
            check_kind(self.facts, "image", "ConceptBuilder")
            if isinstance(candidate_images, (list, tuple)):  # crops of any size
                candidate_images = stack_crops(self.facts.module, candidate_images)
            self.candidates = prepare_images(self.facts, candidate_images)
            self.queries = prepare_images(self.facts, query_image)
            self.candidate_rgb = self._rgb(candidate_rgb, self.candidates)
            self.query_rgb = self._rgb(query_rgb, self.queries)
        except Exception as err:  # noqa: BLE001 - shown as a message in the widget
            self.show_error(describe_error(err), title="Cannot build this widget")
            self.children = [self.message]
            return
        tiles = self._tiles(selected)
        nq = self.queries.shape[0]
        self.query_selector.options = [(str(i), i) for i in range(nq)]
        self.query_selector.layout.display = None if nq > 1 else "none"
        self.query_selector.observe(lambda _: self._guarded("compute", self._recompute), "value")
        for w in (self.sign_toggle, self.opacity):
            w.observe(lambda _: self._guarded("redraw", self._redraw), "value")
        gallery = W.GridBox(
            tiles, layout=W.Layout(grid_template_columns=f"repeat(auto-fill, {self._column_px() + 4}px)", width="100%")
        )
        self.children = [
            W.HTML("<b>Tick example images that show the concept:</b>"),
            gallery,
            W.HBox([self.query_selector, self.sign_toggle, self.opacity]),
            self.message,
            W.HBox([self.image, self.info]),
        ]
        self._guarded("first", self._recompute)

    def _tiles(self, selected: Optional[list[int]]) -> list[W.VBox]:
        """One tile per candidate image: its thumbnail over a checkbox (ticked where ``selected`` says)."""
        tiles = []
        for i, rgb in enumerate(self.candidate_rgb):
            box = W.Checkbox(
                value=bool(selected and i in selected),
                description=f"example {i}",
                indent=False,
                layout=W.Layout(width=f"{self._column_px()}px"),
            )
            box.observe(lambda _: self._guarded("compute", self._recompute), "value")
            self.checkboxes.append(box)
            pic = W.Image(
                value=_encode(rgb, self.tile_size), format="png", layout=W.Layout(width=f"{self.tile_size}px")
            )
            tiles.append(W.VBox([pic, box]))
        return tiles

    def _column_px(self) -> int:
        """Width of one gallery column: the thumbnail, but never too narrow for "example 12"
        (ipywidgets cuts a checkbox label that does not fit with an ellipsis)."""
        return max(self.tile_size + 8, 120)

    def _rgb(self, arg: Any, x: torch.Tensor) -> np.ndarray:
        if arg is None:
            return image_rgb(x, self.facts)
        arr = arg.detach().cpu().numpy() if isinstance(arg, torch.Tensor) else np.asarray(arg)
        if arr.ndim == 3:
            arr = arr[None]
        if arr.shape[0] != x.shape[0]:
            raise InputError(f"got {arr.shape[0]} pictures for {x.shape[0]} images")
        return np.stack([to_rgb_uint8(a) for a in arr])

    @property
    def selected(self) -> list[int]:
        """Indices of the ticked example images."""
        return [i for i, b in enumerate(self.checkboxes) if b.value]

    def select(self, indices: list[int]) -> None:
        """Tick exactly ``indices`` (recomputes once)."""
        with self.hold_sync():
            for i, b in enumerate(self.checkboxes):
                b.unobserve_all("value")
                b.value = i in indices
                b.observe(lambda _: self._guarded("compute", self._recompute), "value")
        self._guarded("compute", self._recompute)

    def _recompute(self) -> None:
        self.clear_error()
        chosen = self.selected
        q = self.query_selector.value
        if not chosen:
            self.concept, self.explanation, self.displayed_map = None, None, None
            self.image.value = _encode(self.query_rgb[q], self.display_size)
            self.info.value = "Tick at least one example image to define a concept."
            return
        key = (tuple(chosen), q)
        if key not in self._cache:
            concept = _engine.concept_target(self.facts.module, self.candidates[chosen])
            exp = _engine.explain(
                self.facts.module, self.queries[q : q + 1], _engine.concept_method(), target=concept, keep_heads=False
            )
            self._cache[key] = (concept, exp)
        self.concept, self.explanation = self._cache[key]
        self._redraw()

    def _redraw(self) -> None:
        if self.explanation is None:
            return
        values = views.view_map(self.explanation, "output")
        signed = bool(self.sign_toggle.value)
        self.displayed_map = values if signed else np.clip(values, 0.0, None)
        title = f"concept of {len(self.selected)} example(s): CDAM"
        self.image.value = render_overlay_png(
            self.query_rgb[self.query_selector.value],
            self.displayed_map,
            alpha=self.opacity.value,
            signed=signed,
            display_size=self.display_size,
            title=title,
        )
        self.info.value = (
            f"concept from examples {self.selected}<br>"
            f"\u03a3 shown = {self.displayed_map.sum():.4g}, "
            f"max |value| = {np.abs(self.displayed_map).max():.4g}"
        )

    def _static_bundle(self) -> dict[str, Any]:
        if not self.image.value:
            return {"text/html": error_html(self.last_error or "nothing to show")}
        return png_bundle(self.image.value, self.last_error)
