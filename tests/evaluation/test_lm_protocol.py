"""The language-model evidence protocol (docs/METHODS.md §3b) on hand-checkable cases."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lrp_core.data.facts import make_facts
from lrp_core.evaluation.lm import (
    MAX_REPLACED,
    answer_probabilities,
    curve_auc,
    encode,
    evidence_scores,
    filler_token,
    prompt_values,
    replacement_curve,
)
from lrp_core.models.tiny_lm import build_model, build_tokenizer


def test_hit_and_average_precision_by_hand():
    scores = np.array([0.0, 5.0, 1.0, 3.0, 2.0])
    context = np.array([1, 2, 3, 4])  # token 0 (begin-of-text) is not context
    hit, ap = evidence_scores(scores, context, np.array([3]))
    assert hit == 0.0 and ap == pytest.approx(1 / 2)  # evidence ranked second
    hit, ap = evidence_scores(scores, context, np.array([1, 4]))
    assert hit == 1.0 and ap == pytest.approx((1 / 1 + 2 / 3) / 2)


def test_curve_auc_is_the_trapezoid_over_k_over_K():
    assert curve_auc(np.array([1.0, 0.5, 0.0])) == pytest.approx(0.5)
    assert curve_auc(np.ones(11)) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def lm():
    """tiny-lm's tokenizer and shape with random weights (seed 0): the properties hold for any weights."""
    torch.manual_seed(0)
    tok = build_tokenizer()
    return SimpleNamespace(model=build_model(len(tok)).eval(), tokenizer=tok)


def test_replacement_curve_replaces_in_order(lm):
    recs = make_facts(2, seed=3)
    enc = encode(lm.tokenizer, recs)
    ids, mask = enc["input_ids"][:1], enc["attention_mask"][:1]
    order = enc["context"][0][:4]
    filler = filler_token(lm.tokenizer)
    curve = replacement_curve(lm.model, ids, mask, order, int(enc["answers"][0]), filler, 3)
    for k in range(4):
        by_hand = ids.clone()
        by_hand[0, order[:k]] = filler
        p = answer_probabilities(lm.model, by_hand, mask, enc["answers"][:1])
        assert curve[k] == pytest.approx(float(p[0]), rel=1e-6)


def test_an_oracle_map_scores_perfectly(lm):
    recs = make_facts(4, seed=9)
    enc = encode(lm.tokenizer, recs)
    for b, r in enumerate(recs):
        oracle = np.zeros(enc["input_ids"].shape[1])
        oracle[enc["evidence"][b].numpy()] = 1.0
        v = prompt_values(lm.model, enc, b, oracle, filler_token(lm.tokenizer))
        assert v["evidence_hit1"] == 1.0 and v["evidence_ap"] == 1.0
        assert 0.0 <= v["morf_auc"] <= 1.0 and 0.0 <= v["lerf_auc"] <= 1.0
        assert lm.tokenizer.convert_ids_to_tokens(enc["input_ids"][b, enc["evidence"][b]].tolist()) == [r.answer]
    assert MAX_REPLACED == 10
