"""ESM (``EsmForSequenceClassification``, protein models): the replay is the model (float32 1e-5, float64 1e-10) with
rotary positions (ESM-2: float32 copies of q and k rotated, token dropout) or absolute ones (ESM-1b: the embedding
LayerNorm), eager and sdpa, right and left padding; batch = each row alone; padding scores 0; CP-LRP conserves on a
constant-free variant; input × gradient is autograd through the model; every method runs; the model is untouched;
the other ESM heads are refused."""

from __future__ import annotations

import pytest
import torch
from conftest import _perturb_norms
from text_families import rel_err
from untouched import assert_untouched, snapshot

import lrp_core
from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.errors import InputError, UnsupportedModelError

#: name -> config changes: ESM-2's layout (rotary, token dropout, no embedding norm) and ESM-1b's
CONFIGS = {
    "esm2": dict(position_embedding_type="rotary", token_dropout=True, emb_layer_norm_before=False),
    "esm1b": dict(position_embedding_type="absolute", token_dropout=False, emb_layer_norm_before=True),
}
CASES = [(c, impl) for c in CONFIGS for impl in ("eager", "sdpa")]
MASK, PAD = 32, 1
#: <cls> … <eos> rows; token 32 is the mask token (token dropout scales the rows that hold it)
ROWS = [[0, 5, 6, MASK, 8, 9, 2], [0, 21, 22, 2], [0, 11, MASK, MASK, 14, 2]]


def make(config: str = "esm2", impl: str = "eager", seed: int = 0, scale: float = 8.0) -> torch.nn.Module:
    """A tiny random ESM classifier (2 pre-LN layers, 2 heads of 16, 3 classes), LayerNorms perturbed, q / k scaled
    by ``scale`` so that the rotation and the softmax matter."""
    from transformers import EsmConfig, EsmForSequenceClassification

    torch.manual_seed(seed)
    cfg = EsmConfig(
        vocab_size=33,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=3,
        pad_token_id=PAD,
        mask_token_id=MASK,
        max_position_embeddings=40,
        attn_implementation=impl,
        **CONFIGS[config],
    )
    model = EsmForSequenceClassification(cfg).eval()
    _perturb_norms(model, seed)
    with torch.no_grad():
        for layer in model.esm.encoder.layer:
            layer.attention.self.query.weight.mul_(scale)
            layer.attention.self.key.weight.mul_(scale)
    return model


def batch(side: str = "right") -> dict:
    T = max(map(len, ROWS))
    pad = [[PAD] * (T - len(r)) for r in ROWS]
    ids = [r + p if side == "right" else p + r for r, p in zip(ROWS, pad)]
    mask = [[1] * len(r) + [0] * len(p) if side == "right" else [0] * len(p) + [1] * len(r) for r, p in zip(ROWS, pad)]
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


def _logits(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("config,impl", CASES)
def test_replay_is_the_model(config, impl, side):
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
        model = make(config, impl).to(dtype)
        inputs = batch(side)
        a = get_adapter(model)
        own = _logits(model, inputs)
        assert (a.forward(a.check_inputs(inputs)).logits - own).abs().max() <= tol * own.abs().max(), dtype


def test_rotation_token_dropout_and_given_positions_are_the_models():
    """Rotating float64 q and k instead of the model's float32 copies, or leaving out the token-dropout scale, is
    visibly off; given position_ids move the rotary positions, and the replay follows."""
    model = make("esm2").double()
    inputs = batch()
    own = _logits(model, inputs)
    a = get_adapter(model)
    assert a.blocks[0].attn.rotary_dtype == torch.float32 and a.blocks[0].attn.query_scale == 16**-0.5
    unmasked = {**inputs, "input_ids": inputs["input_ids"].masked_fill(inputs["input_ids"] == MASK, 7)}
    assert (_logits(model, unmasked) - own).abs().max() > 1e-3 * own.abs().max()
    pos = 3 + 2 * torch.arange(7)[None]
    moved = _logits(model, {**inputs, "position_ids": pos})
    assert (moved - own).abs().max() > 1e-3 * own.abs().max()
    got = explain(model, {**inputs, "position_ids": pos}, method="attnlrp").logits
    assert (got - moved).abs().max() <= 1e-10 * moved.abs().max()


@pytest.mark.parametrize("config", list(CONFIGS))
def test_batch_equals_each_row_alone_and_padding_scores_zero(config):
    """Right padding: each row's map is the row's alone (float64, every method); rotary positions count from 0
    in both, the absolute ones from the padding index on."""
    model = make(config).double()
    inputs = batch()
    mask = inputs["attention_mask"]
    methods = lrp_core.METHODS if config == "esm2" else ("attnlrp", "cp_lrp", "lrp", "transformer_attribution")
    for method in methods:
        exp = explain(model, inputs, method=method)
        assert torch.isfinite(exp.scores).all() and (exp.scores[mask == 0] == 0).all(), method
        for i, row in enumerate(ROWS):
            one = explain(model, {"input_ids": torch.tensor([row])}, method=method)
            assert rel_err(exp.scores[i, : len(row)], one.scores[0]) <= 1e-8, (config, method)


def test_left_padding_is_the_model_and_scores_zero():
    model = make("esm2").double()
    inputs = batch("left")
    own = _logits(model, inputs)
    for method in ("attnlrp", "cp_lrp", "lrp", "rollout"):
        exp = explain(model, inputs, method=method)
        assert (exp.logits - own).abs().max() <= 1e-10 * own.abs().max()
        assert torch.isfinite(exp.scores).all() and (exp.scores[inputs["attention_mask"] == 0] == 0).all()


def _constant_free(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "position_embeddings" in name:
                p.zero_()
    return model


@pytest.mark.parametrize("config", list(CONFIGS))
def test_cp_lrp_conserves_without_additive_constants(config):
    """Biases, LayerNorm β and the absolute position rows zeroed: Σ scores = y_t at every block (the rotation and
    the token-dropout scale are linear, the softmax detached)."""
    model = _constant_free(make(config).double())
    inputs = batch()
    exp = explain(model, inputs, method="cp_lrp")
    y = exp.logits.gather(1, exp.target[:, None])[:, 0]
    # the identity rule's 1e-10 stabiliser at the GELUs aside: measured 1.5e-9 (ESM-2), 1.4e-10 (ESM-1b) relative
    assert ((exp.scores.sum(1) - y).abs() / y.abs()).max() <= 5e-9
    assert ((exp.conservation.blocks - y[:, None]).abs() / y.abs()[:, None]).max() <= 5e-9


@pytest.mark.parametrize("config", list(CONFIGS))
def test_input_x_gradient_is_autograd_through_the_model(config):
    """At the word embeddings; with token dropout the model's own forward from ``input_ids`` (its scale and the
    mask tokens' zero rows are functions of the ids), its word-embedding output read by a forward hook."""
    model = make(config).double()
    inputs = batch()
    exp = explain(model, inputs, method="input_x_gradient")
    seen = {}
    handle = model.esm.embeddings.word_embeddings.register_forward_hook(lambda m, a, out: seen.update(words=out))
    try:
        y = model(**inputs).logits
    finally:
        handle.remove()
    words = seen["words"]
    (grad,) = torch.autograd.grad(y[torch.arange(3), exp.target].sum(), words)
    expected = (words * grad).sum(-1).detach() * inputs["attention_mask"]
    # ESM-2's own backward rounds the gradient at its float32 copies of q and k, which the replay's rounding passes
    # unchanged (as ModernBERT's, docs/METHODS.md §2j): measured 2.4e-8; absolute positions: float64 round-off
    assert rel_err(exp.scores, expected) <= (1e-7 if config == "esm2" else 1e-10)


def test_every_method_runs_and_the_model_is_untouched():
    model = make("esm2", "sdpa")
    model.train()
    inputs = batch()
    before = snapshot(model)
    for method in lrp_core.METHODS:
        assert torch.isfinite(explain(model, inputs, method=method).scores).all(), method
    assert_untouched(before, snapshot(model))
    with pytest.raises(InputError, match="inputs_embeds"):
        explain(model, {**inputs, "inputs_embeds": torch.zeros(3, 7, 32)}, method="attnlrp")
    assert_untouched(before, snapshot(model))


def test_the_other_esm_heads_are_refused():
    from transformers import EsmConfig, EsmForMaskedLM

    model = EsmForMaskedLM(
        EsmConfig(
            vocab_size=33,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            pad_token_id=PAD,
            mask_token_id=MASK,
        )
    )
    with pytest.raises(UnsupportedModelError, match="predict per token") as err:
        explain(model, {"input_ids": torch.tensor([[0, 5, 2]])})
    assert "EsmForSequenceClassification" in str(err.value)
