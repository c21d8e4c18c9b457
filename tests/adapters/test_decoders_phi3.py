"""Phi-3 specifics: the fused qkv and gate_up projections are explained exactly as separate ones (a Llama holding
the same weights split gives every method's map), and partial rotary rotates only part of each head. The properties
every decoder has are tested for Phi-3 in test_decoders_gpt2.py."""

from __future__ import annotations

import pytest
import torch
from decoders import batch, make_decoder, quick, rows

from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.methods.registry import DECODER_METHODS


def _as_llama(phi3: torch.nn.Module) -> torch.nn.Module:
    """A LlamaForCausalLM with Phi-3's weights, qkv_proj split into q/k/v_proj and gate_up_proj into gate/up_proj."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = phi3.config
    cfg = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        pad_token_id=0,
        attn_implementation=c._attn_implementation,
    )
    llama = LlamaForCausalLM(cfg).to(torch.float64).eval()
    q, kv = c.num_attention_heads * 8, c.num_key_value_heads * 8
    state = {}
    for name, t in phi3.state_dict().items():
        if name.endswith("qkv_proj.weight"):
            stem = name[: -len("qkv_proj.weight")]
            state.update(
                {
                    stem + "q_proj.weight": t[:q],
                    stem + "k_proj.weight": t[q : q + kv],
                    stem + "v_proj.weight": t[q + kv :],
                }
            )
        elif name.endswith("gate_up_proj.weight"):
            stem = name[: -len("gate_up_proj.weight")]
            half = t.shape[0] // 2
            state.update({stem + "gate_proj.weight": t[:half], stem + "up_proj.weight": t[half:]})
        else:
            state[name] = t
    llama.load_state_dict(state)
    return llama


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_fused_projections_explain_as_the_split_ones(attn):
    """Full rotary, no window: Phi-3 and a Llama with its split weights are the same function; every method gives
    the same map (float64, ≤ 1e-8 of the map's maximum: the fused and the split matrix products round differently,
    and the LRP baseline's separate denominators amplify that most — measured 4e-9), so the fused qkv / gate_up
    paths (explicit passes included) are exact."""
    phi3 = make_decoder(
        "phi3", attn=attn, sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}
    )
    llama = _as_llama(phi3)
    # left-padded (an explicit causal mask) and unpadded (sdpa's own causal mask in the fused passes)
    for inputs in (batch(rows(), "left"), {"input_ids": rows()[1][None]}):
        for method in DECODER_METHODS:
            a, b = (explain(m, inputs, method=method, **quick(method)) for m in (phi3, llama))
            torch.testing.assert_close(a.logits, b.logits, rtol=1e-12, atol=1e-12)
            scale = b.scores.abs().max().clamp(min=1e-30)
            assert ((a.scores - b.scores).abs().max() / scale) <= 1e-8, method


def test_partial_rotary_rotates_half_of_each_head():
    model = make_decoder("phi3")  # partial_rotary_factor 0.5, head_dim 8
    adapter = get_adapter(model)
    assert adapter.blocks[0].attn.rotary and adapter.blocks[0].attn.window == 4
    prepared = adapter.check_inputs(batch(rows(), "right"))
    cos, sin = adapter.rotary_tables(torch.zeros(3, 9, 32, dtype=torch.float64), prepared.position_ids, "default")
    assert cos.shape[-1] == 4 == sin.shape[-1]
