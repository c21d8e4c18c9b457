"""BiLRP (docs/METHODS.md §2h): R_ij = Σ_k M_i(a; e_k) M_j(b; e_k), conserving ⟨e(a), e(b)⟩ under CP-LRP on a model
without additive constants (float64, 1e-10), symmetric, padding 0, batched over the dimensions."""

from __future__ import annotations

import pytest
import torch
from untouched import assert_untouched, snapshot

from lrp_core import Projection, bilrp, explain
from lrp_core.errors import InputError


def _bert(seed: int = 0, constants: bool = True):
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=60,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=20,
    )
    model = BertModel(cfg, add_pooling_layer=False).double().eval()
    if not constants:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias") or "position" in name or "token_type" in name:
                    p.zero_()
    return model


def _pair():
    a = {
        "input_ids": torch.tensor([[2, 11, 12, 13, 3], [2, 21, 22, 3, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]),
    }
    b = {
        "input_ids": torch.tensor([[2, 31, 32, 3, 0, 0], [2, 41, 42, 43, 44, 3]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]),
    }
    return a, b


def test_cp_lrp_conserves_the_similarity_without_additive_constants():
    model = _bert(constants=False)
    a, b = _pair()
    r = bilrp(model, a, b, method="cp_lrp", pooling="mean")
    assert r.scores.shape == (2, 5, 6)
    with torch.no_grad():
        ha, hb = model(**a).last_hidden_state, model(**b).last_hidden_state
    ma, mb = a["attention_mask"][..., None].double(), b["attention_mask"][..., None].double()
    ea, eb = (ha * ma).sum(1) / ma.sum(1), (hb * mb).sum(1) / mb.sum(1)
    sim = (ea * eb).sum(-1)
    assert torch.allclose(r.similarity, sim, rtol=1e-12)
    assert (r.scores.sum(dim=(1, 2)) - sim).abs().max() <= 1e-10 * sim.abs().max()
    assert r.conservation.abs().max() <= 1e-10 * sim.abs().max()


def test_the_maps_are_the_first_order_maps_of_each_dimension():
    model = _bert()
    a, b = _pair()
    r = bilrp(model, a, b, pooling="cls", dims_per_call=5)
    for k in (0, 7, 15):
        one = explain(model, a, method="cp_lrp", target=Projection(torch.eye(16, dtype=torch.float64)[k], "cls"))
        assert torch.allclose(r.maps_a[:, k], one.scores, rtol=1e-10, atol=1e-14)
    expected = torch.einsum("bki,bkj->bij", r.maps_a, r.maps_b)
    assert torch.equal(r.scores, expected)
    assert r.calls == 2 * 4


def test_symmetric_padding_zero_and_batch_equals_alone():
    model = _bert(seed=1)
    a, b = _pair()
    ab, ba = bilrp(model, a, b, pooling="mean"), bilrp(model, b, a, pooling="mean")
    assert torch.allclose(ab.scores, ba.scores.transpose(1, 2), rtol=1e-10, atol=1e-15)
    assert (ab.scores[1, 4, :] == 0).all() and (ab.scores[0, :, 4:] == 0).all(), "padding rows / columns 0"
    one = bilrp(model, {k: v[1:, :4] for k, v in a.items()}, {k: v[1:] for k, v in b.items()}, pooling="mean")
    assert torch.allclose(ab.pair(1), one.pair(0), rtol=1e-8, atol=1e-14)
    assert ab.pair(1).shape == (4, 6)


@pytest.mark.parametrize("method", ["attnlrp", "lrp", "input_x_gradient"])
def test_other_first_order_methods(method):
    model = _bert(constants=False)
    a, b = _pair()
    r = bilrp(model, a, b, method=method, pooling="mean")
    assert r.scores.shape == (2, 5, 6) and torch.isfinite(r.scores).all() and r.method == method


def test_refusals_and_model_untouched():
    model = _bert().train()
    a, b = _pair()
    with pytest.raises(InputError, match="first-order"):
        bilrp(model, a, b, method="rollout")
    with pytest.raises(InputError, match="dims_per_call"):
        bilrp(model, a, b, dims_per_call=0)
    before = snapshot(model)
    bilrp(model, a, b, pooling="mean")
    assert_untouched(before, snapshot(model))


def test_normalise_explains_the_cosine():
    model = _bert(constants=False)
    a, b = _pair()
    r = bilrp(model, a, b, pooling="mean", normalise=True)
    assert torch.allclose(r.embeddings_b.norm(dim=-1), torch.ones(2, dtype=torch.float64), rtol=1e-12)
    assert torch.allclose(r.embeddings_a.norm(dim=-1), torch.ones(2, dtype=torch.float64), rtol=1e-12)
    assert (r.scores.sum(dim=(1, 2)) - r.similarity).abs().max() <= 1e-10
