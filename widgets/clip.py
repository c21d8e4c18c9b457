"""``ClipExplorer``: a CLIP image explained against free-text prompts instead of classes.

The class selector lists the prompts (ranked by their softmax probability over
the prompts, as classes are), a text box adds a prompt, and "rather than" picks
a second prompt to contrast with (``lrp_core.Contrast``). Everything else is
:class:`RelevanceExplorer`: methods, blocks, heads, views, sign, opacity and the
static PNG fallback.

The logits are the engine's (the adapter's replay of ``logits_per_image``, (B, P)),
so the probabilities shown are those of the model the maps explain.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Sequence

import ipywidgets as W
import torch

from lrp_core import Contrast
from lrp_core.errors import InputError, UnsupportedModelError

from . import _engine
from ._common import check_kind, images_of, is_clip
from .explorer import RelevanceExplorer

#: The value of the "rather than" dropdown when no contrast is chosen.
NO_CONTRAST = -1


def as_prompt_list(prompts: Any) -> list[str]:
    """``prompts`` as a list of strings (one string is one prompt; anything else not iterable is none)."""
    if isinstance(prompts, str):
        return [prompts]
    try:
        return [str(p) for p in prompts]
    except TypeError:
        return []


def tokenize(tokenizer: Any, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``attention_mask`` (P, T) of ``prompts``, padded to the longest.

    ``tokenizer``: a Hugging Face tokenizer, a ``CLIPProcessor`` (its ``tokenizer`` is
    used) or any callable ``tokenizer(list_of_str, padding=True, truncation=True,
    return_tensors="pt")`` returning a mapping with ``input_ids`` (and ``attention_mask``).
    """
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    if not callable(tok):
        raise InputError(f"tokenizer must be callable (a CLIP tokenizer or processor); got {type(tokenizer).__name__}")
    out = tok(list(prompts), padding=True, truncation=True, return_tensors="pt")
    if not isinstance(out, Mapping) or "input_ids" not in out:
        raise InputError(f"the tokenizer returned {type(out).__name__}; expected a mapping with 'input_ids'")
    ids = torch.as_tensor(out["input_ids"])
    mask = out.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask)
    return {"input_ids": ids.long(), "attention_mask": mask.long()}


class ClipExplorer(RelevanceExplorer):
    """A CLIP image with its relevance overlay for one text prompt (or one prompt rather than another).

    Args:
        model: a Hugging Face ``CLIPModel``.
        inputs: normalised images (B, 3, H, W) or (3, H, W), a processor output with
            ``pixel_values``, or PIL images when ``tokenizer`` is a ``CLIPProcessor``.
        prompts: the first prompts (at least one); more are added in the widget.
        tokenizer: the model's tokenizer or ``CLIPProcessor`` (see :func:`tokenize`).
        methods, image, display_size: as :class:`RelevanceExplorer`.

    Controls beyond :class:`RelevanceExplorer`'s: ``prompt_box`` + ``add_button``
    (:meth:`add_prompt`) and ``contrast_selector`` ("rather than": ``NO_CONTRAST`` or a prompt index).
    The prompts are ``prompts``; ``class_selector`` lists them with their probabilities.
    """

    def __init__(
        self,
        model: Any,
        inputs: Any,
        prompts: Sequence[str],
        tokenizer: Any = None,
        methods: Optional[Sequence[str]] = None,
        image: Any = None,
        display_size: int = 320,
    ) -> None:
        self.tokenizer = tokenizer
        self.prompts = as_prompt_list(prompts)
        self.tokens: dict[str, torch.Tensor] = {}
        self.prompt_box = W.Text(
            placeholder="a photo of \u2026", description="new prompt", layout=W.Layout(width="320px")
        )
        self.add_button = W.Button(description="add prompt", icon="plus", layout=W.Layout(width="120px"))
        self.contrast_selector = W.Dropdown(
            description="rather than",
            options=[("none", NO_CONTRAST)],
            value=NO_CONTRAST,
            layout=W.Layout(width="300px"),
        )
        self.prompt_box.add_class("trl-prompt-box")
        self.contrast_selector.add_class("trl-contrast-selector")
        super().__init__(
            model, inputs, labels=list(self.prompts), methods=methods, image=image, display_size=display_size
        )
        self.class_selector.description = "prompt"

    # -- set-up ---------------------------------------------------------
    def _check_kind(self) -> None:
        check_kind(self.facts, self.expected_kind, type(self).__name__)
        if not is_clip(self.facts):
            raise UnsupportedModelError(
                f"ClipExplorer explains a Hugging Face CLIPModel; "
                f"{type(self.facts.module).__name__} is a classifier: use "
                "widgets.RelevanceExplorer"
            )

    def _images(self, inputs: Any) -> torch.Tensor:
        """Images from a tensor, a processor output or PIL images; checked with the prompts by the adapter."""
        if not self.prompts:
            raise InputError("ClipExplorer needs at least one prompt, e.g. prompts=['a photo of a dog']")
        if self.tokenizer is None:
            self.tokenizer = self.facts.tokenizer
        if self.tokenizer is None:
            raise InputError(
                "ClipExplorer needs the model's tokenizer (or CLIPProcessor) to read the prompts: "
                "tokenizer=CLIPProcessor.from_pretrained(...)"
            )
        self._use_processor_stats()
        pixels = self._pixel_values(inputs)
        self.tokens = tokenize(self.tokenizer, self.prompts)
        return images_of(self.facts.adapter.check_inputs(dict(self.tokens, pixel_values=pixels)))

    def _pixel_values(self, inputs: Any) -> Any:
        """``pixel_values`` from what the user gave (PIL images go through the processor's image part)."""
        if isinstance(inputs, Mapping):
            if "pixel_values" not in inputs:
                raise InputError(
                    "inputs is a mapping without 'pixel_values'; pass the images (B, 3, H, W) or the processor's output"
                )
            inputs = inputs["pixel_values"]
        images = getattr(self.tokenizer, "image_processor", None)
        if not isinstance(inputs, torch.Tensor) and images is not None:
            inputs = images(inputs, return_tensors="pt")["pixel_values"]
        if isinstance(inputs, torch.Tensor) and inputs.dim() == 3:
            inputs = inputs.unsqueeze(0)
        return inputs

    def _use_processor_stats(self) -> None:
        """Take the display de-normalisation from a processor's image part, where the model has none."""
        images = getattr(self.tokenizer, "image_processor", None)
        mean, std = getattr(images, "image_mean", None), getattr(images, "image_std", None)
        if self.facts.mean is None and mean is not None and std is not None:
            self.facts.mean, self.facts.std = list(mean), list(std)

    def _controls(self) -> list[W.Widget]:
        rows = super()._controls()
        self.class_search.layout.display = "none"  # a few prompts: the selector is the search
        return [rows[0], W.HBox([self.prompt_box, self.add_button, self.contrast_selector]), *rows[1:]]

    def _wire(self) -> None:
        super()._wire()
        self.contrast_selector.observe(self._on_compute_change, names="value")
        self.add_button.on_click(lambda _: self.add_prompt(self.prompt_box.value))

    # -- the engine's view of the prompts ---------------------------------
    def _clip_inputs(self, images: torch.Tensor, tokens: Optional[dict] = None) -> dict[str, torch.Tensor]:
        """What ``lrp_core.explain`` takes: the images and the tokenized prompts."""
        return dict(tokens if tokens is not None else self.tokens, pixel_values=images)

    def _logits_for(self, tokens: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, P) similarity logits of every image with the prompts ``tokens``, from the engine's adapter."""
        adapter = self.facts.adapter
        with torch.no_grad(), _engine.torch_threads(self.facts.module, self.threads):
            prepared = adapter.check_inputs(self._clip_inputs(self.inputs, tokens))
            return adapter.forward(prepared).logits.detach().float()

    def _forward_logits(self) -> torch.Tensor:
        return self._logits_for(self.tokens)

    def _sample(self, i: int) -> dict[str, torch.Tensor]:
        return self._clip_inputs(self.inputs[i : i + 1])

    # -- targets ----------------------------------------------------------
    @property
    def negative(self) -> Optional[int]:
        """The prompt contrasted with (``None``: no contrast, or a method that ignores the target)."""
        q = self.contrast_selector.value
        if q is None or q == NO_CONTRAST or self.method in _engine.class_agnostic():
            return None
        return int(q)

    def _target_key(self) -> Any:
        q = self.negative
        return self.target if q is None else (self.target, q)

    def _engine_target(self, key: Any) -> Any:
        return Contrast(positive=key[0], negative=key[1]) if isinstance(key, tuple) else key

    def _target_name(self) -> str:
        q = self.negative
        name = f"\u201c{self.names[self.target]}\u201d"
        return name if q is None else f"{name} rather than \u201c{self.names[q]}\u201d"

    def _sync_contrast(self) -> None:
        """ "Rather than" offers every other prompt; off for methods that ignore the target."""
        keep = self.contrast_selector.value
        others = [(p, i) for i, p in enumerate(self.prompts) if i != self.target]
        self._quiet = True
        try:
            self.contrast_selector.options = [("none", NO_CONTRAST)] + others
            self.contrast_selector.value = keep if keep in [i for _, i in others] else NO_CONTRAST
            self.contrast_selector.disabled = self.method in _engine.class_agnostic() or not others
        finally:
            self._quiet = False

    def _recompute(self) -> None:
        self._sync_contrast()
        super()._recompute()

    # -- adding prompts ---------------------------------------------------
    def add_prompt(self, text: str) -> bool:
        """Add ``text`` as a prompt and explain it (an existing prompt is just selected).

        Returns False, with the reason in the error box, if it cannot be added (empty, or
        the tokenizer / model refuses it); the widget keeps its prompts and its picture.
        """
        return self._guarded("compute", lambda: self._add_prompt(text))

    def _add_prompt(self, text: str) -> None:
        self.clear_error()
        text = str(text).strip()
        if not text:
            raise InputError("type a prompt in the box first (e.g. \u201ca photo of a dog\u201d)")
        if text in self.prompts:
            self.prompt_box.value = ""
            self.class_selector.value = self.prompts.index(text)
            return
        prompts = self.prompts + [text]
        tokens = tokenize(self.tokenizer, prompts)
        logits = self._logits_for(tokens)  # raises before anything changes if the model refuses them
        self._set_prompts(prompts, tokens, logits)
        self.prompt_box.value = ""
        self._recompute()

    def _set_prompts(self, prompts: list[str], tokens: dict[str, torch.Tensor], logits: torch.Tensor) -> None:
        """Take new prompts: the logits change, so every cached explanation is dropped; the last is selected."""
        self.prompts, self.tokens, self.logits = prompts, tokens, logits
        self.names = list(prompts)
        self._cache.clear()
        self.class_search.options = tuple(self.names)
        self._fill_classes()
        self._quiet = True
        try:
            self.class_selector.value = len(prompts) - 1
        finally:
            self._quiet = False


__all__ = ["ClipExplorer", "NO_CONTRAST", "as_prompt_list", "tokenize"]
