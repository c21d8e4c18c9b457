"""The result object of :func:`lrp_core.explain`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

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
    """

    output: torch.Tensor
    blocks: torch.Tensor
    input: torch.Tensor
    pixels: Optional[torch.Tensor] = None

    def stages(self) -> torch.Tensor:
        """(B, L + 2) totals in the order the relevance flows: output, block L-1 … block 0, input."""
        return torch.cat([self.output[:, None], self.blocks.flip(1), self.input[:, None]], dim=1)

    def absorbed(self) -> torch.Tensor:
        """(B, L + 1) relevance lost at each step (a stage's total minus the next one's): 0 where conserved.

        Step 0 is the readout (head, final norm: output → leaving block L−1), step k (1 … L−1) is
        block L−k, and step L is block 0 together with the embedding layer below it.
        """
        s = self.stages()
        return s[:, :-1] - s[:, 1:]

    def __getitem__(self, i: int) -> "Conservation":
        sl = slice(i, i + 1)
        return Conservation(self.output[sl], self.blocks[sl], self.input[sl],
                            None if self.pixels is None else self.pixels[sl])


@dataclass
class Explanation:
    """Token relevance for a batch, with what was needed to compute it.

    Attributes:
        scores: (B, T) token relevance. ViT: patch tokens in raster order, no
            [CLS]. BERT: every token, specials included, padding positions 0.
        target: (B,) the class (or -1 for a concept target) that was explained.
        logits: (B, C) the model's logits on ``inputs``.
        method: name of the method in :data:`lrp_core.METHODS`.
        pixels: (B, H, W) pixel relevance (``lrp`` only), else ``None``.
        layers: (B, L, N, N) the per-block matrices Ā_b the method aggregates,
            before ``I +`` is added (zeros for blocks below ``start_layer``),
            where the method has them. Aggregate a range of blocks with
            :func:`lrp_core.rollout.accumulate`.
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
        conservation: relevance totals block by block (AttnLRP, CP-LRP), see :class:`Conservation`.
        options: the method options used.
    """

    scores: torch.Tensor
    target: torch.Tensor
    logits: torch.Tensor
    method: str
    pixels: Optional[torch.Tensor] = None
    layers: Optional[torch.Tensor] = None
    layers_per_head: Optional[torch.Tensor] = None
    token_relevance: Optional[torch.Tensor] = None
    grid: Optional[tuple[int, int]] = None
    image_size: Optional[tuple[int, int]] = None
    start_layer: Optional[int] = None
    attention_mask: Optional[torch.Tensor] = None
    conservation: Optional[Conservation] = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.scores.shape[0]

    def patch_map(self) -> torch.Tensor:
        """Patch scores on the patch grid: (B, h, w)."""
        if self.grid is None:
            raise InputError("patch_map() needs an image explanation; this one is for text")
        h, w = self.grid
        return self.scores.reshape(self.scores.shape[0], h, w)

    def upsample(self, size: Optional[tuple[int, int]] = None, mode: str = "bilinear") -> torch.Tensor:
        """Patch scores upsampled to the image size (or ``size``): (B, H, W)."""
        size = tuple(size or self.image_size)  # type: ignore[arg-type]
        grid = self.patch_map().unsqueeze(1)
        kwargs = {"align_corners": False} if mode in ("bilinear", "bicubic") else {}
        return F.interpolate(grid, size=size, mode=mode, **kwargs).squeeze(1)

    def pixel_map(self) -> torch.Tensor:
        """(B, H, W): pixel relevance for ``lrp``, else the upsampled patch map."""
        return self.pixels if self.pixels is not None else self.upsample()

    def __getitem__(self, i: int) -> "Explanation":
        """The explanation of sample ``i`` as a batch of one."""
        sl = slice(i, i + 1)
        pick = lambda t: None if t is None else t[sl]  # noqa: E731
        return Explanation(
            scores=self.scores[sl], target=self.target[sl], logits=self.logits[sl],
            method=self.method, pixels=pick(self.pixels), layers=pick(self.layers),
            layers_per_head=pick(self.layers_per_head), token_relevance=pick(self.token_relevance),
            grid=self.grid, image_size=self.image_size, start_layer=self.start_layer,
            attention_mask=pick(self.attention_mask),
            conservation=None if self.conservation is None else self.conservation[i], options=dict(self.options),
        )

    def __len__(self) -> int:
        return self.batch_size
