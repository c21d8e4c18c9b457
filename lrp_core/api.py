"""The public calls: ``explain(model, inputs, method=..., target=...)``, ``concept_target`` and
``attention_parts``.

Each call only wires the seams together: the adapter (:mod:`lrp_core.adapters`: validation, modality,
readout, what is per sample), the method registry and its options (:mod:`lrp_core.methods.registry`), the
targets (:mod:`lrp_core.methods.targets`), the pieces a batch is explained in (:mod:`lrp_core.runtime.pieces`) and
the model guard (:mod:`lrp_core.runtime.guard`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .adapters import get_adapter
from .errors import InputError
from .explanation import Explanation, result_fields
from .methods import registry
from .methods.call import Call, ConceptTarget, Contrast, one_hot
from .methods.targets import Target, goal, resolver
from .rules.composites import TRANSFORMER_ATTRIBUTION
from .runtime import pieces
from .runtime.guard import model_guard, public_call

#: Every method ``explain`` knows, in the order the course introduces them.
METHODS: tuple[str, ...] = registry.METHOD_NAMES


@public_call
def explain(model: nn.Module, inputs: Any, method: str = "transformer_attribution", target: Target = None,
            **options: Any) -> Explanation:
    """Explain a batch of predictions of an unmodified timm / Hugging Face Transformer.

    Args:
        model: a supported model (:data:`lrp_core.adapters.SUPPORTED`), also inside ``torch.compile`` /
            ``DataParallel`` / ``DistributedDataParallel``. What the call changes (through the user's hooks) is
            undone; what other threads change meanwhile stays (:mod:`lrp_core.runtime.guard`). Forward hooks on
            modules the replay does not run are named in an :class:`~lrp_core.errors.UnreflectedHookWarning`.
            The call works the same inside ``torch.no_grad()`` and ``torch.inference_mode()``.
        inputs: images (B, 3, H, W) float (another float dtype is cast to the model's), or a tokenizer output
            with ``input_ids`` and a 0/1 ``attention_mask``.
        method: one of :data:`METHODS`.
        target: ``None`` (argmax per sample), an int (Python or NumPy), a sequence / array of B ints, an integer
            tensor (B,) — floats and bools are refused (:mod:`lrp_core.methods.targets`),
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
            estimated peak (:func:`lrp_core.runtime.memory.estimate`) exceeds it is explained in pieces of as many
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
    registry.check_model(spec, adapter)
    prepared = adapter.check_inputs(inputs)
    opt = registry.parse_options(spec, options, adapter.num_blocks, registry.defaults_key(adapter))
    if opt.position is not None:  # decoders: explain the prediction at another token
        prepared = adapter.at_position(prepared, opt.position)
    layout = adapter.layout(prepared)  # after the position: the layout names the token read (token ablation skips it)
    readout = adapter.readout_for(prepared)
    aim = goal(spec, target, adapter.batch_size(prepared), readout.num_classes, type(model).__name__)
    call = Call(adapter, prepared, layout, aim.resolve, opt, aim.concept, aim.negative, readout)
    result = pieces.run(spec, call, pieces.plan(adapter, prepared, spec.memory, opt))
    used = dict(result.used)
    if aim.negative is not None:
        used["contrast_with"] = aim.negative.tolist()
    return Explanation(method=method, grid=layout.grid, image_size=layout.image_size,
                       start_layer=used.get("start_layer"), attention_mask=layout.mask, options=used,
                       **result_fields(result))


@public_call
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


@public_call
def attention_parts(model: nn.Module, inputs: Any, target: Target = None) -> AttentionParts:
    """A_b, ∇A_b and R^{A_b} per block and head — what ``transformer_attribution`` multiplies and clamps.

    For teaching and inspection: ``(gradient * relevance).clamp(min=0).mean(2)`` is ``explain(...).layers``.
    """
    adapter = get_adapter(model).for_inputs(inputs)
    if adapter.num_classes == 0:
        raise InputError(f"{type(model).__name__} has no classification head: there is no class to explain")
    prepared = adapter.check_inputs(inputs)
    readout = adapter.readout_for(prepared)
    resolve = resolver(target, adapter.batch_size(prepared), readout.num_classes)
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


__all__ = ["explain", "METHODS", "concept_target", "ConceptTarget", "Contrast", "model_guard", "attention_parts",
           "AttentionParts"]
