"""The typed batches an adapter's ``check_inputs`` returns and every method reads.

A batch holds the validated inputs of one call, on the model's device, as named fields; the methods read
fields, never keys. Shapes: B samples, T tokens, k images per row, P prompts, E embedding width.

- :class:`ImageBatch`: classifiers and vision towers (``images``).
- :class:`PromptedImageBatch`: CLIP / SigLIP image side, the images and the prompts they are compared with.
- :class:`TextBatch`: encoders (BERT family, ModernBERT); :class:`ChoiceBatch`: a multiple-choice head's.
- :class:`PromptBatch`: CLIP's text side, the prompts and the images they are compared with.
- :class:`DecoderBatch`: decoder language models, with the position each row is read at.
- :class:`VLMBatch`: vision-language models, a decoder batch with each row's images.
- :class:`Seq2SeqBatch`: encoder-decoders, the source (tokens or log-mel features) and the decoder prefix.

Three kinds of field: per-token (B, T, ...), cut along T by :meth:`Batch.take`; per-sample without a
token axis (:attr:`Batch.untrimmed`: a row's images), taken by rows only; shared by every sample
(:attr:`Batch.shared`: the other tower's embeddings), kept whole.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Optional, TypeVar

import torch
from torch import Tensor

B = TypeVar("B", bound="Batch")


@dataclass(frozen=True, eq=False, kw_only=True)
class Batch:
    """What every batch has: its fields, its size, its rows."""

    #: fields shared by all samples (kept whole by :meth:`take`)
    shared: ClassVar[tuple[str, ...]] = ()
    #: per-sample fields without a token axis (taken by rows, never cut to ``n`` tokens)
    untrimmed: ClassVar[tuple[str, ...]] = ()

    def entries(self) -> dict[str, Optional[Tensor]]:
        """Every field by name, in declaration order (``None`` where the batch has none)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def per_sample(self) -> dict[str, Optional[Tensor]]:
        """The fields with one entry per sample (all but :attr:`shared`)."""
        return {k: v for k, v in self.entries().items() if k not in self.shared}

    @property
    def size(self) -> int:
        """B, the number of samples (the first axis of the per-sample fields)."""
        return next(v.shape[0] for v in self.per_sample().values() if v is not None)

    def replace(self: B, **changes: Optional[Tensor]) -> B:
        """A copy with the named fields replaced."""
        return dataclasses.replace(self, **changes)

    def take(self: B, rows: Tensor, n: Optional[int] = None) -> B:
        """The samples ``rows`` (K,), per-token fields cut to their first ``n`` tokens (``None``: as is)."""

        def one(name: str, v: Tensor) -> Tensor:
            v = v[rows.to(v.device)]
            return v if n is None or name in self.untrimmed else v[:, :n]

        taken = {k: None if v is None else one(k, v) for k, v in self.per_sample().items()}
        return self.replace(**taken)


@dataclass(frozen=True, eq=False, kw_only=True)
class ImageBatch(Batch):
    """Images for a vision model.

    Attributes:
        images: (B, 3, H, W) float, normalised, in the model's dtype.
        patch_mask: (B, h, w) bool, the real patches of padded images (Idefics3's tower); ``None``: all.
    """

    images: Tensor
    patch_mask: Optional[Tensor] = None


@dataclass(frozen=True, eq=False, kw_only=True)
class PromptedImageBatch(ImageBatch):
    """Images and the text prompts they are compared with (CLIP, SigLIP image side); a target is a prompt.

    Attributes:
        prompt_ids, prompt_mask: (P, T) the prompts' tokens, for the model's own forward.
        prompt_embeddings: (P, E) the prompts' normalised embeddings, scaled as the model's similarity is.
        probe_attention: (B, N) SigLIP's pooling-probe attention of a plain replay, head mean; ``None``: CLIP.
    """

    shared: ClassVar[tuple[str, ...]] = ("prompt_ids", "prompt_mask", "prompt_embeddings")

    prompt_ids: Tensor
    prompt_mask: Tensor
    prompt_embeddings: Tensor
    probe_attention: Optional[Tensor] = None


@dataclass(frozen=True, eq=False, kw_only=True)
class TextBatch(Batch):
    """Tokens for a text encoder.

    Attributes:
        input_ids: (B, T) long.
        attention_mask: (B, T), 1 = real token, 0 = padding.
        token_type_ids: (B, T) segment ids, ``None``: the model's default.
        position_ids: (B, T) position ids, ``None``: the model's default.
        read_at: (B, T) one-hot, the token a per-token task head is read at (token classification, question
            answering, masked LM: :mod:`lrp_core.adapters.task_heads`); ``None``: the head reads a fixed token.
    """

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Optional[Tensor] = None
    position_ids: Optional[Tensor] = None
    read_at: Optional[Tensor] = None


@dataclass(frozen=True, eq=False, kw_only=True)
class ChoiceBatch(TextBatch):
    """A multiple-choice batch: as checked, the B·C choice rows (B·C, T); as explained, each sample's chosen row.

    Attributes:
        num_choices: () long, C.
        choice_logits: (B, C) every choice's logit (set once the choice is made), else ``None``.
        choice: (B,) long, the explained choice k of each sample, else ``None``.
    """

    shared: ClassVar[tuple[str, ...]] = ("num_choices",)
    untrimmed: ClassVar[tuple[str, ...]] = ("choice_logits", "choice")

    num_choices: Tensor
    choice_logits: Optional[Tensor] = None
    choice: Optional[Tensor] = None


@dataclass(frozen=True, eq=False, kw_only=True)
class PromptBatch(TextBatch):
    """Prompts and the images they are compared with (CLIP's text side); a target is an image.

    Attributes:
        image_embeddings: (B_img, E) the images' normalised embeddings, scaled as the model's similarity is.
    """

    shared: ClassVar[tuple[str, ...]] = ("image_embeddings",)

    image_embeddings: Tensor


@dataclass(frozen=True, eq=False, kw_only=True)
class DecoderBatch(TextBatch):
    """Tokens for a decoder language model, each row read at one position.

    Attributes:
        read_at: (B, T) one-hot, the token whose prediction is explained (default the last real one).
        position_ids: (B, T) the positions the model gives the tokens (from the mask, or as given).
    """

    position_ids: Tensor
    read_at: Tensor

    @property
    def read(self) -> Tensor:
        """(B,) long, the position each row is read at."""
        return self.read_at.argmax(dim=-1)


@dataclass(frozen=True, eq=False, kw_only=True)
class VLMBatch(DecoderBatch):
    """A decoder batch with each row's images.

    Attributes:
        pixel_values: (B, k, 3, H, W) the images, k per row; Qwen-VL: (B, k, N, F) flattened patches.
        image_grid_thw: (B, k, 3) Qwen-VL's patch grid per image; ``None`` elsewhere.
        patch_mask: (B, k, h, w) bool, Idefics3's real patches of padded images; ``None``: all.
        attention_groups: (B, T) long, PaliGemma / Gemma-3: -1 causal, g >= 0 a bidirectional group.
    """

    untrimmed: ClassVar[tuple[str, ...]] = ("pixel_values", "image_grid_thw", "patch_mask")

    pixel_values: Tensor
    image_grid_thw: Optional[Tensor] = None
    patch_mask: Optional[Tensor] = None
    attention_groups: Optional[Tensor] = None

    @classmethod
    def of(cls, text: DecoderBatch, pixel_values: Tensor, image_grid_thw: Optional[Tensor] = None) -> VLMBatch:
        """The decoder batch ``text`` with its rows' images."""
        t = text
        return cls(
            input_ids=t.input_ids,
            attention_mask=t.attention_mask,
            token_type_ids=t.token_type_ids,
            position_ids=t.position_ids,
            read_at=t.read_at,
            pixel_values=pixel_values,
            image_grid_thw=image_grid_thw,
        )

    @property
    def groups(self) -> Tensor:
        """(B, T) the attention groups (:attr:`attention_groups`; a family without them has none)."""
        assert self.attention_groups is not None, "a grouped-attention VLM's check_inputs sets the groups"
        return self.attention_groups

    @property
    def grid_thw(self) -> Tensor:
        """(B, k, 3) Qwen-VL's patch grid per image (:attr:`image_grid_thw`)."""
        assert self.image_grid_thw is not None, "Qwen-VL's check_inputs sets the grid"
        return self.image_grid_thw


@dataclass(frozen=True, eq=False, kw_only=True)
class Seq2SeqBatch(Batch):
    """An encoder-decoder's inputs: the source and the decoder prefix, each row read at one prefix position.

    The replay runs one token axis of S + P tokens: the source's S, then the prefix's P (block 0's input is
    their embeddings side by side), so the scores are (B, S + P): ``source`` then ``prefix``.

    Attributes:
        input_ids: (B, S) the source tokens; ``None`` for a speech model (``input_features``).
        attention_mask: (B, S), 1 = real source token (a speech model: all ones over its S encoder positions).
        decoder_input_ids: (B, P) the decoder prefix (teacher forcing).
        decoder_attention_mask: (B, P), 1 = real prefix token.
        read_at: (B, P) one-hot, the prefix position whose next-token prediction is explained.
        input_features: (B, n_mels, T_audio) Whisper's log-mel frames, else ``None``.
        inputs_embeds: (B, S + P, D) word embeddings that replace the lookup of the tokens (what the Captum
            baselines attribute at), else ``None``.
    """

    untrimmed: ClassVar[tuple[str, ...]] = ("input_features",)

    input_ids: Optional[Tensor]
    attention_mask: Tensor
    decoder_input_ids: Tensor
    decoder_attention_mask: Tensor
    read_at: Tensor
    input_features: Optional[Tensor] = None
    inputs_embeds: Optional[Tensor] = None

    @property
    def read(self) -> Tensor:
        """(B,) long, the prefix position each row is read at."""
        return self.read_at.argmax(dim=-1)

    @property
    def source_length(self) -> int:
        """S, the encoder's positions."""
        return int(self.attention_mask.shape[1])

    @property
    def mask(self) -> Tensor:
        """(B, S + P) 1 = a real token of the source or of the prefix."""
        return torch.cat([self.attention_mask, self.decoder_attention_mask.to(self.attention_mask.dtype)], dim=1)


__all__ = [
    "Batch",
    "ChoiceBatch",
    "DecoderBatch",
    "Seq2SeqBatch",
    "ImageBatch",
    "PromptBatch",
    "PromptedImageBatch",
    "TextBatch",
    "VLMBatch",
]
