"""Decoders no ADAPTERS row names: recognised by their module structure and checked against their own logits.

Tiny seeded models (hidden 32, 2 layers, vocabulary 96) of families transformers ships but the table does not list.
What is checked:
* each recognised family (LayerNorm / RMSNorm / Gemma's 1+w RMSNorm, partial rotary, plain / gated / ReLU² MLPs,
  branch-output norms, q/k norms, windows) is replayed to its own logits and explained by every decoder method,
  a padded batch row by row as each row alone, the explained logit the model's own;
* a model with a supported structure whose numbers differ (Granite's multipliers, EXAONE 4's rotary-free global
  layers, GLM's interleaved rotary, a Llama subclass that scales its logits) is refused with the measured deviation;
* state-space, recurrent, convolutional and mixture-of-experts blocks are refused by name, without a probe;
* parts the engine does not know are named (the module and why);
* the probe runs once per model and configuration, and the model is untouched by recognition and refusals.
"""

from __future__ import annotations

import re

import pytest
import torch
import transformers as T
from decoders import batch, model_logits, perturb, quick, rows

from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.adapters import probe as probe_module
from lrp_core.adapters.recognise import OpenDecoderAdapter
from lrp_core.errors import UnsupportedModelError
from lrp_core.methods.registry import DECODER_METHODS

SMALL = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=1,
    tie_word_embeddings=False,
)

#: family -> (config overrides, has a sequence classifier): the unlisted families recognised, and what each brings
RECOGNISED = {
    "StableLm": ({}, True),  # LayerNorm with biases, partial rotary (a quarter of each head)
    "Starcoder2": (dict(sliding_window=4), True),  # LayerNorm, plain GELU-tanh MLP (c_fc, c_proj), biases, window
    "Exaone4": (dict(sliding_window=4, layer_types=["sliding_attention"] * 2), True),  # norms on the branch outputs,
    #                                                                                   per-head q/k norms, window
    "Gemma": ({}, True),  # RMSNorm with weight 1 + w, √D inside the embedding, GELU-tanh gated MLP
    "SmolLM3": (
        dict(
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=4,
            use_sliding_window=True,
            no_rope_layers=[1, 0],
        ),
        True,
    ),  # per-layer windows (config.layer_types), a layer without RoPE
    "Arcee": ({}, True),  # ReLU² MLP without a gate (up_proj, down_proj)
    "Granite": ({}, False),  # multipliers all 1
}
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def _build(family: str, head: str = "causal", dtype=torch.float64, seed: int = 0, **overrides) -> torch.nn.Module:
    cfg = getattr(T, f"{family}Config")(**{**SMALL, **RECOGNISED.get(family, ({}, False))[0], **overrides})
    if head == "seq":
        cfg.num_labels = 3
    torch.manual_seed(seed)
    model = getattr(T, f"{family}{'ForCausalLM' if head == 'causal' else 'ForSequenceClassification'}")(cfg)
    return perturb(model, seed).to(dtype).eval()


def _meta(cls_name: str, config) -> torch.nn.Module:
    with torch.device("meta"):
        return getattr(T, cls_name)(config)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs().max() / b.abs().max().clamp(min=1e-300)).detach())


def _state(model: torch.nn.Module) -> tuple:
    """Everything a call could change: parameters and buffers (copies), training flags, hooks, gradients."""
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        [m.training for m in model.modules()],
        sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()),
        [p.grad for p in model.parameters()],
    )


def _same(model: torch.nn.Module, before: tuple) -> bool:
    state, training, hooks, grads = before
    return (
        all(torch.equal(state[k], v) for k, v in model.state_dict().items())
        and [m.training for m in model.modules()] == training
        and all(g is None for g in grads)
        and sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == hooks
    )


@pytest.fixture
def probes(monkeypatch):
    """The probes run, as the models they ran on."""
    seen = []
    real = probe_module.probe

    def counting(adapter):
        seen.append(adapter.model)
        return real(adapter)

    monkeypatch.setattr(probe_module, "probe", counting)
    return seen


# ----------------------------------------------------------------------------- recognised families
CASES = [(f, h) for f, (_, seq) in RECOGNISED.items() for h in (("causal", "seq") if seq else ("causal",))]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("family,head", CASES, ids=[f"{f}-{h}" for f, h in CASES])
def test_recognised_and_replayed_to_the_models_logits(family, head, dtype):
    model = _build(family, head, dtype)
    adapter = get_adapter(model)
    assert isinstance(adapter, OpenDecoderAdapter)
    seqs = rows()
    alone = torch.cat([model_logits(model, batch([s])) for s in seqs])
    for side in ("left", "right"):
        got = adapter.forward(adapter.check_inputs(batch(seqs, side))).logits
        assert _rel(got, alone) < TOL[dtype], (side, _rel(got, alone))


def test_what_is_read_from_the_structure():
    """Branch-output norms as post1 / post2 (no pre-norms), per-head q/k norms, windows from config.layer_types,
    the plain MLP's parts, the model's own attention scale."""
    exaone = _build("Exaone4")
    block, layer = get_adapter(exaone).blocks[0], exaone.model.layers[0]
    assert isinstance(block.norm1, torch.nn.Identity) and isinstance(block.norm2, torch.nn.Identity)
    assert block.post1 is layer.post_attention_layernorm and block.post2 is layer.post_feedforward_layernorm
    assert block.attn.q_norm is layer.self_attn.q_norm and block.attn.window == 4
    smol = get_adapter(_build("SmolLM3"))
    assert [b.attn.window for b in smol.blocks] == [4, None] and [b.attn.rotary for b in smol.blocks] == [True, False]
    star = _build("Starcoder2")
    block, layer = get_adapter(star).blocks[1], star.model.layers[1]
    assert not block.mlp.gated and block.mlp.fc1 is layer.mlp.c_fc and block.mlp.act is layer.mlp.act
    assert block.attn.scale == layer.self_attn.scaling == 8**-0.5


@pytest.mark.parametrize(
    "family,head", [("StableLm", "causal"), ("Exaone4", "causal"), ("Gemma", "seq"), ("Starcoder2", "causal")]
)
def test_every_method_explains_a_padded_batch_as_each_row_alone(family, head):
    model = _build(family, head)
    seqs = rows(lengths=(4, 7))
    inputs = batch(seqs, "left")
    own = model_logits(model, batch(seqs, "right"))
    before = _state(model)
    for method in DECODER_METHODS:
        exp = explain(model, inputs, method=method, **quick(method))
        assert _rel(exp.logits, own) < 1e-10, method  # the explained logits are the model's own
        assert torch.equal(exp.target, own.argmax(-1)), method
        assert (exp.scores[inputs["attention_mask"] == 0] == 0).all(), method
        for i, s in enumerate(seqs):
            one = explain(model, batch([s]), method=method, **quick(method)).scores[0]
            row = exp.scores[i][inputs["attention_mask"][i].bool()]
            assert float((row - one).abs().max() / one.abs().max().clamp(min=1e-12)) < 1e-10, (method, i)
    assert _same(model, before)


def test_float32_methods_run_and_read_the_models_logits():
    model = _build("Exaone4", dtype=torch.float32)
    inputs = batch(rows(), "right")
    own = model_logits(model, inputs)
    for method in ("attnlrp", "cp_lrp", "transformer_attribution", "integrated_gradients"):
        exp = explain(model, inputs, method=method, **quick(method))
        assert _rel(exp.logits, own) < 1e-5 and torch.isfinite(exp.scores).all(), method


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_a_half_precision_model_is_probed_in_float32(dtype, probes):
    """Its own forward and the replay both in float32 (compute_precision): the float32 tolerance applies, so a
    structural difference is not hidden in half-precision round-off (measured 2e-7 … 1.5e-6 recognised)."""
    model = _build("Gemma", dtype=dtype)
    before = _state(model)
    assert isinstance(get_adapter(model), OpenDecoderAdapter) and _same(model, before)
    assert all(p.dtype == dtype for p in model.parameters())
    hybrid = _build("Exaone4", dtype=dtype, layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(UnsupportedModelError, match=r"by 1\.1e-01 relative .* compared in float32"):
        get_adapter(hybrid)


# ----------------------------------------------------------------------------- structure matches, numbers differ
class ScaledLlama(T.LlamaForCausalLM):
    """A Llama whose forward scales its logits by 1.5: the same modules, another function."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 1.5
        return out


def _scaled_llama() -> torch.nn.Module:
    cfg = T.LlamaConfig(**SMALL)
    torch.manual_seed(0)
    return perturb(ScaledLlama(cfg), 0).double().eval()


DIFFER = {
    # embedding × 12, each branch × 0.22, logits ÷ 8 (the attention multiplier is the modules' own scaling)
    "Granite with multipliers": (
        lambda: _build(
            "Granite", embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.1, logits_scaling=8.0
        ),
        "embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=8.0",
    ),
    # the global layer of a hybrid EXAONE 4 has no rotary embedding (NoPE)
    "EXAONE 4 with a global layer": (
        lambda: _build("Exaone4", layer_types=["sliding_attention", "full_attention"]),
        None,
    ),
    # GLM rotates interleaved channel pairs (0,1), (2,3), ... of the rotary part
    "GLM": (lambda: _build("Glm"), None),
    "a Llama subclass that scales its logits": (_scaled_llama, None),
}


@pytest.mark.parametrize("name", DIFFER)
def test_same_structure_other_numbers_is_refused_with_the_measured_deviation(name, probes):
    build, fields = DIFFER[name]
    model = build()
    before = _state(model)
    with pytest.raises(UnsupportedModelError) as err:
        explain(model, batch(rows(), "left"), method="attnlrp")
    message = str(err.value)
    got = re.search(r"differs from the model's own logits by ([0-9.e+-]+) relative on a probe input", message)
    assert got and float(got.group(1)) > 1e-3, message
    assert "Supported:" in message
    if fields:
        assert fields in message
    if name.startswith("a Llama subclass"):  # logits × 1.5: the replay is off by 1/3 of the model's own logits
        assert got.group(1) == "3.3e-01"
    assert _same(model, before) and len(probes) == 1
    with pytest.raises(UnsupportedModelError):  # the verdict is kept: no second probe
        get_adapter(model)
    assert len(probes) == 1


def test_a_listed_transformers_class_is_not_probed(probes):
    model = _build("Gemma")  # unlisted: probed once
    get_adapter(model)
    llama = T.LlamaForCausalLM(T.LlamaConfig(**SMALL)).eval()  # a table row: its adapter, no probe
    get_adapter(llama)
    assert probes == [model]


# ----------------------------------------------------------------------------- refused by name
BY_NAME = {
    "Mamba": (
        lambda: _meta(
            "MambaForCausalLM", T.MambaConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, state_size=4)
        ),
        ("MambaMixer", "state-space"),
    ),
    "RWKV": (
        lambda: _meta(
            "RwkvForCausalLM",
            T.RwkvConfig(
                vocab_size=96, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64
            ),
        ),
        ("RwkvSelfAttention", "recurrence"),
    ),
    "LFM2": (
        lambda: _meta("Lfm2ForCausalLM", T.Lfm2Config(**SMALL, layer_types=["conv", "full_attention"])),
        ("Lfm2ShortConv", "convolution"),
    ),
    "Falcon-H1": (
        lambda: _meta(
            "FalconH1ForCausalLM",
            T.FalconH1Config(
                **SMALL, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=4, mamba_n_groups=1
            ),
        ),
        ("FalconH1Mixer", "state-space"),
    ),
    "RecurrentGemma": (
        lambda: _meta(
            "RecurrentGemmaForCausalLM",
            T.RecurrentGemmaConfig(
                vocab_size=96,
                hidden_size=32,
                intermediate_size=48,
                num_hidden_layers=3,
                num_attention_heads=4,
                lru_width=32,
                attention_window_size=8,
            ),
        ),
        ("RecurrentGemmaRglru", "recurrence"),
    ),
}  # parallel blocks are replayed (GPT-NeoX, Phi, Falcon: their rows; others: test_decoders_parallel.py)


@pytest.mark.parametrize("name", BY_NAME)
def test_unreplayable_blocks_are_refused_by_name(name, probes):
    build, words = BY_NAME[name]
    with pytest.raises(UnsupportedModelError) as err:
        get_adapter(build())
    message = str(err.value)
    for w in words:
        assert w in message, (name, w, message)
    assert "Supported:" in message and "probe" not in message and not probes


# ----------------------------------------------------------------------------- parts not understood are named
NOT_UNDERSTOOD = {
    "Cohere": ("CohereLayerNorm", "norm variant"),  # a parallel block whose LayerNorm has no bias and its own mean
    "Nemotron": ("NemotronLayerNorm1P", "norm variant"),  # LayerNorm with weight 1 + w
    "Olmo": ("OlmoLayerNorm", "not a norm the rules can recompute"),  # parameter-free LayerNorm, eps in its code
    "Apertus": ("XIELUActivation", "not an activation the engine knows"),
    "HunYuanDenseV1": ("query_layernorm", "is not q_proj / k_proj / v_proj / o_proj"),
    "Persimmon": ("final_layernorm", "has no norm"),
}


@pytest.mark.parametrize("family", NOT_UNDERSTOOD)
def test_parts_the_engine_does_not_know_are_named(family, probes):
    extra = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    cfg = getattr(T, f"{family}Config")(**SMALL, **extra)
    torch.manual_seed(0)
    model = getattr(T, f"{family}ForCausalLM")(cfg).eval()
    before = _state(model)
    with pytest.raises(UnsupportedModelError) as err:
        get_adapter(model)
    message = str(err.value)
    for w in NOT_UNDERSTOOD[family]:
        assert w in message, (family, w, message)
    assert "is explained when it has" in message and "Supported:" in message
    assert not probes and _same(model, before)


# ----------------------------------------------------------------------------- the probe: once, model untouched
def test_the_probe_runs_once_per_model_and_configuration(probes):
    model = _build("StableLm")
    inputs = batch(rows(), "left")
    for _ in range(2):
        explain(model, inputs, method="attnlrp")
        get_adapter(model)
    assert probes == [model]
    other = _build("StableLm", seed=1)  # another model: its own probe
    get_adapter(other)
    assert len(probes) == 2
    model.float()  # another configuration (dtype) of the first model: probed again, once
    get_adapter(model)
    get_adapter(model)
    assert len(probes) == 3


def test_a_hook_that_changes_the_models_output_is_probed_with_it_and_without_it(probes):
    """A steering hook on a layer (not run by the replay) changes the model's own logits: refused, naming the
    hook; once removed, the model is probed again (the hooks are part of the configuration) and recognised."""
    model = _build("Starcoder2")
    handle = model.model.layers[0].register_forward_hook(
        lambda m, i, out: (out[0] * 1.1,) + tuple(out[1:]) if isinstance(out, tuple) else out * 1.1
    )
    with pytest.raises(UnsupportedModelError, match=r"forward hooks on model\.layers\.0 ran in the model's own"):
        get_adapter(model)
    handle.remove()
    assert isinstance(get_adapter(model), OpenDecoderAdapter) and len(probes) == 2


def test_the_probe_leaves_a_training_model_as_found(probes):
    model = _build("Arcee").train()
    before = _state(model)
    assert isinstance(get_adapter(model), OpenDecoderAdapter)  # the probe compares in eval mode (no dropout)
    assert _same(model, before) and all(m.training for m in model.modules()) and len(probes) == 1


def test_a_meta_model_with_a_supported_structure_is_refused_without_a_probe(probes):
    with pytest.raises(UnsupportedModelError, match="meta device"):
        get_adapter(
            _meta(
                "Ministral3ForCausalLM",
                T.Ministral3Config(**SMALL, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
            )
        )
    assert not probes
