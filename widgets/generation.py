"""``GenerationExplorer``: why a language model wrote each token of its continuation.

The widget continues a prompt once (greedily, or takes the continuation it is
given), then shows the generated tokens as a row of buttons. Choosing token k
shows its relevance map over its context — the prompt and the tokens written
before it — as :func:`lrp_core.explain_generation` computes it (step k is the
teacher-forced prefix "prompt + g_1 … g_{k−1}" explained for ``y_{g_k}``,
``docs/METHODS.md`` §2c, Generation). A contrast token turns the map into
``y_{g_k} − y_{a_k}``: "this token rather than that one".

The layer slider walks through what the method builds, and its right end is
always the method's map:

* layer-product methods (``transformer_attribution``, ``generic_attention``,
  ``rollout``): the product from the start block up to block b, read at the
  explained position (``widgets.views`` "accumulated" view);
* ``raw_attention``: block b's own attention, read the same way;
* methods with a relevance pass (``attnlrp``, ``cp_lrp``, ``lrp``,
  ``partial_lrp``): the relevance of the residual stream leaving block b,
  from the top block down (at the top it all sits on the explained position,
  as the logit), then the map at the input;
* the others (``attention_gradcam``, ``cdam``, ``token_ablation``): the map only.

Every value shown is the engine's (``lrp_core.explain`` on the step's prefix);
explanations are cached per (method, step, contrast) as in the other explorers.
"""

from __future__ import annotations

import html
from dataclasses import replace
from typing import Any, Optional, Sequence, cast

import ipywidgets as W
import numpy as np
import torch

from lrp_core.adapters.decoder import DecoderAdapter
from lrp_core.adapters.vlm import VLMAdapter
from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.methods.call import Contrast
from lrp_core.methods.prompts import vlm_prompts
from lrp_core.sources import as_spans, in_columns
from lrp_core.viz import token_html
from lrp_core.viz.text import image_cell, merge_words, readable, source_blocks, span_text

from . import _engine, views
from ._cache import CACHE_SIZE, Cached, ExplanationCache
from ._common import RelevanceWidget, token_page_bundle
from ._generation_parts import (
    MAP_LABEL,
    decoder_methods,
    new_tokens,
    photo_and_mask,
    prompt_ids,
    resolve_lm,
    shown_token,
    stop_values,
    stops,
    token_id,
    word_scheme,
)

#: the method the widget starts with (the one explain_generation uses by default), where offered
DEFAULT_METHOD = "attnlrp"
TOP_K = 5


# ----------------------------------------------------------------------------- the widget
class GenerationExplorer(RelevanceWidget):
    """Each token a causal LM wrote, explained over its context; method, layer slider and contrast box.

    Args:
        model: a causal LM the engine supports (``LlamaForCausalLM``, ``GPT2LMHeadModel``, …) or a
            ``lrp_core.models.LoadedModel`` of one.
        tokenizer: its tokenizer (default: the LoadedModel's); without one, prompts are token ids.
        prompt: the text to continue (or token ids, or a tokenizer dict of one row). A vision-language model
            (LLaVA, SmolVLM / Idefics3, Qwen2.5-VL / Qwen2-VL, Gemma 3, PaliGemma): the processor's output for one
            image and its text; each step then shows its image map (the pixel map where the method reaches the
            pixels, else the image tokens' scores upsampled) beside the text, whose image tokens are one cell
            "[image]" holding their sum. The processor's per-token entries (``token_type_ids``,
            ``mm_token_type_ids``) are extended for the written tokens as :func:`lrp_core.explain_generation`
            extends them (``VLMAdapter.extend_for_generation``).
        max_new_tokens: K, the greedy tokens to write (default 5; with a continuation, its length).
        methods: the methods offered (default: every method that runs on decoders).
        continuation: the tokens to explain instead of the greedy ones (text or ids).
        sources: token spans (start, end) of the prompt's sources (documents, sentences:
            ``lrp_core.sources``); each step's source scores are drawn as blocks beside its map.
        image: a vision-language model's photo (a PIL image or an (H, W, 3) array), drawn in light grey under
            each step's image map (default: the map on white).
        mask: (H, W) bool at the photo's size (e.g. a ``make_vqa`` record's ``.mask``), outlined on the picture;
            needs ``image``.

    Bad arguments raise an :class:`~lrp_core.errors.InputError` naming what is accepted; errors while
    using the widget (an unknown contrast token) are shown in it. The map shown is ``displayed_map``
    for the tokens ``displayed_tokens``; ``current_values()`` is the per-piece map of the current stop.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        prompt: Any = "",
        max_new_tokens: Optional[int] = None,
        methods: Optional[Sequence[str]] = None,
        continuation: Any = None,
        sources: Any = None,
        image: Any = None,
        mask: Any = None,
    ) -> None:
        super().__init__()
        self.facts = resolve_lm(model, tokenizer)
        #: a vision-language model's image inputs (``pixel_values``, …), the same at every step; {} for a text LM
        self.images: dict = {}
        self.vlm = isinstance(self.facts.adapter, VLMAdapter)
        #: the photo (H, W, 3) uint8 under the image map and the mask (H, W) bool outlined on it, or None
        self.photo, self.mask = photo_and_mask(image, mask, self.vlm)
        chosen = decoder_methods(methods, sources=sources is not None)
        if self.vlm:
            chosen = self._vlm_methods(chosen, methods is None)
        #: (S, 2) the prompt's source spans, or None
        self.sources = None if sources is None else as_spans(sources)[0]
        self.given = continuation is not None
        #: a vision-language model's other per-token entries of the prompt (``token_type_ids``, Qwen-VL's
        #: ``mm_token_type_ids``), each (1, P); {} for a text LM and for the families without them
        self.per_token: dict = {}
        ids, gen = self._prompt_and_steps(prompt, max_new_tokens, continuation)
        #: (1, P+K) the prompt and the K tokens explained; P the prompt's length
        self.input_ids = torch.cat([ids, gen.to(ids.device)], 1)
        self.prompt_length = int(ids.shape[1])
        self._check_length()
        if self.sources is not None:  # checked against the prompt now, not at the first step
            in_columns(self.sources[None], torch.ones_like(ids), torch.tensor([self.prompt_length - 1]))
        self.pieces = self._pieces()
        self._scheme = word_scheme(self.tokenizer)
        self._cache = ExplanationCache(CACHE_SIZE)
        self._current: Optional[Cached] = None
        self._quiet = False
        self.contrast: Optional[int] = None
        self.explanation: Any = None
        self.displayed_map: Optional[np.ndarray] = None
        self.displayed_tokens: list[str] = []
        #: a vision-language model: the image map of the step shown (H, W), else None
        self.image_map: Optional[np.ndarray] = None
        self._with_image: dict = {}  # a VLM: the cached explanations with their image grid, by key
        self._build(chosen)
        self._guarded("first", self._recompute)

    def _prompt_and_steps(
        self, prompt: Any, max_new_tokens: Optional[int], continuation: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt's ids and the tokens to explain, checked against the model.

        A vision-language model's image inputs and per-token entries are set on ``self.images`` and
        ``self.per_token``, and a processor given as the tokenizer is replaced by its tokenizer.

        Parameters
        ----------
        prompt : Any
            The prompt as the widget takes it.
        max_new_tokens : Optional[int]
            K, the greedy tokens to write.
        continuation : Any
            The tokens to explain instead of the greedy ones, or ``None``.

        Returns
        -------
        tuple[torch.Tensor, torch.Tensor]
            ``(ids (1, P), continuation (1, K))``.
        """
        with _engine.torch_threads(self.facts.module, self.threads):
            if self.vlm:
                # a processor given as the tokenizer: its tokenizer gives the pieces
                self.facts.tokenizer, prompt, self.images, per_token = vlm_prompts(
                    self.facts.adapter, self.tokenizer, prompt
                )
            ids = prompt_ids(self.tokenizer, prompt)
            if self.vlm:  # re-padded on the left as the ids: the prompt is their last P columns
                self.per_token = {k: v[:, v.shape[1] - ids.shape[1] :] for k, v in per_token.items()}
            self.facts.adapter.check_inputs(
                {"input_ids": ids, "attention_mask": torch.ones_like(ids), **self.images, **self.per_token}
            )
            gen = new_tokens(
                self.facts.module,
                self.tokenizer,
                ids,
                max_new_tokens,
                continuation,
                self.images,
                self.per_token,
                getattr(self.facts.adapter, "extend_for_generation", None),
            )
        return ids, gen

    @property
    def tokenizer(self) -> Any:
        return self.facts.tokenizer

    @property
    def num_steps(self) -> int:
        return int(self.input_ids.shape[1]) - self.prompt_length

    def _vlm_methods(self, chosen: list[str], default: bool) -> list[str]:
        """The methods offered on a vision-language model: those it does not refuse (refused when named)."""
        refused = self.facts.adapter.refused_methods
        named = [m for m in chosen if m in refused]
        if named and not default:
            raise UnsupportedModelError(
                f"method {named[0]!r} is not defined on {type(self.facts.module).__name__}: {refused[named[0]]}"
            )
        return [m for m in chosen if m not in refused]

    def _check_length(self) -> None:
        adapter = getattr(self.facts.adapter, "text", self.facts.adapter)  # a VLM: its language model's
        limit = cast(DecoderAdapter, adapter).max_length  # resolve_lm found a decoder
        if limit is not None and self.input_ids.shape[1] - 1 > limit:
            raise InputError(
                f"prompt and continuation need {self.input_ids.shape[1] - 1} positions; "
                f"{type(self.facts.module).__name__} reads at most {limit}: write fewer tokens"
            )

    def _pieces(self) -> list[str]:
        ids = self.input_ids[0].tolist()
        if self.tokenizer is None or not hasattr(self.tokenizer, "convert_ids_to_tokens"):
            return [f"#{i}" for i in ids]
        return [str(p) for p in self.tokenizer.convert_ids_to_tokens(ids)]

    # -- controls ---------------------------------------------------------------------------
    def _build(self, methods: list[str]) -> None:
        self.method_selector = W.Dropdown(
            description="method",
            options=methods,
            layout=W.Layout(width="300px"),
            value=DEFAULT_METHOD if DEFAULT_METHOD in methods else methods[0],
        )
        generated = self.pieces[self.prompt_length :]
        self.step_selector = W.ToggleButtons(
            options=[(shown_token(p), k) for k, p in enumerate(generated)],
            value=0,
            tooltips=[f"step {k + 1}: {readable(p)!r}" for k, p in enumerate(generated)],
            style={"button_width": "auto"},
        )
        self.layer_slider = W.SelectionSlider(
            description="layer",
            options=[(MAP_LABEL, ("output", 0))],
            continuous_update=True,
            layout=W.Layout(width="420px"),
        )
        self.contrast_box = W.Text(
            placeholder="rather than\u2026 (a token, Enter)",
            continuous_update=False,
            description="contrast",
            layout=W.Layout(width="300px"),
        )
        self.word_toggle = W.ToggleButtons(
            options=[("words", "words"), ("pieces", "pieces")], value="words", style={"button_width": "80px"}
        )
        self.word_toggle.layout.display = None if self._scheme else "none"  # pieces are words already
        self.html = W.HTML(value="", layout=W.Layout(width="100%"))
        self.info = W.HTML(value="")
        self.status = W.HTML(value="")
        for name in ("method_selector", "step_selector", "layer_slider", "contrast_box", "word_toggle", "info"):
            getattr(self, name).add_class("trl-" + name.replace("_", "-"))  # stable CSS hooks
        self.add_class("trl-widget")
        self.add_class("trl-generation-explorer")
        label = W.HTML(value="<b>generated:</b>&nbsp;")
        self.image_view = W.HTML(value="")
        shown: W.Widget = self.html
        if self.vlm:  # the step's image map beside its text map
            self.word_toggle.layout.display = "none"  # the pieces are shown, the image tokens as one cell
            self.image_view.add_class("trl-image-view")
            shown = W.HBox([self.image_view, self.html])
        self.children = [
            W.HBox([self.method_selector, self.contrast_box, self.word_toggle]),
            W.HBox([label, self.step_selector]),
            self.layer_slider,
            self.message,
            shown,
            self.info,
            self.status,
        ]
        for w in (self.method_selector, self.step_selector):
            w.observe(self._on_compute_change, names="value")
        self.layer_slider.observe(self._on_redraw, names="value")
        self.word_toggle.observe(self._on_redraw, names="value")
        self.contrast_box.observe(self._on_contrast, names="value")

    # -- state --------------------------------------------------------------------------------
    @property
    def method(self) -> str:
        return str(self.method_selector.value)

    @property
    def step(self) -> int:
        """k (0-based): the generated token explained."""
        return int(self.step_selector.value)

    def target_id(self, step: Optional[int] = None) -> int:
        """The token id written at ``step`` (default: the selected one)."""
        return int(self.input_ids[0, self.prompt_length + (self.step if step is None else step)])

    def _key(self) -> tuple:
        return (self.method, self.step, self.contrast)

    def prefix(self, step: int) -> dict[str, torch.Tensor]:
        """The inputs of step k: the prompt and the k tokens written before g_k, (1, P+k); a vision-language
        model's per-token entries extended for those k tokens by its adapter's ``extend_for_generation``, as
        :func:`lrp_core.explain_generation` extends them."""
        ids = self.input_ids[:, : self.prompt_length + step]
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **self.images}
        if self.per_token:
            written = self.input_ids[:, self.prompt_length : self.prompt_length + step]
            inputs.update(cast(VLMAdapter, self.facts.adapter).extend_for_generation(self.per_token, written))
        return inputs

    def explanation_for(self, method: str, step: int, contrast: Optional[int] = None) -> Any:
        """The engine's explanation of step k (cached): ``explain`` on the step's prefix for ``y_{g_k}``
        (minus ``y_contrast``)."""
        return self._entry((method, step, contrast)).explanation

    def _entry(self, key: tuple) -> Cached:
        method, step, contrast = key

        def compute() -> Cached:
            inputs = self.prefix(step)
            self._check_contrast(contrast, step)
            target: Any = self.target_id(step)
            if contrast is not None:
                target = Contrast([target], [contrast])
            exp = _engine.explain(
                self.facts.module, inputs, method, target=target, keep_heads=False, sources=self.sources
            )
            if self.vlm:  # the views read the text row (every position); the image map is read from the whole
                self._with_image[key] = exp
                exp = replace(exp, grid=None, image_size=None, pixels=None)
            return Cached(exp, _engine.sample_readout(self.facts.adapter, inputs))

        return self._cache.get(key, compute)

    def _name(self, token: int) -> str:
        if self.tokenizer is None:
            return f"#{token}"
        return readable(str(self.tokenizer.convert_ids_to_tokens([token])[0]))

    # -- observers ------------------------------------------------------------------------------
    def _on_compute_change(self, change: dict) -> None:
        if not self._quiet:
            self._guarded("compute", self._recompute)

    def _on_redraw(self, change: dict) -> None:
        if not self._quiet:
            self._guarded("redraw", self._redraw)

    def _on_contrast(self, change: dict) -> None:
        def use() -> None:
            text = str(change["new"]).strip()
            hint = f" — likely here: {', '.join(repr(t) for t, _ in self._top())}" if self._current else ""
            new = (
                None
                if not text
                else token_id(self.tokenizer, text, cast(DecoderAdapter, self.facts.adapter).vocab_size, hint)
            )
            self._check_contrast(new, self.step)  # a refused contrast leaves the map as it was
            self.contrast = new
            self._recompute()

        self._guarded("compute", use)

    def _check_contrast(self, contrast: Optional[int], step: int) -> None:
        if contrast is not None and contrast == self.target_id(step):
            raise InputError(
                f"the contrast {self._name(contrast)!r} is the token written at this step: choose "
                "another token (the difference would be zero)"
            )

    # -- computing and drawing --------------------------------------------------------------------
    def _recompute(self) -> None:
        self.clear_error()
        if self._key() not in self._cache:  # reaches the browser before the work starts
            self.status.value = (
                f'<i style="color:#666">computing {html.escape(self.method)} for '
                f"{html.escape(self._name(self.target_id()))}\u2026</i>"
            )
        try:
            self._current = self._entry(self._key())
        except Exception:
            self._current = self.explanation = self.displayed_map = None  # no stale map under this error
            self.html.value = self.info.value = ""
            raise
        finally:
            self.status.value = ""
        self.explanation = self._current.explanation
        self._sync_slider()
        if self.layer_slider.value[0] == "accumulated":  # the partial products, once per explanation
            self._current.layer_products().prefix(self.explanation.start_layer or 0)
        self._redraw()

    def _sync_slider(self) -> None:
        """Give the slider this explanation's stops (kept, with the position, when they are the same)."""
        new = stops(self.explanation)
        if list(self.layer_slider.options) == new:
            return
        self._quiet = True
        try:
            self.layer_slider.options = new
            self.layer_slider.value = new[-1][1]
            self.layer_slider.disabled = len(new) == 1
        finally:
            self._quiet = False

    def current_values(self) -> np.ndarray:
        """The per-piece values (P+k,) of the current stop, before words are merged."""
        assert self._current is not None  # read only once an explanation is cached
        return stop_values(self._current, self.layer_slider.value)

    def _redraw(self) -> None:
        if self._current is None:
            return
        values = self.current_values()
        pieces = self.pieces[: self.prompt_length + self.step]
        if self.vlm:  # the image tokens as one cell holding their sum
            image_id = cast(VLMAdapter, self.facts.adapter).image_token_id
            placeholder = (self.input_ids[0, : len(pieces)] == image_id).numpy()
            tokens, summed = image_cell(pieces, np.asarray(values, dtype=np.float64)[None], placeholder)
            values, tokens = summed[0], [shown_token(t) for t in tokens]
            self.image_view.value = self._image_html()
        elif self._scheme and self.word_toggle.value == "words":  # the sum keeps the total
            tokens, merged = merge_words(pieces, values, reduce="sum", scheme=self._scheme)
            assert merged is not None  # values given, so merged too
            values = merged
            tokens = [shown_token(t) for t in tokens]
        else:
            tokens = [shown_token(p) for p in pieces]
        self.displayed_map, self.displayed_tokens = np.asarray(values, dtype=np.float64), tokens
        nxt = html.escape(shown_token(self.pieces[self.prompt_length + self.step]))
        self.html.value = (
            f'<div style="color:#333;margin:4px 0">{html.escape(self._title())}</div>'
            + token_html(tokens, values, signed=True, explained="the token")
            + f'<div class="trl-next" style="margin-top:4px">\u2192 next token: <b>{nxt}</b></div>'
            + self._sources_html()
        )
        self.info.value = self._info_html()

    def _image_html(self) -> str:
        """The step's image map as an ``<img>`` (the method's map, whatever the layer slider shows)."""
        import base64

        from lrp_core.viz.thumbnails import map_png

        exp = self._with_image.get(self._key())
        if (
            exp is None
            or exp.grid is None
            or exp.image_tokens is None
            or exp.image_tokens.shape[1] != exp.grid[0] * exp.grid[1]
        ):
            self.image_map = None  # several images per row: their tokens are scored, no single map
            return ""
        self.image_map = exp.pixel_map()[0].detach().double().cpu().numpy()
        what = "pixels" if exp.pixels is not None else "image tokens, upsampled"
        png = map_png(self.image_map, image=self.photo, mask=self.mask, title=f"image ({what})")
        return (
            f'<img class="trl-step-image" alt="image map of step {self.step + 1}" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        )

    def source_labels(self) -> list[str]:
        """The text of each source (its pieces joined)."""
        spans = [] if self.sources is None else self.sources.tolist()
        return [span_text(self.pieces[a:b], self.pieces) for a, b in spans]

    def _sources_html(self) -> str:
        """This step's source scores as blocks (the whole map's, not the layer slider's stop); '' without
        sources."""
        exp = self.explanation
        if self.sources is None or exp is None or exp.sources is None:
            return ""
        return (
            '<div style="color:#333;margin-top:6px">sources (each: the sum of its tokens\' scores):</div>'
            + source_blocks(self.source_labels(), exp.sources[0].double().cpu().numpy())
        )

    def _title(self) -> str:
        versus = "" if self.contrast is None else f" rather than {self._name(self.contrast)!r}"
        label = next(lab for lab, v in self.layer_slider.options if v == self.layer_slider.value)
        # a given token may be one the model would not write: not "why", but what speaks for it
        why = "what speaks for" if self.given else "why"
        return (
            f"{self.method}: {why} {self._name(self.target_id())!r}{versus} "
            f"(step {self.step + 1} of {self.num_steps}) | {label}"
        )

    def _top(self) -> list[tuple[str, float]]:
        """The model's most likely next tokens at this step, with their probabilities (from the engine's logits)."""
        probs = torch.softmax(self.explanation.logits[0].double(), 0)
        top = torch.topk(probs, min(TOP_K, probs.numel()))
        return [(self._name(int(i)), float(p)) for p, i in zip(top.values, top.indices)]

    def _info_html(self) -> str:
        exp, g = self.explanation, self.target_id()
        logits = exp.logits[0].double()
        p = float(torch.softmax(logits, 0)[g])
        y = float(logits[g]) - (0.0 if self.contrast is None else float(logits[self.contrast]))
        what = "y" if self.contrast is None else f"y \u2212 y_{html.escape(self._name(self.contrast))}"
        shown = self.displayed_map
        assert shown is not None  # _redraw sets it before the info is drawn
        lines = [
            f"explaining <b>{html.escape(self._name(g))}</b> (p = {p:.1%}; {what} = {y:.4g}); likely here: "
            + ", ".join(f"{html.escape(t)} ({q:.1%})" for t, q in self._top()),
            f"\u03a3 shown = {shown.sum():.4g}, max |value| = {np.abs(shown).max():.4g}",
        ]
        note = views.absorbed_note(exp)
        if note is not None:
            lines.append(html.escape(note))
        return "<br>".join(lines)

    def _static_bundle(self) -> dict[str, Any]:
        bundle = token_page_bundle(self)
        if self.vlm and self.displayed_map is not None and self.image_view.value:  # the image map beside the text
            bundle["text/html"] = (
                f'<div style="display:flex;gap:8px">{self.image_view.value}<div>{bundle["text/html"]}</div></div>'
            )
        return bundle


__all__ = ["GenerationExplorer", "decoder_methods", "stops", "token_id", "word_scheme"]
