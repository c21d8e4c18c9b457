"""GPT-2, Gemma 3 text, Phi-3 and the parallel-block families (GPT-NeoX, Phi-1/2, Falcon), every head and attention
implementation.

Tiny seeded models from ``tests/decoders.py``, float64: the replay is the model; every method gives each row the
map it gives the row alone, padded on the left or the right, padding 0; eager equals sdpa; CP-LRP conserves with
the additive constants zeroed; ``position=`` is teacher forcing; the model stays untouched; bad inputs are refused.
GPT-2's AttnLRP / CP-LRP equal a hand-written GPT-2 with LXT's rules (docs/METHODS.md §2c).
"""

from __future__ import annotations

import pytest
import torch
from decoders import batch, make_decoder, model_logits, quick, rows
from untouched import assert_untouched, snapshot

from lrp_core import Contrast, explain
from lrp_core.adapters import get_adapter
from lrp_core.adapters.gpt2 import Conv1DLinear, GPT2Adapter
from lrp_core.errors import InputError
from lrp_core.methods.registry import DECODER_METHODS

FAMILIES = ("gpt2", "gemma3", "phi3", "gpt_neox", "phi", "falcon")
HEADS = ("causal", "seq")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| relative to max |b| (absolute where b is all zero)."""
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30)) if b.abs().max() > 0 else float(a.abs().max())


# ---------------------------------------------------------------- the replay is the model
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", FAMILIES)
def test_replay_logits_are_the_models(family, attn, head, side):
    """The adapter's replay gives the model's own logits at each row's last real token.

    sdpa in float64 (to round-off). Eager in float32: transformers' eager attention with a sliding window returns
    NaN in float64 (its mask's minimum overflows), and its softmax computes in float32 anyway (Gemma 3, Phi-3)."""
    dtype = torch.float64 if attn == "sdpa" else torch.float32
    model = make_decoder(family, attn=attn, head=head, dtype=dtype)
    inputs = batch(rows(), side)
    expected = model_logits(model, inputs)
    adapter = get_adapter(model)
    with torch.no_grad():
        got = adapter.forward(adapter.check_inputs(inputs)).logits
    tol = 1e-12 if attn == "sdpa" else 1e-5
    if (family, attn, head, side) == ("falcon", "sdpa", "seq", "left"):
        # FalconForSequenceClassification does not pass position_ids on: the model rotates a left-padded row from
        # position 0 at its first padding token, the replay from its first real token (the row alone's positions).
        # The same relative positions; the float32 rotary tables at the shifted positions: measured 3.4e-9
        tol = 1e-8
    assert (got - expected).abs().max() <= tol
    assert (explain(model, inputs, method="rollout").logits - expected).abs().max() <= tol


# ---------------------------------------------------------------- every method: batch, either side, alone
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_method_gives_each_row_its_own_map_padded_left_right_or_alone(family, head):
    model = make_decoder(family, attn="sdpa", head=head)
    seqs = rows()
    for method in DECODER_METHODS:
        alone = [explain(model, {"input_ids": s[None]}, method=method, **quick(method)).scores[0] for s in seqs]
        for side in ("left", "right"):
            inputs = batch(seqs, side)
            exp = explain(model, inputs, method=method, **quick(method))
            mask = inputs["attention_mask"].bool()
            assert exp.scores.shape == mask.shape and torch.isfinite(exp.scores).all(), (method, side)
            assert (exp.scores[~mask] == 0).all(), (method, side, "padding scores 0")
            for i, one in enumerate(alone):
                assert _rel(exp.scores[i][mask[i]], one) <= 1e-8, (family, head, method, side, i)


@pytest.mark.parametrize("family", FAMILIES)
def test_eager_and_sdpa_give_the_same_maps(family):
    """sdpa: AttnLRP / CP-LRP run the fused attention (no N×N map); the others replay eagerly. Same numbers — up
    to float32 round-off (amplified by the explicit passes) where the eager model computes its softmax in
    float32 (Gemma 3, Phi-3)."""
    inputs = batch(rows(), "left")
    eager, sdpa = make_decoder(family, attn="eager"), make_decoder(family, attn="sdpa")
    for method in ("attnlrp", "cp_lrp", "transformer_attribution", "lrp", "cdam"):
        a, b = explain(eager, inputs, method=method).scores, explain(sdpa, inputs, method=method).scores
        assert _rel(a, b) <= (1e-10 if family == "gpt2" else 1e-4), (family, method)


# ---------------------------------------------------------------- conservation (§2b, §2c)
def _zero_additive_constants(model: torch.nn.Module) -> torch.nn.Module:
    """Biases, LayerNorm β and learned position embeddings set to zero (RMSNorm has no β; Gemma's √D is a product)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".wpe." in name:
                p.zero_()
    return model


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("family", FAMILIES)
def test_cp_lrp_conserves_the_logit_with_every_additive_constant_zero(family, head):
    """Σ_tokens scores = y_t per row. GPT-2: up to the identity rule's stabiliser (f(x) / (x + 1e-10) at GELU:
    measured 3e-10 relative). Gemma 3 / Phi-3: their RMSNorm computes in float32 (the model's arithmetic, kept by
    LXT's patch), so a float64 model conserves to float32 round-off only."""
    model = _zero_additive_constants(make_decoder(family, attn="sdpa", head=head))
    inputs = batch(rows(), "left")
    exp = explain(model, inputs, method="cp_lrp")
    y = exp.logits.gather(1, exp.target[:, None])[:, 0]
    tol = 1e-8 if family == "gpt2" else 1e-5
    assert ((exp.scores.sum(1) - y).abs() / y.abs()).max() <= tol, (exp.scores.sum(1), y)


# ---------------------------------------------------------------- what is explained
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ["attnlrp", "transformer_attribution", "lrp", "token_ablation", "attention_gradcam"])
def test_position_is_teacher_forcing(family, method):
    """``position=p`` explains the prediction at p: the same map as the row cut after p, zero after p."""
    model = make_decoder(family, attn="sdpa")
    seqs = rows()
    inputs = batch(seqs, "left")
    T = inputs["input_ids"].shape[1]
    p = [T - 3, T - 2, T - 4]  # real tokens of each (left-padded) row
    exp = explain(model, inputs, method=method, position=p)
    for i, s in enumerate(seqs):
        keep = p[i] - (T - len(s)) + 1  # tokens of row i up to and including p
        cut = explain(model, {"input_ids": s[None, :keep]}, method=method)
        assert _rel(exp.scores[i, p[i] - keep + 1 : p[i] + 1], cut.scores[0]) <= 1e-8
        assert (exp.scores[i, p[i] + 1 :] == 0).all()
        assert torch.equal(exp.target[i], cut.target[0])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_contrast_is_the_difference_of_the_two_maps(family):
    """AttnLRP / CP-LRP are linear in the explained output: y_a − y_b gives map(a) − map(b) (to float32 round-off
    where the gradient passes an RMSNorm computed in float32)."""
    model = make_decoder(family, attn="sdpa")
    inputs = batch(rows(), "right")
    for method in ("attnlrp", "cp_lrp"):
        a = explain(model, inputs, method=method, target=[3, 4, 5]).scores
        b = explain(model, inputs, method=method, target=[7, 8, 9]).scores
        both = explain(model, inputs, method=method, target=Contrast([3, 4, 5], [7, 8, 9])).scores
        assert _rel(both, a - b) <= (1e-10 if family == "gpt2" else 1e-6)


# ---------------------------------------------------------------- the model is untouched; bad input
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("family", FAMILIES)
def test_model_is_untouched(family, head):
    model = make_decoder(family, attn="sdpa", head=head, dtype=torch.float32)
    model.train()  # an unusual mode must survive too (dropout is an identity in the replay)
    inputs = batch(rows(), "left")
    before = snapshot(model)
    for method in DECODER_METHODS:
        explain(model, inputs, method=method, **quick(method))
        assert_untouched(before, snapshot(model))


@pytest.mark.parametrize("family", FAMILIES)
def test_bad_inputs_are_refused_clearly(family):
    model = make_decoder(family, attn="sdpa")
    inputs = batch(rows(), "right")
    cases = [
        (
            dict(
                inputs=dict(
                    inputs,
                    attention_mask=torch.cat(
                        [inputs["attention_mask"][:2], torch.zeros_like(inputs["attention_mask"][2:])]
                    ),
                )
            ),
            "all padding",
        ),
        (dict(inputs={"input_ids": torch.zeros(1, 0, dtype=torch.long)}), "empty"),
        (dict(inputs=inputs, target=10_000), "10000"),
        (dict(inputs=inputs, position=40), "past the row"),
        (dict(inputs=inputs, position=[8, 8, 8]), "padding"),
        (dict(inputs=inputs, method="attnlrp", start_layer=1), "start_layer"),
        (dict(inputs={"input_ids": inputs["input_ids"] + 200}), "vocabulary"),
    ]
    for kw, words in cases:
        kw = {"method": "transformer_attribution", **kw}
        with pytest.raises(InputError, match=words):
            explain(model, kw.pop("inputs"), **kw)


def test_gpt2_refuses_token_type_ids():
    model = make_decoder("gpt2", attn="sdpa")
    inputs = batch(rows(), "right")
    with pytest.raises(InputError, match="token_type_ids"):
        explain(model, dict(inputs, token_type_ids=torch.zeros_like(inputs["input_ids"])), method="attnlrp")


# ---------------------------------------------------------------- GPT-2: Conv1D views, LXT's rules by hand
def test_gpt2_blocks_read_the_conv1d_weights_through_views():
    model = make_decoder("gpt2")
    adapter = get_adapter(model)
    assert isinstance(adapter, GPT2Adapter)
    block, layer = adapter.blocks[0], model.transformer.h[0]
    for view, conv in (
        (block.attn.qkv, layer.attn.c_attn),
        (block.attn.proj, layer.attn.c_proj),
        (block.mlp.fc1, layer.mlp.c_fc),
        (block.mlp.fc2, layer.mlp.c_proj),
    ):
        assert isinstance(view, Conv1DLinear) and view.weight.data_ptr() == conv.weight.data_ptr()
        assert view.weight.shape == conv.weight.shape[::-1]
    assert adapter.readout.head_layers[0].module is model.lm_head
    assert model.lm_head.weight is model.transformer.wte.weight


class _DivideGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g / ctx.factor, None


class _IdentityRule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fn):
        y = fn(x)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y / (x + 1e-10), None


def _lxt_gpt2(model, ids: torch.Tensor, cp: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """LXT's GPT-2 rules written out on one unpadded row ids (T,): LayerNorm std detached, the identity rule on
    GELU, AttnLRP: q, k gradient ÷4 and v ÷2 / CP-LRP: q, k detached. -> (scores (T,), target logit)."""
    tr = model.transformer
    T, D, H = ids.shape[0], model.config.n_embd, model.config.n_head
    e = tr.wte(ids)[None].detach().requires_grad_(True)
    x = e + tr.wpe(torch.arange(T))[None]

    def ln(m, x):
        c = x - x.mean(-1, keepdim=True)
        return c / (c.pow(2).mean(-1, keepdim=True) + m.eps).sqrt().detach() * m.weight + m.bias

    def conv(m, x):
        return x @ m.weight + m.bias

    causal = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    for blk in tr.h:
        qkv = conv(blk.attn.c_attn, ln(blk.ln_1, x)).split(D, -1)
        q, k, v = (t.reshape(1, T, H, D // H).transpose(1, 2) for t in qkv)
        q, k, v = (
            (q.detach(), k.detach(), v)
            if cp
            else (_DivideGradient.apply(q, 4.0), _DivideGradient.apply(k, 4.0), _DivideGradient.apply(v, 2.0))
        )
        A = ((q @ k.transpose(-1, -2)) * blk.attn.scaling + causal).softmax(-1)
        x = x + conv(blk.attn.c_proj, (A @ v).transpose(1, 2).reshape(1, T, D))
        x = x + conv(blk.mlp.c_proj, _IdentityRule.apply(conv(blk.mlp.c_fc, ln(blk.ln_2, x)), blk.mlp.act))
    logits = ln(tr.ln_f, x)[0, -1] @ model.lm_head.weight.T
    y = logits[logits.argmax()]
    (g,) = torch.autograd.grad(y, e)
    return (e * g).sum(-1)[0].detach(), y.detach()


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_gpt2_attnlrp_and_cp_lrp_equal_lxts_rules_written_out(method, side):
    model = make_decoder("gpt2", attn="sdpa")
    seqs = rows()
    exp = explain(model, batch(seqs, side), method=method)
    mask = batch(seqs, side)["attention_mask"].bool()
    for i, s in enumerate(seqs):
        ref, y = _lxt_gpt2(model, s, cp=method == "cp_lrp")
        assert _rel(exp.scores[i][mask[i]], ref) <= 1e-10
        assert abs(float(exp.logits[i, exp.target[i]] - y)) <= 1e-12
