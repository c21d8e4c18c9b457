"""The public calls: ``explain(model, inputs, method=..., target=...)``, ``concept_target`` and
``attention_parts``.

Each call only wires the seams together: the adapter (:mod:`lrp_core.adapters`: validation, modality,
readout, what is per sample), the method registry and its options (:mod:`lrp_core.methods.registry`), the
targets (:mod:`lrp_core.methods.targets`), the pieces a batch is explained in (:mod:`lrp_core.runtime.pieces`) and
the model guard (:mod:`lrp_core.runtime.guard`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, NoReturn, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from .adapters import get_adapter, verification
from .errors import InputError, UnsupportedModelError
from .explanation import Explanation, result_fields
from .methods import registry
from .methods.call import Call, ConceptTarget, Contrast, one_hot
from .methods.options import OPTIONS
from .methods.targets import Target, goal, resolver
from .rules.composites import TRANSFORMER_ATTRIBUTION, Composite
from .runtime import pieces
from .runtime.guard import model_guard, public_call
from .runtime.memory import MaxMemory
from .sources import SourcesLike, by_source, in_columns

#: Every token-map method ``explain`` knows, in the order the course introduces them.
METHODS: tuple[str, ...] = registry.METHOD_NAMES
#: The methods that score sources (``sources=`` given; decoder language models): leave-one-out, ContextCite.
SOURCE_METHODS: tuple[str, ...] = registry.SOURCE_METHOD_NAMES
#: The options ``explain`` takes as keyword-only parameters: the fields of :class:`~lrp_core.methods.options.Options`.
OPTION_NAMES: frozenset[str] = frozenset(o.name for o in OPTIONS)


@public_call
def explain(
    model: nn.Module,
    inputs: Any,
    method: str = "transformer_attribution",
    target: Target = None,
    *,
    start_layer: Optional[int] = None,
    end_layer: Optional[int] = None,
    rollout_norm: Optional[Literal["none", "row"]] = None,
    use_gradient: Optional[bool] = None,
    keep_heads: Optional[bool] = None,
    batch_size: Optional[int] = None,
    n_steps: Optional[int] = None,
    baseline: Union[Literal["zeros", "blur", "pad", "mask"], int, None] = None,
    n_samples: Optional[int] = None,
    stdevs: Optional[float] = None,
    seed: Optional[int] = None,
    base: Optional[Literal["attnlrp", "cp_lrp", "cp_halved"]] = None,
    composite: Optional[Composite] = None,
    progress: Optional[bool] = None,
    position: Union[int, Sequence[int], Tensor, None] = None,
    max_memory: MaxMemory = None,
    chunk_size: Optional[int] = None,
    sources: Optional[SourcesLike] = None,
    n_ablations: Optional[int] = None,
    keep_prob: Optional[float] = None,
    alpha: Optional[float] = None,
    filler: Optional[int] = None,
    dtype: Optional[torch.dtype] = None,
    unverified: Optional[bool] = None,
    **unknown: NoReturn,
) -> Explanation:
    """Explain a batch of predictions of an unmodified timm / Hugging Face Transformer.

    Every option is keyword-only and ``None`` by default, which means the method's default (per input
    modality where the method has one, ``MethodSpec.defaults``). A method takes the options listed for it below
    and the six every method takes (``progress``, ``position``, ``max_memory``, ``chunk_size``, ``dtype``,
    ``unverified``); any other
    option, or a misspelled one, is an :class:`~lrp_core.errors.InputError` naming the accepted ones.

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
    method : str
        One of :data:`METHODS`, or of :data:`SOURCE_METHODS` (``leave_one_out``, ``context_cite``: they score the
        ``sources`` of a decoder language model's context by removing them).
    target : None, int, sequence of B ints, Tensor (B,), Contrast or ConceptTarget
        ``None`` (argmax per sample), an int (Python or NumPy), a sequence / array of B ints, an integer tensor
        (B,) — floats and bools are refused (:mod:`lrp_core.methods.targets`); ``Contrast(positive, negative)``
        (explain ``y_positive − y_negative``: "this class rather than that one"); or, for the methods that take
        one (``cdam``), a :class:`ConceptTarget` from :func:`concept_target`.
    start_layer : int, optional
        ``transformer_attribution``, ``generic_attention``, ``rollout``: the first block in the layer product
        (default 0; negative counts from the end).
    end_layer : int, optional
        ``transformer_attribution``, ``rollout``: the last block in the layer product (default the last).
    rollout_norm : {"none", "row"}, optional
        ``transformer_attribution``: the normalisation of each factor ``I + Ā_b`` (default "none" for images,
        "row" for text).
    use_gradient : bool, optional
        ``transformer_attribution``: weight ``R^A`` by ``∇A`` (default True) or by ``A`` (False, the paper's
        ablation).
    keep_heads : bool, optional
        ``transformer_attribution``, ``generic_attention``, ``rollout``, ``raw_attention``: also return the
        per-head matrices ``layers_per_head`` (B, L, H, N, N) (default False).
    batch_size : int, optional
        ``token_ablation``, ``integrated_gradients``, ``smoothgrad``, ``occlusion``, ``kernel_shap``: sequences
        per forward pass (default 64).
    n_steps : int, optional
        ``integrated_gradients``: integration steps (default 50).
    baseline : {"zeros", "blur", "pad", "mask"} or int, optional
        ``integrated_gradients``, ``occlusion``, ``kernel_shap``: the reference input, "zeros" | "blur" for
        images, "zeros" | "pad" | "mask" | a token id for text (padding positions kept). Default "zeros" for
        images and decoder LMs, "pad" for text encoders.
    n_samples : int, optional
        ``smoothgrad``: noisy copies per sample (default 16); ``kernel_shap``: coalitions per sample
        (default 256).
    stdevs : float, optional
        ``smoothgrad``: the standard deviation of the Gaussian noise, in input units (default 0.6 for normalised
        pixels, 0.02 for embedding entries; on a vision-language model the embeddings' σ, the pixels getting 30 ×
        it, docs/METHODS.md §2g.5).
    seed : int, optional
        ``smoothgrad``, ``kernel_shap``: the seed of the random draws, the same for every sample (default 0).
    base : {"attnlrp", "cp_lrp", "cp_halved"}, optional
        ``pa_lrp``: the rule set the positional rules are added to (default "attnlrp"; "cp_halved": the
        authors' ViT rules, CP-LRP with A·V's ÷2 kept, not conservative).
    composite : Composite, optional
        ``lrp``, ``partial_lrp``, ``attnlrp``, ``cp_lrp``: the rule set of the relevance pass
        (:class:`lrp_core.rules.Composite`; default: the method's own). ``lrp`` and ``partial_lrp`` take an
        explicit-pass set (from ``LRP_BASELINE``), ``attnlrp`` and ``cp_lrp`` a modified-gradient one (from
        ``ATTNLRP`` / ``CP_LRP``), e.g. ``ATTNLRP.with_rules(by_name={"blocks.*.mlp.*": GammaGradient(0.25)})``.
    progress : bool, optional
        Every method: a progress bar (True), none (False); default only for long runs.
    position : int, sequence of B ints or Tensor (B,), optional
        Every method, decoder language models only: the token whose prediction is explained, one for all rows
        or one per row (default: each row's last real token; negative counts from the end).
    max_memory : int, float or str, optional
        Every method: the memory the call may use. ``None`` / ``"auto"`` (default): half of what the device of
        the model has free (CPU: ``MemAvailable``; CUDA: ``torch.cuda.mem_get_info``); an int (bytes) or a
        string such as ``"512MB"`` / ``"2GiB"``; ``float("inf")`` / ``"none"``: never split. A batch whose
        estimated peak (:func:`lrp_core.runtime.memory.estimate`) exceeds it is explained in pieces of as many
        samples as fit (at least one) and the results merged in batch order — every field, as if explained at
        once. Each piece gets exactly the arithmetic of being explained alone; against the whole batch at once
        it may differ by round-off, as a batch does from its samples one by one (the BLAS kernels depend on the
        number of rows; docs/ARCHITECTURE.md, "Memory and pieces").
    chunk_size : int, optional
        Every method: explain in pieces of at most this many samples (an int ≥ 1) instead; giving it together
        with an explicit ``max_memory`` is an error. Padded text is grouped by length first (each group
        explained unpadded, docs/METHODS.md §5.8), then each group is cut into pieces.
    sources : list of (start, end), list of such lists, or Tensor (S, 2) / (B, S, 2), optional
        Every method, text only: token spans (half-open) of the context's sources — documents, sentences,
        marked passages — counted from each row's first real token (special tokens included), one list for
        every row or one per row (the same number S each); :func:`lrp_core.sources.sentences` and
        :func:`lrp_core.sources.documents` find them in a text. Fills ``sources`` (B, S): the sum of the token
        scores over each span (the source methods: their own scores). On a decoder a source ends before the
        explained token.
    n_ablations : int, optional
        ``context_cite`` (a source method): random ablation masks per row (default 64, ContextCite's).
    keep_prob : float, optional
        ``context_cite``: the probability that a mask keeps a source (default 0.5, ContextCite's).
    alpha : float, optional
        ``context_cite``: the Lasso penalty on the standardised masks (default 0.01, ContextCite's; 0 fits least
        squares).
    filler : int, optional
        ``leave_one_out``, ``context_cite``: ``None`` (default) removes an ablated source's tokens (the later
        tokens' positions follow); a token id replaces them instead.
    dtype : torch.dtype, optional
        Every method: ``torch.float64`` computes every pass (the replay, the relevance and gradient passes) of
        a float32 or half-precision model in float64, without copying or changing it — what ``model.double()``
        would give. Plain LRP and transformer attribution are ill-conditioned in float32: their float32 maps
        depend on the CPU's kernels (docs/METHODS.md §5.10 gives the deviations), their float64 maps far less.
        ``None`` (default): the model's own precision, half models in float32.
    unverified : bool, optional
        Every method: ``True`` skips the end-to-end check. By default (``None`` / ``False``) every call compares
        the logits the method read from the replay with the model's own forward on the same inputs (one forward
        without gradients, in eval semantics and the call's precision) and refuses, with an
        :class:`~lrp_core.errors.UnsupportedModelError` naming the deviation and the first block that departs,
        when they differ by more than 1e-5 relative in float32 (1e-10 in float64; half models are compared in
        float32, 1e-5) — docs/CONTRACTS.md, "Verification on every call". Skipping it saves that forward
        (benchmarks) and risks an explanation of a model the replay misreads, silently.
    **unknown
        No other keyword is accepted: one is an :class:`~lrp_core.errors.InputError` naming the accepted
        options (typed ``NoReturn`` so that a type checker flags it too).

    Returns
    -------
    Explanation
        ``scores`` (B, T), ``target`` (B,), ``logits`` (B, C), and the fields the method fills
        (``lrp_core.methods.registry.METHODS[method].returns``: ``layers`` (B, L, N, N), ``pixels`` (B, H, W),
        ...); ``options`` holds the options the method used.
    """
    # the options given, by name: every parameter after ``target`` that is not None, and the unknown ones
    # (refused by parse_options with the accepted ones named)
    given = {k: v for k, v in locals().items() if k in OPTION_NAMES and v is not None}
    return _explain(model, inputs, method, target, {**given, **unknown})


def _explain(model: nn.Module, inputs: Any, method: str, target: Any, options: dict[str, Any]) -> Explanation:
    """``explain`` with its options gathered by name (the given ones and the unknown ones, refused here)."""
    spec = registry.get(method)
    adapter = get_adapter(model).for_inputs(inputs)
    if method in adapter.refused_methods:
        runs = [m for m in registry.METHODS if m not in adapter.refused_methods]
        raise UnsupportedModelError(
            f"method {method!r} is not defined on {type(model).__name__}: "
            f"{adapter.refused_methods[method]}. Methods that run on it: {', '.join(runs)}"
        )
    prepared = adapter.check_inputs(inputs)
    opt = registry.parse_options(spec, options, adapter.num_blocks, registry.defaults_key(adapter))
    if opt.position is not None:  # decoders: explain the prediction at another token
        prepared = adapter.at_position(prepared, opt.position)
    layout = adapter.layout(prepared)  # after the position: the layout names the token read (token ablation skips it)
    if opt.sources is not None:  # the spans as columns of this batch, checked against its rows
        if layout.modality != "text" or layout.output_start != 0:
            raise InputError("sources are token spans of a text; this model explains images")
        read = prepared["read_at"].argmax(dim=-1) if adapter.is_decoder else None
        opt = replace(opt, sources=in_columns(opt.sources, prepared["attention_mask"], read))
    readout = adapter.readout_for(prepared)
    aim = goal(spec, target, adapter.batch_size(prepared), readout.num_classes, type(model).__name__)
    call = Call(adapter, prepared, layout, aim.resolve, opt, aim.concept, aim.negative, readout)
    plan = pieces.plan(adapter, prepared, spec.memory, opt)
    result = pieces.run(spec, call, plan)
    if not opt.unverified:  # the replay's logits against the model's own forward (lrp_core.adapters.verification)
        verification.check(adapter, prepared, result.logits, plan)
    used = dict(result.used)
    if opt.sources is not None and result.sources is None:  # a token-map method: its scores summed per source
        result.sources = by_source(result.scores.detach(), opt.sources.to(result.scores.device))
    if aim.negative is not None:
        used["contrast_with"] = aim.negative.tolist()
    return Explanation(
        method=method,
        grid=layout.grid,
        image_size=layout.image_size,
        start_layer=used.get("start_layer"),
        attention_mask=layout.mask,
        image_tokens=layout.image_tokens,
        options=used,
        **result_fields(result),
    )


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
    prepared = adapter.check_inputs(inputs)
    readout = adapter.readout_for(prepared)
    resolve = resolver(target, adapter.batch_size(prepared), readout.num_classes)
    trace = adapter.forward(prepared, grad=True, readout=readout, composite=TRANSFORMER_ATTRIBUTION)
    verification.check(
        adapter, prepared, trace.logits, [pieces.Piece(torch.arange(adapter.batch_size(prepared)), None)]
    )
    t = resolve(trace.logits.detach())
    L = adapter.num_blocks
    attns = [trace.attention(b) for b in range(L)]
    assert trace.replay is not None  # the explicit replay: ∇A on its graph, then its relevance pass
    with trace.replay.plain_gradients():
        grads = torch.autograd.grad(trace.logits.gather(1, t[:, None]).sum(), attns, retain_graph=True)
    rel = adapter.relprop(trace, one_hot(trace.logits.detach(), t), TRANSFORMER_ATTRIBUTION, stop_block=0)
    stack = lambda ts: torch.stack([x.detach() for x in ts], dim=1)  # noqa: E731
    return AttentionParts(
        attention=stack(attns), gradient=stack(grads), relevance=stack(rel.attn), target=t, logits=trace.logits.detach()
    )


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
