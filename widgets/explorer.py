"""``RelevanceExplorer``: one image, its relevance overlay, and every control that matters."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import ipywidgets as W
import numpy as np
import torch

from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.viz import render_overlay_png, to_rgb_uint8

from ._common import MIN_PICTURE_PX, error_html, image_rgb, is_clip, png_bundle, prepare_images, readable_size
from ._layered import LayerExplorer


class RelevanceExplorer(LayerExplorer):
    """An image with its relevance overlay and live controls.

    Args:
        model: a timm ``VisionTransformer`` / HF ``ViTForImageClassification``, or a
            ``lrp_core.models.LoadedModel`` (a ``CLIPModel``: :class:`widgets.ClipExplorer`).
        inputs: normalised images (B, 3, H, W) (or one (3, H, W) image).
        labels: class names (default: the model's).
        methods: the methods offered (default: all of ``lrp_core.METHODS``).
        image: the RGB pictures to draw on, (B, H, W, 3) or (H, W, 3), float in
            [0, 1] or uint8 (default: ``inputs`` de-normalised with the model's mean/std).
        display_size: size in pixels of the longest side of the picture (at least
            ``MIN_PICTURE_PX`` = 320: smaller values are raised to it). The title
            above it is wrapped onto as many lines as it needs, never cut.

    Public controls: ``class_selector``, ``class_search``, ``method_selector``,
    ``view_selector``, ``layer_slider``, ``start_layer``, ``head_selector``,
    ``sign_toggle``, ``opacity``, ``sample_selector`` (B > 1). The picture is
    ``image`` (PNG bytes in ``image.value``); the values drawn are ``displayed_map``.
    """

    expected_kind = "image"

    def __init__(
        self,
        model: Any,
        inputs: Any,
        labels: Optional[Sequence[str]] = None,
        methods: Optional[Sequence[str]] = None,
        image: Any = None,
        display_size: int = 320,
    ) -> None:
        self._rgb_arg = image
        self.display_size = readable_size(display_size, MIN_PICTURE_PX)
        self.image = W.Image(format="png", layout=W.Layout(width=f"{self.display_size}px"))
        self.image.add_class("trl-image")
        self.opacity = W.FloatSlider(
            description="opacity", min=0.0, max=1.0, step=0.05, value=0.7, continuous_update=True
        )
        super().__init__(model, inputs, labels=labels, methods=methods)

    def _check_kind(self) -> None:
        super()._check_kind()
        if is_clip(self.facts):
            raise UnsupportedModelError(
                f"{type(self.facts.module).__name__} scores images against text prompts, not classes: use "
                "widgets.ClipExplorer(model, images, prompts=['a dog', 'a cat'], tokenizer=processor)"
            )

    def _prepare_inputs(self, inputs: Any) -> torch.Tensor:
        x = self._images(inputs)
        if self._rgb_arg is None:
            self.rgb = image_rgb(x, self.facts)
        else:
            arr = self._rgb_arg
            arr = arr.detach().cpu().numpy() if isinstance(arr, torch.Tensor) else np.asarray(arr)
            if arr.ndim == 3:
                arr = arr[None]
            if arr.shape[0] != x.shape[0]:
                raise InputError(f"got {arr.shape[0]} display images for {x.shape[0]} inputs")
            self.rgb = np.stack([to_rgb_uint8(a) for a in arr])
        return x

    def _images(self, inputs: Any) -> torch.Tensor:
        """The normalised images (B, 3, H, W), validated by the engine's adapter."""
        return prepare_images(self.facts, inputs)

    def _sample(self, i: int) -> Any:
        return self.inputs[i : i + 1]

    def _extra_controls(self) -> list[W.Widget]:
        self.opacity.observe(self._on_redraw, names="value")
        return [self.opacity]

    def _build_layout(self) -> None:
        picture = W.VBox([self.image, self.status], layout=W.Layout(margin="0 12px 0 0"))
        self.children = [*self._controls(), self.message, W.HBox([picture, self.info])]

    def _png(self, values: np.ndarray, title: Optional[str] = None, legend: bool = True) -> bytes:
        rgb = self.rgb[self.sample_selector.value]
        return render_overlay_png(
            rgb,
            values,
            alpha=self.opacity.value,
            signed=self.signed,
            display_size=self.display_size,
            title=title,
            legend=legend,
        )

    def _render(self, values: np.ndarray, title: str) -> None:
        self.image.value = self._png(values, title=title)

    def static_png(self) -> bytes:
        """The current picture with its title and colourbar, as PNG bytes."""
        if self.displayed_map is None:
            raise InputError(self.last_error or "nothing has been computed yet")
        return self._png(self.displayed_map, title=self._title())

    def _static_bundle(self) -> dict[str, Any]:
        if self.displayed_map is None:
            return {"text/html": error_html(self.last_error or "nothing to show")}
        return png_bundle(self.static_png(), self.last_error)
