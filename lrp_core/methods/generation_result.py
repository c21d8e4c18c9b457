"""The result of :func:`lrp_core.explain_generation`: one relevance row per generated token, its views and pages.

A :class:`GenerationExplanation` holds, for B prompts and K steps, the (B, K, P + K − 1) scores, the written
tokens and, for a vision-language model, the image tokens that map its patches back to the picture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor

from ..errors import InputError
from ..viz.text import generation_html, image_cell, page


@dataclass
class GenerationExplanation:
    """Relevance maps of a generated continuation, one per step.

    Attributes:
        method: the method used.
        input_ids: (B, P+K) prompt and continuation, left-padded (the prompts end at column P).
        attention_mask: (B, P+K) 1 = real token; 0 = padding, also after a row's end-of-text token.
        prompt_length: P, the padded prompt width (every row's prompt ends at column P − 1).
        scores: (B, K, P+K−1) row k: the relevance of each input position for step k; padding and positions from
            P+k on are 0.
        tokens: per row, the P+K pieces (padding as the tokenizer's pad token).
        targets: (B, K) the explained token ids; ``contrasts`` (B, K) the contrasted ids (−1: none), or ``None``.
        logits: (B, K) the explained quantity: the target logit (minus the contrast's) at each step.
        sources: (B, K, S) with ``sources=`` (token spans of the prompts): each source's score at each step (the
            sum of the step's token scores over the span; the source methods: their own), else ``None``;
            :meth:`answer_sources` sums it over the answer.
        probabilities: (B, K) the model's probability of each explained token at its step (0 for steps not
            explained): a given continuation may hold tokens the model would not write.
        pixels: a vision-language model with one image per row, and a method that reaches the pixels (``lrp``,
            ``attnlrp``, ``cp_lrp``): (B, K, H, W) the pixel relevance of each step, else ``None``.
        grid, image_size: a vision-language model's patch grid (h, w) and image size (H, W), else ``None``.
        image_tokens: (B, k·h·w) a vision-language model's image tokens: for each patch in raster order, the
            position in ``scores`` of the image token carrying it (the same at every step: the image is in the
            prompt), else ``None``; :meth:`patch_map` (B, K, h, w) and :meth:`upsample` (B, K, H, W) read the
            step maps there.

    K is the number of steps the longest row took. A row that wrote its end-of-text token at step s < K (greedy
    with ``stop_at_eos``) is padded after it as ``generate`` pads it: from step s+1 on its ``input_ids`` and
    ``targets`` hold the pad id, its ``attention_mask`` is 0, and its steps are not explained (``scores`` rows 0,
    ``logits`` 0, ``contrasts`` −1). :attr:`steps_per_row` gives each row's s.
    """

    method: str
    input_ids: Tensor
    attention_mask: Tensor
    prompt_length: int
    scores: Tensor
    tokens: list
    targets: Tensor
    logits: Tensor
    contrasts: Optional[Tensor] = None
    options: dict = field(default_factory=dict)
    sources: Optional[Tensor] = None
    probabilities: Optional[Tensor] = None
    pixels: Optional[Tensor] = None
    grid: Optional[tuple[int, int]] = None
    image_size: Optional[tuple[int, int]] = None
    image_tokens: Optional[Tensor] = None

    def _steps_as_explanation(self) -> Any:
        """The B·K step maps as one :class:`~lrp_core.explanation.Explanation` (row b·K + k: row b, step k)."""
        from ..explanation import Explanation

        if self.grid is None or self.image_tokens is None:
            raise InputError(
                "patch_map() / upsample() need the explanation of a vision-language model's "
                "generation; this one is of a text"
            )
        B, K, T = self.scores.shape
        return Explanation(
            scores=self.scores.reshape(B * K, T),
            target=self.targets.reshape(-1),
            logits=self.logits.reshape(-1, 1),
            method=self.method,
            grid=self.grid,
            image_size=self.image_size,
            image_tokens=self.image_tokens.repeat_interleave(K, 0),
        )

    def patch_map(self) -> Tensor:
        """(B, K, h, w) each step's image-token scores on the patch grid (as ``Explanation.patch_map``)."""
        B, K = self.scores.shape[:2]
        maps = self._steps_as_explanation().patch_map()
        return maps.reshape(B, K, *maps.shape[-2:])

    def upsample(self, size: Optional[tuple[int, int]] = None, mode: str = "bilinear") -> Tensor:
        """(B, K, H, W) each step's patch map upsampled to the image size (or ``size``), as
        ``Explanation.upsample``."""
        B, K = self.scores.shape[:2]
        maps = self._steps_as_explanation().upsample(size, mode)
        return maps.reshape(B, K, *maps.shape[-2:])

    def pixel_map(self) -> Tensor:
        """(B, K, H, W) the pixel relevance where the method computed it (``pixels``), else :meth:`upsample`."""
        return self.pixels if self.pixels is not None else self.upsample()

    def answer_sources(self) -> Tensor:
        """(B, S) each source's score for the whole answer: the sum of its step scores over the steps each row
        took (docs/METHODS.md §2s)."""
        if self.sources is None:
            raise InputError(
                "this explanation has no sources: pass sources=[(start, end), ...] (token spans of the "
                "prompt) to explain_generation"
            )
        return self.sources.sum(1)

    @property
    def num_steps(self) -> int:
        return self.scores.shape[1]

    @property
    def steps_per_row(self) -> Tensor:
        """(B,) the steps explained in each row: K, or fewer for a row that stopped at its end-of-text token."""
        return self.attention_mask[:, self.prompt_length :].sum(1)

    def generated(self, row: int = 0) -> list[str]:
        """The generated pieces of a row (up to its end-of-text token, included)."""
        return self.tokens[row][self.prompt_length : self.prompt_length + int(self.steps_per_row[row])]

    def html(self, row: int = 0, scale: str = "row", merge: bool = False, image: Any = None, mask: Any = None) -> str:
        """The heat map of one row as an HTML fragment (context tokens × generated tokens).

        A vision-language model's steps each get their image map (:func:`lrp_core.viz.thumbnails.step_thumbnails`,
        on the ``scale`` of the rows): over ``image``, the photo the row's model read (a PIL image or an (H, W, 3)
        array; ``None``: the map on white), with ``mask`` ((H, W) bool at the photo's size, e.g. a
        ``make_vqa`` record's ``.mask``: the object asked about) outlined.
        """
        if not 0 <= row < len(self.tokens):
            raise InputError(f"row must be in 0 … {len(self.tokens) - 1}, got {row}")
        keep = self.attention_mask[row, :-1].bool().cpu()
        start = int(torch.nonzero(keep)[0]) if keep.any() else 0  # drop the left padding from the picture
        steps = int(self.steps_per_row[row])  # and the steps after the row's end-of-text token
        stop = self.prompt_length + steps - 1
        context = self.tokens[row][start:stop]
        scores = self.scores[row, :steps, start:stop].detach().double().cpu().numpy()
        contrasts = None
        if self.contrasts is not None:
            contrasts = [None if c < 0 else self._piece(row, int(c)) for c in self.contrasts[row, :steps].tolist()]
        given = bool(self.options.get("continuation_given"))
        # a given continuation is not necessarily what the model writes (a step may have p ≈ 0)
        title = (
            f"{self.method}: what speaks for each token of the given continuation"
            if given
            else f"{self.method}: why the model wrote what it wrote"
        )
        sources = labels = None
        if self.sources is not None:
            sources = self.sources[row, :steps].detach().double().cpu().numpy()
            labels = self.source_labels(row)
        probs = None if self.probabilities is None else self.probabilities[row, :steps].tolist()
        images = note = None
        if self.image_tokens is not None:
            image_id = self.options["image_token_id"]
            placeholder = (self.input_ids[row, start:stop] == image_id).cpu().numpy()
            context, scores = image_cell(context, scores, placeholder)
            images, note = self._step_images(row, steps, scale, image, mask)
        elif image is not None or mask is not None:
            raise InputError(
                "image= and mask= draw a vision-language model's image maps; this explanation is of a text"
            )
        return generation_html(
            context,
            self.generated(row),
            scores,
            scale=scale,
            contrasts=contrasts,
            title=title,
            sources=sources,
            source_labels=labels,
            probabilities=probs,
            images=images,
            image_note=note,
        )

    def _step_images(
        self, row: int, steps: int, scale: str, image: Any, mask: Any
    ) -> tuple[Optional[list], Optional[str]]:
        """Per step a ``<figure>`` (:func:`lrp_core.viz.thumbnails.step_thumbnails`): the pixel map, else the
        upsampled patch map, over ``image`` with ``mask`` outlined, and the note saying so; ``None`` for several
        images per row."""
        from ..viz.thumbnails import image_note, step_thumbnails

        if self.grid is None or self.image_tokens is None or self.image_tokens.shape[1] != self.grid[0] * self.grid[1]:
            return None, None
        return (
            step_thumbnails(self.pixel_map()[row, :steps], image=image, mask=mask, scale=scale),
            image_note(self.pixels is not None, image is not None, mask is not None),
        )

    def source_labels(self, row: int = 0) -> list[str]:
        """The text of each source of a row (its tokens joined), from the spans given as ``sources=``."""
        from ..sources import as_spans
        from ..viz.text import span_text

        spans = as_spans(self.options["sources"]).expand(len(self.tokens), -1, -1)[row]
        first = int(torch.nonzero(self.attention_mask[row])[0]) if self.attention_mask[row].any() else 0
        pieces = self.tokens[row]
        return [span_text(pieces[first + a : first + b], pieces) for a, b in spans.tolist()]

    def _piece(self, row: int, token_id: int) -> str:
        return self.options.get("id_to_token", {}).get(token_id, str(token_id))

    def show(self, row: int = 0, scale: str = "row", image: Any = None, mask: Any = None) -> None:
        """Display the heat map of one row in Jupyter, once (``image`` / ``mask``: as :meth:`html`).

        Returns None: a cell that ends in ``gen.show()`` would otherwise display the returned object a
        second time. ``html(row, scale)`` gives the fragment itself.
        """
        from IPython.display import HTML, display

        display(HTML(self.html(row, scale, image=image, mask=mask)))

    def _repr_html_(self) -> str:
        return self.html(0)

    def save_html(
        self,
        path: Union[str, Path],
        rows: Optional[Sequence[int]] = None,
        scale: str = "row",
        images: Optional[Sequence[Any]] = None,
        masks: Optional[Sequence[Any]] = None,
    ) -> Path:
        """Write a self-contained page (no script, font or style from elsewhere) with the rows' heat maps.

        ``images`` / ``masks``: a vision-language model's photos and masks, one per row of the batch (B; ``None``
        for none), drawn under and around each step's image map as :meth:`html` draws them.
        """
        B = len(self.tokens)
        for name, given in (("images", images), ("masks", masks)):
            if given is not None and (not isinstance(given, (list, tuple)) or len(given) != B):
                got = f"{len(given)} entries" if isinstance(given, (list, tuple)) else type(given).__name__
                raise InputError(
                    f"{name} must be a list with one entry per row of the batch ({B}; None for none), got {got}"
                )
        rows = range(B) if rows is None else rows
        path = Path(path)
        body = "".join(
            self.html(r, scale, image=None if images is None else images[r], mask=None if masks is None else masks[r])
            for r in rows
        )
        path.write_text(page(body, title=f"{self.method} — generation"), encoding="utf-8")
        return path
