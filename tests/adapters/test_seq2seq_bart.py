"""Encoder-decoders of the BART layout (issue #48): BART, Marian, mBART, Pegasus — docs/METHODS.md §2i.

Tiny seeded models (tests/adapters/seq2seq_models.py), float64 unless named. What is checked:
* the replay's logits are the model's own (each row alone; float32 1e-5, float64 1e-10);
* input × gradient is autograd through the model's own forward at its word embeddings;
* CP-LRP conserves, Σ source + Σ prefix = y_t, with every additive constant zeroed;
* every defined method: a row's scores do not depend on its batch or on padding on either side, padding and the
  prefix after the explained position score 0; the layer-product methods are refused with the reason;
* the model is untouched; ``position=`` reads another prefix token.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from seq2seq_models import PREFIXES, SOURCES, batch, input_x_gradient, make_seq2seq, own_logits, zero_constants  # noqa: E402
from untouched import assert_untouched, snapshot  # noqa: E402

import lrp_core  # noqa: E402
from lrp_core.adapters import get_adapter  # noqa: E402
from lrp_core.errors import InputError, UnsupportedModelError  # noqa: E402
from lrp_core.methods.registry import METHOD_NAMES  # noqa: E402

FAMILIES = ("bart", "marian", "mbart", "pegasus", "blenderbot_small")
QUICK = {"integrated_gradients": {"n_steps": 4}, "smoothgrad": {"n_samples": 3}, "kernel_shap": {"n_samples": 16}}
SIDES = [("right", "right"), ("left", "left"), ("left", "right"), ("right", "left")]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-300))


def _defined(model) -> list:
    return [m for m in METHOD_NAMES if m not in get_adapter(model).refused_methods]


def _row(exp, inputs: dict, i: int) -> torch.Tensor:
    """Row i's scores at its real source and prefix tokens (source first)."""
    src = exp.source[i][inputs["attention_mask"][i].bool()]
    return torch.cat([src, exp.prefix[i][inputs["decoder_attention_mask"][i].bool()]])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_replay_logits_equal_the_models_own(family, dtype, tol):
    model = make_seq2seq(family, dtype)
    alone = own_logits(model, SOURCES, PREFIXES)
    adapter = get_adapter(model)
    for src_side, dec_side in SIDES:
        got = adapter.forward(adapter.check_inputs(batch(SOURCES, PREFIXES, src_side, dec_side))).logits
        assert _rel(got, alone) < tol, (src_side, dec_side, _rel(got, alone))
    exp = lrp_core.explain(model, batch(SOURCES, PREFIXES), method="cp_lrp")  # the verified call
    assert _rel(exp.logits, alone) < tol


@pytest.mark.parametrize("family", FAMILIES)
def test_input_x_gradient_is_autograd_through_the_model(family):
    model = make_seq2seq(family)
    inputs = batch(SOURCES, PREFIXES, "left", "right")
    exp = lrp_core.explain(model, inputs, method="input_x_gradient", target=7)
    for i, (s, p) in enumerate(zip(SOURCES, PREFIXES)):
        ref = input_x_gradient(model, s, p, 7)
        assert _rel(_row(exp, inputs, i), ref) < 1e-10, i
    assert exp.source.shape == inputs["input_ids"].shape and exp.prefix.shape == inputs["decoder_input_ids"].shape


@pytest.mark.parametrize("family", FAMILIES)
def test_cp_lrp_conserves_without_additive_constants(family):
    model = zero_constants(make_seq2seq(family))
    exp = lrp_core.explain(model, batch(SOURCES, PREFIXES, "left", "right"), method="cp_lrp")
    y = exp.logits.gather(1, exp.target[:, None]).squeeze(1)
    total = exp.source.sum(-1) + exp.prefix.sum(-1)
    # exact up to the rules' stabilisers (the identity rule's ε on GELU): measured ≤ 2.4e-10 relative
    assert torch.allclose(total, y, rtol=1e-8, atol=0), (total, y)
    assert torch.allclose(exp.conservation.blocks, y[:, None].expand_as(exp.conservation.blocks), rtol=1e-8)
    assert (exp.source.abs().sum(-1) > 0).all()  # the source carries relevance, through the cross-attention
    # the constants matter: kept, their share is missing well beyond round-off
    kept = lrp_core.explain(make_seq2seq(family), batch(SOURCES, PREFIXES), method="cp_lrp")
    y_kept = kept.logits.gather(1, kept.target[:, None]).squeeze(1)
    assert not torch.allclose(kept.scores.sum(-1), y_kept, rtol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bart", "marian"])
def test_every_method_batch_and_padding_invariant(family):
    model = make_seq2seq(family)
    for method in _defined(model):
        alone = [
            lrp_core.explain(model, batch([s], [p]), method=method, target=7, **QUICK.get(method, {})).scores[0]
            for s, p in zip(SOURCES, PREFIXES)
        ]
        for src_side, dec_side in SIDES[:2] + SIDES[3:]:
            inputs = batch(SOURCES, PREFIXES, src_side, dec_side)
            exp = lrp_core.explain(model, inputs, method=method, target=7, **QUICK.get(method, {}))
            assert (exp.source[inputs["attention_mask"] == 0] == 0).all(), method
            assert (exp.prefix[inputs["decoder_attention_mask"] == 0] == 0).all(), method
            for i, one in enumerate(alone):
                assert _rel(_row(exp, inputs, i), one) < 1e-9, (method, src_side, dec_side, i)


def test_position_reads_another_prefix_token_and_later_ones_score_zero():
    model = make_seq2seq("bart")
    inputs = batch(SOURCES, PREFIXES)
    exp = lrp_core.explain(model, inputs, method="attnlrp", position=1, target=7)
    short = [p[:2] for p in PREFIXES]
    ref = own_logits(model, SOURCES, short)
    assert _rel(exp.logits, ref) < 1e-10
    assert (exp.prefix[:, 2:] == 0).all() and (exp.prefix[:, :2] != 0).any()
    again = lrp_core.explain(model, batch(SOURCES, short), method="attnlrp", target=7)
    assert _rel(exp.scores[:, : again.scores.shape[1]], again.scores) < 1e-10


@pytest.mark.parametrize("method", ["rollout", "transformer_attribution", "partial_lrp", "token_ablation", "pa_lrp"])
def test_layer_product_methods_refused_with_the_reason(method):
    model = make_seq2seq("marian")
    with pytest.raises(UnsupportedModelError, match="not defined on MarianMTModel"):
        lrp_core.explain(model, batch(SOURCES, PREFIXES), method=method)


def test_model_untouched_and_bad_inputs():
    model = make_seq2seq("bart")
    before = snapshot(model)
    for method in _defined(model):
        lrp_core.explain(model, batch(SOURCES, PREFIXES, "left", "left"), method=method, **QUICK.get(method, {}))
    assert_untouched(before, snapshot(model))
    inputs = batch(SOURCES, PREFIXES)
    with pytest.raises(InputError, match="decoder_input_ids"):
        lrp_core.explain(model, {"input_ids": inputs["input_ids"]}, method="cp_lrp")
    with pytest.raises(InputError, match="encoder_outputs"):
        lrp_core.explain(model, {**inputs, "encoder_outputs": torch.zeros(1)}, method="cp_lrp")
    with pytest.raises(InputError, match="padding"):
        lrp_core.explain(model, inputs, method="cp_lrp", position=3)
    with pytest.raises(InputError, match="vocabulary"):
        lrp_core.explain(model, {**inputs, "decoder_input_ids": inputs["decoder_input_ids"] + 100}, method="cp_lrp")


def test_source_and_prefix_are_the_scores_parts():
    model = make_seq2seq("marian")
    inputs = batch(SOURCES, PREFIXES, "left", "right")
    exp = lrp_core.explain(model, inputs, method="attnlrp")
    S = inputs["input_ids"].shape[1]
    assert exp.source_length == S and exp.scores.shape[1] == S + inputs["decoder_input_ids"].shape[1]
    assert torch.equal(torch.cat([exp.source, exp.prefix], dim=1), exp.scores)
    assert torch.equal(exp[1].source, exp.source[1:2])


@pytest.mark.parametrize(
    "cls, config",
    [
        ("WhisperModel", "WhisperConfig"),
        ("BlenderbotForConditionalGeneration", "BlenderbotConfig"),
        ("M2M100ForConditionalGeneration", "M2M100Config"),
        ("BartModel", "BartConfig"),
    ],
)
def test_other_encoder_decoders_refused_by_name(cls, config):
    import transformers as tf

    kw = dict(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2)
    kw.update(decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16)
    if cls.startswith("Whisper"):
        kw.update(num_mel_bins=8, max_source_positions=8, max_target_positions=16, pad_token_id=1)
        kw.update(bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    model = getattr(tf, cls)(getattr(tf, config)(**kw)).eval()
    with pytest.raises(UnsupportedModelError, match="(?i)other encoder-decoders") as err:
        get_adapter(model)
    assert cls in str(err.value) and "BartForConditionalGeneration" in str(err.value)
