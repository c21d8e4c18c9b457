"""Tiny decoder language models for the tests (issue #22), built in milliseconds, every parameter random.

``make_decoder(family, ...)`` gives a seeded model of hidden 32, 2 blocks, 4 query heads / 2 key-value heads,
vocabulary 96; ``batch(rows, side)`` pads unpadded id rows on the left or the right.
"""

from __future__ import annotations

from typing import Optional

import torch

VOCAB = 96
PAD = 0

#: family -> (transformers module, causal-LM class, sequence-classifier class, config class)
FAMILIES = {
    "llama": ("llama", "LlamaForCausalLM", "LlamaForSequenceClassification", "LlamaConfig"),
    "mistral": ("mistral", "MistralForCausalLM", "MistralForSequenceClassification", "MistralConfig"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", "Qwen2ForSequenceClassification", "Qwen2Config"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM", "Qwen3ForSequenceClassification", "Qwen3Config"),
    "gpt2": ("gpt2", "GPT2LMHeadModel", "GPT2ForSequenceClassification", "GPT2Config"),
    "gemma3": ("gemma3", "Gemma3ForCausalLM", "Gemma3TextForSequenceClassification", "Gemma3TextConfig"),
    "phi3": ("phi3", "Phi3ForCausalLM", "Phi3ForSequenceClassification", "Phi3Config"),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeForSequenceClassification", "Qwen3MoeConfig"),
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2MoeForSequenceClassification", "Qwen2MoeConfig"),
    "mixtral": ("mixtral", "MixtralForCausalLM", "MixtralForSequenceClassification", "MixtralConfig"),
    "olmoe": ("olmoe", "OlmoeForCausalLM", None, "OlmoeConfig"),  # no sequence classifier in transformers
    "gpt_neox": ("gpt_neox", "GPTNeoXForCausalLM", "GPTNeoXForSequenceClassification", "GPTNeoXConfig"),
    "phi": ("phi", "PhiForCausalLM", "PhiForSequenceClassification", "PhiConfig"),
    "falcon": ("falcon", "FalconForCausalLM", "FalconForSequenceClassification", "FalconConfig"),
    "gpt_oss": ("gpt_oss", "GptOssForCausalLM", "GptOssForSequenceClassification", "GptOssConfig"),
    "gemma2": ("gemma2", "Gemma2ForCausalLM", "Gemma2ForSequenceClassification", "Gemma2Config"),
    "olmo2": ("olmo2", "Olmo2ForCausalLM", None, "Olmo2Config"),  # no sequence classifier in transformers
}

#: What float64 agreement a float64 Hugging Face decoder allows on every CPU. transformers computes the eager
#: softmax in float32 even in a float64 model (all these families but GPT-2, Falcon and GPT-OSS), and with the
#: portable or AVX2 ATen kernels a float32 softmax rounds differently with the row's length and padding: a padded
#: row, the row alone, the replay and the model's own forward then agree to float32 round-off (measured with
#: ATEN_CPU_CAPABILITY=default: up to 3.7e-7 relative for the maps and logits, 2.1e-6 for integrated gradients'
#: sums; 0 with AVX-512), not to float64's: the float32 models' tolerance, 1e-5. Bounds below this are kept where
#: the whole pass is float64 (GPT-2, Falcon, GPT-OSS, sdpa).
FLOAT32_ISLANDS = 1e-5
#: the families whose eager attention keeps its softmax in the model's dtype
FLOAT64_EAGER = ("gpt2", "falcon", "gpt_oss")


def has_float32_islands(model: torch.nn.Module) -> bool:
    """Whether a float64 model's eager attention computes its softmax in float32 (see :data:`FLOAT32_ISLANDS`)."""
    cfg = getattr(model, "config", None)
    configs = [cfg, getattr(cfg, "text_config", None)]
    eager = any(getattr(c, "_attn_implementation", None) == "eager" for c in configs if c is not None)
    types = {getattr(c, "model_type", None) for c in configs if c is not None}
    return eager and not types <= set(FLOAT64_EAGER) | {None} and next(model.parameters()).dtype == torch.float64


def f64_bound(model: torch.nn.Module, strict: float) -> float:
    """``strict`` where ``model``'s float64 pass is float64 throughout, else :data:`FLOAT32_ISLANDS`."""
    return max(strict, FLOAT32_ISLANDS) if has_float32_islands(model) else strict


#: the mixture-of-experts families: 4 experts, top-2 (their own configuration in ``_config``)
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")

#: GPT-OSS: 4 experts, top-2, a sliding then a full layer, YaRN past 16 positions, attention sinks, and a SwiGLU
#: limit of 1 so that the clamps bind on the tiny random model (the default 7 is never reached there)
GPT_OSS = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=4,
    layer_types=["sliding_attention", "full_attention"],
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    swiglu_limit=1.0,
    pad_token_id=PAD,
    bos_token_id=1,
    eos_token_id=1,
    tie_word_embeddings=False,
    experts_implementation="eager",
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 16,
    },
)

#: the gpt2 helper's families (tests/adapters/test_decoders_gpt2.py etc.): configurations that differ from Llama's
GPT2_HELPER_FAMILIES = ("gpt2", "gemma3", "phi3")


def _other_config(family: str, attn: str) -> dict:
    """GPT-2: its own names and a tied LM head; Gemma 3: a sliding then a global layer with their own rotary
    bases, query_pre_attn_scalar ≠ head_dim, GELU-tanh; Phi-3: fused projections, partial rotary, a window."""
    if family == "gpt2":
        return dict(
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            pad_token_id=PAD,
            bos_token_id=1,
            eos_token_id=1,
            attn_implementation=attn,
        )
    if family == "gemma3":
        return dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            query_pre_attn_scalar=12,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            max_position_embeddings=64,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            pad_token_id=PAD,
            bos_token_id=1,
            eos_token_id=1,
            attn_implementation=attn,
        )
    return dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=4,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=1,
        tie_word_embeddings=False,
        attn_implementation=attn,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    )


#: the parallel-block families (GPT-NeoX / Pythia, Phi-1/2, Falcon), in tests/adapters/test_decoders_gpt2.py too
PARALLEL_FAMILIES = ("gpt_neox", "phi", "falcon")


def _parallel_config(family: str, attn: str) -> dict:
    """GPT-NeoX: parallel residual, per-head fused qkv with biases, partial rotary; Phi: one norm for both branches,
    per-head q/k LayerNorms, grouped kv heads, partial rotary; Falcon: the new decoder architecture (two norms,
    2 key/value groups in one fused qkv) with biases. Variants by ``overrides`` (``use_parallel_residual=False``,
    ``new_decoder_architecture=False, multi_query=True``, ...)."""
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=1,
        tie_word_embeddings=False,
        attn_implementation=attn,
    )
    partial = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    if family == "gpt_neox":
        return dict(
            common, intermediate_size=48, use_parallel_residual=True, attention_bias=True, rope_parameters=partial
        )
    if family == "phi":
        return dict(common, intermediate_size=48, num_key_value_heads=2, qk_layernorm=True, rope_parameters=partial)
    return dict(
        common,
        ffn_hidden_size=48,
        new_decoder_architecture=True,
        num_kv_heads=2,
        num_ln_in_parallel_attn=2,
        parallel_attn=True,
        multi_query=False,
        alibi=False,
        bias=True,
    )


#: Gemma 2 (both soft-caps on, a sliding then a global layer; transformers runs it eager only) and OLMo-2 (post-norm
#: blocks, whole-projection q/k norms), as tests/adapters/test_decoders_parallel.py builds them
OTHER_CONFIGS = {
    "gemma2": dict(
        hidden_size=32,
        intermediate_size=48,
        num_key_value_heads=2,
        head_dim=8,
        query_pre_attn_scalar=12,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0,
    ),
    "olmo2": dict(hidden_size=32, intermediate_size=48, num_key_value_heads=2),
}


def _config(family: str, attn: str, **overrides):
    import transformers

    if family in OTHER_CONFIGS:
        common = dict(
            vocab_size=VOCAB,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            pad_token_id=PAD,
            bos_token_id=1,
            eos_token_id=1,
            tie_word_embeddings=False,
            attn_implementation="eager" if family == "gemma2" else attn,
        )
        return getattr(transformers, FAMILIES[family][3])(**{**common, **OTHER_CONFIGS[family], **overrides})
    if family == "gpt_oss":
        return transformers.GptOssConfig(**{**GPT_OSS, "attn_implementation": attn, **overrides})
    if family in PARALLEL_FAMILIES:
        return getattr(transformers, FAMILIES[family][3])(**{**_parallel_config(family, attn), **overrides})
    if family in GPT2_HELPER_FAMILIES:
        return getattr(transformers, FAMILIES[family][3])(**{**_other_config(family, attn), **overrides})
    kw = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        pad_token_id=PAD,
        tie_word_embeddings=False,
        attn_implementation=attn,
    )
    if family == "mistral":
        kw["sliding_window"] = 4  # shorter than the test rows, so the window matters
    if family == "qwen2":
        kw.update(use_sliding_window=True, sliding_window=4, max_window_layers=1)  # layer 1 slides
    if family == "qwen3":
        kw.update(head_dim=8)
    if family in MOE_FAMILIES:  # the experts one by one, as the replay runs them (grouped_mm has no float64)
        kw.update(experts_implementation="eager")
    if family == "qwen3_moe":  # per-head q/k norms; routed weights renormalised
        kw.update(head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True)
    if family == "qwen2_moe":  # not renormalised; a shared expert with its sigmoid gate; layer 1 slides
        kw.update(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=24,
            norm_topk_prob=False,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=1,
        )
    if family == "mixtral":
        kw.update(num_local_experts=4, num_experts_per_tok=2, sliding_window=4)
    if family == "olmoe":  # q/k norms over the whole projections
        kw.update(num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, bos_token_id=1, eos_token_id=1)
    kw.update(overrides)
    return getattr(transformers, FAMILIES[family][3])(**kw)


#: Small settings for the Captum baselines in the loops over every decoder method: the properties those loops test
#: (each row its own map, the model untouched, families equal) do not depend on the number of integration steps,
#: noisy copies or coalitions, and the defaults (50 / 16 / 256 per sample) make the loops minutes long.
QUICK = {"integrated_gradients": {"n_steps": 4}, "smoothgrad": {"n_samples": 3}, "kernel_shap": {"n_samples": 16}}


def quick(method: str) -> dict:
    """The options a loop over every decoder method passes to ``method`` (:data:`QUICK`; none for the rest)."""
    return dict(QUICK.get(method, {}))


def perturb(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter random (norm weights around 1, so they are not all ones), deterministically."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.3 * noise)
    return model


def make_decoder(
    family: str = "llama",
    attn: str = "eager",
    head: str = "causal",
    dtype=torch.float64,
    seed: int = 0,
    num_labels: int = 3,
    **overrides,
) -> torch.nn.Module:
    """A tiny seeded decoder: ``head`` "causal" (LM head) or "seq" (sequence classifier)."""
    import transformers

    _, causal, seq, _ = FAMILIES[family]
    cfg = _config(family, attn, **overrides)
    if head == "seq":
        cfg.num_labels = num_labels
    torch.manual_seed(seed)
    model = getattr(transformers, causal if head == "causal" else seq)(cfg)
    return perturb(model, seed).to(dtype).eval()


def rows(seed: int = 1, lengths=(5, 9, 7)) -> list:
    """Unpadded id rows (no padding id inside)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g) for n in lengths]


def batch(sequences: list, side: str = "right", pad_id: int = PAD) -> dict:
    """``{"input_ids", "attention_mask"}`` (B, T) with the rows padded on ``side``."""
    T = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), T, dtype=torch.long)
    for i, s in enumerate(sequences):
        sl = slice(0, len(s)) if side == "right" else slice(T - len(s), T)
        ids[i, sl], mask[i, sl] = s, 1
    return {"input_ids": ids, "attention_mask": mask}


def model_logits(model, inputs: dict, position: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The model's own logits (B, V or C) at each row's last real token (or ``position``), position ids from the
    mask."""
    mask = inputs["attention_mask"]
    pos_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=inputs["input_ids"], attention_mask=mask, position_ids=pos_ids).logits
    if out.dim() == 2:  # a sequence classifier pools itself
        return out
    if position is None:
        position = (torch.arange(mask.shape[1]) * mask).argmax(-1)
    return out[torch.arange(len(out)), position]


# ----------------------------------------------------------------------------- every rotary type
LONGROPE = dict(
    rope_parameters={
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "short_factor": [1.0, 1.1],
        "long_factor": [3.0, 5.0],
        "original_max_position_embeddings": 8,
    },
    original_max_position_embeddings=8,
    sliding_window=None,
)
#: every rotary type transformers has, on a tiny Llama (longrope on Phi-3), each with a row past its switch length
ROPES = {
    "default": ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    "linear": ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    "dynamic": (
        "llama",
        {
            "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
            "max_position_embeddings": 8,
        },
    ),
    "yarn": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 8,
            }
        },
    ),
    "llama3": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8,
            }
        },
    ),
    "proportional": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "proportional",
                "rope_theta": 10000.0,
                "factor": 2.0,
                "partial_rotary_factor": 0.5,
            }
        },
    ),
    "longrope": ("phi3", LONGROPE),
}
