"""Bidirectional attention groups in a VLM's language model (docs/METHODS.md §2g.3): Gemma 3's images, PaliGemma's
prefix.

Some vision-language models let chosen tokens attend each other in both directions while the rest of the sequence
stays causal: Gemma 3 the tokens of one image (each run of ``token_type_ids == 1``), PaliGemma the image and the
prompt (every token with ``token_type_ids == 0``). The model builds this from ``token_type_ids`` (passed by its
processor; without them the model is causal). Here each row's tokens get a **group**: ``-1`` for a causal token, a
number ``g ≥ 0`` shared by the tokens that see each other whatever their order. Query i may attend key j when

* j is a real token (``attention_mask``), and
* ``j ≤ i`` or i and j are in the same group ``g ≥ 0``, and
* (sliding-window layers) ``pos_i − pos_j < window``: for every allowed pair (Gemma 3: the window bounds the
  group too), or for the causal pairs only (PaliGemma 2: a group ignores the window),

exactly what transformers' ``create_causal_mask`` / ``create_sliding_window_causal_mask`` build with
``block_sequence_ids`` (``blockwise_overlay``) for these models. The groups are a constant of the attention, like
the padding mask: they decide which scores are set to the dtype's minimum, and carry no relevance.

The groups travel with the batch's readout (:class:`GroupedPositionReadout`): it is the per-batch object every
replay is given, and it follows the batch when a method takes rows or removes a token (token ablation: the removed
token's column goes, the other tokens keep their groups).

Shapes: B rows, T tokens.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from ..errors import InputError
from .batches import VLMBatch
from .blocks import NO_RECORD, Replay
from .positions import position_ids
from .readouts import HeadLayer, PositionReadout
from .records import Trace
from .vlm import VLMAdapter


def grouped_bias(
    mask: Tensor,
    positions: Tensor,
    groups: Tensor,
    window: Optional[int],
    window_bounds_groups: bool,
    dtype: torch.dtype,
) -> Tensor:
    """The additive attention mask with bidirectional groups: 0 where query i may attend key j, the dtype's minimum
    elsewhere (the module docstring's rule). A padding query row attends itself only, as
    :func:`~lrp_core.adapters.positions.causal_bias` has it (its output reaches no real token).

    Parameters
    ----------
    mask : Tensor
        (B, T) the attention mask, 1 for a real token.
    positions : Tensor
        (B, T) the position ids, read by the sliding window.
    groups : Tensor
        (B, T) long: -1 for a causal token, g ≥ 0 for the tokens of one bidirectional group.
    window : int or None
        The layer's sliding window in positions, or ``None``.
    window_bounds_groups : bool
        Whether the window also bounds the pairs of a group (Gemma 3) or only the causal pairs (PaliGemma 2).
    dtype : torch.dtype
        The scores' dtype.

    Returns
    -------
    Tensor
        (B, 1, T, T) in ``dtype``.
    """
    T = mask.shape[1]
    idx = torch.arange(T, device=mask.device)
    causal = (idx[None, :] <= idx[:, None])[None]
    groups = groups.to(mask.device)
    together = (groups[:, :, None] == groups[:, None, :]) & (groups[:, :, None] >= 0)
    if window is None:
        allowed = causal | together
    else:
        near = (positions[:, :, None] - positions[:, None, :]) < window
        allowed = (causal | together) & near if window_bounds_groups else (causal & near) | together
    allowed = allowed & mask[:, None, :].bool()
    allowed |= torch.eye(T, dtype=torch.bool, device=mask.device)[None] & ~mask[:, :, None].bool()
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


class GroupedPositionReadout(PositionReadout):
    """A decoder's readout (the head at one token per row) that also carries the rows' attention groups (B, T) the
    replay builds its masks from (:func:`grouped_bias`)."""

    def __init__(self, norm: Any, head_layers: Sequence[HeadLayer], positions: Tensor, groups: Tensor):
        super().__init__(norm, head_layers, positions)
        self.groups = groups.long()

    def after_removal(self, rows: Tensor, removed: Tensor) -> "GroupedPositionReadout":
        """The rows ``rows`` (K,) with the token ``removed`` (K,) taken out: the read position moves left where a
        token before it went, and the removed token's group entry goes (the others keep theirs)."""
        moved = super().after_removal(rows, removed)
        g = self.groups.to(rows.device)[rows]
        keep = torch.arange(g.shape[1] - 1, device=rows.device)
        idx = keep[None, :] + (keep[None, :] >= removed.to(rows.device)[:, None]).long()
        return GroupedPositionReadout(moved.norm, moved.head_layers, moved.positions, g.gather(1, idx))


class GroupedAttentionVLM(VLMAdapter):
    """A VLM whose language model attends bidirectionally inside groups named by ``token_type_ids``.

    A family sets :meth:`groups_of` (its reading of ``token_type_ids``) and :attr:`window_bounds_groups`. Without
    ``token_type_ids`` every token is causal (as the model is then).
    """

    #: the input keys read besides the text's
    image_inputs = ("pixel_values", "token_type_ids")
    #: whether a sliding window also bounds a group's pairs (see :func:`grouped_bias`)
    window_bounds_groups: bool = True
    #: what a group is, for messages
    group_name: str = "a bidirectional group"

    def groups_of(self, token_type_ids: Tensor) -> Tensor:
        """(B, T) ``token_type_ids`` -> (B, T) long groups (-1 causal, g ≥ 0 a bidirectional group)."""
        raise NotImplementedError

    def types_of(self, groups: Tensor) -> Tensor:
        """(B, T) the ``token_type_ids`` that give ``groups`` (the inverse of :meth:`groups_of`), for the model's own
        forward."""
        raise NotImplementedError

    def own_inputs(self, prepared: VLMBatch) -> dict:
        """The base's, with the ``token_type_ids`` of the batch's attention groups."""
        return {**super().own_inputs(prepared), "token_type_ids": self.types_of(prepared.groups)}

    def check_inputs(self, inputs) -> VLMBatch:
        """:meth:`VLMAdapter.check_inputs`, and ``token_type_ids`` (B, T) (optional: the processor's) read into
        the batch's ``attention_groups`` (B, T) long."""
        prepared = super().check_inputs(inputs)
        ids = prepared.input_ids
        given = inputs.get("token_type_ids")
        if given is None:
            groups = torch.full_like(ids, -1)
        else:
            types = torch.as_tensor(given).to(ids.device)
            if types.dim() == 1 and ids.shape[0] == 1:
                types = types[None]
            if types.shape != ids.shape or types.is_floating_point() or types.is_complex():
                raise InputError(
                    f"token_type_ids must be integers of the shape of input_ids {tuple(ids.shape)} (the "
                    f"processor's, one type per token); got {tuple(types.shape)} {types.dtype}"
                )
            groups = self.groups_of(types.long())
        return prepared.replace(attention_groups=groups)

    def readout_for(self, prepared: VLMBatch) -> GroupedPositionReadout:
        """The decoder's readout of the batch, with its rows' attention groups."""
        head = super().readout_for(prepared)
        groups = prepared.attention_groups
        if groups is None:
            raise InputError(
                f"{type(self.model).__name__}: the batch has no attention groups; prepare it with adapter.check_inputs"
            )
        return GroupedPositionReadout(head.norm, head.head_layers, head.positions, groups)

    def at_position(self, prepared: VLMBatch, position) -> VLMBatch:
        """The decoder's ``position=``; a position inside a group that has real tokens after it is refused: the
        prediction there reads those later tokens too, so the tokens before it are not its whole context."""
        out = super().at_position(prepared, position)
        groups, mask = prepared.groups, prepared.attention_mask
        read = out.read
        for b in range(groups.shape[0]):
            p, g = int(read[b]), int(groups[b, read[b]])
            later = (groups[b, p + 1 :] == g) & (mask[b, p + 1 :] != 0)
            if g >= 0 and bool(later.any()):
                raise InputError(
                    f"position {p} of row {b} lies in a group of tokens that attend each other in both "
                    f"directions (token_type_ids: {self.group_name}) and token "
                    f"{p + 1 + int(later.nonzero()[0, 0])} of that group comes after it, so the "
                    "prediction there reads later tokens too: name a position after the group (or its "
                    "last token)"
                )
        return out

    def run_blocks(
        self,
        x0: Tensor,
        mask: Optional[Tensor] = None,
        r: Replay = NO_RECORD,
        keep: bool = True,
        readout: Optional[Any] = None,
        positions: Optional[Tensor] = None,
        rows: Optional[Tensor] = None,
    ) -> Trace:
        """:meth:`Adapter.run_blocks` with every block's mask built from the readout's attention groups
        (:func:`grouped_bias`) where any token is in a group; the plain causal masks otherwise."""
        head = self.readout if readout is None else readout
        groups = getattr(head, "groups", None)
        if groups is None or not bool((groups >= 0).any()):
            return super().run_blocks(x0, mask, r, keep, readout, positions, rows)
        # a sibling view of this adapter whose block context is this batch's (the adapter itself never changes)
        view = copy.copy(self)
        view.block_context = functools.partial(self._grouped_context, groups=groups)  # type: ignore[method-assign]
        return super(GroupedAttentionVLM, view).run_blocks(x0, mask, r, keep, readout, positions, rows)

    def _grouped_context(
        self, x0: Tensor, mask: Tensor, positions: Optional[Tensor], fused: bool = False, *, groups: Tensor
    ) -> list:
        """Per block (bias, rope): the text decoder's rotary tables, the masks of :func:`grouped_bias`."""
        context = self.text.block_context(x0, mask, positions, False)
        if positions is None:
            positions = position_ids(mask)
        biases = {
            w: grouped_bias(mask, positions, groups, w, self.window_bounds_groups, x0.dtype)
            for w in {s.attn.window for s in self.blocks}
        }
        return [(biases[s.attn.window], rope) for s, (_, rope) in zip(self.blocks, context)]


__all__ = ["GroupedAttentionVLM", "GroupedPositionReadout", "grouped_bias"]
