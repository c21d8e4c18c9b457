"""Verification on every call: the replay's explained output held against the model's own forward.

Every :func:`lrp_core.explain` call (every method, every family) compares the logits the method read from the
replay — (B, C) for the rows explained, a decoder's at each row's read position — with the model's own forward
on the same inputs (:meth:`~lrp_core.adapters.base.Adapter.own_output`), run once without gradients, in eval
semantics and under the call's precision mode (:mod:`lrp_core.runtime.own_forward`). The figure is
``max |replay − own| / max |own|`` over the batch; the tolerance is set by the dtype the call computes in
(:data:`TOLERANCE`: ``explain(..., dtype=torch.float64)`` and float64 models 1e-10, float32 models 1e-5, half
models — replayed and run in float32 — 1e-5; the fast half mode, ``dtype=`` a half model's own, replayed and run
in that dtype: bfloat16 5e-2, float16 1e-2, against at most 2.0e-2 / 2.0e-3 measured, docs/METHODS.md §5.9).
Nothing is cached: the verdict depends on the inputs (lengths, rotary tables, windows, padding), so it is
recomputed on every call at the cost of one forward without gradients.

On a mismatch the call is refused (:class:`~lrp_core.errors.UnsupportedModelError`) with the figure and where the
picture departs: the replay and the model are run once more on the worst row, the model with temporary engine
hooks on its blocks (removed afterwards), and the first block whose output (the residual stream) differs from the
model's own beyond the tolerance is named — or the embedding, or the readout after the last block.
``explain(..., unverified=True)`` skips the check (benchmarks): the result is then not known to be the model's.

Where forward hooks of the user's on modules the replay does not run ran in the model's own forward (the
:class:`~lrp_core.errors.UnreflectedHookWarning` names them), a difference is theirs and the call is not refused.

Shapes: B batch, C classes (or vocabulary entries), N tokens, D width.
"""

from __future__ import annotations

import inspect
import threading
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..runtime.guard import engine_hook
from ..runtime.own_forward import own_forward
from ..runtime.precision import active_dtype, compute_dtype, is_half
from .batches import Batch, DecoderBatch

if TYPE_CHECKING:
    from .base import Adapter

#: max |replay − own| / max |own| accepted, by the dtype the call computes in (a half model: float32; the fast half
#: mode: its own half dtype, about 5 and 10 units of its last place)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 1e-2}


def tolerance(adapter: "Adapter") -> tuple[float, torch.dtype]:
    """(the tolerance, the dtype compared in): the active precision mode's target, else the model's own compute
    dtype (float32 for a half model). A float64 model whose own code computes a step in float32 (Hugging Face's
    eager softmax, a float32 rotation or router softmax: :func:`float32_steps`) carries float32 round-off, which
    the CPU's float32 kernels round differently with a row's length and padding: it gets float32's tolerance
    (``dtype=torch.float64`` lifts those steps to float64, in the replay and in the model's own forward)."""
    dtype = active_dtype() or compute_dtype(adapter.model)
    if dtype == torch.float64 and active_dtype() is None and float32_steps(adapter):
        return TOLERANCE[torch.float32], torch.float32
    return TOLERANCE.get(dtype, 1e-5), dtype


def float32_steps(adapter: "Adapter") -> bool:
    """Whether the replay computes a step in float32 whatever the model's dtype, as the model's own code does."""
    for spec in getattr(adapter, "blocks", ()):
        attn = spec.attn
        steps = (
            getattr(attn, "softmax_dtype", None),
            getattr(attn, "rotary_dtype", None),
            getattr(attn, "rotary_compute", None),
        )
        if torch.float32 in steps or getattr(attn, "softmax", None) is not None:
            return True
        if hasattr(spec.mlp, "router") or type(spec.mlp).__name__ == "MoeSpec":  # the router's float32 softmax
            return True
    return False


def deviation(replay: Tensor, own: Tensor, mask: Optional[Tensor] = None) -> float:
    """``max |replay − own| / max |own|`` in float64 (over ``mask``'s entries where given); NaN or inf where either
    is not finite, or the shapes differ."""
    if replay.shape != own.shape:
        return float("nan")
    a, b = replay.detach().double(), own.detach().double().to(replay.device)
    if mask is not None:
        a, b = a[mask], b[mask]
    if not a.numel():
        return 0.0
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("nan")
    return float((a - b).abs().max() / b.abs().max().clamp(min=torch.finfo(torch.float64).tiny))


def own_logits(adapter: "Adapter", prepared: Batch, pieces: Sequence[Any]) -> tuple[Tensor, set]:
    """The model's own explained output (B, C) for a prepared batch, piece by piece (``pieces``: the call's
    :class:`~lrp_core.runtime.pieces.Piece` list), and the hooked modules that ran only in it."""
    parts = []
    with own_forward(adapter.model) as run:
        for piece in pieces:
            sub = prepared.take(piece.rows, piece.n) if len(pieces) > 1 or piece.n is not None else prepared
            for rows, group in adapter.own_pieces(sub):
                parts.append((piece.rows.to(rows.device)[rows], adapter.own_output(group)))
    first = parts[0][1]
    out = first.new_zeros((prepared.size,) + tuple(first.shape[1:]))
    for rows, part in parts:
        out[rows.to(out.device)] = part.to(out.dtype)
    return out, run.unreflected


def check(adapter: "Adapter", prepared: Batch, logits: Tensor, pieces: Sequence[Any]) -> float:
    """Refuse a call whose replay does not reproduce the model's own output (see the module docstring).

    Parameters
    ----------
    adapter : Adapter
        The call's adapter.
    prepared : Batch
        The batch explained.
    logits : Tensor
        (B, C) the logits the method read from the replay.
    pieces : sequence of Piece
        The pieces the call ran in (the own forward runs in the same pieces).

    Returns
    -------
    float
        The measured deviation.

    Raises
    ------
    UnsupportedModelError
        With the deviation, the tolerance and the first block that departs, when the replay is not the model.
    """
    own, unreflected = own_logits(adapter, prepared, pieces)
    tol, dtype = tolerance(adapter)
    dev = deviation(logits, own)
    if dev <= tol or unreflected:  # within tolerance; or the user's hooks the replay does not run (warned about)
        return dev
    row = _worst_row(logits, own)
    where = locate(adapter, prepared.take(torch.tensor([row])), tol)
    name = type(adapter.model).__name__
    half = " (a half-precision model, replayed and run in float32)" if is_half(adapter.model) else ""
    if dtype in (torch.float16, torch.bfloat16):
        half = " (the fast half mode: replayed and run in the model's own dtype)"
    raise UnsupportedModelError(
        f"the replay of {name} does not reproduce the model's own output on these inputs: its explained logits "
        f"differ from the model's forward by {dev:.2e} relative (max |replay − model| / max |model|; tolerance "
        f"{tol:.0e} in {str(dtype).replace('torch.', '')}{half}{_islands(adapter, dtype)}, "
        f"worst at row {row}). {where} The explanation "
        "would describe another function than the model's, so it is not given. The model may have modules that "
        "are not what their class or name suggests (a swapped norm, a changed attention scale, a replaced "
        "layer, a forward the replay does not read): explain an unmodified model of a supported family, or "
        "report the model; explain(..., unverified=True) skips this check (the result is then unverified)"
    )


def _islands(adapter: "Adapter", dtype: torch.dtype) -> str:
    model_dtype = compute_dtype(adapter.model)
    return (
        " (the model's own code computes steps in float32)"
        if dtype != model_dtype and not is_half(adapter.model)
        else ""
    )


def _worst_row(replay: Tensor, own: Tensor) -> int:
    if replay.shape != own.shape:
        return 0
    diff = (replay.detach().double() - own.detach().double().to(replay.device)).abs()
    diff = torch.nan_to_num(diff, nan=float("inf")).flatten(1).max(dim=1).values
    return int(diff.argmax())


# ----------------------------------------------------------------------------
# where the picture departs
# ----------------------------------------------------------------------------
def block_modules(adapter: "Adapter") -> list[Optional[nn.Module]]:
    """Per block of the replay, the model's module that computes it: the deepest module holding every module
    the block description names (its norms, projections and MLP); ``None`` where there is none."""
    names = adapter.module_names
    modules = dict(adapter.model.named_modules())
    out: list[Optional[nn.Module]] = []
    for spec in adapter.blocks:
        parts = [spec.norm1, spec.norm2, spec.attn.proj, getattr(spec.mlp, "fc2", None), getattr(spec.mlp, "fc1", None)]
        paths = [names[m].split(".") for m in parts if isinstance(m, nn.Module) and m in names]
        if not paths:
            out.append(None)
            continue
        common = paths[0]
        for p in paths[1:]:
            k = 0
            while k < min(len(common), len(p)) and common[k] == p[k]:
                k += 1
            common = common[:k]
        out.append(modules.get(".".join(common)) if common else None)
    return out


def _first_tensor(value: Any) -> Optional[Tensor]:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, Tensor)), None)
    hidden = getattr(value, "last_hidden_state", None)
    return hidden if isinstance(hidden, Tensor) else None


def locate(adapter: "Adapter", prepared: Batch, tol: float) -> str:
    """Where the replay of one sample departs from the model's own forward: a sentence naming the first block
    whose output differs beyond ``tol`` (or the embedding, or the readout).

    Parameters
    ----------
    adapter : Adapter
        The call's adapter.
    prepared : Batch
        A batch of one sample.
    tol : float
        The tolerance of the call's dtype.

    Returns
    -------
    str
        The sentence (or why the blocks could not be compared).
    """
    sub = adapter.own_pieces(prepared)[0][1]  # the row as the model's own forward runs it (unpadded)
    modules = block_modules(adapter)
    seen: dict[int, list] = {}
    thread = threading.get_ident()

    def record(module: nn.Module, args: Any, output: Any) -> None:
        if threading.get_ident() == thread:
            seen.setdefault(id(module), []).append((_first_tensor(args), _first_tensor(output)))

    distinct = list({id(m): m for m in modules if m is not None}.values())
    try:
        with own_forward(adapter.model), ExitStack() as hooks:
            for m in distinct:
                hooks.enter_context(engine_hook(m, record))  # removed on leaving, whatever ends the block
            adapter.own_output(sub)
    except Exception as err:  # the model's own forward on one row: a failure is reported, not raised over the refusal
        return f"(The blocks could not be compared: {type(err).__name__}: {err}.)"
    # the plain replay (the explicit passes, the gradient methods), then the modified-gradient ones (AttnLRP, CP-LRP
    # compute some operations through their rules' own forward): the first that departs is named
    from ..rules.composites import ATTNLRP, CP_LRP

    found = ""
    for composite, words in ((None, ""), (ATTNLRP, " in AttnLRP's replay"), (CP_LRP, " in CP-LRP's replay")):
        with torch.no_grad():
            trace = adapter.forward(prepared, composite=composite)  # padded as the call ran it: compared at real tokens
        where, departs = _first_departure(adapter, trace, modules, seen, tol, words)
        if departs:
            return where
        found = found or where
    return found


def _first_departure(
    adapter: "Adapter", trace: Any, modules: list, seen: dict, tol: float, words: str
) -> tuple[str, bool]:
    """The sentence of :func:`locate` from the replay's records and the blocks' own inputs and outputs, and whether
    it names a departure inside the blocks (``words``: which replay, for the sentence)."""
    names = adapter.module_names
    uses: dict[int, int] = {}
    mask = trace.mask.bool() if trace.mask is not None else None  # (1, N) 1 = real token
    compared, worst = 0, 0.0
    for b, (module, rec) in enumerate(zip(modules, trace.blocks)):
        if module is None or rec is None:
            continue
        k = uses.get(id(module), 0)
        uses[id(module)] = k + 1
        calls = seen.get(id(module), [])
        if k >= len(calls):
            continue
        inp, out = calls[k]
        label = names.get(module, type(module).__name__)
        x, y = _real(rec.x, mask), _real(rec.out, mask)
        if b == 0 and inp is not None and inp.numel() == x.numel():
            d = deviation(x, inp.reshape(x.shape))
            if not d <= tol:
                return (
                    f"It departs before the first block{words}: the input of {label} (the embedding) differs by "
                    f"{d:.2e} relative from the model's own."
                ), True
        if out is None or out.numel() != y.numel():
            continue
        d = deviation(y, out.reshape(y.shape))
        compared += 1
        if not d <= tol:
            return (
                f"It departs at block {b} ({label}){words}: the residual stream leaving it differs by {d:.2e} "
                f"relative from the model's own hidden states{' (the blocks before it agree)' if b else ''}."
            ), True
        worst = max(worst, d)
    if not compared:
        return "(The model's blocks could not be compared with the replay's.)", False
    return (
        f"Every block's output agrees with the model's own (to {worst:.1e}): it departs after the last block, in "
        "the final norm, the pooling or the head."
    ), False


def _real(x: Tensor, mask: Optional[Tensor]) -> Tensor:
    """The real tokens of one sample's (1, N, ...) record, where the trace's mask (1, N) fits it: (1, n, ...) as the
    model's own forward of the unpadded row gives them; else the record as it is."""
    if mask is None or x.dim() < 2 or x.shape[0] != 1 or tuple(mask.shape) != tuple(x.shape[:2]):
        return x
    return x[:, mask[0].to(x.device)]


# ----------------------------------------------------------------------------
# helpers of the families' own outputs
# ----------------------------------------------------------------------------
def logits_of(output: Any) -> Tensor:
    """The logits of a model's output: a tensor as is, else its ``logits`` (or first entry)."""
    if isinstance(output, Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, Tensor):
        return logits
    first = _first_tensor(output)
    if first is None:
        raise UnsupportedModelError(f"the model's own forward gave no logits ({type(output).__name__})")
    return first


def unpadded_pieces(prepared: DecoderBatch, length_dependent: bool) -> list[tuple[Tensor, DecoderBatch]]:
    """A decoder's batch as groups of rows without padding: ``(rows, the batch of those rows)``, each row
    cut to its real tokens (which must be contiguous; else the batch as it is), rows of one length together
    (``length_dependent``: and of one longest position, as a length-dependent rotary table needs).

    Every (B, T, ...) field is cut along T; the others (the batch's ``untrimmed``: the images) are taken by rows.
    """
    mask = prepared.attention_mask
    B, T = mask.shape
    lengths = mask.sum(dim=1)
    first = mask.argmax(dim=1)
    idx = torch.arange(T, device=mask.device)[None, :]
    inside = (idx >= first[:, None]) & (idx < (first + lengths)[:, None])
    if not torch.equal(inside, mask.bool()) or bool((lengths == T).all()):
        return [(torch.arange(B), prepared)]
    keys = lengths.tolist()
    if length_dependent and prepared.position_ids is not None:
        top = prepared.position_ids.masked_fill(mask == 0, -1).max(dim=1).values.tolist()
        keys = list(zip(keys, top))
    out = []
    for key in dict.fromkeys(keys):
        rows = torch.tensor([b for b in range(B) if keys[b] == key], device=mask.device)
        n = int(lengths[rows[0]])
        cols = first[rows][:, None] + torch.arange(n, device=mask.device)[None, :]
        cut = {k: _cut(v, rows, cols, B, T, k in prepared.untrimmed) for k, v in prepared.per_sample().items()}
        out.append((rows.cpu(), prepared.replace(**cut)))
    return out


def _cut(v: Any, rows: Tensor, cols: Tensor, B: int, T: int, whole: bool) -> Any:
    if not isinstance(v, Tensor) or v.dim() == 0 or v.shape[0] != B:
        return v
    v = v[rows.to(v.device)]
    if whole or v.dim() < 2 or v.shape[1] != T:
        return v
    index = cols.to(v.device).reshape(cols.shape + (1,) * (v.dim() - 2)).expand(cols.shape + tuple(v.shape[2:]))
    return v.gather(1, index)


def read_logits(model: nn.Module, kwargs: dict, read: Tensor, head: Optional[nn.Module]) -> Tensor:
    """(B, C) a decoder's own logits at each row's read position ``read`` (B,).

    A causal LM: its ``logits`` (only at the read positions, where its forward takes ``logits_to_keep``); a
    sequence classifier (``head`` its ``score``): the head's own output at the read positions (its pooling reads
    one position only, and ``position=`` may name another).
    """
    rows = torch.arange(read.shape[0], device=read.device)
    if head is not None:
        seen: list = []
        with engine_hook(head, lambda m, a, out: seen.append(out)):
            model(**kwargs)
        return seen[-1][rows, read.to(seen[-1].device)]
    try:
        takes = "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes = False
    if takes:
        keep = torch.unique(read)
        out = logits_of(model(**kwargs, logits_to_keep=keep))
        where = torch.searchsorted(keep, read)
        return out[rows.to(out.device), where.to(out.device)]
    out = logits_of(model(**kwargs))
    return out[rows.to(out.device), read.to(out.device)]


__all__ = [
    "TOLERANCE",
    "tolerance",
    "deviation",
    "own_logits",
    "check",
    "locate",
    "block_modules",
    "logits_of",
    "unpadded_pieces",
    "read_logits",
]
