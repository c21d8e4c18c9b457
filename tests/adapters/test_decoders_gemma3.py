"""Gemma 3 text specifics: what the adapter reads from the model (rotary bases per layer type, windows, the attention
scale, sandwich norms, the √D embedding scale inside e). The properties every decoder has (replay = model, batch =
alone, conservation, ...) are tested for Gemma 3 in test_decoders_gpt2.py, agreement with LXT in
test_decoders_lxt.py."""

from __future__ import annotations

import pytest
import torch
from decoders import batch, make_decoder, rows

from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.adapters.gemma3 import Gemma3Adapter
from lrp_core.errors import UnsupportedModelError


def test_layer_types_give_their_window_and_rotary_base():
    model = make_decoder("gemma3")
    adapter = get_adapter(model)
    assert isinstance(adapter, Gemma3Adapter)
    sliding, full = (b.attn for b in adapter.blocks)
    assert (sliding.rope_key, sliding.window) == ("sliding_attention", 4)
    assert (full.rope_key, full.window) == ("full_attention", None)
    assert sliding.scale == full.scale == 12**-0.5  # query_pre_attn_scalar, not head_dim
    positions = torch.arange(9)[None]
    x = torch.zeros(1, 9, 32, dtype=torch.float64)
    cos_s, _ = adapter.rotary_tables(x, positions, "sliding_attention")
    cos_f, _ = adapter.rotary_tables(x, positions, "full_attention")
    assert not torch.allclose(cos_s, cos_f)  # bases 100 and 10000: the tables differ


def test_sandwich_norms_and_q_k_norms_are_the_models():
    model = make_decoder("gemma3")
    block, layer = get_adapter(model).blocks[1], model.model.layers[1]
    assert block.post1 is layer.post_attention_layernorm and block.post2 is layer.post_feedforward_layernorm
    assert block.norm2 is layer.pre_feedforward_layernorm
    assert block.attn.q_norm is layer.self_attn.q_norm and block.attn.k_norm is layer.self_attn.k_norm
    assert block.mlp.gate is layer.mlp.gate_proj and block.mlp.act is layer.mlp.act_fn


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp"])
def test_relevance_is_read_at_the_scaled_embedding(method):
    """e = embed_tokens(ids) = W[ids]·√D: the scores are Σ e ⊙ ∂y/∂e. With the scale a product, reading at W[ids]
    instead gives the same sum (e ⊙ g = W[ids]·√D ⊙ g = W[ids] ⊙ (√D g)): the check is that the adapter's e carries
    the scale, so a gradient taken at e is the model's."""
    model = make_decoder("gemma3", attn="sdpa")
    inputs = batch(rows(), "left")
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(inputs)
    e = adapter.embed(prepared).embeds
    table = model.model.embed_tokens
    scale = table.embed_scale.to(table.weight.dtype)  # √D as the model holds it (a float32 buffer)
    assert abs(float(scale) - 32**0.5) <= 1e-6
    torch.testing.assert_close(e, table.weight[inputs["input_ids"]] * scale, rtol=0, atol=0)
    exp = explain(model, inputs, method=method)
    assert torch.isfinite(exp.scores).all() and (exp.scores.abs().sum(1) > 0).all()


def test_an_embedding_model_with_bidirectional_attention_is_refused():
    with pytest.raises(UnsupportedModelError, match="bidirectional"):
        get_adapter(make_decoder("gemma3", use_bidirectional_attention=True))
