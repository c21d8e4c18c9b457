"""ModernBERT (``ModernBertForSequenceClassification``): the replay is the model in float64 (rotary q/k, global and
sliding-window layers, [CLS] and mean pooling), the window and the mean readout are the model's, CP-LRP conserves
on a bias-free model, and what the replay cannot explain is refused. The shared text-family tests
(test_text_families.py: batch = single for every method, finite scores, padding 0, the model untouched) run on
ModernBERT through ``text_families.FAMILIES``."""

from __future__ import annotations

import pytest
import torch
from text_families import make, rel_err

from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.errors import InputError, UnsupportedModelError

POOLINGS = {"cls": "modernbert", "mean": "modernbert_mean"}
CASES = [(pooling, impl) for pooling in POOLINGS for impl in ("eager", "sdpa")]
#: lengths 9, 4 and 7 (right padded): longer than the ±2 window of the sliding-window layers
ROWS = [[1, 5, 6, 7, 8, 9, 10, 11, 2], [1, 21, 22, 2], [1, 31, 32, 33, 34, 35, 2]]


def _model(pooling: str = "cls", impl: str = "sdpa", qkv_scale: float = 20.0, seed: int = 0) -> torch.nn.Module:
    """The tiny float64 ModernBERT of the shared list; ``qkv_scale`` scales Wqkv so that q·k is of the size a
    trained model's is (the random init gives |q·k| ≪ 1, where rounding q and k hardly shows)."""
    model = make(POOLINGS[pooling], impl, seed=seed).double()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.attn.Wqkv.weight.mul_(qkv_scale)
    return model


def _batch(rows=ROWS, side: str = "right") -> dict:
    T = max(map(len, rows))
    pad = [[0] * (T - len(r)) for r in rows]
    ids = [r + p if side == "right" else p + r for r, p in zip(rows, pad)]
    mask = [[1] * len(r) + [0] * len(p) if side == "right" else [0] * len(p) + [1] * len(r) for r, p in zip(rows, pad)]
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


def _alone(model, rows=ROWS) -> torch.Tensor:
    """(B, C) the model's logits of each row run alone (no padding)."""
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([r])).logits for r in rows])


# ---------------------------------------------------------------- the replay is the model
@pytest.mark.parametrize("pooling,impl", CASES)
def test_replay_of_a_padded_batch_is_the_model_in_float64(pooling, impl):
    """The padded batch, replayed as is (no trimming): each row's logits are the model's on the row alone, and
    the model's own padded forward where it is finite (sdpa), to float64 round-off. The rotation of float32
    copies of q and k is the model's (rotating in float64 instead: 5.6e-9 to 1.1e-8 off, these four cases)."""
    model = _model(pooling, impl)
    batch = _batch()
    a = get_adapter(model)
    with torch.no_grad():
        got = a.forward(a.check_inputs(batch)).logits
        own = model(**batch).logits
    assert (got - _alone(model)).abs().max() <= 1e-10
    if impl == "sdpa":
        assert (got - own).abs().max() <= 1e-10
    assert (explain(model, batch, method="rollout").logits - _alone(model)).abs().max() <= 1e-10


def test_eager_float64_padding_is_nan_in_the_model_but_not_in_the_explanation():
    """transformers' eager ModernBERT in float64 gives NaN for a row padded farther than the window past its end:
    the padding query has no key in its window, the float64 minimum becomes −inf in the float32 softmax, and the
    NaN row reaches the real tokens through 0 · NaN in the next A·V. The replay lets such a row attend itself
    (it is never read), so every row is explained as the model computes it alone."""
    model = _model("cls", "eager")
    batch = _batch()
    with torch.no_grad():
        own = model(**batch).logits
    assert torch.isnan(own[1]).all() and torch.isfinite(own[0]).all()
    for method in ("attnlrp", "transformer_attribution"):
        exp = explain(model, batch, method=method)
        assert torch.isfinite(exp.scores).all() and (exp.logits - _alone(model)).abs().max() <= 1e-10


def test_the_window_is_the_models():
    """Sliding-window layers attend to keys with |i − j| ≤ local_attention // 2 only (weight exactly 0 beyond), the
    global layer to every real key; the window changes the prediction, and the replay follows the model's."""
    model = _model("cls", "eager")
    a = get_adapter(model)
    assert [b.attn.window for b in a.blocks] == [None, 2, 2]
    assert [b.attn.rope_key for b in a.blocks] == ["full_attention", "sliding_attention", "sliding_attention"]
    ids = torch.tensor([ROWS[0]])
    trace = a.forward(a.check_inputs({"input_ids": ids}))
    far = (torch.arange(9)[:, None] - torch.arange(9)[None, :]).abs() > 2
    for b in (1, 2):
        A = trace.attention(b)[0]  # (H, N, N)
        assert (A[:, far] == 0).all() and (A[:, ~far] > 0).all()
    assert (trace.attention(0) > 0).all()
    wide = _model("cls", "eager")
    wide.config.local_attention = 32  # the masks are built from the config at each call
    with torch.no_grad():
        narrow_logits, wide_logits = model(input_ids=ids).logits, wide(input_ids=ids).logits
    assert (narrow_logits - wide_logits).abs().max() > 1e-3
    w = get_adapter(wide)
    assert (w.forward(w.check_inputs({"input_ids": ids})).logits - wide_logits).abs().max() <= 1e-10


def test_two_rotary_bases_one_per_layer_type():
    """Global and local layers rotate with their own bases (global_rope_theta / local_rope_theta): swapping the
    bases changes the logits, and the replay follows."""
    model = _model("cls", "sdpa")
    a = get_adapter(model)
    ids = torch.tensor([ROWS[0]])
    ctx = a.block_context(torch.zeros(1, 9, 32, dtype=torch.float64), torch.ones(1, 9, dtype=torch.long), None)
    (cos_global, _), (cos_local, _) = ctx[0][1], ctx[1][1]
    assert not torch.allclose(cos_global, cos_local)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    assert (a.forward(a.check_inputs({"input_ids": ids})).logits - expected).abs().max() <= 1e-10


def test_given_position_ids_are_honoured():
    """position_ids move the rotary positions (the window counts tokens): the replay is the model with them."""
    model = _model("mean", "sdpa")
    batch = _batch()
    pos = 3 + 2 * torch.arange(batch["input_ids"].shape[1])[None]
    with torch.no_grad():
        expected = model(**batch, position_ids=pos).logits
        default = model(**batch).logits
    a = get_adapter(model)
    got = a.forward(a.check_inputs({**batch, "position_ids": pos})).logits
    assert (default - expected).abs().max() > 1e-3 and (got - expected).abs().max() <= 1e-10


# ---------------------------------------------------------------- padding
@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp", "lrp", "rollout", "token_ablation"])
def test_left_padding_with_mean_pooling_is_the_model_and_each_row_alone(method):
    """Left padding (explained padded): the model's logits, positions counting the padding as the model's do. Each
    row's map is the row's alone to float64 round-off where the real tokens get the positions 0, 1, … they have
    alone (position_ids given); with the model's positions, to the round-off of its rotary angles, which it
    computes in float32 (position × inverse frequency): rollout 2e-8, and the ill-conditioned explicit pass of
    lrp (docs/METHODS.md §5.1) 1.6e-4."""
    model = _model("mean", "sdpa")
    batch = _batch(side="left")
    with torch.no_grad():
        expected = model(**batch).logits
    exp = explain(model, batch, method=method)
    assert (exp.logits - expected).abs().max() <= 1e-10
    real_positions = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    shifted = explain(model, {**batch, "position_ids": real_positions}, method=method)
    T = batch["input_ids"].shape[1]
    for i, r in enumerate(ROWS):
        one = explain(model, {"input_ids": torch.tensor([r])}, method=method)
        if method != "token_ablation":  # given positions stay with their tokens when one is removed; alone: 0, 1, …
            assert rel_err(shifted.scores[i, T - len(r) :], one.scores[0]) <= 1e-10, method
        assert (exp.scores[i, : T - len(r)] == 0).all() and (shifted.scores[i, : T - len(r)] == 0).all()
        if method != "lrp":
            assert rel_err(exp.scores[i, T - len(r) :], one.scores[0]) <= 1e-7, method


def test_cls_pooling_of_a_left_padded_row_is_refused():
    """[CLS] pooling reads token 0, which left padding makes a padding token: refused, with the fix."""
    model = _model("cls", "sdpa")
    with pytest.raises(InputError, match="padding_side"):
        explain(model, _batch(side="left"), method="attnlrp")


# ---------------------------------------------------------------- the mean readout
def test_mean_readout_weights_and_token_ablation_are_the_models():
    """The token weights are 1/P on each real token; token ablation's score of token i is the model's logit minus
    the model's logit of the row without token i (the mean then over the P − 1 others)."""
    model = _model("mean", "eager")
    batch = _batch()
    a = get_adapter(model)
    prepared = a.check_inputs(batch)
    readout = a.readout_for(prepared)
    w = readout.weights(9)
    assert torch.equal(w, batch["attention_mask"].double() / batch["attention_mask"].sum(1, keepdim=True))
    M = torch.rand(3, 2, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert (readout.row(M) - (w[:, None, None, :] @ M)[..., 0, :]).abs().max() <= 1e-15  # the map's row: wᵀM
    assert a.layout(prepared).readout_tokens == ()
    exp = explain(model, batch, method="token_ablation")
    t = exp.target
    for i, r in enumerate(ROWS):
        full = _alone(model, [r])[0, t[i]]
        ref = torch.stack([full - _alone(model, [r[:j] + r[j + 1 :]])[0, t[i]] for j in range(len(r))])
        assert (exp.scores[i, : len(r)] - ref).abs().max() <= 1e-10


# ---------------------------------------------------------------- conservation (bias-free: the config's biases
# are off; only the classifier's is zeroed)
@pytest.mark.parametrize("pooling,impl", CASES)
def test_cp_lrp_conserves_and_the_explicit_pass_conserves(pooling, impl):
    """CP-LRP: Σ scores = y_t and every block's total = y_t (the identity rule's 1e-10 stabiliser aside). The
    explicit pass of transformer_attribution conserves its starting 1 at every block (up to its stabilisers).
    pa_lrp on AttnLRP gives the rotary tables a share; on CP-LRP none (q, k detached)."""
    model = _model(pooling, impl)
    with torch.no_grad():
        model.classifier.bias.zero_()
    assert all(not n.endswith("bias") or n == "classifier.bias" for n, _ in model.named_parameters())
    batch = _batch()
    exp = explain(model, batch, method="cp_lrp")
    y = exp.logits.gather(1, exp.target[:, None])[:, 0]
    assert ((exp.scores.sum(1) - y).abs() / y.abs()).max() <= 1e-9  # measured 8.6e-11
    assert ((exp.conservation.blocks - y[:, None]).abs() / y.abs()[:, None]).max() <= 1e-9
    ta = explain(model, batch, method="transformer_attribution")
    assert (ta.token_relevance.sum(-1) - 1).abs().max() <= 1e-6  # the stabilisers: measured 6.3e-8
    pa = explain(model, batch, method="pa_lrp")
    assert pa.positional.abs().max() > 1e-3 and (pa.positional[batch["attention_mask"] == 0] == 0).all()
    pa_cp = explain(model, batch, method="pa_lrp", base="cp_lrp")
    assert pa_cp.positional.abs().max() == 0 and torch.allclose(pa_cp.scores, exp.scores, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- refusals
def test_what_the_replay_cannot_explain_is_refused():
    model = _model("cls", "sdpa")
    batch = _batch()
    with pytest.raises(InputError, match="inputs_embeds"):
        explain(model, {**batch, "inputs_embeds": torch.zeros(3, 9, 32)}, method="attnlrp")
    flash = _model("cls", "sdpa")
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(UnsupportedModelError, match="flash_attention_2"):
        explain(flash, batch, method="attnlrp")
    per_token = _model("cls", "sdpa")
    # transformers validates the field (cls / mean); a config that bypasses it would classify every token
    object.__setattr__(per_token.config, "classifier_pooling", "none")
    with pytest.raises(UnsupportedModelError, match="classifier_pooling"):
        explain(per_token, batch, method="attnlrp")
    # token_type_ids change nothing in the model (no segment table; its forward ignores them)
    types = torch.ones_like(batch["input_ids"])
    with torch.no_grad():
        assert torch.equal(model(**batch, token_type_ids=types).logits, model(**batch).logits)
    assert torch.equal(
        explain(model, {**batch, "token_type_ids": types}, method="attnlrp").scores,
        explain(model, batch, method="attnlrp").scores,
    )
