"""The public calls: ``explain(model, inputs, method=..., target=...)``, ``concept_target`` and
``attention_parts``.

Each call only wires the seams together: the adapter (:mod:`lrp_core.adapters`: validation, modality,
readout, what is per sample), the method registry and its options (:mod:`lrp_core.methods.registry`), the
targets (:mod:`lrp_core.methods.targets`), the pieces a batch is explained in (:mod:`lrp_core.runtime.pieces`) and
the model guard (:mod:`lrp_core.runtime.guard`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from .adapters import EmbeddingTarget, get_adapter, verification, with_target
from .adapters.batches import DecoderBatch, TextBatch
from .errors import InputError, UnsupportedModelError
from .explanation import Explanation, result_fields
from .methods import registry
from .methods.call import Call, ConceptTarget, Contrast, one_hot
from .methods.options import Shared
from .methods.registry import MethodLike
from .methods.targets import Target, goal, resolver
from .rules.composites import TRANSFORMER_ATTRIBUTION
from .runtime import pieces
from .runtime.devices import at_entry, moved
from .runtime.fast_half import FAST, check_method, lifted_fields
from .runtime.guard import model_guard, public_call
from .runtime.memory import MaxMemory
from .sources import SourcesLike, by_source, in_columns

#: Every token-map method ``explain`` knows, in the order the course introduces them.
METHODS: tuple[str, ...] = registry.METHOD_NAMES
#: The methods that score sources (``sources=`` given; decoder language models): leave-one-out, ContextCite.
SOURCE_METHODS: tuple[str, ...] = registry.SOURCE_METHOD_NAMES


@public_call
def explain(
    model: nn.Module,
    inputs: Any,
    method: MethodLike = "transformer_attribution",
    target: Target = None,
    *,
    progress: Optional[bool] = None,
    position: Union[int, Sequence[int], Tensor, None] = None,
    sources: Optional[SourcesLike] = None,
    max_memory: MaxMemory = None,
    chunk_size: Optional[int] = None,
    dtype: Optional[torch.dtype] = None,
    low_memory: Optional[bool] = None,
    unverified: Optional[bool] = None,
    **options: Any,
) -> Explanation:
    """Explain a batch of predictions of an unmodified timm / Hugging Face Transformer.

    ``method`` is a method object (``IntegratedGradients(n_steps=32)``, its options typed on its class,
    :mod:`lrp_core.methods.objects`) or its name with the same options as keywords
    (``method="integrated_gradients", n_steps=32``: the same call). The keyword-only parameters below are the
    options every method takes; ``None`` means the default.

    Parameters
    ----------
    model : nn.Module
        A supported model (:data:`lrp_core.adapters.SUPPORTED`), also inside ``torch.compile`` /
        ``DataParallel`` / ``DistributedDataParallel``. What the call changes (through the user's hooks) is
        undone; what other threads change meanwhile stays (:mod:`lrp_core.runtime.guard`). Forward hooks on
        modules the replay does not run are named in an :class:`~lrp_core.errors.UnreflectedHookWarning`.
        The call works the same inside ``torch.no_grad()`` and ``torch.inference_mode()``.
    inputs : Tensor (B, 3, H, W) or Mapping[str, Tensor]
        Images, float (another float dtype is cast to the model's), or a tokenizer output with ``input_ids``
        (B, T) and a 0/1 ``attention_mask`` (B, T).
    method : str or Method
        A method object, its class, or the name of one of :data:`METHODS` or of :data:`SOURCE_METHODS`
        (``leave_one_out``, ``context_cite``: they score the ``sources`` of a decoder language model's context
        by removing them).
    target : None, int, sequence of B ints, Tensor (B,), Contrast or ConceptTarget
        ``None`` (argmax per sample), an int (Python or NumPy), a sequence / array of B ints, an integer tensor
        (B,) — floats and bools are refused (:mod:`lrp_core.methods.targets`); ``Contrast(positive, negative)``
        (explain ``y_positive − y_negative``: "this class rather than that one"); or, for the methods that take
        one (``cdam``), a :class:`ConceptTarget` from :func:`concept_target`. A question-answering head takes
        ``"start"`` (default) or ``"end"`` (one for all rows or one per row); a multiple-choice head the choice
        (default: the top one); a token classifier / masked LM the class / vocabulary entry at ``position``.
    progress : bool, optional
        A progress bar (True), none (False); default only for long runs.
    position : int, sequence of B ints or Tensor (B,), optional
        The token whose prediction is explained, one for all rows or one per row (negative counts from the end):
        decoder language models (default: each row's last real token) and per-token task heads (token
        classification and masked LM: required; question answering: default the argmax of the explained logit).
    sources : list of (start, end), list of such lists, or Tensor (S, 2) / (B, S, 2), optional
        Text only: token spans (half-open) of the context's sources — documents, sentences, marked passages —
        counted from each row's first real token (special tokens included), one list for every row or one per
        row (the same number S each); :func:`lrp_core.sources.sentences` and :func:`lrp_core.sources.documents`
        find them in a text. Fills ``sources`` (B, S): the sum of the token scores over each span (the source
        methods: their own scores). On a decoder a source ends before the explained token.
    max_memory : int, float or str, optional
        The memory the call may use. ``None`` / ``"auto"`` (default): half of what the device of the model has
        free (CPU: ``MemAvailable``; CUDA: ``torch.cuda.mem_get_info``); an int (bytes) or a string such as
        ``"512MB"`` / ``"2GiB"``; ``float("inf")`` / ``"none"``: never split. A batch whose estimated peak
        (:func:`lrp_core.runtime.memory.estimate`) exceeds it is explained in pieces of as many samples as fit
        (at least one) and the results merged in batch order — every field, as if explained at once. Each piece
        gets exactly the arithmetic of being explained alone; against the whole batch at once it may differ by
        round-off, as a batch does from its samples one by one (docs/ARCHITECTURE.md, "Memory and pieces").
    chunk_size : int, optional
        Explain in pieces of at most this many samples (an int ≥ 1) instead; giving it together with an explicit
        ``max_memory`` is an error. Padded text is grouped by length first (each group explained unpadded,
        docs/METHODS.md §5.8), then each group is cut into pieces.
    dtype : torch.dtype, optional
        ``torch.float64`` computes every pass (the replay, the relevance and gradient passes) of a float32 or
        half-precision model in float64, without copying or changing it — what ``model.double()`` would give.
        Plain LRP and transformer attribution are ill-conditioned in float32 (docs/METHODS.md §5.10).
        ``None`` (default): the model's own precision, half models in float32 (exact: ``model.float()``'s
        result). A half model's own dtype (``torch.bfloat16`` on a bfloat16 model, ``torch.float16`` on a float16
        one) is the fast half mode: the forward and the matrix products in that dtype, the rules' divisions,
        norms, softmax gradient and the per-token sums in float32 (docs/METHODS.md §5.9, "The fast half mode":
        maps within 1–4 % (bfloat16) / 0.1–0.4 % (float16) of the float32 ones); for ``attnlrp``, ``cp_lrp``,
        ``pa_lrp`` and ``input_x_gradient`` only, the others refused.
    low_memory : bool, optional
        AttnLRP and CP-LRP: ``True`` runs the blockwise relevance pass — each block's graph built again from its
        input and freed before the next, explicit attention in query chunks — so the pass holds L block inputs
        and one block's tensors, never every block's (B, H, T, T) maps (docs/ARCHITECTURE.md, "Memory and
        pieces"); ``False`` the full pass; ``None`` (default): blockwise where the full pass's predicted peak
        (:func:`lrp_core.runtime.pass_memory.full_pass`) exceeds the memory budget (``max_memory``).
        ``Explanation.options["relevance_pass"]`` is ``"blockwise"`` where it ran. Other methods refuse ``True``.
    unverified : bool, optional
        ``True`` skips the end-to-end check. By default every call compares the logits the method read from
        the replay with the model's own forward on the same inputs (one forward without gradients, in eval
        semantics and the call's precision) and refuses, with an :class:`~lrp_core.errors.UnsupportedModelError`
        naming the deviation and the first block that departs, when they differ by more than 1e-5 relative in
        float32 (1e-10 in float64; half models are compared in float32; the fast half mode 5e-2 in bfloat16,
        1e-2 in float16) — docs/CONTRACTS.md, "Verification on
        every call". Skipping it saves that forward (benchmarks) and risks an explanation of a model the replay
        misreads, silently.
    **options
        With a method name: the method's own options (the fields of its class, e.g. ``n_steps``, ``baseline``
        for ``integrated_gradients``). A keyword the method does not own is an
        :class:`~lrp_core.errors.InputError` naming the method's options; with a method object, its options are
        its fields and no keyword is accepted here.

    Returns
    -------
    Explanation
        ``scores`` (B, T), ``target`` (B,), ``logits`` (B, C), and the fields the method fills (its class's
        ``returns``: ``layers`` (B, L, N, N), ``pixels`` (B, H, W), ...); ``options`` holds the options the
        method used.
    """
    shared = dict(
        progress=progress,
        position=position,
        sources=sources,
        max_memory=max_memory,
        chunk_size=chunk_size,
        dtype=dtype,
        low_memory=low_memory,
        unverified=unverified,
    )
    return _explain(model, inputs, method, target, options, shared)


def _explain(
    model: nn.Module, inputs: Any, method: MethodLike, target: Any, options: dict[str, Any], shared: dict[str, Any]
) -> Explanation:
    """``explain`` with the method's keywords ``options`` and the shared ones ``shared`` gathered."""
    name = registry.name_of(method)
    adapter = get_adapter(model).for_inputs(inputs)
    if name in adapter.refused_methods:
        runs = [m for m in registry.METHODS if m not in adapter.refused_methods]
        raise UnsupportedModelError(
            f"method {name!r} is not defined on {type(model).__name__}: "
            f"{adapter.refused_methods[name]}. Methods that run on it: {', '.join(runs)}"
        )
    prepared, home = at_entry(model, adapter.check_inputs(inputs), inputs)  # a split model: the batch where it enters
    if isinstance(target, EmbeddingTarget):  # the readout ends in the target's projection of the embedding
        adapter, target = with_target(adapter, target), target.class_ids(prepared.size)
    bound = registry.bound(method, options, adapter)
    run = Shared(**shared)
    if run.low_memory and not bound.blockwise:
        have = [m for m in registry.METHODS if getattr(registry.get(m), "blockwise", False)]
        raise InputError(
            f"low_memory=True: method {name!r} has no blockwise relevance pass; the methods that have one: "
            f"{', '.join(have)} (None or False runs {name!r} as usual)"
        )
    if run.dtype in FAST:  # the fast half mode runs the methods whose steps were checked in half precision
        check_method(name, run.dtype)
    # the token read (decoders, per-token task heads) and the target in class ids (question answering: start / end)
    prepared, target = adapter.task_inputs(prepared, run.position, target)
    layout = adapter.layout(prepared)  # after the position: the layout names the token read (token ablation skips it)
    if run.sources is not None:  # the spans as columns of this batch, checked against its rows
        if not isinstance(prepared, TextBatch) or layout.output_start != 0:
            raise InputError("sources are token spans of a text; this model explains images")
        read = prepared.read if isinstance(prepared, DecoderBatch) else None
        run = replace(run, sources=in_columns(run.sources, prepared.attention_mask, read))
    readout = adapter.readout_for(prepared)
    aim = goal(bound, target, prepared.size, readout.num_classes, type(model).__name__)
    call = Call(adapter, prepared, layout, aim.resolve, bound, run, aim.concept, aim.negative, readout)
    plan = pieces.plan(adapter, prepared, bound, run)
    result = pieces.run(call, plan)
    if not run.unverified:  # the replay's logits against the model's own forward (lrp_core.adapters.verification)
        verification.check(adapter, prepared, result.logits, plan)
    result = adapter.task_result(prepared, result)  # question answering, multiple choice: the task's shapes
    if run.dtype in FAST:  # the fast half mode returns float32 tensors too (the half logits upcast, exactly)
        result = lifted_fields(result)
    used = dict(result.used)
    if run.sources is not None and result.sources is None:  # a token-map method: its scores summed per source
        result.sources = by_source(result.scores.detach(), run.sources.to(result.scores.device))
    if aim.negative is not None:
        used["contrast_with"] = aim.negative.tolist()
    explanation = Explanation(
        method=name,
        grid=layout.grid,
        image_size=layout.image_size,
        start_layer=used.get("start_layer"),
        attention_mask=layout.mask,
        image_tokens=layout.image_tokens,
        source_length=layout.source_tokens,
        options=used,
        **result_fields(result),
    )
    return explanation if home is None else moved(explanation, home)  # where the inputs came from


@public_call
def concept_target(model: nn.Module, examples: Any, name: str = "concept") -> ConceptTarget:
    """A CDAM concept target: the mean final [CLS] embedding of a few example inputs.

    Parameters
    ----------
    model : nn.Module
        a supported model.
    examples : Any
        images (K, 3, H, W) or a tokenizer output for K texts.
    name : str, optional
        An optional label for plots.

    Returns
    -------
    ConceptTarget
        The concept: its (D,) mean embedding, the number of examples and the name.
    """
    adapter = get_adapter(model).for_inputs(examples)
    prepared, home = at_entry(model, adapter.check_inputs(examples), examples)
    with torch.no_grad():
        pooled = adapter.forward(prepared, grad=False).pooled
    pooled = pooled if home is None else pooled.to(home)
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

    Parameters
    ----------
    model : nn.Module
        A supported model with a classification head.
    inputs : Any
        Images (B, 3, H, W) or a tokenizer output, as :func:`explain` takes them.
    target : Target, optional
        The classes to explain: ``None`` (each sample's top class), an id for all
        samples, or one per sample.

    Returns
    -------
    AttentionParts
        (B, L, H, N, N) attention, gradient and relevance per block and head; the
        explained class (B,) and the logits (B, C).

    Raises
    ------
    InputError
        If the model has no classification head (or the inputs or target are refused).
    """
    adapter = get_adapter(model).for_inputs(inputs)
    if adapter.num_classes == 0:
        raise InputError(f"{type(model).__name__} has no classification head: there is no class to explain")
    prepared, home = at_entry(model, adapter.check_inputs(inputs), inputs)
    readout = adapter.readout_for(prepared)
    resolve = resolver(target, prepared.size, readout.num_classes)
    trace = adapter.forward(prepared, grad=True, readout=readout, composite=TRANSFORMER_ATTRIBUTION)
    verification.check(adapter, prepared, trace.logits, [pieces.Piece(torch.arange(prepared.size), None)])
    t = resolve(trace.logits.detach())
    L = adapter.num_blocks
    attns = [trace.attention(b) for b in range(L)]
    assert trace.replay is not None  # the explicit replay: ∇A on its graph, then its relevance pass
    with trace.replay.plain_gradients():
        grads = torch.autograd.grad(trace.logits.gather(1, t[:, None]).sum(), attns, retain_graph=True)
    rel = adapter.relprop(trace, one_hot(trace.logits.detach(), t), TRANSFORMER_ATTRIBUTION, stop_block=0)
    device = trace.logits.device  # a split model's blocks: each map where its block computed
    stack = lambda ts: torch.stack([x.detach().to(device) for x in ts], dim=1)  # noqa: E731
    parts = AttentionParts(
        attention=stack(attns), gradient=stack(grads), relevance=stack(rel.attn), target=t, logits=trace.logits.detach()
    )
    return parts if home is None else moved(parts, home)


__all__ = [
    "explain",
    "METHODS",
    "SOURCE_METHODS",
    "concept_target",
    "ConceptTarget",
    "Contrast",
    "model_guard",
    "attention_parts",
    "AttentionParts",
]
