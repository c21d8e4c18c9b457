"""The peak memory of AttnLRP's / CP-LRP's relevance passes, full and blockwise, and of forward + backward.

:mod:`lrp_core.runtime.memory` gives every method an upper bound that sizes the pieces of a batch. This module
predicts the peak itself (not a bound) for the two modified-gradient passes, so that a call can tell whether the
full pass fits its budget or the blockwise pass (:mod:`lrp_core.adapters.blockwise`) is needed, and states the
model's own forward + backward for comparison. Counted in elements, times the bytes per element; B batch,
N tokens, D width, H heads, L blocks, M the MLP's kept width (:attr:`SizeFacts.mlp`: a gated MLP's gate + up,
2·F), P the parameters, P_h the largest weight (an LM head's V·D), c the query rows per attention chunk,
W the additive masks the batch materialises (one per distinct window; none for an unpadded batch under sdpa):

* **full pass**: ``B·N·[(L−1)·(12·D + 2·M) + 7.5·D + 2·M] + B·W·N²`` — every block's saved tensors until the
  backward reaches it (the last block is replayed at the read row only: its keys and values and the backward's
  temporaries are the second term); explicit (eager) attention adds ``B·[(L−1)·(H·N² + N·D) + H·N²]``, each
  block's softmax kept for ``A·V`` and one block's temporaries;
* **blockwise pass**: ``B·N·[L·D + max(11·D + 2.5·M, 12·D + 3·H·c)] + B·W·N²`` — the L block inputs and one
  block's graph (its MLP, or its attention chunk's ``(B, H, c, N)`` temporaries where those are larger);
* **forward + backward** (the model's own, the loss on one row's logits, into the parameters):
  ``max(P, P_h + B·N·L·(10·D + 2·M))`` (+ ``B·L·H·N²`` for eager attention) — every parameter's gradient at the end,
  or the head's gradient with every block's saved activations at the start of the backward.

The coefficients were read from the CPU allocator's own accounting (the profiler's memory events: the peak of
live tensor bytes) on Llama-shaped models of width 256 / 512, MLP 688 / 1376, 4 / 8 blocks, 256 … 1024 tokens,
sdpa and eager; checked against a fresh process's peak at 1k … 16k tokens on the benchmarks' Llama row
(``scripts/measure_long_context.py``, docs/results/long-context-cpu.json). They describe the Llama layout
(pre-norm, RMSNorm, gated MLP, rotary grouped-query attention); other layouts are priced with the same terms.
The weights and the inputs are not counted (they are resident before the call).

Shapes in the docstrings: B batch, N tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..rules.linear import is_linear
from .memory import SizeFacts, facts_of


@dataclass(frozen=True)
class PassFacts:
    """:class:`SizeFacts` and what the passes' peaks add: the batch, the masks, the chunk rows, the parameters.

    ``explicit``: attention computed with its map (not fused: eager, or a kernel the replay cannot fuse);
    ``masks``: the additive ``(B, 1, N, N)`` masks the batch materialises; ``rows``: query rows per chunk
    (:func:`lrp_core.adapters.chunked.rows_per_chunk`); ``params`` / ``largest``: the model's parameters and its
    largest weight, in elements.
    """

    size: SizeFacts
    batch: int
    explicit: bool
    masks: int
    rows: int
    params: int
    largest: int


@dataclass(frozen=True)
class Prediction:
    """Predicted peak bytes of one call: the full pass, the blockwise pass, the model's forward + backward."""

    full: int
    blockwise: int
    forward_backward: int


def pass_facts(adapter: Any, prepared: Any) -> PassFacts:
    """The :class:`PassFacts` of an adapter's model on a batch.

    Parameters
    ----------
    adapter : Adapter
        The model's adapter.
    prepared : Batch
        Its batch (a text batch's ``attention_mask`` tells whether it is padded).

    Returns
    -------
    PassFacts
        The facts the predictions read.
    """
    size = facts_of(adapter, prepared)
    attns = [spec.attn for spec in adapter.blocks]
    mask = getattr(prepared, "attention_mask", None)
    padded = mask is not None and not bool(mask.all())
    windows = {a.window for a in attns}
    masks = sum(1 for w in windows if not size.sdpa or padded or w is not None) if adapter.mask_value is not None else 0
    weights = [_weight_numel(m) for m in adapter.model.modules() if is_linear(m)]
    return PassFacts(
        size=size,
        batch=int(prepared.size),
        explicit=not size.sdpa,
        masks=masks,
        rows=int(adapter.chunk_rows),
        params=sum(int(p.numel()) for p in adapter.model.parameters()),
        largest=max(weights, default=0),
    )


def _weight_numel(module: nn.Module) -> int:
    """The element count of a Linear-like module's weight: an attribute, or a method (torch's dynamically
    quantised Linear: ``weight()``); 0 where it has none."""
    w = getattr(module, "weight", None)
    if callable(w) and not isinstance(w, Tensor):
        w = w()
    return int(w.numel()) if isinstance(w, Tensor) else 0


def full_pass(f: PassFacts) -> int:
    """Predicted peak bytes of the full modified-gradient pass (module docstring)."""
    s = f.size
    N, D, M, H, L = s.tokens, s.width, s.mlp, s.heads, s.blocks
    per_token = (L - 1) * (12 * D + 2 * M) + 7.5 * D + 2 * M
    maps = ((L - 1) * (H * N * N + N * D) + H * N * N) if f.explicit else 0
    return int(f.batch * (N * per_token + maps + f.masks * N * N) * s.itemsize)


def blockwise_pass(f: PassFacts) -> int:
    """Predicted peak bytes of the blockwise pass (module docstring)."""
    s = f.size
    N, D, M, H, L = s.tokens, s.width, s.mlp, s.heads, s.blocks
    block = 11 * D + 2.5 * M
    if f.explicit:
        block = max(block, 12 * D + 3 * H * min(f.rows, N))
    return int(f.batch * (N * (L * D + block) + f.masks * N * N) * s.itemsize)


def forward_backward(f: PassFacts) -> int:
    """Predicted peak bytes of the model's own forward + backward into its parameters (module docstring)."""
    s = f.size
    N, D, M, H, L = s.tokens, s.width, s.mlp, s.heads, s.blocks
    saved = f.batch * N * L * (10 * D + 2 * M) + (f.batch * L * H * N * N if f.explicit else 0)
    return int(max(f.params, f.largest + saved) * s.itemsize)


def predict(adapter: Any, prepared: Any) -> Prediction:
    """The three predictions for an adapter's model on a batch.

    Parameters
    ----------
    adapter : Adapter
        The model's adapter.
    prepared : Batch
        Its batch.

    Returns
    -------
    Prediction
        Peak bytes of the full pass, the blockwise pass and forward + backward.
    """
    f = pass_facts(adapter, prepared)
    return Prediction(full=full_pass(f), blockwise=blockwise_pass(f), forward_backward=forward_backward(f))


def fits(adapter: Any, prepared: Any, budget: float) -> bool:
    """Whether the full pass's predicted peak fits ``budget`` bytes."""
    return budget == float("inf") or full_pass(pass_facts(adapter, prepared)) <= budget


__all__ = [
    "PassFacts",
    "Prediction",
    "pass_facts",
    "full_pass",
    "blockwise_pass",
    "forward_backward",
    "predict",
    "fits",
]
