"""The text protocol (lrp_core.evaluation.text), with a fake explainer whose scores are known."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lrp_core import evaluation as E
from lrp_core.evaluation import batching

VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "the",
    "film",
    "was",
    "great",
    "plot",
    "un",
    "##watch",
    "##able",
    ".",
]


@pytest.fixture()
def tokenizer():
    from transformers import BertTokenizerFast

    return BertTokenizerFast(vocab={w: i for i, w in enumerate(VOCAB)}, do_lower_case=True)


# score of each vocabulary entry; specials score highest and must be ignored
TOKEN_SCORE = {
    "[CLS]": 100.0,
    "[SEP]": 100.0,
    "[PAD]": 0.0,
    "the": 1.0,
    "film": 3.0,
    "was": 1.5,
    "great": 4.0,
    "plot": 2.0,
    "un": 0.0,
    "##watch": 5.0,
    "##able": 0.0,
    ".": 0.5,
}


def fake_explain(tokenizer):
    ids = tokenizer.convert_tokens_to_ids(list(TOKEN_SCORE))
    table = torch.zeros(len(VOCAB))
    table[ids] = torch.tensor(list(TOKEN_SCORE.values()))

    def explain(model, inputs, method, target):
        return SimpleNamespace(scores=table[inputs["input_ids"]])

    return explain


def test_text_pipeline_hand_computed(monkeypatch, tokenizer):
    monkeypatch.setattr(batching, "explain_batch", fake_explain(tokenizer))
    data = E.TextSet(
        [
            E.RationaleRecord(
                "The film was great.", ["The", "film", "was", "great", "."], np.array([0, 0, 0, 1, 0], bool), 1
            ),
            E.RationaleRecord(
                "the plot was unwatchable", ["the", "plot", "was", "unwatchable"], np.array([0, 0, 0, 1], bool), 0
            ),
        ]
    )
    ws, ts = E.text_word_scores(None, tokenizer, data.records, "x", batch_size=2)
    np.testing.assert_allclose(ws[0], [1.0, 3.0, 1.5, 4.0, 0.5])
    np.testing.assert_allclose(ws[1], [1.0, 2.0, 1.5, 5.0])  # max over un ##watch ##able
    assert len(ts[0]) == 5 and len(ts[1]) == 6  # specials, padding dropped
    res, skipped = E.evaluate_text(None, tokenizer, data, ["x"], ks=(1, 2, 10), progress=False, baseline=True)
    r = res["x"]
    # every word is taken at k=10, whatever the ranking: the random row agrees
    assert list(res) == ["x", "random"]
    assert res["random"]["token_f1@10"] == pytest.approx(r["token_f1@10"])
    assert skipped == []
    assert r["token_f1@1"] == pytest.approx(1.0)  # great; unwatchable
    # k=2: {great, film} and {unwatchable, plot}: P=1/2, R=1, F1=2/3 each
    assert r["token_f1@2"] == pytest.approx(2 / 3)
    assert r["token_precision@2"] == pytest.approx(0.5)
    # k=10 takes every word: P = 1/5 and 1/4, R = 1 -> F1 = 1/3 and 2/5
    assert r["token_f1@10"] == pytest.approx((1 / 3 + 0.4) / 2)
    assert r["token_recall@10"] == 1.0
    assert r["cdam_sparsity"] is None
    # k = |gold| = 1: great, unwatchable are both top-1 -> 1
    assert r["token_f1@gold"] == 1.0


def test_text_evaluation_tiny_bert_real_engine(tokenizer):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=2,
        max_position_embeddings=32,
    )
    model = BertForSequenceClassification(cfg).eval()
    data = E.TextSet(
        [
            E.RationaleRecord("the film was great", "the film was great".split(), np.array([0, 0, 0, 1], bool), 1),
            E.RationaleRecord(
                "the plot was unwatchable .", "the plot was unwatchable .".split(), np.array([0, 0, 0, 1, 0], bool), 0
            ),
        ]
    )
    res, skipped = E.evaluate_text(
        model, tokenizer, data, ["transformer_attribution", "rollout"], ks=(1, 10), progress=False
    )
    assert set(res) | {s.split(":")[0] for s in skipped} == {"transformer_attribution", "rollout"}
    for r in res.values():
        assert 0.0 <= r["token_f1@1"] <= 1.0
        assert r["token_recall@10"] == 1.0  # every word taken
