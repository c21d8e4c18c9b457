"""DeBERTa-v2 / v3 (``DebertaV2ForSequenceClassification``, disentangled attention): the replay is the model
(float32 1e-5, float64 1e-10) for every layout of the position terms (c2p / p2c, log buckets or none, shared or
separate position projections, absolute positions, token types, embed_proj), right and left padding; batch =
each row alone; padding scores 0; CP-LRP conserves on a constant-free variant; input × gradient is autograd
through the model; the explicit pass takes §1's MatMul rule at each product and the normalised add of the three;
every method runs or is refused with the reason; the model is untouched. transformers has one attention path
for DeBERTa-v2 (no sdpa), so there is one implementation to follow."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import _perturb_norms
from text_families import rel_err
from untouched import assert_untouched, snapshot

import lrp_core
from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.adapters.blocks import Replay
from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.rules import functional as F
from lrp_core.rules.composites import ATTNLRP, CP_LRP, TRANSFORMER_ATTRIBUTION

#: DeBERTa-v3's layout (microsoft/deberta-v3-base's config, tiny): both terms, 256 buckets, shared projections,
#: the relative table normalised, no absolute positions and no token types
V3 = dict(
    relative_attention=True,
    pos_att_type=["p2c", "c2p"],
    position_buckets=256,
    max_relative_positions=-1,
    share_att_key=True,
    norm_rel_ebd="layer_norm",
    position_biased_input=False,
    type_vocab_size=0,
)
#: the configurations replayed: name -> changes to V3
CONFIGS = {
    "v3": {},
    "unbucketed": dict(position_buckets=-1),  # plain i − j, the table as long as max_position_embeddings
    "log_buckets": dict(position_buckets=4, max_relative_positions=8),  # |i − j| ≥ 2 log-bucketed (N = 7)
    "separate_projections": dict(share_att_key=False),  # pos_key_proj / pos_query_proj
    "c2p_only": dict(pos_att_type=["c2p"]),
    "p2c_only": dict(pos_att_type=["p2c"], share_att_key=False),
    "v2": dict(position_biased_input=True, type_vocab_size=2, norm_rel_ebd="none", share_att_key=False),
    "embed_proj": dict(embedding_size=16, position_biased_input=True, position_buckets=4, max_relative_positions=8),
    "no_relative": dict(relative_attention=False, position_biased_input=True),  # c2c only, scaled by √(3d)
}
ROWS = [[1, 11, 12, 13, 14, 15, 2], [1, 21, 22, 2], [1, 31, 32, 33, 34, 2]]


def make(config: str = "v3", seed: int = 0, scale: float = 8.0) -> torch.nn.Module:
    """A tiny random DeBERTa-v2 classifier (2 layers, 2 heads of 16, 3 classes) in eval mode, LayerNorms perturbed,
    q / k / position projections and the relative table scaled by ``scale`` so that every score term is of the
    size a trained model's is (the random init leaves the softmax almost uniform)."""
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    torch.manual_seed(seed)
    cfg = DebertaV2Config(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=42,
        num_labels=3,
        **{**V3, **CONFIGS[config]},
    )
    model = DebertaV2ForSequenceClassification(cfg).eval()
    _perturb_norms(model, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and any(k in name for k in ("query_proj", "key_proj", "rel_embeddings")):
                p.mul_(scale)
    return model


def batch(side: str = "right", rows=ROWS) -> dict:
    T = max(map(len, rows))
    pad = [[0] * (T - len(r)) for r in rows]
    ids = [r + p if side == "right" else p + r for r, p in zip(rows, pad)]
    mask = [[1] * len(r) + [0] * len(p) if side == "right" else [0] * len(p) + [1] * len(r) for r, p in zip(rows, pad)]
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


def _logits(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


# ---------------------------------------------------------------- the replay is the model
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_replay_is_the_model(config, side):
    """float32 to 1e-5 and float64 to 1e-10, padded on either side (a left-padded row's token 0 is padding: the
    pooler reads it, its query row attends every key uniformly, as the model's masked_fill makes it)."""
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
        model = make(config).to(dtype)
        inputs = batch(side)
        a = get_adapter(model)
        got = a.forward(a.check_inputs(inputs)).logits
        own = _logits(model, inputs)
        assert (got - own).abs().max() <= tol * own.abs().max(), (config, dtype)
        assert (explain(model, inputs, method="rollout").logits - own).abs().max() <= tol * own.abs().max()


def test_the_position_terms_change_the_prediction():
    """Each term matters on the test models (so the replay's agreement is not that of a content-only model): the
    model with its relative table zeroed, or one term off, predicts otherwise, and the replay follows each."""
    inputs = batch()
    model = make("v3").double()
    own = _logits(model, inputs)
    variants = []
    flat = copy.deepcopy(model)
    with torch.no_grad():
        flat.deberta.encoder.rel_embeddings.weight.zero_()
        flat.deberta.encoder.LayerNorm.bias.zero_()
    variants.append(flat)
    for term in ("c2p", "p2c"):
        one = copy.deepcopy(model)
        for layer in one.deberta.encoder.layer:
            layer.attention.self.pos_att_type = [term]  # the other term off (the scale keeps √(2d) then)
        variants.append(one)
    for variant in variants:
        theirs = _logits(variant, inputs)
        assert (theirs - own).abs().max() > 1e-3 * own.abs().max()
        a = get_adapter(variant)
        assert (a.forward(a.check_inputs(inputs)).logits - theirs).abs().max() <= 1e-10 * theirs.abs().max()


def test_the_buckets_and_table_are_the_models():
    """The relative positions are the model's log buckets (|i − j| < mid kept, beyond: logarithmic), the table the
    encoder's LayerNorm of rel_embeddings, the span its position_buckets."""
    model = make("log_buckets").double()
    a = get_adapter(model)
    scores = a.blocks[0].attn.scores
    rel = scores.relative(7)
    assert rel[0, 1] == -1 and rel[1, 0] == 1 and rel[0, 6] == -3 and scores.span == 4
    assert torch.equal(rel, model.deberta.encoder.get_rel_pos(torch.zeros(1, 7, 32))[0])
    with torch.no_grad():
        normed = model.deberta.encoder.LayerNorm(model.deberta.encoder.rel_embeddings.weight)
    assert torch.equal(scores.table(), normed)
    assert scores.pos_key is model.deberta.encoder.layer[0].attention.self.key_proj  # share_att_key
    separate = get_adapter(make("separate_projections")).blocks[1]
    layer = separate.attn.scores
    assert layer.pos_key is not layer.pos_query and layer.scale_factor == 3


# ---------------------------------------------------------------- batch = each row alone; padding 0
@pytest.mark.parametrize("config", ["log_buckets"])  # DeBERTa-v3's layout, log buckets reached
def test_batch_equals_each_row_alone_in_float64(config):
    """Every method but PA-LRP (refused): each row's map is the row's alone (relative positions do not see the
    right padding), padding scores 0."""
    model = make(config).double()
    inputs = batch()
    mask = inputs["attention_mask"]
    for method in lrp_core.METHODS:
        if method == "pa_lrp":
            continue  # refused (test_methods_run_or_are_refused)
        exp = explain(model, inputs, method=method)
        assert exp.scores.shape == mask.shape and torch.isfinite(exp.scores).all(), method
        for i, row in enumerate(ROWS):
            one = explain(model, {"input_ids": torch.tensor([row])}, method=method)
            assert rel_err(exp.scores[i, : len(row)], one.scores[0]) <= 1e-8, (config, method)
        assert (exp.scores[mask == 0] == 0).all(), method


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp", "lrp", "transformer_attribution", "input_x_gradient"])
def test_left_padding_is_the_model_and_scores_zero(method):
    model = make("v2").double()
    inputs = batch("left")
    exp = explain(model, inputs, method=method)
    own = _logits(model, inputs)
    assert (exp.logits - own).abs().max() <= 1e-10 * own.abs().max()
    assert torch.isfinite(exp.scores).all() and (exp.scores[inputs["attention_mask"] == 0] == 0).all()
    assert exp.scores.abs().max() > 0


# ---------------------------------------------------------------- conservation, gradients
def _constant_free(model: torch.nn.Module) -> torch.nn.Module:
    """Every additive constant zeroed: biases, LayerNorm β, the absolute position and token-type rows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "position_embeddings" in name or "token_type_embeddings" in name:
                p.zero_()
    return model


@pytest.mark.parametrize("config", ["v3", "v2", "log_buckets", "embed_proj"])
def test_cp_lrp_conserves_without_additive_constants(config):
    """CP-LRP is gradient × input of a function linear in the tokens given its detached factors (the scores with
    all three terms, the norms' std): Σ scores = y_t and every block's total = y_t; with the constants kept it does
    not."""
    model = _constant_free(make(config).double())
    inputs = batch()
    exp = explain(model, inputs, method="cp_lrp")
    y = exp.logits.gather(1, exp.target[:, None])[:, 0]
    # the identity rule's 1e-10 stabiliser at GELU aside: measured ≤ 5.9e-10 relative
    assert ((exp.scores.sum(1) - y).abs() / y.abs()).max() <= 2e-9
    assert ((exp.conservation.blocks - y[:, None]).abs() / y.abs()[:, None]).max() <= 2e-9
    kept = explain(make(config).double(), inputs, method="cp_lrp")
    y_kept = kept.logits.gather(1, kept.target[:, None])[:, 0]
    assert ((kept.scores.sum(1) - y_kept).abs() / y_kept.abs()).max() > 1e-3


@pytest.mark.parametrize("config", ["v3", "v2"])
def test_input_x_gradient_is_autograd_through_the_model(config):
    model = make(config).double()
    inputs = batch()
    exp = explain(model, inputs, method="input_x_gradient")
    words = model.deberta.embeddings.word_embeddings(inputs["input_ids"]).detach().requires_grad_(True)
    y = model(inputs_embeds=words, attention_mask=inputs["attention_mask"]).logits
    (grad,) = torch.autograd.grad(y[torch.arange(3), exp.target].sum(), words)
    expected = (words * grad).sum(-1).detach() * inputs["attention_mask"]
    assert rel_err(exp.scores, expected) <= 1e-10


def _scores_relevance(composite, config: str = "v3"):
    """One layer's disentangled scores on random q, k (float64) through ``composite``: (q, k, scores, R_q, R_k)
    for a random relevance R of the scores."""
    spec = get_adapter(make(config).double()).blocks[0].attn.scores
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 2, 5, 16, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    r = Replay(composite)
    s = spec(q, k, r)
    R = torch.randn(s.shape, generator=g, dtype=torch.float64)
    Rq = Rk = None  # CP-LRP: the scores carry no gradient at all
    if s.requires_grad:
        Rq, Rk = torch.autograd.grad(s, (q, k), R, allow_unused=True)
    return spec, q.detach(), k.detach(), s.detach(), R, Rq, Rk


def test_explicit_pass_is_the_normalised_add_of_three_matmul_rules():
    """transformer_attribution's rules at the scores: the three products' relevances by the normalised add, each
    product's by §1's MatMul rule (halved), the relative-position operand's half absorbed — formed by hand."""
    spec, q, k, s, R, Rq, Rk = _scores_relevance(TRANSFORMER_ATTRIBUTION)
    scale = spec.scale(torch.float64)
    rel = spec.relative(5)
    kr = spec.projected(spec.pos_key, q)
    qr = spec.projected(spec.pos_query, k)
    c2c = q @ (k.transpose(-2, -1) / scale)
    c2p_full = (q @ kr.transpose(-2, -1)) / scale
    p2c_full = (k @ qr.transpose(-2, -1)) / scale
    i_c2p = (rel + spec.span).clamp(0, 2 * spec.span - 1).expand(2, 2, 5, 5)
    i_p2c = (spec.span - rel).clamp(0, 2 * spec.span - 1).expand(2, 2, 5, 5)
    c2p, p2c = c2p_full.gather(-1, i_c2p), p2c_full.gather(-1, i_p2c).transpose(-1, -2)
    assert (s - (c2c + (c2p + p2c))).abs().max() <= 1e-12
    R_c2c, R_c2p, R_p2c = F.add_normalized_n((c2c, c2p, p2c), R)
    Rq_c2c, Rk_c2c = F.matmul(q, k.transpose(-2, -1), R_c2c, halve=True)
    full_c2p = torch.zeros_like(c2p_full).scatter_add(-1, i_c2p, R_c2p)
    Rq_c2p, _ = F.matmul(q, kr.transpose(-2, -1), full_c2p, halve=True)
    full_p2c = torch.zeros_like(p2c_full).scatter_add(-1, i_p2c, R_p2c.transpose(-1, -2))
    Rk_p2c, _ = F.matmul(k, qr.transpose(-2, -1), full_p2c, halve=True)
    assert rel_err(Rq, Rq_c2c + Rq_c2p) <= 1e-10
    assert rel_err(Rk, Rk_c2c.transpose(-2, -1) + Rk_p2c) <= 1e-10


def test_attnlrp_halves_and_cp_lrp_detaches_each_product():
    """AttnLRP: the plain gradient of the scores, halved (every product is linear in q and in k); CP-LRP: none."""
    _, q, k, s, R, Rq, Rk = _scores_relevance(ATTNLRP)
    q1, k1 = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    spec = get_adapter(make("v3").double()).blocks[0].attn.scores
    plain = torch.autograd.grad(spec(q1, k1, Replay()), (q1, k1), R)
    assert rel_err(Rq, plain[0] / 2) <= 1e-12 and rel_err(Rk, plain[1] / 2) <= 1e-12
    *_, Rq_cp, Rk_cp = _scores_relevance(CP_LRP)
    assert Rq_cp is None or not Rq_cp.abs().max()
    assert Rk_cp is None or not Rk_cp.abs().max()


# ---------------------------------------------------------------- methods, the model untouched, refusals
def test_methods_run_or_are_refused_and_the_model_is_untouched():
    """Every method of the registry runs (finite scores) on a model left in training mode, except PA-LRP on a model
    with relative attention: refused, naming why; without relative attention (positions only absolute) PA-LRP runs.
    Parameters, modes, flags, hooks and gradients stay as they were."""
    model = make("separate_projections")
    model.train()  # an unusual mode must survive too
    inputs = batch()
    before = snapshot(model)
    for method in lrp_core.METHODS:
        if method == "pa_lrp":
            with pytest.raises(UnsupportedModelError, match="relative-position terms"):
                explain(model, inputs, method=method)
            continue
        assert torch.isfinite(explain(model, inputs, method=method).scores).all(), method
    assert_untouched(before, snapshot(model))
    with pytest.raises(InputError):
        explain(model, inputs, target=99)
    assert_untouched(before, snapshot(model))
    absolute = make("no_relative").double()
    pa = explain(absolute, inputs, method="pa_lrp")
    assert pa.positional.abs().max() > 0 and (pa.positional[inputs["attention_mask"] == 0] == 0).all()


def _tiny(cls_name: str, config_name: str, **kw):
    import transformers

    cfg = getattr(transformers, config_name)(
        vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, **kw
    )
    return getattr(transformers, cls_name)(cfg).eval()


@pytest.mark.parametrize(
    "build,why",
    [
        (lambda: _tiny("DebertaV2ForTokenClassification", "DebertaV2Config"), "DebertaV2ForSequenceClassification"),
        (lambda: _tiny("DebertaForSequenceClassification", "DebertaConfig"), "in_proj"),
        (lambda: _tiny("EsmForTokenClassification", "EsmConfig", pad_token_id=1), "predict per token"),
        (lambda: _tiny("RoFormerForSequenceClassification", "RoFormerConfig"), "RoFormer rotates"),
        (lambda: _tiny("LongformerForSequenceClassification", "LongformerConfig", attention_window=4), "sparse"),
        (lambda: _tiny("BigBirdForSequenceClassification", "BigBirdConfig"), "block-sparse"),
    ],
)
def test_what_is_not_replayed_is_refused_by_name(build, why):
    with pytest.raises(UnsupportedModelError, match=why) as err:
        explain(build(), {"input_ids": torch.tensor([[5, 6, 7]])})
    assert "Supported:" in str(err.value) and "DebertaV2ForSequenceClassification" in str(err.value)


def test_the_convolution_of_deberta_v2_xlarge_is_refused():
    model = _tiny("DebertaV2ForSequenceClassification", "DebertaV2Config", conv_kernel_size=3)
    with pytest.raises(UnsupportedModelError, match="convolution over the tokens") as err:
        explain(model, {"input_ids": torch.tensor([[5, 6, 7]])})
    assert "read with transformers" in str(err.value)


def test_inputs_the_replay_does_not_read_are_refused():
    model = make("v3")
    inputs = batch()
    with pytest.raises(InputError, match="inputs_embeds"):
        explain(model, {**inputs, "inputs_embeds": torch.zeros(3, 7, 32)}, method="attnlrp")
    # DeBERTa-v3 has no absolute table: its forward ignores position_ids, and so does the replay
    pos = torch.arange(7)[None].expand(3, -1) + 5
    assert torch.equal(_logits(model, {**inputs, "position_ids": pos}), _logits(model, inputs))
    v2 = make("v2").double()
    own = _logits(v2, {**inputs, "position_ids": pos})
    assert (explain(v2, {**inputs, "position_ids": pos}, method="attnlrp").logits - own).abs().max() <= 1e-10


@pytest.mark.parametrize("config", ["v3", "log_buckets", "c2p_only", "p2c_only"])
def test_scores_of_one_query_row_are_that_row_of_the_full_scores(config):
    """``rows`` (a readout that reads one token per row computes the last block at it alone): the scores of query
    row ``rows[b]`` equal that row of the full (B, H, N, N) scores."""
    from lrp_core.rules.tensors import take_rows

    spec = get_adapter(make(config).double()).blocks[0].attn.scores
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(3, 2, 6, 16, generator=g, dtype=torch.float64) for _ in range(2))
    rows = torch.tensor([5, 0, 3])
    full = spec(q, k, Replay())
    one = spec(take_rows(q, rows, 2), k, Replay(), rows)
    assert one.shape == (3, 2, 1, 6) and rel_err(one, take_rows(full, rows, 2)) <= 1e-13  # BLAS round-off
