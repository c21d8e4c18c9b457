"""The public call: ``explain(model, inputs, method=..., target=...)``."""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, Callable, Optional, TypeVar

import torch
from torch import Tensor, nn

from . import memory, registry
from .adapters import get_adapter
from .composites import TRANSFORMER_ATTRIBUTION
from .errors import InputError
from .explanation import RESULT_FIELDS, Conservation, Explanation, ResultField, result_fields
from .guard import autograd_on, inference_model_named, model_guard, normal_tensors, warn_unreflected_hooks
from .methods import Call, ConceptTarget, Contrast, MethodResult, one_hot
from .precision import compute_precision
from .targets import Target
from .targets import resolver as _target_resolver
from .utils import progress_bar
from .wrappers import unwrap

#: Every method ``explain`` knows, in the order the course introduces them.
METHODS: tuple[str, ...] = registry.METHOD_NAMES

F = TypeVar("F", bound=Callable[..., Any])


def _robust(fn: F) -> F:
    """The same footing for every public call (``explain``, ``concept_target``, ``attention_parts``):

    * wrappers are looked through (``torch.compile``, ``DataParallel``, ``DistributedDataParallel``;
      :func:`lrp_core.wrappers.unwrap`), TorchScript is refused;
    * gradients are recorded whatever the caller's context (``no_grad``, ``inference_mode``), and inputs
      made under ``inference_mode`` are cloned into ordinary tensors (:mod:`lrp_core.guard`);
    * the model is left as found (:func:`lrp_core.guard.model_guard`, also on error), and forward hooks on
      modules the replay does not run are named in an :class:`~lrp_core.errors.UnreflectedHookWarning`.
    """
    @functools.wraps(fn)
    def call(model, inputs, *args, **kwargs):
        if not isinstance(model, nn.Module):
            return fn(model, inputs, *args, **kwargs)  # get_adapter names what is supported
        model = unwrap(model)
        with autograd_on(), inference_model_named(model):
            # compute_precision: fp16 / bf16 models and autocast are computed in float32 (lrp_core.precision)
            with model_guard(model) as seen, compute_precision(model):
                out = fn(model, normal_tensors(inputs), *args, **kwargs)
        warn_unreflected_hooks(seen, stacklevel=3)
        return out
    return call  # type: ignore[return-value]


@_robust
def explain(model: nn.Module, inputs: Any, method: str = "transformer_attribution", target: Target = None,
            **options: Any) -> Explanation:
    """Explain a batch of predictions of an unmodified timm / Hugging Face Transformer.

    Args:
        model: a supported model (:data:`lrp_core.adapters.SUPPORTED`), also inside ``torch.compile`` /
            ``DataParallel`` / ``DistributedDataParallel``. What the call changes (through the user's hooks) is
            undone; what other threads change meanwhile stays (:mod:`lrp_core.guard`). Forward hooks on
            modules the replay does not run are named in an :class:`~lrp_core.errors.UnreflectedHookWarning`.
            The call works the same inside ``torch.no_grad()`` and ``torch.inference_mode()``.
        inputs: images (B, 3, H, W) float (another float dtype is cast to the model's), or a tokenizer output
            with ``input_ids`` and a 0/1 ``attention_mask``.
        method: one of :data:`METHODS`.
        target: ``None`` (argmax per sample), an int (Python or NumPy), a sequence / array of B ints, an integer
            tensor (B,) — floats and bools are refused (:mod:`lrp_core.targets`),
            ``Contrast(positive, negative)`` (explain ``y_positive − y_negative``: "this class rather than that
            one"), or — for methods that take one (``cdam``) — a :class:`ConceptTarget` from
            :func:`concept_target`.
        **options: the options the method takes (``lrp_core.registry.METHODS[method].options``); any other
            option is an error naming the accepted ones. ``start_layer`` (first block in the layer product,
            default 0; negative counts from the end), ``end_layer`` (last block, default the last),
            ``rollout_norm`` ("none" | "row"; default "none" for images, "row" for text), ``use_gradient``
            (default True; False is the paper's ablation), ``keep_heads`` (also return the per-head matrices),
            ``batch_size`` (sequences per forward pass in ``token_ablation``). Every method also takes
            ``progress`` (a progress bar; ``None``: only for long runs), ``max_memory`` and ``chunk_size``.
        max_memory: the memory the call may use. ``None`` / ``"auto"`` (default): half of what the device of
            the model has free (CPU: ``MemAvailable``; CUDA: ``torch.cuda.mem_get_info``); an int (bytes) or a
            string such as ``"512MB"`` / ``"2GiB"``; ``float("inf")`` / ``"none"``: never split. A batch whose
            estimated peak (:func:`lrp_core.memory.estimate`) exceeds it is explained in pieces of as many
            samples as fit (at least one) and the results merged in batch order — every field, as if explained
            at once. Each piece gets exactly the arithmetic of being explained alone; against the whole batch
            at once it may differ by round-off, as a batch does from its samples one by one (the BLAS kernels
            depend on the number of rows; docs/ARCHITECTURE.md, "Memory and pieces").
        chunk_size: explain in pieces of at most this many samples (an int ≥ 1) instead; giving it together
            with an explicit ``max_memory`` is an error. Padded text is grouped by length first (each group
            explained unpadded, docs/METHODS.md §5.8), then each group is cut into pieces.

    Returns:
        An :class:`Explanation` with ``scores`` (B, T) and what the method aggregated.
    """
    spec = registry.get(method)
    adapter = get_adapter(model).for_inputs(inputs)
    prepared = adapter.check_inputs(inputs)
    layout = adapter.layout(prepared)
    opt = registry.parse_options(spec, options, adapter.num_blocks, adapter.modality)
    if opt.position is not None:  # decoders: explain the prediction at another token
        prepared = adapter.at_position(prepared, opt.position)
    readout = adapter.readout_for(prepared)
    num_classes = readout.num_classes
    batch = adapter.batch_size(prepared)
    concept = target if isinstance(target, ConceptTarget) else None
    if concept is not None and not spec.concept_target:
        takers = [n for n, s in registry.METHODS.items() if s.concept_target]
        raise InputError(f"a concept target works with method={takers[0]!r} only, not {method!r}")
    if concept is None and num_classes == 0 and not spec.class_agnostic:
        raise InputError(f"{type(model).__name__} has no classification head: explain it with a class-agnostic "
                         f"method ({', '.join(registry.CLASS_AGNOSTIC)}) or with method='cdam' and a concept target "
                         "(lrp_core.concept_target)")
    negative = None
    if isinstance(target, Contrast):
        if spec.class_agnostic:
            raise InputError(f"{method!r} does not depend on the target class, so a contrast explains nothing; "
                             "use a class-sensitive method")
        if target.negative is None:
            raise InputError("Contrast(positive, negative) needs the class to contrast with (negative), e.g. "
                             "Contrast(positive=None, negative=3): the prediction rather than class 3")
        negative = _target_resolver(target.negative, batch, num_classes)(torch.empty(0))
        target = target.positive
    resolve = _target_resolver(target if concept is None else None, batch, num_classes)
    pieces = _pieces(prepared, adapter, method, opt, batch)
    if len(pieces) == 1 and pieces[0][1] is None:  # the whole batch at once, as given
        result = spec.run(Call(adapter, prepared, layout, resolve, opt, concept, negative, readout))
    else:
        parts = []
        for rows, n in progress_bar(pieces, opt.progress or (opt.progress is None and len(pieces) >= 16),
                                    desc=method, unit="piece", leave=False):
            sub = adapter.take(prepared, rows, n)
            call = Call(adapter, sub, adapter.layout(sub), _sub_resolver(resolve, rows), opt, concept,
                        None if negative is None else negative.to(rows.device)[rows])
            parts.append((rows, n, spec.run(call)))
        result = _merge(parts, batch, layout.num_tokens if adapter.modality == "text" else None)
    used = dict(result.used)
    if negative is not None:
        used["contrast_with"] = negative.tolist()
    return Explanation(method=method, grid=layout.grid, image_size=layout.image_size,
                       start_layer=used.get("start_layer"), attention_mask=layout.mask, options=used,
                       **result_fields(result))


def _length_groups(prepared: dict) -> Optional[list[tuple[Tensor, int]]]:
    """Right-padded text of several lengths: the samples grouped by length, else ``None``.

    Each group is explained without padding, so every sample gets exactly the
    arithmetic of explaining it alone: relevance passes amplify round-off, and
    padding changes the length of the reductions (softmax, A·V) and hence
    their rounding.
    """
    mask = prepared["attention_mask"]
    lengths = mask.sum(dim=1)
    T = mask.shape[1]
    prefix = (torch.arange(T, device=mask.device)[None, :] < lengths[:, None]).long()
    if not torch.equal(mask, prefix) or bool((lengths == T).all()):
        return None  # no padding, or not right-padded (positions would shift if trimmed)
    return [(torch.nonzero(lengths == n).flatten(), int(n)) for n in lengths.unique().tolist()]


def _pieces(prepared: dict, adapter, method: str, opt, batch: int) -> list[tuple[Tensor, Optional[int]]]:
    """The pieces a batch is explained in: ``(rows, n)`` — sample indices, and the length the text is trimmed
    to (``None``: not trimmed).

    Right-padded text of several lengths is first grouped by length (:func:`_length_groups`); each group
    (or the whole batch) is then cut into runs of at most ``k`` consecutive samples: ``k = chunk_size``
    if given, else as many as fit ``max_memory`` by :mod:`lrp_core.memory`'s estimate (at least one).
    """
    groups = _length_groups(prepared) if adapter.modality == "text" else None
    if groups is None:
        groups = [(torch.arange(batch), None)]  # indices; moved to each tensor's device where they index it
    budget = None
    if opt.chunk_size is None:
        budget = memory.budget(opt.max_memory, adapter.blocks[0].attn.proj.weight.device)
    pieces = []
    for rows, n in groups:
        if opt.chunk_size is not None:
            k = opt.chunk_size
        else:
            facts = memory.facts_of(adapter, prepared, tokens=n)
            k = memory.piece_size(budget, method, facts, len(rows), keep_heads=opt.keep_heads,
                                  batch_size=opt.batch_size)
        pieces += [(part, n) for part in rows.split(k)]
    return pieces


def _take(prepared: dict, rows: Tensor, n: Optional[int]) -> dict:
    """The samples ``rows`` of a prepared batch, text trimmed to ``n`` tokens (``None``: as is).

    Images: only ``images`` is per sample (CLIP's prompts are shared by the whole batch); text: every entry.
    """
    if "images" in prepared:
        return {k: (v[rows.to(v.device)] if k == "images" else v) for k, v in prepared.items()}
    cut = slice(None) if n is None else slice(0, n)
    return {k: (None if v is None else v[rows.to(v.device), cut]) for k, v in prepared.items()}


def _sub_resolver(resolve, rows: Tensor):
    return lambda logits: resolve(logits, rows)


def _merge(parts: list, batch: int, T: Optional[int]):
    """Scatter the results of the pieces back into (B, ...) tensors in batch order.

    ``parts``: ``(rows, n, MethodResult)`` per piece. Every field of
    :data:`~lrp_core.explanation.RESULT_FIELDS` is merged by its own rule: text (``T`` the padded length):
    its ``token_axes`` trailing axes are zero-padded from ``n`` back to ``T``; images (``T`` is ``None``):
    every piece has the whole token axes. ``conservation`` is merged total by total.
    """
    first = parts[0][2]

    def gather(f: ResultField):
        like = getattr(first, f.name)
        if like is None:
            return None
        if isinstance(like, Conservation):
            return _merge_conservation(parts, batch)
        pad_dims = 0 if T is None else f.token_axes
        shape = (batch,) + tuple(like.shape[1:like.dim() - pad_dims]) + (T,) * pad_dims
        out = torch.zeros(shape, dtype=like.dtype, device=like.device)
        for rows, n, res in parts:
            idx = (rows.to(out.device),) + (slice(None),) * (like.dim() - 1 - pad_dims) + (slice(0, n),) * pad_dims
            out[idx] = getattr(res, f.name).to(out.device)
        return out

    return MethodResult(**{f.name: gather(f) for f in RESULT_FIELDS}, used=first.used)


def _merge_conservation(parts: list, batch: int) -> Optional[Conservation]:
    """The per-sample totals of each piece, back in batch order."""
    first = parts[0][2].conservation
    if first is None:
        return None
    totals = {}
    for name in (f.name for f in fields(Conservation)):
        like = getattr(first, name)
        if like is None:
            totals[name] = None
            continue
        out = torch.empty((batch,) + tuple(like.shape[1:]), dtype=like.dtype, device=like.device)
        for rows, _, res in parts:
            out[rows.to(out.device)] = getattr(res.conservation, name)
        totals[name] = out
    return Conservation(**totals)


@_robust
def concept_target(model: nn.Module, examples: Any, name: str = "concept") -> ConceptTarget:
    """A CDAM concept target: the mean final [CLS] embedding of a few example inputs.

    Args:
        model: a supported model.
        examples: images (K, 3, H, W) or a tokenizer output for K texts.
    """
    adapter = get_adapter(model).for_inputs(examples)
    prepared = adapter.check_inputs(examples)
    with torch.no_grad():
        pooled = adapter.forward(prepared, grad=False).pooled
    return ConceptTarget(vector=pooled.mean(dim=0), n_examples=pooled.shape[0], name=name)


@dataclass
class AttentionParts:
    """The ingredients of ``transformer_attribution`` for every block, before they are combined.

    Attributes:
        attention: (B, L, H, N, N) A_b after softmax.
        gradient: (B, L, H, N, N) ∇A_b = ∂y_t/∂A_b.
        relevance: (B, L, H, N, N) R^{A_b}, the relevance of A_b (Chefer et al. rules).
        target: (B,) the explained class; logits: (B, C).
    """

    attention: Tensor
    gradient: Tensor
    relevance: Tensor
    target: Tensor
    logits: Tensor


@_robust
def attention_parts(model: nn.Module, inputs: Any, target: Target = None) -> AttentionParts:
    """A_b, ∇A_b and R^{A_b} per block and head — what ``transformer_attribution`` multiplies and clamps.

    For teaching and inspection: ``(gradient * relevance).clamp(min=0).mean(2)`` is ``explain(...).layers``.
    """
    adapter = get_adapter(model).for_inputs(inputs)
    if adapter.num_classes == 0:
        raise InputError(f"{type(model).__name__} has no classification head: there is no class to explain")
    prepared = adapter.check_inputs(inputs)
    readout = adapter.readout_for(prepared)
    resolve = _target_resolver(target, adapter.batch_size(prepared), readout.num_classes)
    trace = adapter.forward(prepared, grad=True, readout=readout)
    t = resolve(trace.logits.detach())
    L = adapter.num_blocks
    attns = [trace.attention(b) for b in range(L)]
    grads = torch.autograd.grad(trace.logits.gather(1, t[:, None]).sum(), attns)
    with torch.no_grad():
        rel = adapter.relprop(trace, one_hot(trace.logits, t), TRANSFORMER_ATTRIBUTION, stop_block=0)
    stack = lambda ts: torch.stack([x.detach() for x in ts], dim=1)  # noqa: E731
    return AttentionParts(attention=stack(attns), gradient=stack(grads), relevance=stack(rel.attn),
                          target=t, logits=trace.logits.detach())


# ----------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------
def _batch_tensor(prepared: dict) -> Tensor:
    return prepared["images"] if "images" in prepared else prepared["input_ids"]


def _batch_size(prepared: dict) -> int:
    return _batch_tensor(prepared).shape[0]


__all__ = ["explain", "METHODS", "concept_target", "ConceptTarget", "Contrast", "model_guard", "attention_parts",
           "AttentionParts"]
