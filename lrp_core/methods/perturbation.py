"""Perturbation (docs/METHODS.md §2.7): what the output loses when one token is removed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from .call import Call, MethodResult

if TYPE_CHECKING:
    from .objects import TokenAblation


def token_ablation(c: Call[TokenAblation]) -> MethodResult:
    """Token ablation map: ``y_t(all tokens) − y_t(without token i)``, the removals batched.

    Decoders: the other tokens keep their position ids, and the head reads the same token.
    A row with nothing to remove (its only real token is the one read: a one-token row, or a decoder read at
    ``position=0``) has the all-zero map, and a batch of such rows runs no removal at all.
    """
    a, opt, shared = c.adapter, c.method, c.shared
    with torch.no_grad():
        trace = c.forward(grad=False)
        target = c.resolve(trace.logits)
        y_full = c.output(trace.logits, target)
        x0 = trace.x0
        B, N, D = x0.shape
        mask, positions = trace.mask, trace.positions
        # (sample, token) pairs to ablate: every scored token but those the classifier reads (their score stays 0)
        dev = x0.device  # every index lives where the activations are (CUDA too)
        pairs = c.layout.ablation_pairs(B, dev)
        keep = torch.arange(N - 1, device=dev)
        scores = torch.zeros(B, N, dtype=x0.dtype, device=dev)
        bar = tqdm(
            total=len(pairs),
            desc="token ablation",
            unit="seq",
            disable=not shared.progress if shared.progress is not None else len(pairs) < 2048,
            leave=False,
        )
        # an empty split still yields one empty chunk, whose replay cannot reshape zero rows: skip it
        for chunk in pairs.split(opt.batch_size) if len(pairs) else ():
            bi, ti = chunk[:, 0], chunk[:, 1]
            idx = keep[None, :] + (keep[None, :] >= ti[:, None]).long()  # positions without token ti
            xs = x0[bi].gather(1, idx[..., None].expand(-1, -1, D))
            ms = None if mask is None else mask[bi].gather(1, idx)
            ps = None if positions is None else positions[bi].gather(1, idx)  # the others keep their positions
            head = c.readout.after_removal(bi, ti)  # a per-row readout position moves with the removal
            out = a.run_blocks(xs, ms, keep=False, readout=head, positions=ps)  # logits only
            scores[bi, ti] = y_full[bi] - c.output(out.logits, target[bi], rows=bi)
            bar.update(len(chunk))
        bar.close()
    return MethodResult(scores=scores[:, c.layout.output_start :], target=target, logits=trace.logits)
