"""Shared machinery of the image and text explorers: class / method / block / head controls.

The controls and their observers live here; the cache of explanations in
:mod:`widgets._cache` (one bounded LRU: moving the block slider, switching the
head, the view or the sign only re-slices cached tensors), and the title and
info line in :mod:`widgets._render`. Subclasses draw the map (``_render``).
"""

from __future__ import annotations

import html
from typing import Any, Optional, Sequence

import ipywidgets as W
import numpy as np
import torch

from lrp_core.errors import UnsupportedModelError
from lrp_core.runtime.utils import logits_of

from . import _engine, _render, views
from ._cache import CACHE_SIZE, Cached, ExplanationCache
from ._common import (
    RelevanceWidget,
    ResolvedModel,
    check_kind,
    class_names,
    class_options,
    describe_error,
    resolve_model,
)


def forward_logits(facts: ResolvedModel, inputs: Any, threads: Any = "auto") -> torch.Tensor:
    """The model's logits (B, C) without gradients (on ``threads`` CPU threads)."""
    if facts.adapter.num_classes == 0:  # a backbone without a head (e.g. DINOv2): no classes to pick
        raise UnsupportedModelError(
            f"{type(facts.module).__name__} has no classification head, so there are no "
            "classes to explain: use widgets.ConceptBuilder (a concept from example "
            "images) or a class-agnostic method "
            f"({', '.join(_engine.class_agnostic())}) with lrp_core.explain"
        )
    with torch.no_grad(), _engine.torch_threads(facts.module, threads):
        return logits_of(facts.module, inputs).float()


class LayerExplorer(RelevanceWidget):
    """Base of :class:`RelevanceExplorer` and :class:`TokenRelevance` (not used directly).

    Subclasses define ``expected_kind``, :meth:`_prepare_inputs`, :meth:`_sample`,
    :meth:`_render` and :meth:`_extra_controls`.
    """

    expected_kind = "image"

    def __init__(
        self, model: Any, inputs: Any, labels: Optional[Sequence[str]] = None, methods: Optional[Sequence[str]] = None
    ) -> None:
        super().__init__()
        self._cache = ExplanationCache(CACHE_SIZE)
        self._current: Optional[Cached] = None
        self._quiet = False
        self._sync_count = 0
        self.explanation: Any = None
        self.displayed_map: Optional[np.ndarray] = None
        self._make_controls()
        try:
            self.facts: ResolvedModel = resolve_model(model, type(self).__name__)
            self._check_kind()
            self.inputs = self._prepare_inputs(inputs)
            self.logits = self._forward_logits()
            self.names = class_names(
                list(labels) if labels is not None else self.facts.labels,
                self.logits.shape[1],
                strict=labels is not None,
            )
            self._set_methods(methods)
        except Exception as err:  # noqa: BLE001 - shown as a message in the widget
            self.show_error(describe_error(err), title="Cannot build this widget")
            self.children = [self.message]
            return
        n = self.logits.shape[0]
        self.sample_selector.options = [(str(i), i) for i in range(n)]
        self.sample_selector.layout.display = None if n > 1 else "none"
        self.class_search.options = tuple(self.names)
        self._fill_classes()
        self._build_layout()
        self._wire()
        self._guarded("first", self._recompute)

    # -- set-up ---------------------------------------------------------
    def _make_controls(self) -> None:
        """The controls, empty until the model is known, each with a stable CSS class."""
        self.class_selector = W.Dropdown(description="class", layout=W.Layout(width="320px"))
        self.class_search = W.Combobox(
            placeholder="any class by name\u2026", ensure_option=True, layout=W.Layout(width="200px")
        )
        self.method_selector = W.Dropdown(description="method", layout=W.Layout(width="300px"))
        self.sample_selector = W.Dropdown(description="sample", options=[("0", 0)], layout=W.Layout(width="160px"))
        self.view_selector = W.ToggleButtons(
            options=[(views.VIEW_LABELS["output"], "output")], style={"button_width": "140px"}
        )
        self.layer_slider = W.IntSlider(description="block b", min=0, max=0, value=0, continuous_update=True)
        self.start_layer = W.IntSlider(description="start layer", min=0, max=0, value=0, continuous_update=False)
        self.head_selector = W.Dropdown(
            description="head", options=[("mean", "mean")], value="mean", layout=W.Layout(width="160px")
        )
        self.sign_toggle = W.ToggleButtons(
            options=[("signed", True), ("positive", False)], value=True, style={"button_width": "80px"}
        )
        self.info = W.HTML(value="")
        self.status = W.HTML(value="")
        for name in (
            "class_selector",
            "method_selector",
            "view_selector",
            "layer_slider",
            "start_layer",
            "head_selector",
            "sign_toggle",
            "info",
        ):
            getattr(self, name).add_class("trl-" + name.replace("_", "-"))  # stable CSS hooks
        self.add_class("trl-widget")

    def _check_kind(self) -> None:
        check_kind(self.facts, self.expected_kind, type(self).__name__)

    def _set_methods(self, methods: Optional[Sequence[str]]) -> None:
        chosen = _engine.check_methods(methods if methods is not None else _engine.methods())
        default = _engine.default_method()
        self.method_selector.options = chosen
        self.method_selector.value = default if default in chosen else chosen[0]

    def _fill_classes(self) -> None:
        logits = self.logits[self.sample_selector.value]
        self._quiet = True
        try:
            self.class_selector.options = class_options(logits, self.names, probabilities=self.facts.probabilities)
            self.class_selector.value = int(logits.argmax())
        finally:
            self._quiet = False

    def _controls(self) -> list[W.Widget]:
        row1 = W.HBox([self.class_selector, self.class_search, self.method_selector, self.sample_selector])
        row2 = W.HBox([self.view_selector])
        row3 = W.HBox([self.layer_slider, self.start_layer, self.head_selector])
        row4 = W.HBox([self.sign_toggle] + self._extra_controls())
        return [row1, row2, row3, row4]

    def _build_layout(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _wire(self) -> None:
        for w in (self.class_selector, self.method_selector, self.sample_selector):
            w.observe(self._on_compute_change, names="value")
        self.start_layer.observe(self._on_start_change, names="value")
        self.layer_slider.observe(self._on_layer_change, names="value")
        for w in (self.view_selector, self.head_selector, self.sign_toggle):
            w.observe(self._on_redraw, names="value")
        self.class_search.observe(self._on_search, names="value")

    # -- hooks for subclasses -------------------------------------------
    def _prepare_inputs(self, inputs: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def _sample(self, i: int) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def _render(self, values: np.ndarray, title: str) -> None:  # pragma: no cover
        raise NotImplementedError

    def _extra_controls(self) -> list[W.Widget]:
        return []

    def _forward_logits(self) -> torch.Tensor:
        """The logits (B, C) the class selector ranks (subclasses may compute them otherwise)."""
        return forward_logits(self.facts, self.inputs, self.threads)

    def _target_key(self) -> Any:
        """The target part of the cache key (hashable); :meth:`_engine_target` turns it into the engine's."""
        return self.target

    def _engine_target(self, key: Any) -> Any:
        """The ``target`` passed to ``lrp_core.explain`` for the target part of a cache key."""
        return key

    def _target_name(self) -> str:
        """What is explained, in words (title, info line, busy note)."""
        return self.names[self.target]

    # -- state ----------------------------------------------------------
    @property
    def target(self) -> int:
        """The class being explained."""
        return int(self.class_selector.value)

    @property
    def method(self) -> str:
        return str(self.method_selector.value)

    @property
    def head(self) -> Optional[int]:
        """Selected head index, or None for the head mean."""
        v = self.head_selector.value
        return None if v == "mean" else int(v)

    @property
    def signed(self) -> bool:
        return bool(self.sign_toggle.value)

    def _key(self) -> tuple:
        start = self.start_layer.value if _engine.takes(self.method, "start_layer") else None
        return (self.sample_selector.value, self._target_key(), self.method, start)

    def _entry(self, key: Optional[tuple] = None) -> Cached:
        """The cache entry for ``key`` (default: the current controls), computed on a miss."""
        key = key or self._key()

        def compute() -> Cached:
            sample, target, method, start = key
            inputs = self._sample(sample)
            exp = _engine.explain(
                self.facts.module, inputs, method, target=self._engine_target(target), start_layer=start
            )
            return Cached(exp, _engine.sample_readout(self.facts.adapter, inputs))

        return self._cache.get(key, compute)

    def explanation_for(self, key: Optional[tuple] = None) -> Any:
        """The cached explanation for ``key`` (default: the current controls)."""
        return self._entry(key).explanation

    # -- observers ------------------------------------------------------
    def _on_compute_change(self, change: dict) -> None:
        if self._quiet:
            return
        if change["owner"] is self.sample_selector:
            self._fill_classes()
        self._guarded("compute", self._recompute)

    def _on_start_change(self, change: dict) -> None:
        if self._quiet:
            return
        if _engine.takes(self.method, "start_layer"):
            self._guarded("compute", self._recompute)
        else:
            self._guarded("redraw", self._redraw)

    def _on_layer_change(self, change: dict) -> None:
        if self._quiet:
            return
        if self.view_selector.value == "output" and "accumulated" in self._views():
            self._quiet = True  # moving the block slider asks for a per-block view
            self.view_selector.value = "accumulated"
            self._quiet = False
        self._guarded("redraw", self._redraw)

    def _on_redraw(self, change: dict) -> None:
        if not self._quiet:
            self._guarded("redraw", self._redraw)

    def _on_search(self, change: dict) -> None:
        name = change["new"]
        if name in self.names:
            self.class_selector.value = self.names.index(name)

    # -- computing and drawing -------------------------------------------
    def _views(self) -> list[str]:
        return [v for _, v in self.view_selector.options]

    def _recompute(self) -> None:
        self.clear_error()
        if self._key() not in self._cache:  # reaches the browser before the work starts
            self.status.value = (
                f'<i style="color:#666">computing {self.method} for {html.escape(self._target_name())}\u2026</i>'
            )
        try:
            self._current = self._entry()
        finally:
            self.status.value = ""
        self.explanation = exp = self._current.explanation
        self._sync_controls(exp)
        self._warm()
        self._redraw()

    def _sync_controls(self, exp: Any) -> None:
        """Fit the block / head / view controls to what this explanation offers."""
        self._quiet = True
        try:
            avail = views.available_views(exp)
            current = self.view_selector.value
            first = self._sync_count == 0
            self._sync_count += 1
            self.view_selector.options = [(views.VIEW_LABELS[v], v) for v in avail]
            if current in avail and not first:
                self.view_selector.value = current
            else:
                self.view_selector.value = "accumulated" if "accumulated" in avail else "output"
            L = views.n_blocks(exp)
            has_blocks = L > 0
            if has_blocks and self.layer_slider.max != L - 1:
                self.layer_slider.max = L - 1
                self.layer_slider.value = L - 1
                self.start_layer.max = L - 1
            self.layer_slider.disabled = not has_blocks
            self.start_layer.disabled = not has_blocks
            H = views.n_heads(exp)
            opts = [("mean", "mean")] + [(f"head {h}", h) for h in range(H)]
            if [v for _, v in self.head_selector.options] != [v for _, v in opts]:
                keep = self.head_selector.value
                self.head_selector.options = opts
                self.head_selector.value = keep if keep in [v for _, v in opts] else "mean"
            self.head_selector.disabled = H == 0
        finally:
            self._quiet = False

    def values_for(self, view: str, block: int, start: int, head: Optional[int]) -> np.ndarray:
        """Signed values of a view of the current explanation (memoised in its cache entry)."""
        if view in ("output", "residual"):
            head = None
        if view in ("output", "block", "residual"):
            start = 0
        if view == "output":
            block = 0
        assert self._current is not None  # a view is read only once an explanation is cached
        return self._current.view(view, block, start, head)

    def current_values(self) -> np.ndarray:
        """The (signed) values of the current view, before the sign toggle."""
        view = self.view_selector.value
        head = self.head if view in ("block", "accumulated") else None
        return self.values_for(view, self.layer_slider.value, self.start_layer.value, head)

    def _warm(self) -> None:
        """Precompute the partial products, so the slider and the heads never multiply matrices."""
        if "accumulated" in views.available_views(self.explanation) and self._current is not None:
            self._current.layer_products().prefix(self.start_layer.value)

    def _redraw(self) -> None:
        if self.explanation is None:
            return
        view = self.view_selector.value
        self.head_selector.disabled = views.n_heads(self.explanation) == 0 or view not in ("block", "accumulated")
        values = self.current_values()
        shown = values if self.signed else np.clip(values, 0.0, None)
        self.displayed_map = shown
        self._render(shown, self._title())
        self.info.value = self._info_html(shown)

    def _title(self) -> str:
        return _render.view_title(
            self._target_name(),
            self.method,
            self.view_selector.value,
            self.layer_slider.value,
            self.start_layer.value,
            self.head,
        )

    def _info_html(self, shown: np.ndarray) -> str:
        return _render.info_html(
            self.logits[self.sample_selector.value],
            self.target,
            self.names,
            self._target_name(),
            self.view_selector.value,
            shown,
            self.explanation,
            self.layer_slider.value,
            self.facts.probabilities,
        )
