"""ERASER comprehensiveness / sufficiency: the rationale texts and the AOPC, by hand."""

import numpy as np
import pytest

from lrp_core import metrics as M


def test_eraser_texts_by_hand():
    words = ["the", "film", "was", "truly", "awful", "and", "long", "too", "loud", "ok"]
    scores = np.array([0.0, 0.1, 0.0, 0.5, 0.9, 0.0, 0.3, 0.0, 0.2, 0.0])
    pairs = M.eraser_texts(words, scores, (0.01, 0.2, 0.6))
    # 1 %: ceil(0.1) = 1 word ("awful"); 20 %: 2 words; 60 %: 6 words (the zero tie: "the", first)
    assert pairs[0] == ("the film was truly and long too loud ok", "awful")
    assert pairs[1] == ("the film was and long too loud ok", "truly awful")
    assert pairs[2] == ("was and too ok", "the film truly awful long loud")


def test_aopc_by_hand():
    # full probability 0.9; without the rationale at q = 1, 5, 10, 20, 50 %: 0.8, 0.6, 0.5, 0.3, 0.1
    assert M.aopc(0.9, [0.8, 0.6, 0.5, 0.3, 0.1]) == pytest.approx((0.1 + 0.3 + 0.4 + 0.6 + 0.8) / 5)
    # sufficiency can be negative: the rationale alone is more convincing than the text
    assert M.aopc(0.6, [0.7, 0.9]) == pytest.approx(-0.2)


def test_faithfulness_with_a_counting_model():
    """A 'model' whose positive probability is the share of the word 'good' decides by hand."""
    import torch

    from lrp_core.data.rationales import RationaleRecord
    from lrp_core.evaluation import text as T

    class Tok:
        is_fast = True
        model_max_length = 64

        def __call__(self, texts, **kw):
            ids = [[1 if w == "good" else 2 for w in t.split()] or [0] for t in texts]
            n = max(map(len, ids))
            pad = [r + [0] * (n - len(r)) for r in ids]
            return {"input_ids": torch.tensor(pad), "attention_mask": (torch.tensor(pad) > 0).long()}

    class Model(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            good = ((input_ids == 1).sum(1).double() + 1) / (attention_mask.sum(1).double() + 2)
            return torch.log(torch.stack([1 - good, good], 1))  # softmax gives (1 - g, g)

    words = ["good", "bad", "bad", "good"]
    rec = RationaleRecord(text=" ".join(words), words=words, rationale=np.array([1, 0, 0, 1], bool), label=1)
    scores = [np.array([0.9, 0.0, 0.1, 0.5])]
    r = T.faithfulness(Model(), Tok(), [rec], scores, [1], fractions=(0.25, 0.5))
    p = lambda n_good, n: (n_good + 1) / (n + 2)  # noqa: E731
    full = p(2, 4)
    # q = 25 %: 1 word ("good" #0); q = 50 %: 2 words (both "good")
    comp = ((full - p(1, 3)) + (full - p(0, 2))) / 2
    suff = ((full - p(1, 1)) + (full - p(2, 2))) / 2
    assert r["comprehensiveness"] == pytest.approx(comp)
    assert r["sufficiency"] == pytest.approx(suff)
