"""WhisperForConditionalGeneration (issue #48 item 2): the log-mel frames through the two-convolution stem, a
pre-LN encoder-decoder — docs/METHODS.md §2n.

What is checked: the replay's logits are the model's own (float32 1e-5, float64 1e-10; the prefix padded on
either side); input × gradient over the prefix is autograd through the model; CP-LRP with every additive
constant zeroed (the convolutions' biases, the position rows, LayerNorm β) conserves from the frames up:
Σ frames = Σ source and Σ source + Σ prefix = y_t; rows are their own alone; plain LRP is refused; untouched.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import transformers as tf

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from seq2seq_models import pad, perturb, zero_constants  # noqa: E402
from untouched import assert_untouched, snapshot  # noqa: E402

import lrp_core  # noqa: E402
from lrp_core.adapters import get_adapter  # noqa: E402
from lrp_core.errors import InputError, UnsupportedModelError  # noqa: E402

PREFIXES = [[2, 14, 15], [2, 16], [2, 17, 18, 19]]


def _whisper(dtype=torch.float64):
    torch.manual_seed(0)
    cfg = tf.WhisperConfig(
        vocab_size=40, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=24, decoder_ffn_dim=24, num_mel_bins=8, max_source_positions=6,
        max_target_positions=16, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    return perturb(tf.WhisperForConditionalGeneration(cfg).eval().to(dtype), 0)


def _inputs(side: str = "right", dtype=torch.float64) -> dict:
    g = torch.Generator().manual_seed(1)
    dec, mask = pad(PREFIXES, side)
    feats = torch.randn(3, 8, 12, generator=g, dtype=torch.float64).to(dtype)
    return {"input_features": feats, "decoder_input_ids": dec, "decoder_attention_mask": mask}


def _alone(model, inputs: dict) -> torch.Tensor:
    out = []
    with torch.no_grad():
        for i, p in enumerate(PREFIXES):
            f = inputs["input_features"][i : i + 1]
            out.append(model(input_features=f, decoder_input_ids=torch.tensor([p])).logits[0, -1])
    return torch.stack(out)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_replay_logits_equal_the_models_own(dtype, tol):
    model = _whisper(dtype)
    adapter = get_adapter(model)
    for side in ("left", "right"):
        inputs = _inputs(side, dtype)
        got = adapter.forward(adapter.check_inputs(inputs)).logits
        alone = _alone(model, inputs)
        assert float((got - alone).abs().max() / alone.abs().max()) < tol, side


def test_prefix_input_x_gradient_is_autograd_through_the_model():
    model = _whisper()
    inputs = _inputs("left")
    exp = lrp_core.explain(model, inputs, method="input_x_gradient", target=7)
    for i, p in enumerate(PREFIXES):
        d = model.get_decoder().embed_tokens(torch.tensor([p])).detach().requires_grad_(True)
        y = model(input_features=inputs["input_features"][i : i + 1], decoder_inputs_embeds=d).logits[0, -1, 7]
        (g,) = torch.autograd.grad(y, [d])
        ref = (d * g).sum(-1)[0].detach()
        got = exp.prefix[i][inputs["decoder_attention_mask"][i].bool()]
        assert float((got - ref).abs().max() / ref.abs().max()) < 1e-10, i


@pytest.mark.parametrize("method", ["cp_lrp", "attnlrp"])
def test_frames_conserve_without_constants(method):
    model = zero_constants(_whisper())
    exp = lrp_core.explain(model, _inputs("left"), method=method)
    y = exp.logits.gather(1, exp.target[:, None]).squeeze(1)
    assert exp.frames.shape == (3, 12) and exp.source.shape == (3, 6)
    assert torch.allclose(exp.frames.sum(-1), exp.source.sum(-1), rtol=1e-8, atol=0)
    if method == "cp_lrp":
        assert torch.allclose(exp.source.sum(-1) + exp.prefix.sum(-1), y, rtol=1e-8, atol=0)


def test_rows_alone_refusals_untouched():
    model = _whisper()
    before = snapshot(model)
    inputs = _inputs("left")
    for method in ("cp_lrp", "integrated_gradients", "occlusion"):
        exp = lrp_core.explain(model, inputs, method=method, target=7)
        for i, p in enumerate(PREFIXES):
            one = lrp_core.explain(
                model,
                {"input_features": inputs["input_features"][i : i + 1], "decoder_input_ids": torch.tensor([p])},
                method=method,
                target=7,
            )
            row = torch.cat([exp.source[i], exp.prefix[i][inputs["decoder_attention_mask"][i].bool()]])
            assert float((row - one.scores[0]).abs().max() / one.scores.abs().max()) < 1e-9, (method, i)
    assert_untouched(before, snapshot(model))
    with pytest.raises(UnsupportedModelError, match="convolutions"):
        lrp_core.explain(model, inputs, method="lrp")
    with pytest.raises(InputError, match="input_features"):
        lrp_core.explain(model, {"decoder_input_ids": inputs["decoder_input_ids"]}, method="cp_lrp")
