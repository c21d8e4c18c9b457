"""``MethodGrid``: several explanation methods side by side for one input and one class."""

from __future__ import annotations

import html as _html
from typing import Any, Optional, Sequence

import ipywidgets as W
import numpy as np

from lrp_core.errors import InputError
from lrp_core.viz import overlay_image, tile_pngs, to_rgb_uint8, token_html

from . import _engine, views
from ._common import (
    MIN_PANEL_PX,
    RelevanceWidget,
    class_names,
    class_options,
    describe_error,
    error_html,
    image_rgb,
    png_bundle,
    prepare_images,
    readable_size,
    resolve_model,
)
from ._layered import forward_logits
from .text import prepare_text


class MethodGrid(RelevanceWidget):
    """One panel per method, all explaining the same input and the same class.

    Args:
        model: an image or text model (or a ``LoadedModel``).
        inputs: one image (1, 3, H, W) / (3, H, W), or tokenised text / a text
            (with a tokenizer); for a batch, ``sample`` picks the one shown.
        methods: the methods to compare (default: all of ``lrp_core.METHODS``).
        target: the class, by index or name (default: the predicted class).
        labels: class names; image: RGB picture to draw on; tokenizer: for texts.
        panel_size: px of each image panel (at least 200; titles wrap, never cut).

    Each panel has its own symmetric colour limit (``lrp_core.viz.colour_scale``). ``maps`` holds each method's
    signed output, ``displayed_maps`` what is drawn (after the sign toggle),
    ``errors`` the methods that could not run and why.
    """

    def __init__(
        self,
        model: Any,
        inputs: Any,
        methods: Optional[Sequence[str]] = None,
        target: Any = None,
        labels: Optional[Sequence[str]] = None,
        image: Any = None,
        sample: int = 0,
        tokenizer: Any = None,
        ncols: int = 4,
        panel_size: int = 200,
    ) -> None:
        super().__init__()
        self.ncols, self.panel_size = int(ncols), readable_size(panel_size, MIN_PANEL_PX)
        self.image = W.Image(format="png")
        self.html = W.HTML(value="")
        self.class_selector = W.Dropdown(description="class", layout=W.Layout(width="320px"))
        self.sign_toggle = W.ToggleButtons(
            options=[("signed", True), ("positive", False)], value=True, style={"button_width": "80px"}
        )
        self.opacity = W.FloatSlider(description="opacity", min=0.0, max=1.0, step=0.05, value=0.7)
        self.maps: dict[str, np.ndarray] = {}
        self.displayed_maps: dict[str, np.ndarray] = {}
        self.errors: dict[str, str] = {}
        self.explanations: dict[str, Any] = {}
        self._cache: dict[tuple[int, str], Any] = {}
        try:
            self._setup(model, inputs, methods, target, labels, image, sample, tokenizer)
        except Exception as err:  # noqa: BLE001 - shown as a message in the widget
            self.show_error(describe_error(err), title="Cannot build this widget")
            self.children = [self.message]
            return
        self.class_selector.observe(lambda _: self._guarded("compute", self._recompute), "value")
        for w in (self.sign_toggle, self.opacity):
            w.observe(lambda _: self._guarded("redraw", self._redraw), "value")
        picture = self.image if self.kind == "image" else self.html
        self.children = [W.HBox([self.class_selector, self.sign_toggle, self.opacity]), self.message, picture]
        self._guarded("first", self._recompute)

    def _setup(
        self,
        model: Any,
        inputs: Any,
        methods: Optional[Sequence[str]],
        target: Any,
        labels: Optional[Sequence[str]],
        image: Any,
        sample: int,
        tokenizer: Any,
    ) -> None:
        self.facts = resolve_model(model, "MethodGrid")
        self.kind = self.facts.kind  # images and texts alike
        self.inputs: Any  # text: the tokenizer dict; images: (1, 3, H, W) (self.kind says which)
        if self.kind == "text":
            self.tokenizer = tokenizer if tokenizer is not None else self.facts.tokenizer
            full = prepare_text(self.facts, inputs, self.tokenizer)
            self.inputs = {k: v[sample : sample + 1] for k, v in full.items()}
        else:
            self.inputs = prepare_images(self.facts, inputs)[sample : sample + 1]
            if image is None:
                self.rgb = image_rgb(self.inputs, self.facts)[0]
            else:
                arr = np.asarray(image)
                self.rgb = to_rgb_uint8(arr[sample] if arr.ndim == 4 else arr)
        self.methods = _engine.check_methods(methods if methods is not None else _engine.methods())
        self.logits = forward_logits(self.facts, self.inputs, self.threads)
        self.names = class_names(
            list(labels) if labels is not None else self.facts.labels, self.logits.shape[1], strict=labels is not None
        )
        self.class_selector.options = class_options(self.logits[0], self.names, probabilities=self.facts.probabilities)
        if target is None:
            self.class_selector.value = int(self.logits[0].argmax())
        elif isinstance(target, str):
            if target not in self.names:
                raise InputError(f"unknown class {target!r}; the classes are {', '.join(self.names)}")
            self.class_selector.value = self.names.index(target)
        else:
            if not 0 <= int(target) < len(self.names):
                raise InputError(f"target must be a class index in 0..{len(self.names) - 1}; got {target}")
            self.class_selector.value = int(target)

    @property
    def target(self) -> int:
        return int(self.class_selector.value)

    def _recompute(self) -> None:
        self.clear_error()
        self.maps, self.errors, self.explanations = {}, {}, {}
        for m in self.methods:
            key = (self.target, m)
            try:
                if key not in self._cache:
                    self._cache[key] = _engine.explain(
                        self.facts.module, self.inputs, m, target=self.target, keep_heads=False
                    )
                exp = self._cache[key]
                self.explanations[m] = exp
                self.maps[m] = views.view_map(exp, "output")
            except Exception as err:  # noqa: BLE001 - one failing method keeps the others
                self.errors[m] = describe_error(err)
        if self.errors:
            self.show_error("; ".join(f"{m}: {e}" for m, e in self.errors.items()), title="Some methods could not run")
        self._redraw()

    def _redraw(self) -> None:
        signed = bool(self.sign_toggle.value)
        self.displayed_maps = {m: v if signed else np.clip(v, 0.0, None) for m, v in self.maps.items()}
        if not self.displayed_maps:
            return
        if self.kind == "image":
            tiles = [
                overlay_image(
                    self.rgb, v, alpha=self.opacity.value, signed=signed, display_size=self.panel_size, title=m
                )
                for m, v in self.displayed_maps.items()
            ]
            self.image.value = tile_pngs(tiles, ncols=min(self.ncols, len(tiles)))
        else:
            self.html.value = self._text_table(signed)

    def _text_table(self, signed: bool) -> str:
        n = int(self.inputs["attention_mask"][0].sum())
        ids = self.inputs["input_ids"][0, :n].tolist()
        tok = self.tokenizer
        tokens = [str(t) for t in tok.convert_ids_to_tokens(ids)] if tok is not None else [f"[{i}]" for i in ids]
        rows = [
            f'<tr><td style="padding:4px 8px;vertical-align:top"><b>{_html.escape(m)}</b></td>'
            f"<td>{token_html(tokens, v[:n], signed=signed, legend=False)}</td></tr>"
            for m, v in self.displayed_maps.items()
        ]
        return f'<table class="trl-method-grid">{"".join(rows)}</table>'

    def _static_bundle(self) -> dict[str, Any]:
        if not self.displayed_maps:
            return {"text/html": error_html(self.last_error or "nothing to show")}
        if self.kind == "text":
            return {"text/html": (error_html(self.last_error) if self.last_error else "") + self.html.value}
        return png_bundle(self.image.value, self.last_error)
