"""What the Captum baselines hand Captum (docs/METHODS.md §2d): the forward function at the pixels or the word
embeddings (:func:`forward_function`), the reference inputs (:func:`reference`), the features of occlusion and
KernelSHAP (:func:`feature_mask`) and a sample cut to its features (:class:`Row`).

:func:`forward_function` is public so that a test (or a reader) can call Captum directly on the very function
the methods use.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..adapters.base import Adapter
from ..adapters.batches import Batch, ImageBatch, Seq2SeqBatch, TextBatch
from ..errors import InputError, UnsupportedModelError
from ..runtime.guard import engine_hook
from .baselines_vlm import contrast as _contrast
from .baselines_vlm import output_replaced as _output_replaced
from .call import Call

#: What ``baseline`` may name: images "zeros" | "blur", text "zeros" | "pad" | "mask" (or a token id).
IMAGE_BASELINES = ("zeros", "blur")
TEXT_BASELINES = ("zeros", "pad", "mask")
#: σ of the Gaussian blur of the "blur" baseline, in patches (one patch: the detail inside a patch is gone).
BLUR_SIGMA_PATCHES = 1.0


@dataclass
class Attributed:
    """What Captum attributes: ``forward(inputs, *args)`` → logits (B, C).

    Attributes:
        forward: the adapter's replay from ``inputs`` to the (contrasted) logits.
        inputs: (B, 3, H, W) pixels or (B, T, E) word embeddings, detached.
        args: the per-sample additional forward arguments (text: the batch's per-sample fields; the contrast class).
        mask: (B, T) 1 = a feature (text: a real token; decoders: a context token), else ``None``.
        module: the word-embedding module (text), else ``None``.
        cut_anywhere: a row may be cut to its features wherever they lie (decoders: position ids follow the
            mask, so a row cut to its context is the row alone); else only a leading run is cut (encoders'
            position ids count from the first token).
        token_reference: token id -> (B, T, E) that token's embedding at every position, where ``module`` alone
            does not give it (an encoder-decoder embeds its source and its prefix by two modules), else ``None``.
        row_cut: sample i -> (the columns (n,) of its features, the additional forward arguments of the sample
            cut to them): the row alone, where its fields are not cut along T (an encoder-decoder's source and
            prefix); else ``None`` (:class:`Row` cuts the fields itself).
    """

    forward: Callable[..., Tensor]
    inputs: Tensor
    args: tuple
    mask: Optional[Tensor] = None
    module: Optional[nn.Module] = None
    cut_anywhere: bool = False
    token_reference: Optional[Callable[[int], Tensor]] = None
    row_cut: Optional[Callable[[int], tuple[Tensor, tuple]]] = None

    @property
    def image(self) -> bool:
        return self.mask is None and self.inputs.dim() == 4

    def row(self, i: int) -> tuple:
        """The additional forward arguments of one sample, as a batch of one.

        Parameters
        ----------
        i : int
            The sample's index.

        Returns
        -------
        tuple
            ``args`` with each tensor cut to row ``i`` (``[i:i + 1]``); other arguments as they are.
        """
        return tuple(a[i : i + 1] if isinstance(a, Tensor) else a for a in self.args)


def word_embedding_module(adapter: Adapter, prepared: Batch) -> nn.Module:
    """The ``nn.Embedding`` whose output the adapter reads as the word embeddings (``EmbeddingRecord.embeds``).

    It is found by identity during one embedding pass, with temporary hooks on the model's ``nn.Embedding``
    modules, so no family needs to name it.

    Parameters
    ----------
    adapter : Adapter
        The text model's adapter.
    prepared : Batch
        A batch of the adapter's.

    Returns
    -------
    nn.Module
        The embedding module.

    Raises
    ------
    UnsupportedModelError
        If no ``nn.Embedding`` module outputs the word embeddings.
    """
    outputs: list = []
    with ExitStack() as hooks, torch.no_grad():
        for m in adapter.model.modules():
            if isinstance(m, nn.Embedding):
                hooks.enter_context(engine_hook(m, lambda mod, a, out: outputs.append((mod, out))))
        embeds = adapter.embed(prepared).embeds
    for mod, out in outputs:
        if out is embeds:
            return mod
    raise UnsupportedModelError(
        f"{type(adapter.model).__name__}: its word embeddings are not the output of one "
        "nn.Embedding module, so the Captum baselines cannot attribute at them"
    )


def forward_function(adapter: Adapter, prepared: Batch, negative: Optional[Tensor] = None) -> Attributed:
    """The forward function the baselines give Captum, with its inputs and additional arguments.

    Images: ``f(pixels, negative)``. Text: ``f(embeddings, *the batch's per-sample fields, negative)``, where for
    one replay ``embeddings`` stands in for the word-embedding module's output (for decoders the fields include
    ``read_at``, so the logits are read at each row's read position). Calling Captum as
    ``Method(a.forward).attribute(a.inputs, target=..., additional_forward_args=a.args)`` computes the methods.

    Parameters
    ----------
    adapter : Adapter
        The model's adapter.
    prepared : Batch
        The batch (B rows).
    negative : Optional[Tensor], optional
        (B,) a contrast class per row: the forward then returns ``y_c - y_negative`` for every class c.

    Returns
    -------
    Attributed
        ``forward(inputs, *args)`` -> (B, C) logits; ``inputs`` (B, 3, H, W) pixels or (B, T, E) word
        embeddings, detached.

    Raises
    ------
    UnsupportedModelError
        If the word embeddings are not the output of one ``nn.Embedding`` module (text).
    """
    if isinstance(prepared, ImageBatch):
        batch = prepared

        def forward_images(images: Tensor, neg: Optional[Tensor] = None) -> Tensor:
            trace = adapter.forward(batch.replace(images=images), grad=torch.is_grad_enabled())
            return _contrast(trace.logits, neg)

        return Attributed(forward_images, prepared.images.detach(), (negative,))

    if isinstance(prepared, Seq2SeqBatch):
        return _seq2seq_function(adapter, prepared, negative)
    assert isinstance(prepared, TextBatch), "a batch holds images or tokens"
    # per-sample fields travel with the samples (Captum repeats / slices them); shared ones (CLIP's images of the
    # text side) are the batch's fact and stay whole
    given = {k: v for k, v in prepared.per_sample().items() if v is not None}
    keys = tuple(given)
    module = word_embedding_module(adapter, prepared)

    def forward(embeds: Tensor, *values: Any) -> Tensor:
        *entries, neg = values
        with _output_replaced(module, embeds):
            trace = adapter.forward(prepared.replace(**dict(zip(keys, entries))), grad=torch.is_grad_enabled())
        return _contrast(trace.logits, neg)

    with torch.no_grad():
        embeds = adapter.embed(prepared).embeds
    assert embeds is not None, "word_embedding_module found the output of this embedding pass"
    embeds = embeds.detach()
    decoder = adapter.is_decoder
    # a decoder's features are the context of the prediction read (the layout's mask), an encoder's its real tokens
    features = adapter.layout(prepared).mask if decoder else prepared.attention_mask
    return Attributed(forward, embeds, tuple(given.values()) + (negative,), features, module, cut_anywhere=decoder)


def _seq2seq_function(adapter: Adapter, prepared: Seq2SeqBatch, negative: Optional[Tensor]) -> Attributed:
    """An encoder-decoder's forward function: ``f(embeddings (B, S + P, E), *the batch's per-sample fields,
    negative)``, the embeddings given to the replay in the batch (``inputs_embeds``: source, then prefix); the
    features are the real source tokens and the prefix up to the read position."""
    given = {k: v for k, v in prepared.per_sample().items() if v is not None and k != "inputs_embeds"}
    keys = tuple(given)

    def forward(embeds: Tensor, *values: Any) -> Tensor:
        *entries, neg = values
        batch = prepared.replace(inputs_embeds=embeds, **dict(zip(keys, entries)))
        return _contrast(adapter.forward(batch, grad=torch.is_grad_enabled()).logits, neg)

    with torch.no_grad():
        embeds = adapter.embed(prepared).embeds
    assert embeds is not None, "an encoder-decoder's embedding records its word embeddings"
    features = adapter.layout(prepared).mask
    assert features is not None, "an encoder-decoder's layout has its mask"

    def reference(token: int) -> Tensor:
        return adapter.token_embeddings(prepared, token)

    def row_cut(i: int) -> tuple[Tensor, tuple]:
        alone = adapter.context_row(prepared, i)  # the row without padding, its prefix up to p
        neg = None if negative is None else negative[i : i + 1]
        return torch.nonzero(features[i]).flatten(), tuple(getattr(alone, k) for k in keys) + (neg,)

    args = tuple(given.values()) + (negative,)
    return Attributed(forward, embeds.detach(), args, features, None, False, reference, row_cut)


# ----------------------------------------------------------------------------
# reference inputs
# ----------------------------------------------------------------------------
def gaussian_blur(images: Tensor, sigma: float) -> Tensor:
    """Blur images channel by channel with a Gaussian kernel, reflecting at the borders.

    Parameters
    ----------
    images : Tensor
        (B, C, H, W) images.
    sigma : float
        The Gaussian's standard deviation, in pixels.

    Returns
    -------
    Tensor
        (B, C, H, W) the blurred images.
    """
    radius = max(1, min(int(3 * sigma + 0.5), min(images.shape[-2:]) - 1))
    x = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    k = k / k.sum()
    C = images.shape[1]
    out = F.pad(images, (radius, radius, radius, radius), mode="reflect")
    out = F.conv2d(out, k.view(1, 1, 1, -1).expand(C, 1, 1, -1), groups=C)  # along the width
    return F.conv2d(out, k.view(1, 1, -1, 1).expand(C, 1, -1, 1), groups=C)  # along the height


def _special_token(adapter: Adapter, name: str) -> int:
    """``config.<name>_token_id`` of the model (or of its text tower), else an error saying what to pass."""
    config = getattr(adapter.model, "config", None)
    for cfg in (config, getattr(config, "text_config", None)):
        tok = getattr(cfg, f"{name}_token_id", None)
        if isinstance(tok, int):
            return tok
    raise InputError(
        f"baseline={name!r}: {type(adapter.model).__name__}'s config names no {name} token; pass its id "
        f"instead, e.g. baseline=tokenizer.{name}_token_id"
    )


def grid(c: Call) -> tuple[int, int]:
    """(h, w): the patch grid of an image call's layout."""
    assert c.layout.grid is not None, "an image layout carries its patch grid"
    return c.layout.grid


def mask_of(a: Attributed) -> Tensor:
    """(B, T): the feature mask of text inputs."""
    assert a.mask is not None, "text inputs carry their feature mask"
    return a.mask


def reference(c: Call, a: Attributed) -> Tensor:
    """The baseline input of IG, occlusion and KernelSHAP.

    Images: ``"zeros"`` (0 in the normalised input, i.e. the mean colour) or ``"blur"`` (the image blurred with
    σ = one patch). Text: ``"zeros"`` (zero vectors), or ``"pad"`` / ``"mask"`` / a token id (that token's
    embedding) at the features (the real tokens; for decoders the context tokens). Padding positions, and a
    decoder's tokens after the read position, keep their own embeddings.

    Parameters
    ----------
    c : Call
        The method call; its ``baseline`` option picks the reference.
    a : Attributed
        The forward function and its inputs (:func:`forward_function`).

    Returns
    -------
    Tensor
        Shaped like ``a.inputs``: (B, 3, H, W) or (B, T, E).

    Raises
    ------
    InputError
        If the baseline is not one for the input kind, names a token the model's config lacks, or is a
        token id outside the vocabulary.
    """
    choice: Union[str, int] = c.method.baseline
    if a.image:
        if choice not in IMAGE_BASELINES:
            raise InputError(f"baseline={choice!r} is not one for images: use one of {IMAGE_BASELINES}")
        if choice == "zeros":
            return torch.zeros_like(a.inputs)
        sigma = BLUR_SIGMA_PATCHES * a.inputs.shape[-1] / grid(c)[1]
        return gaussian_blur(a.inputs.detach(), sigma)
    if choice == "blur":
        raise InputError(f"baseline='blur' is for images; for text use one of {TEXT_BASELINES} or a token id")
    if choice == "zeros":
        ref = torch.zeros_like(a.inputs)
    else:
        tok = choice if isinstance(choice, int) else _special_token(c.adapter, choice)
        if a.token_reference is not None:
            return _at_features(a, a.token_reference(tok).to(a.inputs.dtype))
        embedding = a.module
        assert isinstance(embedding, nn.Embedding), "text inputs carry their word-embedding module"
        if not 0 <= tok < embedding.num_embeddings:
            raise InputError(f"baseline token id {tok} is outside the vocabulary (0 … {embedding.num_embeddings - 1})")
        ids = torch.full(a.inputs.shape[:2], tok, dtype=torch.long, device=a.inputs.device)
        with torch.no_grad():
            ref = embedding(ids).to(a.inputs.dtype)
    return _at_features(a, ref)


def _at_features(a: Attributed, ref: Tensor) -> Tensor:
    """``ref`` at the features, the inputs' own values elsewhere (padding stays as it is: no method moves it)."""
    real = mask_of(a).bool()[..., None].to(a.inputs.device)
    return torch.where(real, ref, a.inputs.detach())


def feature_mask(c: Call, a: Attributed) -> Tensor:
    """The features of occlusion and KernelSHAP: one per patch, or one per feature token.

    A padding position (or a decoder's token after the read position) shares a feature token's id: its
    baseline is its own value, so removing that feature leaves it unchanged at no extra forward pass. Ids
    count 0, 1, ... along each row's feature tokens.

    Parameters
    ----------
    c : Call
        The method call (its layout gives an image's patch grid).
    a : Attributed
        The forward function and its inputs (:func:`forward_function`).

    Returns
    -------
    Tensor
        (1, 1, H, W) patch ids for images, (B, T, 1) token ids for text.
    """
    if a.image:
        h, w = grid(c)
        H, W = a.inputs.shape[-2:]
        ids = torch.arange(h * w, device=a.inputs.device).reshape(h, w)
        return ids.repeat_interleave(H // h, 0).repeat_interleave(W // w, 1)[None, None]
    mask = mask_of(a).to(a.inputs.device).long()
    return (mask.cumsum(dim=1) - 1).clamp(min=0)[..., None]


@dataclass
class Row:
    """Sample ``i`` of an :class:`Attributed`, cut to the span of its features where that is the row alone.

    Text: right-padded encoder rows lose their padding (positions unchanged); decoder rows (``cut_anywhere``)
    are cut to their context — the first to the last feature, padding on either side and the tokens after the
    read position dropped (position ids follow the mask, so the cut row is the row alone). Images and other
    text stay as they are (``span = None``).

    Attributes:
        x: (1, n, D) the cut input (or (1, ...) as is).
        args: its additional forward arguments, cut alike.
        span: ``(start, end)`` of the cut in the row, or ``None``.
        length: T, the row's length before the cut.
        columns: (n,) the columns kept where they are not one span (an encoder-decoder's source and prefix).
    """

    x: Tensor
    args: tuple
    span: Optional[tuple[int, int]]
    length: int
    columns: Optional[Tensor] = None

    @staticmethod
    def of(a: Attributed, i: int) -> "Row":
        x, args = a.inputs[i : i + 1], a.row(i)
        if a.row_cut is not None:
            cols, cut_args = a.row_cut(i)
            return Row(x[:, cols.to(x.device)], cut_args, None, x.shape[1], cols)
        if a.image or a.mask is None:
            return Row(x, args, None, 0)
        m = a.mask[i].bool()
        T = m.shape[0]
        where = torch.nonzero(m).flatten().tolist()
        if not where:  # no feature at all: nothing to cut to
            return Row(x, args, None, T)
        start, end = (where[0], where[-1] + 1) if a.cut_anywhere else (0, len(where))
        if (start, end) == (0, T) or not bool(m[start:end].all()):
            return Row(x, args, None, T)  # nothing to cut, or features that are not one run
        row = Row(x, args, (start, end), T)
        return Row(row.cut(x), tuple(row.cut(v) for v in args), (start, end), T)

    def cut(self, v: Any) -> Any:
        """``v`` (1, T, ...) cut to the span; another value (shared entries, ``None``) as it is."""
        if self.columns is not None and isinstance(v, Tensor) and v.dim() >= 2 and v.shape[1] == self.length:
            return v[:, self.columns.to(v.device)]
        if self.span is None or not isinstance(v, Tensor) or v.dim() < 2 or v.shape[1] != self.length:
            return v
        return v[:, self.span[0] : self.span[1]]

    def back(self, attr: Tensor) -> Tensor:
        """Attributions of the cut row (1, n, D) padded back with zeros to the row's length (1, T, D)."""
        if self.columns is not None:
            out = attr.new_zeros((attr.shape[0], self.length) + tuple(attr.shape[2:]))
            return out.index_copy(1, self.columns.to(attr.device), attr)
        if self.span is None:
            return attr
        return F.pad(attr, (0, 0, self.span[0], self.length - self.span[1]))


__all__ = [
    "Attributed",
    "Row",
    "forward_function",
    "word_embedding_module",
    "gaussian_blur",
    "reference",
    "feature_mask",
    "IMAGE_BASELINES",
    "TEXT_BASELINES",
]
