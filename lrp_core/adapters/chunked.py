"""The attention core computed in query chunks: at most ``(B, H, c, M)`` scores and weights alive at once.

The rows of a softmax are independent, so ``softmax(mask(q·kᵀ))·v`` of N queries is the concatenation of the
same computation on chunks of c query rows. :func:`chunked_core` runs the core (the attention's
own: the scaled ``q·kᵀ``, the mask, the softmax and ``A·v``, each operation through the replay's rule,
:mod:`lrp_core.adapters.attention`) chunk by chunk as one autograd function that saves q, k, v
only: its backward computes each chunk again with its graph, takes that chunk's gradient (the rules' backward,
as the full pass would) and frees it before the next — per-chunk checkpointing inside one block. The result and
its gradients equal the full core's up to the round-off of summing the chunks' gradients of k and v in another
order (the modified-gradient rules are linear in the incoming gradient).

Used by the blockwise relevance pass (:mod:`lrp_core.adapters.blockwise`) for a modified-gradient replay
(AttnLRP, CP-LRP) of attention computed explicitly (eager attention; sdpa runs fused and holds no map). The
map ``A`` is then not recorded (such a pass never reads it).

Shapes: B batch, H heads, Hkv key/value heads, N queries, M keys, d head width, c rows per chunk.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Callable, Optional

import torch
from torch import Tensor
from torch.overrides import _get_current_function_mode_stack

Core = Callable[[Tensor, Tensor, Tensor, Optional[Tensor]], Tensor]  # (q rows, k, v, bias rows) -> (B, H, c, d)
RowCore = Callable[[Tensor, Tensor, Tensor, slice], Tensor]  # (q rows, k, v, the rows) -> (B, H, c, d)


def _bias_rows(bias: Optional[Tensor], rows: slice) -> Optional[Tensor]:
    """The additive mask's rows of a chunk (a mask with one row, ``(B, 1, 1, M)``, serves every chunk)."""
    if bias is None or bias.dim() < 2 or bias.shape[-2] == 1:
        return bias
    return bias[..., rows, :]


def chunked_core(core: Core, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], rows: int) -> Tensor:
    """``core(q, k, v, bias)`` computed ``rows`` query rows at a time (see the module docstring).

    Parameters
    ----------
    core : Callable
        The attention core on some query rows: (q rows (B, H, c, d), k, v (B, Hkv, M, d), the mask's rows or
        ``None``) -> ``A·v`` (B, H, c, d), each operation through the replay's rules.
    q : Tensor
        The queries ``(B, H, N, d)``.
    k, v : Tensor
        The keys and values ``(B, Hkv, M, d)``.
    bias : Tensor or None
        The additive mask, broadcast to ``(B, H, N, M)``, or ``None``.
    rows : int
        Query rows per chunk.

    Returns
    -------
    Tensor
        The heads' outputs ``(B, H, N, d)``.
    """

    def on_rows(q_rows: Tensor, k_all: Tensor, v_all: Tensor, s: slice) -> Tensor:
        return core(q_rows, k_all, v_all, _bias_rows(bias, s))

    return _Chunked.apply(on_rows, rows, q, k, v)


class _Chunked(torch.autograd.Function):
    """The core chunk by chunk: forward without a graph (q, k, v saved), backward recomputing each chunk."""

    @staticmethod
    def forward(ctx, core: RowCore, rows: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        ctx.core, ctx.rows = core, rows
        ctx.modes = _get_current_function_mode_stack()  # a precision mode: the backward computes as this did
        ctx.save_for_backward(q, k, v)
        N = q.shape[2]
        with torch.no_grad():
            return torch.cat([core(q[:, :, s], k, v, s) for s in _slices(N, rows)], dim=2)

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v = ctx.saved_tensors
        wants = ctx.needs_input_grad[2:]
        dq = torch.zeros_like(q) if wants[0] else None
        dk = torch.zeros_like(k) if wants[1] else None
        dv = torch.zeros_like(v) if wants[2] else None
        with _entered(ctx.modes), torch.enable_grad():
            for s in _slices(q.shape[2], ctx.rows):
                operands = ((q[:, :, s], wants[0]), (k, wants[1]), (v, wants[2]))
                leaves = [t.detach().requires_grad_(w) for t, w in operands]
                out = ctx.core(leaves[0], leaves[1], leaves[2], s)
                asked = [t for t in leaves if t.requires_grad]
                got = iter(torch.autograd.grad(out, asked, grad[:, :, s], allow_unused=True) if asked else ())
                g_q, g_k, g_v = (next(got) if t.requires_grad else None for t in leaves)
                if dq is not None and g_q is not None:
                    dq[:, :, s] = g_q
                if dk is not None and g_k is not None:
                    dk += g_k
                if dv is not None and g_v is not None:
                    dv += g_v
                del out, leaves
        return None, None, dq, dk, dv


def _slices(n: int, rows: int) -> list[slice]:
    """The chunks of ``n`` rows, ``rows`` each (the last one shorter)."""
    return [slice(i, min(i + rows, n)) for i in range(0, n, rows)]


def _entered(modes: list) -> ExitStack:
    """The torch-function modes a forward ran under, entered again where they are not active now."""
    stack, active = ExitStack(), _get_current_function_mode_stack()
    for mode in modes:
        if not any(mode is m for m in active):
            stack.enter_context(mode)
    return stack


__all__ = ["chunked_core"]
