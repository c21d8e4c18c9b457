"""How much memory an explanation needs, and how much there is: the arithmetic behind ``max_memory``.

:func:`lrp_core.explain` splits a batch into pieces when the estimated peak of
explaining it at once exceeds a memory budget (docs/ARCHITECTURE.md, "Memory
and pieces"). This module holds the three parts of that decision:

- :func:`estimate` — an upper bound on the peak memory of one method's pass
  over a batch, from the model's facts (:class:`SizeFacts`): blocks ``L``,
  tokens ``N``, width ``D``, heads ``H``, MLP width ``F``, bytes per element.
- :func:`budget` — the memory a call may use: ``max_memory`` as given, or a
  fraction of what the model's device has free.
- :func:`piece_size` — how many samples fit in the budget.

What the estimate counts, per sample and block (elements):

- **the replay** the methods read back (every block's activations are kept
  for the relevance pass or the gradients): ``a·N·D + m·N·F + s·H·N²`` — the
  ``N·D`` activations (norm outputs, q/k/v, context, projections, residual
  stream), the ``N·F`` MLP activations (fc1 output, activation) and the
  ``H·N²`` attention scores and maps. With a graph (gradient methods) autograd
  saves a few more of each; AttnLRP / CP-LRP's rules save more still
  (decomposed LayerNorms, the identity rule's ratios).
- **the matrices a method keeps** for every block: attention gradients,
  attention relevances, per-head products ``(B, L, H, N, N)`` and their head
  means ``(B, L, N, N)`` (``k·H·N² + N²``; ``keep_heads`` adds ``H·N²``).
- **one block's temporaries** while the relevance or gradient pass crosses
  it (the signed Linear rule forms several ``N·F`` tensors at the MLP, the
  product rule several ``H·N²`` at the attention): ``t_a·N·D + t_m·N·F +
  t_s·H·N²``, counted once, not per block.

plus a fixed part independent of the batch: the weight-sized tensors of the
signed Linear rule (three of the largest weight) and, for ``token_ablation``,
the forward passes of ``batch_size`` ablated sequences.

Decoders: the head's ``C`` outputs (a causal LM's vocabulary
``V``) cost ``2·C`` per sample (the logits read and their gradient), and its
``C·D`` weight counts among the largest weights of the fixed part (for a
language model the LM head is the largest by far). A gated MLP counts as
twice its width (gate and up outputs, the activation and the product). On a
model that runs sdpa, the methods whose pass is one modified backward
(``Profile.fused``: AttnLRP, CP-LRP) keep no ``H·N²`` maps: the fused
kernel's replay holds at most the additive masks, ``2·N²`` per sample (one
per distinct window; none for an unpadded batch).

The coefficients are upper bounds calibrated by measurement (peak resident
memory of a fresh process on CPU, ``scripts/measure_memory.py``): the
estimate is 1.2× … 1.8× the measured peak on BERT and ViT of width 256, 4
blocks, 128 … 257 tokens, batches 2 and 8, and 1.25× … 1.65× at width 384, 6
blocks, in float32 and float64 (``token_ablation``, whose peak varies with
the allocator from run to run, up to 2.5×; the table in
docs/ARCHITECTURE.md). It does not count the model's weights (already
resident) or the inputs. On CUDA the same tensors are allocated; the estimate
was not measured there.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from ..adapters.batches import Batch
from ..errors import InputError
from ..rules.linear import is_linear
from .precision import active_dtype, compute_dtype
from .utils import proc_kib

#: Fraction of the device's free memory a call may use when ``max_memory`` is ``None`` / ``"auto"``.
SAFETY_FRACTION = 0.5

MaxMemory = Union[None, int, float, str]


@dataclass(frozen=True)
class SizeFacts:
    """The sizes the estimate needs: blocks, tokens, width, heads, MLP width, bytes per element.

    ``outputs``: the head's outputs ``C`` (a causal LM's vocabulary ``V``; 0: not counted);
    ``sdpa``: the model runs fused attention, so a ``Profile.fused`` method keeps no N×N maps.
    """

    blocks: int
    tokens: int
    width: int
    heads: int
    mlp: int
    itemsize: int
    outputs: int = 0
    sdpa: bool = False


@dataclass(frozen=True)
class Profile:
    """Elements per sample of one method's pass, as coefficients of ``N·D``, ``N·F`` and ``H·N²``.

    ``act``, ``mlp``, ``att``: kept per block (the replay, with or without a graph).
    ``kept``: ``H·N²`` matrices kept per block by the method (gradients, relevances, products);
    ``layers``: whether it returns ``(B, L, N, N)`` head means (``keep_heads`` then adds ``H·N²``).
    ``tmp_act``, ``tmp_mlp``, ``tmp_att``: one block's temporaries, counted once.
    ``batched``: its passes run up to ``batch_size`` sequences at a time besides the batch (the Captum
    baselines' steps, perturbations, noisy copies): the fixed part holds ``batch_size`` samples' pass.
    ``fused``: its pass is one modified backward that replays sdpa attention fused (no ``H·N²`` on an
    sdpa model, :attr:`SizeFacts.sdpa`).
    ``ablated``: its fixed part holds ``batch_size`` forward passes of the sequence with one token removed
    (token ablation), each priced as :data:`ABLATED_PASS`.
    ``streamed``: its passes replay logits only (``run_blocks(keep=False)``): each block's tensors are dropped
    once the next block has its output, so two blocks' ``act``, ``mlp`` and ``att`` are held at a time, not L.
    """

    act: float
    mlp: float
    att: float
    kept: float = 0.0
    layers: bool = False
    tmp_act: float = 0.0
    tmp_mlp: float = 0.0
    tmp_att: float = 0.0
    batched: bool = False
    fused: bool = False
    ablated: bool = False
    streamed: bool = False


# The parts a method's Profile is made of (each method's profile is its class's ``memory``, lrp_core.methods.objects).
# (typed dict[str, Any]: spread into Profile, whose float and bool fields one value type cannot cover)
REPLAY_ONLY: dict[str, Any] = dict(act=16, mlp=2, att=3)  # replay without a graph
GRAPH: dict[str, Any] = dict(act=18, mlp=3, att=4)  # replay with autograd's saved tensors
MODIFIED: dict[str, Any] = dict(act=24, mlp=4, att=5)  # the modified-gradient replay (decomposed LayerNorm, ratios)
RELPROP: dict[str, Any] = dict(tmp_act=8, tmp_mlp=8, tmp_att=6)  # the explicit pass at one block
BACKWARD: dict[str, Any] = dict(tmp_act=6, tmp_mlp=3, tmp_att=3)  # autograd's backward at one block

#: One forward pass of a sequence with a token removed (token ablation's fixed part), priced as a plain
#: replay that keeps its head-mean maps.
ABLATED_PASS = Profile(**REPLAY_ONLY, layers=True, tmp_att=1)


def facts_of(adapter: Any, prepared: Optional[Batch], tokens: Optional[int] = None) -> SizeFacts:
    """The :class:`SizeFacts` of an adapter's model on a batch (``tokens``: override ``N``; then the batch may be
    ``None``).

    Parameters
    ----------
    adapter : Any
        The model's adapter.
    prepared : Optional[Batch]
        The adapter's batch (:mod:`lrp_core.adapters.batches`); ``None`` with ``tokens``.
    tokens : Optional[int], optional
        Override for the number of tokens ``N``.

    Returns
    -------
    SizeFacts
        Blocks, tokens, width, heads, MLP width, outputs and bytes per element.
    """
    first = adapter.blocks[0]
    # a gated MLP keeps gate and up outputs, the activation and the product: twice a plain one's N·F; a
    # mixture of experts says its own per-token width (MoeSpec.hidden_width: the k chosen experts')
    widths = [
        getattr(spec.mlp, "hidden_width", None)
        or spec.mlp.fc1.out_features * (2 if getattr(spec.mlp, "gated", False) else 1)
        for spec in adapter.blocks
    ]
    if tokens is None:
        assert prepared is not None, "the tokens of a batch, or the tokens given"
        tokens = adapter.layout(prepared).num_tokens
    n = tokens
    return SizeFacts(
        blocks=adapter.num_blocks,
        tokens=int(n),
        width=int(first.attn.proj.out_features),
        heads=int(first.attn.num_heads),
        mlp=int(max(widths)),
        itemsize=_compute_itemsize(adapter.model),
        outputs=_head_outputs(adapter),
        sdpa=bool(getattr(first.attn, "sdpa", False)),
    )


def _head_outputs(adapter: Any) -> int:
    """``C``: the outputs of the head's last Linear (an LM head's vocabulary), 0 where there is none."""
    head = getattr(getattr(adapter, "readout", None), "head_layers", None) or ()
    linears = [layer.module for layer in head if is_linear(layer.module)]
    return int(linears[-1].out_features) if linears else 0


def _compute_itemsize(model: Any) -> int:
    """Bytes per activation element: the dtype the model is computed in (a half-precision model is explained in
    float32, any model in the dtype a call asked for: lrp_core.runtime.precision), whatever its weights are
    stored as (a quantised Linear's packed integers, a torch dynamic-quantised layer's packed parameters)."""
    active = active_dtype()
    if active is not None:
        return torch.finfo(active).bits // 8
    return torch.finfo(compute_dtype(model)).bits // 8


def per_sample(p: Profile, f: SizeFacts, keep_heads: bool = False) -> int:
    """Bytes one more sample adds to the peak of a pass with profile ``p`` (a method class's ``memory``).

    Parameters
    ----------
    p : Profile
        The method's memory profile (its class's ``memory``).
    f : SizeFacts
        The model's size facts (:func:`facts_of`).
    keep_heads : bool, optional
        The method keeps per-head matrices (adds ``H·N²`` where the profile returns layers).

    Returns
    -------
    int
        Bytes per additional sample.
    """
    N, D, H, F, L = f.tokens, f.width, f.heads, f.mlp, f.blocks
    nd, nf, hnn = N * D, N * F, H * N * N
    fused = p.fused and f.sdpa  # one modified backward through the fused kernel: no attention maps
    att, tmp_att = (0.0, 0.0) if fused else (p.att + p.kept + (1 if keep_heads and p.layers else 0), p.tmp_att)
    block = p.act * nd + p.mlp * nf + att * hnn
    block += N * N if p.layers else 0
    once = p.tmp_act * nd + p.tmp_mlp * nf + tmp_att * hnn + 2 * f.outputs
    once += 2 * N * N if fused else 0  # the additive masks of a padded or windowed batch, one per window
    # a logits-only replay holds two blocks' tensors: block b's record is freed once block b + 1's exists
    held = min(2, L) if p.streamed else L
    return int(math.ceil((held * block + once) * f.itemsize))


def fixed(p: Profile, f: SizeFacts, batch_size: int = 64) -> int:
    """Bytes of a pass with profile ``p`` that do not grow with the batch.

    These are the weight-sized temporaries and the ablated or batched sequences.

    Parameters
    ----------
    p : Profile
        The method's memory profile.
    f : SizeFacts
        The model's size facts.
    batch_size : int, optional
        Sequences the batched or ablated passes run at a time.

    Returns
    -------
    int
        Bytes independent of the batch.
    """
    out = 3 * f.width * max(f.mlp, f.outputs) * f.itemsize  # the largest weight: an LM head's V·D
    if p.ablated:
        out += batch_size * per_sample(
            ABLATED_PASS,
            SizeFacts(f.blocks, max(f.tokens - 1, 1), f.width, f.heads, f.mlp, f.itemsize, f.outputs, f.sdpa),
        )
    elif p.batched:
        out += batch_size * per_sample(p, f)
    return int(out)


def estimate(p: Profile, f: SizeFacts, batch: int, keep_heads: bool = False, batch_size: int = 64) -> int:
    """Upper bound on the peak bytes of explaining ``batch`` samples at once with a pass of profile ``p``.

    Parameters
    ----------
    p : Profile
        The method's memory profile.
    f : SizeFacts
        The model's size facts.
    batch : int
        Number of samples B explained at once.
    keep_heads : bool, optional
        The method keeps per-head matrices.
    batch_size : int, optional
        Sequences the batched or ablated passes run at a time.

    Returns
    -------
    int
        ``fixed + batch · per_sample`` in bytes.
    """
    return fixed(p, f, batch_size) + batch * per_sample(p, f, keep_heads)


# ----------------------------------------------------------------------------
# the budget
# ----------------------------------------------------------------------------
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_ACCEPTED = (
    "max_memory must be None or 'auto' (a share of the free memory of the model's device), a number of "
    "bytes (> 0), a string such as '512MB' or '2GiB', or float('inf') / 'none' (never split)"
)


def parse_max_memory(value: MaxMemory) -> Union[None, float]:
    """``None`` for "auto", ``math.inf`` for "never split", else a positive number of bytes.

    Parameters
    ----------
    value : MaxMemory
        ``None`` or ``"auto"``; a number of bytes > 0; a string such as ``"512MB"``
        or ``"2GiB"``; ``float("inf")``, ``"none"``, ``"inf"`` or ``"off"``.

    Returns
    -------
    Union[None, float]
        ``None``, ``math.inf`` or the bytes as a float.

    Raises
    ------
    InputError
        If ``value`` is a bool, not positive, NaN, an unreadable string or of
        another type (the message lists what is accepted).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise InputError(f"{_ACCEPTED}; got {value!r}")
    if isinstance(value, str):
        s = value.strip().upper().replace(" ", "")
        if s == "AUTO":
            return None
        if s in ("NONE", "INF", "OFF"):
            return math.inf
        m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)([KMGT]I?B|B)?", s)
        if m is None:
            raise InputError(f"{_ACCEPTED}; got {value!r}")
        value = float(m.group(1)) * _UNITS[m.group(2) or ""]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value == math.inf:
            return math.inf
        if not value > 0 or math.isnan(value):
            raise InputError(f"{_ACCEPTED}; got {value!r}")
        return float(value)
    raise InputError(f"{_ACCEPTED}; got {type(value).__name__}")


def available(device: torch.device) -> Optional[int]:
    """Free bytes on ``device``, or ``None`` where they cannot be read.

    ``torch.cuda.mem_get_info`` plus what PyTorch's allocator holds unused on
    CUDA, ``MemAvailable`` (/proc/meminfo, else psutil) on CPU; ``None`` where it cannot be read.

    Parameters
    ----------
    device : torch.device
        The model's device.

    Returns
    -------
    Optional[int]
        Free bytes, or ``None``.
    """
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # memory PyTorch's caching allocator holds but does not use is free to this process too
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type != "cpu":
        return None
    kib = proc_kib("/proc/meminfo", "MemAvailable")
    if kib is not None:
        return kib * 1024
    try:
        import psutil  # optional

        return int(psutil.virtual_memory().available)
    except Exception:  # not installed, or no reading on this system
        return None


def budget(max_memory: MaxMemory, device: torch.device) -> float:
    """The bytes a call may use.

    ``max_memory`` parsed, or :data:`SAFETY_FRACTION` of :func:`available`
    (``math.inf`` when that cannot be read: never split).

    Parameters
    ----------
    max_memory : MaxMemory
        The caller's ``max_memory`` (see :func:`parse_max_memory`).
    device : torch.device
        The model's device.

    Returns
    -------
    float
        The budget in bytes (``math.inf``: never split).
    """
    b = parse_max_memory(max_memory)
    if b is not None:
        return b
    free = available(device)
    return math.inf if free is None else SAFETY_FRACTION * free


def piece_size(
    budget_bytes: float, p: Profile, f: SizeFacts, batch: int, keep_heads: bool = False, batch_size: int = 64
) -> int:
    """Samples per piece of a pass with profile ``p``.

    ``batch`` if the whole batch fits, else
    ``⌊(budget − fixed) / per sample⌋`` (≥ 1).

    Parameters
    ----------
    budget_bytes : float
        The budget in bytes (:func:`budget`).
    p : Profile
        The method's memory profile.
    f : SizeFacts
        The model's size facts.
    batch : int
        Number of samples B in the batch.
    keep_heads : bool, optional
        The method keeps per-head matrices.
    batch_size : int, optional
        Sequences the batched or ablated passes run at a time.

    Returns
    -------
    int
        Samples per piece, in ``1 .. batch``.
    """
    if budget_bytes == math.inf or estimate(p, f, batch, keep_heads, batch_size) <= budget_bytes:
        return batch
    room = budget_bytes - fixed(p, f, batch_size)
    return max(1, min(batch, int(room // max(per_sample(p, f, keep_heads), 1))))


__all__ = [
    "SizeFacts",
    "Profile",
    "ABLATED_PASS",
    "SAFETY_FRACTION",
    "facts_of",
    "per_sample",
    "fixed",
    "estimate",
    "parse_max_memory",
    "available",
    "budget",
    "piece_size",
]
