"""Open recognition: a decoder language model that no :data:`~lrp_core.adapters.ADAPTERS` row names.

Many Hugging Face decoder classes (SmolLM3, StableLM, Starcoder2, Seed-OSS, Ministral, Arcee, EXAONE 4, Gemma,
CWM, ...) are built from the blocks the engine already replays: pre-norm (or branch-output-norm)
blocks with RMSNorm or LayerNorm, grouped-query attention with q/k/v/o projections, rotary embeddings (partial
too), optional per-head q/k norms and sliding windows, and gated or plain MLPs. Such a model is explained when

1. its modules have one of the structures listed in :data:`STRUCTURES` — read from the module tree and the
   config, never from the class name — and every part is one the rules know (its norms computed by the rules'
   arithmetic, a known activation, a rotary embedding of a known type); and
2. the engine's replay reproduces the model's own logits on a probe input (:func:`~lrp_core.adapters.probe.probe`),
   to a tolerance scaled to the dtype (:data:`TOLERANCE`). The probe runs once per model and configuration
   (dtype, device, attention implementation, config values, forward hooks), its result cached with the model.

Otherwise the model is refused with the reason: the module that was not understood, or the measured deviation
of the replay. Blocks the engine cannot describe at all (state-space, recurrent or convolutional mixers,
mixture-of-experts) are refused by name first (:func:`unreplayable`); parallel blocks (attention and MLP both read
the layer input: one ``input_layernorm``, or a ``use_parallel_residual`` / ``parallel_attn`` config) are replayed as
such and checked by the probe like any other.

Shapes: B batch, T tokens, D width, V vocabulary, H heads, d head width.
"""

from __future__ import annotations

import inspect
from typing import Optional, cast

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..rules.composites import ATTNLRP
from ..rules.norms import norm_kind
from ..rules.ops import GradientRule
from .blocks import BlockSpec, MlpSpec
from .decoder import DecoderAdapter
from .parts import ModelPart
from .positions import row_rotary_tables

#: What an unlisted decoder must look like to be recognised (the text of every refusal).
STRUCTURES = (
    "an unlisted Hugging Face decoder (…ForCausalLM / …ForSequenceClassification / …ForTokenClassification / "
    "…ForQuestionAnswering) is explained when it has model.model.{embed_tokens, layers, norm, rotary_emb} (a "
    "question-answering head: model.transformer) and lm_head (or score, or qa_outputs); each layer self_attn with "
    "q_proj / k_proj / v_proj / o_proj (nn.Linear, grouped-query heads allowed), optional per-head q_norm / "
    "k_norm and an optional use_rope flag, and mlp with gate_proj / up_proj / down_proj, up_proj / down_proj, "
    "gate_up_proj / down_proj, c_fc / c_proj or fc1 / fc2 and a SiLU, GELU, ReLU, ReLU² or tanh activation; its "
    "norms (RMSNorm or LayerNorm) "
    "input_layernorm + post_attention_layernorm (pre-norm), optionally with post_self_attn_layernorm + "
    "post_mlp_layernorm, or input_layernorm + pre_feedforward_layernorm (+ post_attention_layernorm + "
    "post_feedforward_layernorm), or attention_layernorm + feedforward_layernorm, or post_attention_layernorm + "
    "post_feedforward_layernorm alone (norms on the branch outputs); a rotary embedding of type default, linear, "
    "llama3, yarn or proportional; parallel blocks (input_layernorm alone, or a use_parallel_residual / parallel_attn "
    "config) too; and the engine's replay equal to the model's own logits on a probe input"
)

#: Relative tolerance of the probe (max |replay − model| / max |model| over the probe's logits), by dtype:
#: float32 round-off accumulated over a few blocks is ~1e-6 (measured 2e-7 … 6e-7 on the tiny test models, float64
#: 2e-16 … 5e-16). A half-precision model is compared in float32: its replay and its own forward both run under
#: lrp_core.runtime.precision.compute_precision (what ``model.float()`` would give; measured 2e-7 … 1.5e-6).
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-5}

#: Activation modules the rules know (element-wise: relevance passes them unchanged, docs/METHODS.md §1.2, §2c).
ACTIVATIONS = (
    "SiLU",
    "SiLUActivation",
    "GELU",
    "GELUActivation",
    "NewGELUActivation",
    "GELUTanh",
    "PytorchGELUTanh",
    "FastGELUActivation",
    "QuickGELUActivation",
    "AccurateGELUActivation",
    "ReLU",
    "ReLUSquaredActivation",
    "Tanh",
)

#: Rotary types whose tables the model's rotary module computes from the positions alone. "dynamic" and
#: "longrope" rewrite the module's own frequency buffers as sequences grow (state the probe cannot vouch for).
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")

#: norm names of a layer -> (norm1, norm2, post1, post2): the pre-norms and the branch-output norms
NORM_LAYOUTS = {
    frozenset({"input_layernorm", "post_attention_layernorm"}): (
        "input_layernorm",
        "post_attention_layernorm",
        None,
        None,
    ),
    frozenset({"input_layernorm", "post_attention_layernorm", "post_self_attn_layernorm", "post_mlp_layernorm"}): (
        "input_layernorm",
        "post_attention_layernorm",
        "post_self_attn_layernorm",
        "post_mlp_layernorm",
    ),
    frozenset(
        {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"}
    ): ("input_layernorm", "pre_feedforward_layernorm", "post_attention_layernorm", "post_feedforward_layernorm"),
    frozenset({"input_layernorm", "pre_feedforward_layernorm"}): (
        "input_layernorm",
        "pre_feedforward_layernorm",
        None,
        None,
    ),
    frozenset({"attention_layernorm", "feedforward_layernorm"}): (
        "attention_layernorm",
        "feedforward_layernorm",
        None,
        None,
    ),
    frozenset({"post_attention_layernorm", "post_feedforward_layernorm"}): (
        None,
        None,
        "post_attention_layernorm",
        "post_feedforward_layernorm",
    ),
}

#: mlp child names (without the activation) -> (gate, up/fc1, down/fc2, fused gate): the MLP forms understood
MLP_FORMS = {
    frozenset({"gate_proj", "up_proj", "down_proj"}): ("gate_proj", "up_proj", "down_proj", False),
    frozenset({"up_proj", "down_proj"}): (None, "up_proj", "down_proj", False),
    frozenset({"gate_up_proj", "down_proj"}): (None, "gate_up_proj", "down_proj", True),
    frozenset({"c_fc", "c_proj"}): (None, "c_fc", "c_proj", False),
    frozenset({"fc1", "fc2"}): (None, "fc1", "fc2", False),
}

#: ``config.layer_types`` entries the replay describes
LAYER_TYPES = ("full_attention", "sliding_attention")

ATTENTION_PARTS = {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"}

#: (words in a module's class name, what such a module is): blocks refused by name
UNREPLAYABLE = (
    (
        ("mamba", "mixer"),
        "a state-space (Mamba-style) mixer: a selective scan over the sequence with a causal "
        "convolution, not attention",
    ),
    (("rwkv",), "an RWKV time-mixing layer: a recurrence over the sequence, not attention"),
    (("shortconv",), "a short causal convolution mixer (LFM2): a convolution over the sequence, not attention"),
    (("recurrentblock", "rglru", "recurrent"), "a gated linear recurrence (RecurrentGemma / Griffin), not attention"),
    (
        ("gateddeltanet", "lineardecoderlayer", "linearattention", "lightning"),
        "a linear-attention / delta-rule recurrence, not softmax attention",
    ),
    (
        ("moe", "experts", "router", "topkrouter"),
        "a mixture-of-experts layer of a family no adapter lists (Mixtral, "
        "Qwen2-MoE, Qwen3-MoE and OLMoE have theirs): its router and "
        "experts are not recognised by their structure",
    ),
)


def _layers(model: nn.Module) -> Optional[nn.ModuleList]:
    """The model's list of decoder layers: the first ModuleList named ``layers`` / ``h`` / ``blocks``."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and name.rsplit(".", 1)[-1] in ("layers", "h", "blocks"):
            return module
    return None


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


def unreplayable(model: nn.Module) -> Optional[str]:
    """Why the model's blocks cannot be replayed at all, naming the module and what it is; ``None`` if no such block.

    State-space, recurrent and convolutional mixers and mixture-of-experts layers are found by their modules'
    class names. (Parallel blocks are replayed: :meth:`OpenDecoderAdapter._block`.)

    Parameters
    ----------
    model : nn.Module
        The model whose modules are inspected.

    Returns
    -------
    str or None
        The reason, naming the module and what it is; ``None`` if no block is of such a kind.
    """
    found, convs = [], []
    for name, module in model.named_modules():
        low = type(module).__name__.lower()
        if not _is_norm(module):  # a family's norms carry its name too (MambaRMSNorm)
            found += [(name, module, what) for words, what in UNREPLAYABLE if any(w in low for w in words)][:1]
        if isinstance(module, nn.Conv1d):
            convs.append((name, module, "a convolution over the sequence (a convolutional mixer), not attention"))
    if found or convs:  # the innermost such module names the mixer best (the model's own class may carry the word)
        name, module, what = max(found or convs, key=lambda f: f[0].count(".") if f[0] else -1)
        return f"its module {name} ({type(module).__name__}) is {what}"
    cfg = getattr(model, "config", None)
    odd = sorted({t for t in getattr(cfg, "layer_types", None) or () if t not in LAYER_TYPES})
    if odd:
        return (
            f"config.layer_types has {', '.join(map(repr, odd))} layers: mixers other than (sliding-window) "
            "softmax attention (recurrent, convolutional or state-space), which the block replay does not describe"
        )
    return None


#: config flags that make every layer a parallel block (attention and MLP both read the layer input)
PARALLEL_FLAGS = ("use_parallel_residual", "parallel_attn", "parallel_residual")


def _children(module: nn.Module) -> dict:
    """Named children, dropouts left out (identities at inference)."""
    return {n: m for n, m in module.named_children() if not isinstance(m, nn.Dropout)}


class OpenDecoderAdapter(DecoderAdapter):
    """A decoder recognised by its structure (:data:`STRUCTURES`): the Llama layout with the variations listed."""

    def __init__(self, model: nn.Module):
        cfg = getattr(model, "config", None)
        if int(getattr(cfg, "pretraining_tp", 1) or 1) > 1:
            raise UnsupportedModelError(
                "pretraining_tp > 1 splits every Linear into slices the replay does not "
                "describe; load the model with pretraining_tp=1 (the same function)"
            )
        super().__init__(model)

    def _stack(self):
        stack = "transformer" if self.task == "qa" and getattr(self.model, "model", None) is None else "model"
        base = getattr(self.model, stack, None)  # a question-answering head keeps it as model.transformer
        if self.config is None or base is None:
            raise UnsupportedModelError(f"{type(self.model).__name__} has no model.{stack} (the decoder stack)")
        parts = _children(base)
        missing = {"embed_tokens", "layers", "norm", "rotary_emb"} - set(parts)
        if missing:
            raise UnsupportedModelError(
                f"model.model ({type(base).__name__}) has no {', '.join(sorted(missing))}; "
                f"its parts are {', '.join(parts)}"
            )
        extra = set(parts) - {"embed_tokens", "layers", "norm", "rotary_emb"}
        if extra:
            name = sorted(extra)[0]
            raise UnsupportedModelError(
                f"model.model.{name} ({type(parts[name]).__name__}) is a part the replay does not describe"
            )
        top = set(_children(self.model)) - {stack, "lm_head", "score", "qa_outputs"}
        if top:
            name = sorted(top)[0]
            raise UnsupportedModelError(
                f"model.{name} ({type(getattr(self.model, name)).__name__}) is a part the replay does not describe"
            )
        rope = getattr(base.rotary_emb, "rope_type", "default")
        for kind in rope.values() if isinstance(rope, dict) else [rope]:  # a dict: one per layer type
            if kind not in ROPE_TYPES:
                raise UnsupportedModelError(
                    f"the rotary embedding's rope_type {kind!r} is not one the engine replays ({', '.join(ROPE_TYPES)})"
                )
        self._rope_takes_type = "layer_type" in inspect.signature(base.rotary_emb.forward).parameters
        return base, base.layers, base.norm

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """The layer's norms, attention and MLP by their names (:data:`NORM_LAYOUTS`, :data:`MLP_FORMS`)."""
        where = f"layer {i} ({type(layer).__name__})"
        if layer._parameters:
            raise UnsupportedModelError(
                f"{where} has parameters of its own ({', '.join(layer._parameters)}) the replay does not describe"
            )
        parts = _children(layer)
        if set(parts) - {"self_attn", "mlp"} - {n for n, m in parts.items() if _is_norm(m)}:
            name = sorted(set(parts) - {"self_attn", "mlp"} - {n for n, m in parts.items() if _is_norm(m)})[0]
            raise UnsupportedModelError(
                f"{where}.{name} ({type(parts[name]).__name__}) is a part the replay does not describe"
            )
        if "self_attn" not in parts or "mlp" not in parts:
            raise UnsupportedModelError(f"{where} has no self_attn and mlp (its parts: {', '.join(parts)})")
        norms = frozenset(n for n, m in parts.items() if _is_norm(m))
        if norms == {"input_layernorm"} or any(getattr(self.config, f, False) is True for f in PARALLEL_FLAGS):
            return self._parallel_block(i, layer, parts, norms, where)
        layout = NORM_LAYOUTS.get(norms)
        if layout is None:
            raise UnsupportedModelError(
                f"{where} has the norms {', '.join(sorted(norms))}, not one of the layouts the replay describes"
            )
        norm1, norm2, post1, post2 = (parts[n] if n else nn.Identity() for n in layout)
        return BlockSpec(
            layout="pre_ln",
            norm1=norm1,
            norm2=norm2,
            post1=post1,
            post2=post2,
            attn=self._open_attention(i, layer.self_attn, where),
            mlp=_mlp(layer.mlp, where),
        )

    def _parallel_block(self, i: int, layer: ModelPart, parts: dict, norms: frozenset, where: str) -> BlockSpec:
        """A parallel block (docs/METHODS.md §2f) summed as ``(x + attn) + mlp``: ``input_layernorm`` feeding both
        branches, or it and ``post_attention_layernorm`` feeding the attention and the MLP (the probe checks)."""
        if norms not in ({"input_layernorm"}, {"input_layernorm", "post_attention_layernorm"}):
            raise UnsupportedModelError(
                f"{where} is a parallel block with the norms {', '.join(sorted(norms))}; the "
                "replay describes input_layernorm (+ post_attention_layernorm for the MLP)"
            )
        norm1 = parts["input_layernorm"]
        return BlockSpec(
            layout="parallel",
            norm1=norm1,
            norm2=parts.get("post_attention_layernorm", norm1),
            skip_first=True,
            attn=self._open_attention(i, layer.self_attn, where),
            mlp=_mlp(layer.mlp, where),
        )

    def _open_attention(self, i: int, att: ModelPart, where: str):
        cfg = self.config
        parts = _children(att)
        extra = set(parts) - ATTENTION_PARTS
        if extra or att._parameters or not {"q_proj", "k_proj", "v_proj", "o_proj"} <= set(parts):
            what = sorted(extra) + list(att._parameters)
            raise UnsupportedModelError(
                f"{where}.self_attn ({type(att).__name__}) is not q_proj / k_proj / v_proj / o_proj with optional "
                f"q_norm / k_norm" + (f": it has {', '.join(what)}" if what else "")
            )
        if not all(isinstance(parts[n], nn.Linear) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            raise UnsupportedModelError(f"{where}.self_attn's projections are not nn.Linear")
        d = int(getattr(att, "head_dim", 0) or 0)
        H = int(cfg.num_attention_heads)
        Hkv = int(getattr(cfg, "num_key_value_heads", None) or H)
        widths = (att.q_proj.out_features, att.k_proj.out_features)
        if not d or widths != (H * d, Hkv * d) or not hasattr(att, "scaling"):
            raise UnsupportedModelError(
                f"{where}.self_attn: q_proj / k_proj widths ({att.q_proj.out_features}, "
                f"{att.k_proj.out_features}) are not {H} / {Hkv} heads of head_dim {d}, or "
                "it has no scaling"
            )
        for n in ("q_norm", "k_norm"):
            if n in parts:
                w = getattr(parts[n], "weight", None)
                if w is not None and w.numel() != d:
                    raise UnsupportedModelError(
                        f"{where}.self_attn.{n} normalises {w.numel()} channels at once (all heads together); the "
                        f"replay describes per-head q/k norms over head_dim = {d} channels"
                    )
        types = getattr(cfg, "layer_types", None)
        layer_type = types[i] if types is not None and i < len(types) else None
        if layer_type is not None:
            window = getattr(cfg, "sliding_window", None) if layer_type == "sliding_attention" else None
        else:
            window = getattr(att, "sliding_window", None) or (
                getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
            )
        key = layer_type if self._rope_takes_type and layer_type is not None else "default"
        spec = self._attention(att, window=int(window) if window else None, rope_key=key)
        spec.rotary = bool(getattr(att, "use_rope", True))  # SmolLM3: some layers without positions (NoPE)
        return spec

    def rotary_tables(
        self, x0: Tensor, positions: Tensor, key: str, mask: Optional[Tensor] = None
    ) -> tuple[Tensor, Tensor]:
        """(cos, sin) (B, T, r) of the model's rotary embedding; per layer type where the module takes one
        (each row's as for the row alone: :func:`~lrp_core.adapters.positions.row_rotary_tables`)."""
        return row_rotary_tables(self.base.rotary_emb, x0, positions, mask, key if self._rope_takes_type else None)

    def check_norms(self) -> None:
        """Every norm of the replay (blocks, q/k, final) computed by the rules' arithmetic (:func:`_check_norm`)."""
        names = self.module_names
        norms = [self.readout.norm] + [
            m for s in self.blocks for m in (s.norm1, s.norm2, s.post1, s.post2, s.attn.q_norm, s.attn.k_norm)
        ]
        done = set()
        for spec_norm in norms:
            if not isinstance(spec_norm, nn.Identity) and id(spec_norm) not in done:
                done.add(id(spec_norm))
                _check_norm(spec_norm, names.get(spec_norm, type(spec_norm).__name__))


def _mlp(mlp: nn.Module, where: str) -> MlpSpec:
    """The MLP in one of :data:`MLP_FORMS`, with a known activation."""
    parts = _children(mlp)
    acts = {n: m for n, m in parts.items() if not isinstance(m, nn.Linear)}
    form = MLP_FORMS.get(frozenset(set(parts) - set(acts)))
    if form is None or len(acts) != 1 or mlp._parameters:
        raise UnsupportedModelError(
            f"{where}.mlp ({type(mlp).__name__}) with parts {', '.join(parts)} is not one "
            "of the MLP forms the replay describes"
        )
    ((act_name, act),) = acts.items()
    if type(act).__name__ not in ACTIVATIONS:
        raise UnsupportedModelError(
            f"{where}.mlp.{act_name} ({type(act).__name__}) is not an activation the engine "
            f"knows ({', '.join(ACTIVATIONS)})"
        )
    gate, up, down, fused = form
    return MlpSpec(gate=parts[gate] if gate else None, fc1=parts[up], fc2=parts[down], act=act, fused_gate=fused)


def _check_norm(module: ModelPart, where: str) -> None:
    """The modified-gradient rules recompute a norm from its parameters (AttnLRP / CP-LRP hold its divisor
    constant): their arithmetic must be the module's. Compared on a fixed random input; refused otherwise."""
    p = next(module.parameters(), None)
    shape = getattr(module, "normalized_shape", None)
    n = p.shape[-1] if p is not None else (shape[-1] if shape else None)
    if n is None:
        raise UnsupportedModelError(f"{where} ({type(module).__name__}) has no weight or normalized_shape to read")
    ref = p if p is not None else next((b for b in module.buffers()), None)
    dtype = ref.dtype if ref is not None and ref.is_floating_point() else torch.float32
    device = ref.device if ref is not None else torch.device("cpu")
    if device.type == "meta":
        return  # no values to compare; the probe refuses a meta model
    x = torch.randn(2, 3, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(
        dtype=dtype, device=device
    )
    rule = cast(GradientRule, ATTNLRP.rules[norm_kind(module)])  # AttnLRP is a modified-gradient rule set
    try:
        with torch.no_grad():
            want, got = module(x), rule.forward(module, x, module=module)
    except (AttributeError, TypeError, RuntimeError, UnsupportedModelError) as err:
        raise UnsupportedModelError(
            f"{where} ({type(module).__name__}) is not a norm the rules can recompute ({type(err).__name__}: {err})"
        ) from None
    dev = float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))
    # the rules compute RMSNorm in float32 as LXT does (a float64 model's own norm may round elsewhere: ~1e-8)
    if not dev <= max(TOLERANCE.get(dtype, 1e-5), 1e-5):
        raise UnsupportedModelError(
            f"{where} ({type(module).__name__}) is not computed as the rules' "
            f"{norm_kind(module)} (they differ by {dev:.1e} relative): a norm variant the "
            "AttnLRP / CP-LRP rules do not describe"
        )


__all__ = ["OpenDecoderAdapter", "unreplayable", "STRUCTURES", "TOLERANCE", "ACTIVATIONS", "ROPE_TYPES"]
