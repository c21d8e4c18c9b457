"""The result object of :func:`lrp_core.explain`, and the one declaration of its per-sample fields.

:class:`ResultFields` declares every field a method computes per sample
(scores, target, logits, and what a method may add: pixels, layers, ...): its
type, whether every method fills it, and in the field's metadata its shape and
how pieces of a batch are merged. It is the one source of truth:
:class:`lrp_core.methods.call.MethodResult` (what a method returns) and
:class:`Explanation` (what ``explain`` returns) derive from it, so type checkers
and editors see the fields on both, and :data:`RESULT_FIELDS` (what
``Explanation.__getitem__``, the merge of pieces
(:func:`lrp_core.runtime.pieces.merge`) and ``explain``'s hand-over
(:func:`result_fields`) loop over) is read from its fields. Which method fills
which optional field is the method class's ``returns`` in
:mod:`lrp_core.methods.registry` (:func:`lrp_core.methods.registry.filled_by`).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, MISSING, dataclass, field, fields
from typing import Any, Optional, get_type_hints

import torch
import torch.nn.functional as F

from .errors import InputError


@dataclass
class Conservation:
    """Relevance totals from the output to the input, per sample: where relevance is kept and where it is absorbed.

    Attributes:
        output: (B,) the relevance put in at the top (``y_t`` for gradient × input methods).
        blocks: (B, L) Σ over tokens of the residual stream's relevance leaving block b.
        input: (B,) Σ of the token scores at the input (patch / word embeddings).
        pixels: (B,) Σ of the pixel relevance (images), else ``None``.
        positional: (B,) Σ of the relevance the position encodings took (``pa_lrp``: every position, every
            block's rotary tables), else ``None``. The input stage counts it: tokens + positions.
        registers: (B,) Σ of the register tokens' relevance (a ViT with registers), else ``None``; the input
            stage counts it too.
    """

    output: torch.Tensor
    blocks: torch.Tensor
    input: torch.Tensor
    pixels: Optional[torch.Tensor] = None
    positional: Optional[torch.Tensor] = None
    registers: Optional[torch.Tensor] = None

    def stages(self) -> torch.Tensor:
        """(B, L + 2) totals in the order the relevance flows: output, block L-1 … block 0, input
        (with ``positional``: input tokens + positions; with ``registers``: + the register tokens)."""
        bottom = self.input if self.positional is None else self.input + self.positional
        if self.registers is not None:
            bottom = bottom + self.registers
        return torch.cat([self.output[:, None], self.blocks.flip(1), bottom[:, None]], dim=1)

    def absorbed(self) -> torch.Tensor:
        """(B, L + 1) relevance lost at each step (a stage's total minus the next one's): 0 where conserved.

        Step 0 is the readout (head, final norm: output → leaving block L−1), step k (1 … L−1) is
        block L−k, and step L is block 0 together with the embedding layer below it.
        """
        s = self.stages()
        return s[:, :-1] - s[:, 1:]

    def __getitem__(self, i: int) -> "Conservation":
        sl = slice(i, i + 1)
        return Conservation(
            self.output[sl],
            self.blocks[sl],
            self.input[sl],
            None if self.pixels is None else self.pixels[sl],
            None if self.positional is None else self.positional[sl],
            None if self.registers is None else self.registers[sl],
        )


@dataclass(frozen=True)
class ResultField:
    """One per-sample field of a method's result, as :data:`RESULT_FIELDS` lists it.

    Attributes:
        name: the attribute of :class:`ResultFields` (so of :class:`~lrp_core.methods.call.MethodResult` and
            :class:`Explanation`).
        shape: its shape, for docs (``B`` the batch, ``T`` tokens, ``N`` tokens incl. specials, ``L`` blocks).
        type: the annotation of the field.
        token_axes: how many trailing axes are token axes: merging pieces of padded text that were explained
            unpadded (``n`` tokens), they are zero-padded back to the batch's ``T``.
        required: every method fills it (else ``None`` where the method does not).
        detach: ``explain`` detaches it from the graph the method built.
    """

    name: str
    shape: str
    type: Any
    token_axes: int = 0
    required: bool = False
    detach: bool = False


def _meta(shape: str, token_axes: int = 0, detach: bool = False) -> dict[str, Any]:
    """The metadata of a field of :class:`ResultFields` (see :class:`ResultField`)."""
    return {"shape": shape, "token_axes": token_axes, "detach": detach}


@dataclass
class ResultFields:
    """The per-sample fields of a result: the declaration :data:`RESULT_FIELDS` is read from.

    :class:`~lrp_core.methods.call.MethodResult` (what a method returns) and :class:`Explanation` (what
    ``explain`` returns) both derive from this class, so each field is declared once, here: its type (the
    annotation), whether every method fills it (no default) or only some (``None`` by default; which,
    ``returns`` of its class, :mod:`lrp_core.methods.objects`), and in its metadata its shape, its token axes
    and whether ``explain`` detaches it. The batch dimension is the first of each; ``conservation`` is a
    :class:`Conservation` (its own per-sample totals). Each field is described in :class:`Explanation`.
    """

    scores: torch.Tensor = field(metadata=_meta("(B, T)", token_axes=1, detach=True))
    target: torch.Tensor = field(metadata=_meta("(B,)"))
    logits: torch.Tensor = field(metadata=_meta("(B, C)", detach=True))
    layers: Optional[torch.Tensor] = field(default=None, metadata=_meta("(B, L, N, N)", token_axes=2))
    layers_per_head: Optional[torch.Tensor] = field(default=None, metadata=_meta("(B, L, H, N, N)", token_axes=2))
    token_relevance: Optional[torch.Tensor] = field(default=None, metadata=_meta("(B, L, N)", token_axes=1))
    pixels: Optional[torch.Tensor] = field(default=None, metadata=_meta("(B, H, W)"))
    conservation: Optional[Conservation] = field(default=None, metadata=_meta("Conservation of (B, ...) totals"))
    convergence_delta: Optional[torch.Tensor] = field(default=None, metadata=_meta("(B,)", detach=True))
    positional: Optional[torch.Tensor] = field(default=None, metadata=_meta("(B, T)", token_axes=1, detach=True))
    sources: Optional[torch.Tensor] = field(default=None, metadata=_meta("(B, S)", detach=True))
    registers: Optional[torch.Tensor] = field(default=None, metadata=_meta("(B, R)", detach=True))


def _declared() -> tuple[ResultField, ...]:
    """:data:`RESULT_FIELDS`, read from the fields of :class:`ResultFields`."""
    hints = get_type_hints(ResultFields)
    return tuple(
        ResultField(
            f.name,
            f.metadata["shape"],
            hints[f.name],
            f.metadata["token_axes"],
            required=f.default is MISSING,
            detach=f.metadata["detach"],
        )
        for f in fields(ResultFields)
    )


#: Every per-sample field of a result, in the order of :class:`ResultFields`.
RESULT_FIELDS: tuple[ResultField, ...] = _declared()
#: The optional fields: what a method may add (a method class's ``returns``).
OPTIONAL_FIELDS: tuple[str, ...] = tuple(f.name for f in RESULT_FIELDS if not f.required)


def result_fields(result: Any) -> dict[str, Any]:
    """The :data:`RESULT_FIELDS` of a method's result, as ``explain`` hands them to :class:`Explanation`.

    Parameters
    ----------
    result : Any
        A method's result (a ``MethodResult``), with one attribute per field.

    Returns
    -------
    dict[str, Any]
        ``{field name: value}``; the fields declared ``detach`` are detached from the graph.
    """
    out = {}
    for f in RESULT_FIELDS:
        v = getattr(result, f.name)
        out[f.name] = v.detach() if f.detach and v is not None else v
    return out


def _sample(value: Any, i: int) -> Any:
    """Sample ``i`` of a per-sample field as a batch of one."""
    if value is None:
        return None
    return value[i] if isinstance(value, Conservation) else value[i : i + 1]


@dataclass
class Explanation(ResultFields):
    """Token relevance for a batch, with what was needed to compute it.

    The per-sample fields (``scores`` … ``positional``) are those of :class:`ResultFields`, in its order; the
    fields that describe the call (``method`` … ``options``) follow, keyword-only.

    Attributes:
        scores: (B, T) token relevance. ViT: patch tokens in raster order, no
            [CLS]. BERT: every token, specials included, padding positions 0.
            A multiple-choice head: (B, C, T), the explained choice's row (the others 0).
        target: (B,) the class (or -1 for a concept target) that was explained (question answering: 0 start,
            1 end; multiple choice: the choice).
        logits: (B, C) the model's logits on ``inputs`` (a per-token head: at the explained position; question
            answering: (B,) the explained start or end logit; multiple choice: (B, C) every choice's logit).
        method: name of the method in :data:`lrp_core.METHODS`.
        pixels: (B, H, W) pixel relevance from the methods that carry relevance down to the pixels
            (``lrp``, ``attnlrp``, ``cp_lrp``: ``lrp_core.methods.registry.filled_by("pixels")``), else ``None``.
        layers: (B, L, N, N) the per-block matrices Ā_b the method aggregates,
            before ``I +`` is added (zeros for blocks below ``start_layer``),
            where the method has them. Aggregate a range of blocks with
            :func:`lrp_core.methods.products.accumulate`.
        layers_per_head: (B, L, H, N, N) the same before the head mean
            (only with ``keep_heads=True``).
        token_relevance: (B, L, N) relevance of each token in the residual
            stream leaving block b, summed over channels (methods with a
            relevance pass; zeros below the block where the pass stopped).
            Its sum over tokens is the relevance total at that depth.
        grid: (h, w) patch grid of a ViT, ``None`` for text.
        image_size: (H, W) of the input images, ``None`` for text.
        start_layer: first block that enters the layer product, where used.
        attention_mask: (B, T) text mask (1 = real token), ``None`` for images.
        image_tokens: (B, k·h·w) a vision-language model's k images per row: for each patch in raster order, image
            after image, the position of the token carrying it in ``scores`` (``patch_map`` and ``upsample`` read
            the image tokens' scores there, one image per row), else ``None``.
        conservation: relevance totals block by block (AttnLRP, CP-LRP), see :class:`Conservation`.
        convergence_delta: (B,) Captum's convergence delta where it gives one (``integrated_gradients``):
            Σ attributions − (f(x) − f(baseline)), 0 for an exact integral; else ``None``.
        positional: (B, T) the relevance of each scored token's position encoding (``pa_lrp``: the learned /
            absolute embedding added at its position, or its rotary tables summed over blocks), else ``None``.
        sources: (B, S) the score of each source given with ``sources=`` (token spans of the context): the sum
            of the token scores over its span, or the ablation methods' own (``leave_one_out``,
            ``context_cite``), else ``None``.
        registers: (B, R) the relevance of a ViT's register tokens (DINOv2 with registers, timm ``reg_tokens``)
            from the relevance methods (``lrp``, ``attnlrp``, ``cp_lrp``, ``pa_lrp``): not part of the patch map, but
            counted in ``conservation`` (``Σ pixels + Σ registers = y_t`` where CP-LRP conserves), else ``None``.
        source_length: S, an encoder-decoder's source tokens: ``scores`` (B, S + P) holds the source's scores,
            then the decoder prefix's (:attr:`source`, :attr:`prefix`); ``None`` for every other model.
        options: the method options used.
    """

    _: KW_ONLY
    method: str
    grid: Optional[tuple[int, int]] = None
    image_size: Optional[tuple[int, int]] = None
    start_layer: Optional[int] = None
    attention_mask: Optional[torch.Tensor] = None
    image_tokens: Optional[torch.Tensor] = None
    source_length: Optional[int] = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.scores.shape[0]

    @property
    def source(self) -> torch.Tensor:
        """(B, S) an encoder-decoder's scores over its source tokens (padding 0; docs/METHODS.md §2i)."""
        return self.scores[:, : self._source_length("source")]

    @property
    def prefix(self) -> torch.Tensor:
        """(B, P) an encoder-decoder's scores over its decoder prefix (padding and positions after the one
        explained score 0); ``source.sum(-1) + prefix.sum(-1) = scores.sum(-1)``."""
        return self.scores[:, self._source_length("prefix") :]

    @property
    def frames(self) -> torch.Tensor:
        """(B, T_audio) a speech encoder-decoder's (Whisper) relevance over its log-mel frames in time, summed
        over the mel bins: its input-space map, held in ``pixels`` (the methods that reach the input: ``attnlrp``,
        ``cp_lrp``); ``Σ frames = Σ source`` where the audio stem conserves."""
        if self.pixels is None or self.pixels.dim() != 2 or self.source_length is None:
            raise InputError("exp.frames is a speech model's (Whisper, with attnlrp / cp_lrp): none here")
        return self.pixels

    def _source_length(self, name: str) -> int:
        if self.source_length is None:
            raise InputError(
                f"exp.{name} is an encoder-decoder's (source and decoder prefix); this model has one input"
            )
        return self.source_length

    def patch_map(self) -> torch.Tensor:
        """Patch scores on the patch grid: (B, h, w).

        A vision-language model: each patch gets the score of the image token that carries it, split equally
        over the patches one token carries (a connector that merges patches, docs/METHODS.md §2g).
        """
        if self.grid is None:
            raise InputError("patch_map() needs an image explanation; this one is for text")
        h, w = self.grid
        scores = self.scores
        if self.image_tokens is not None:
            if self.image_tokens.shape[1] != h * w:
                raise InputError(
                    f"patch_map() and upsample() show one image per row; these rows hold "
                    f"{self.image_tokens.shape[1] // (h * w)} images each: read their image tokens' "
                    "scores at the positions exp.image_tokens names, image after image"
                )
            idx = self.image_tokens.to(scores.device)
            share = torch.zeros_like(scores).scatter_add_(1, idx, torch.ones_like(idx, dtype=scores.dtype))
            scores = scores.gather(1, idx) / share.gather(1, idx)
        return scores.reshape(scores.shape[0], h, w)

    def upsample(self, size: Optional[tuple[int, int]] = None, mode: str = "bilinear") -> torch.Tensor:
        """Patch scores upsampled to the image size (or ``size``): (B, H, W)."""
        grid = self.patch_map().unsqueeze(1)
        hw = size or self.image_size
        if hw is None:
            raise InputError("upsample() needs a size: this explanation records no image size")
        kwargs = {"align_corners": False} if mode in ("bilinear", "bicubic") else {}
        return F.interpolate(grid, size=tuple(hw), mode=mode, **kwargs).squeeze(1)

    def pixel_map(self) -> torch.Tensor:
        """(B, H, W): the pixel relevance where the method computed it (``pixels``), else the upsampled patch map."""
        return self.pixels if self.pixels is not None else self.upsample()

    def by_source(self, spans: Any) -> torch.Tensor:
        """(B, S) the sum of the token scores over each source (docs/METHODS.md §2s).

        Parameters
        ----------
        spans : token spans (start, end) as ``explain(..., sources=)`` takes them: one list for every row or one
            per row, counted from each row's first real token (:mod:`lrp_core.sources`).

        Returns
        -------
        Tensor (B, S)
        """
        from .sources import as_spans, by_source, in_columns

        if (self.grid is not None and self.image_tokens is None) or self.attention_mask is None:
            raise InputError("by_source() needs a text explanation: sources are token spans")
        return by_source(self.scores, in_columns(as_spans(spans), self.attention_mask))

    def __getitem__(self, i: int) -> "Explanation":
        """The explanation of sample ``i`` as a batch of one."""
        per_sample = {f.name: _sample(getattr(self, f.name), i) for f in RESULT_FIELDS}
        return Explanation(
            method=self.method,
            grid=self.grid,
            image_size=self.image_size,
            start_layer=self.start_layer,
            attention_mask=_sample(self.attention_mask, i),
            image_tokens=_sample(self.image_tokens, i),
            source_length=self.source_length,
            options=dict(self.options),
            **per_sample,
        )

    def __len__(self) -> int:
        return self.batch_size
