"""Hand-computed checks of the evaluation metrics (lrp_core.metrics)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from lrp_core import metrics as M
from lrp_core.errors import InputError


# --------------------------------------------------------------------------
# perturbation
# --------------------------------------------------------------------------
class ObjectCounter(torch.nn.Module):
    """Fake classifier on (B, 3, 1, 10) images whose object is pixels 5..9.

    Predicts class 0 iff more than half of the object survives: logit 0 is
    the mean of channel 0 over the object, logit 1 is 0.5. With all-ones
    images it is right while >= 3 of the 5 object pixels are non-zero.
    """

    def __init__(self) -> None:
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        obj = x[:, 0, 0, 5:].mean(dim=1)
        return torch.stack([obj, torch.full_like(obj, 0.5)], dim=1)


def _setup(n: int = 3):
    images = torch.ones(n, 3, 1, 10)
    labels = torch.zeros(n, dtype=torch.long)
    perfect = torch.tensor([0, 0, 0, 0, 0, 1, 2, 3, 4, 5.0]).view(1, 1, 10).repeat(n, 1, 1)
    return ObjectCounter(), images, labels, perfect


def test_perturbation_perfect_map():
    model, images, labels, perfect = _setup()
    # p=0.1 removes 1 object pixel (4 left), 0.2 -> 3 left: right; 0.3 -> 2 left: wrong
    acc = M.perturbation_curve(model, images, perfect, labels, batch_size=7)
    np.testing.assert_array_equal(acc, [1, 1, 1, 0, 0, 0, 0, 0, 0, 0])
    # trapezoid: 0.1 + 0.1 + 0.05 = 0.25
    assert M.perturbation_auc(acc) == pytest.approx(25.0)
    # negative test: background first (p<=0.5), then 1, 2 object pixels: right until 0.7
    neg = M.perturbation_curve(model, images, perfect, labels, negative=True)
    np.testing.assert_array_equal(neg, [1, 1, 1, 1, 1, 1, 1, 1, 0, 0])
    assert M.perturbation_auc(neg) == pytest.approx(75.0)


def test_perturbation_inverted_map_swaps_the_tests():
    model, images, labels, perfect = _setup()
    pos = M.perturbation_auc(M.perturbation_curve(model, images, -perfect, labels))
    neg = M.perturbation_auc(M.perturbation_curve(model, images, -perfect, labels, negative=True))
    assert (pos, neg) == (pytest.approx(75.0), pytest.approx(25.0))


def test_perturbation_constant_map_breaks_ties_by_pixel_index():
    model, images, labels, _ = _setup()
    const = torch.full((3, 1, 10), 0.3)
    for negative in (False, True):  # pixels 0..4 first either way: AUC 75
        acc = M.perturbation_curve(model, images, const, labels, negative=negative)
        assert M.perturbation_auc(acc) == pytest.approx(75.0)


def test_perturbation_measures_against_true_label_and_mixes_images():
    model, images, _, perfect = _setup(4)
    labels = torch.tensor([0, 1, 0, 0])  # image 1 is "wrong" when intact, right when destroyed
    maps = perfect.clone()
    maps[2] = -perfect[2]  # image 2 gets the inverted map
    correct = M.perturbation_curve(model, images, maps, labels, batch_size=3, return_correct=True)
    assert correct.shape == (10, 4)
    np.testing.assert_array_equal(correct[:, 0], [1, 1, 1, 0, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(correct[:, 1], [0, 0, 0, 1, 1, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(correct[:, 2], [1] * 8 + [0, 0])
    acc = M.perturbation_curve(model, images, maps, labels, batch_size=5)
    np.testing.assert_allclose(acc, correct.mean(axis=1))


def test_perturbation_zeroes_all_channels_in_input_space():
    maps = torch.tensor([[[3.0, 1.0], [2.0, 0.0]]])
    masks = M.perturbation_masks(maps, fractions=(0.25, 0.5, 0.75))
    expected = [[[True, False], [False, False]], [[True, False], [True, False]], [[True, True], [True, False]]]
    assert masks[:, 0].tolist() == expected
    seen = []

    def model(x):
        seen.append(x.clone())
        return torch.zeros(x.shape[0], 2)

    images = torch.full((1, 3, 2, 2), -1.5)  # normalised input: zero != black
    M.perturbation_curve(model, images, maps, torch.tensor([0]), fractions=(0.5,))
    x = torch.cat(seen)
    assert torch.equal(x[0], images[0])  # clean
    assert x[1, :, 0, 0].eq(0).all() and x[1, :, 1, 0].eq(0).all()
    assert x[1, :, 0, 1].eq(-1.5).all() and x[1, :, 1, 1].eq(-1.5).all()


def test_n_removed_and_auc_bounds():
    assert [M.n_removed(p, 10) for p in M.FRACTIONS] == list(range(1, 10))
    assert M.n_removed(0.1, 4096) == 409
    assert M.perturbation_auc([1.0] * 10) == pytest.approx(90.0)
    assert M.perturbation_auc([0.0] * 10) == 0.0
    with pytest.raises(InputError):
        M.perturbation_auc([1.0] * 9)


def test_perturbation_rejects_bad_shapes():
    model, images, labels, perfect = _setup()
    with pytest.raises(InputError, match="upsample"):
        M.perturbation_curve(model, images, perfect[:, :, :5], labels)
    with pytest.raises(InputError):
        M.perturbation_curve(model, images, perfect, labels[:2])
    with pytest.raises(InputError):
        M.perturbation_masks(perfect, fractions=(1.5,))


# --------------------------------------------------------------------------
# segmentation
# --------------------------------------------------------------------------
MASK = torch.tensor([[[True, True], [False, False]]])


def test_segmentation_perfect_inverted_constant():
    perfect = M.segmentation_scores(MASK.float(), MASK)
    assert perfect == {"pixel_accuracy": 1.0, "iou_background": 1.0, "iou_foreground": 1.0, "miou": 1.0, "map": 1.0}
    inv = M.segmentation_scores(1 - MASK.float(), MASK)
    assert inv["pixel_accuracy"] == 0.0 and inv["miou"] == 0.0
    assert inv["map"] == pytest.approx(0.5)  # bg ranked first: P=0.5 at full recall
    const = M.segmentation_scores(torch.full((1, 2, 2), 7.0), MASK)
    # nothing above the mean -> all background
    assert const["pixel_accuracy"] == 0.5
    assert const["iou_background"] == 0.5 and const["iou_foreground"] == 0.0
    assert const["miou"] == 0.25 and const["map"] == pytest.approx(0.5)


def test_segmentation_threshold_at_mean_of_normalised_map():
    m = torch.tensor([[[0.9, 0.2], [0.1, 0.0]]])
    # normalised [1, 2/9, 1/9, 0], mean 1/3 -> only pixel (0, 0) is foreground
    s = M.segmentation_scores(m, MASK)
    assert s["pixel_accuracy"] == 0.75
    assert s["iou_foreground"] == pytest.approx(0.5)
    assert s["iou_background"] == pytest.approx(2 / 3)
    assert s["miou"] == pytest.approx(7 / 12)
    assert s["map"] == pytest.approx(1.0)  # both object pixels outrank the background


def test_segmentation_accumulates_over_the_set():
    maps = torch.stack([MASK[0].float(), torch.tensor([[0.9, 0.2], [0.1, 0.0]])])
    masks = torch.cat([MASK, MASK])
    s = M.segmentation_scores(maps, masks)
    # fg: inter 2 + 1, union 2 + 2 -> 3/4 (the per-image mean would be 3/4 too, so check bg)
    assert s["iou_foreground"] == pytest.approx(3 / 4)
    # bg: inter 2 + 2, union 2 + 3 -> 4/5 (per-image mean would be (1 + 2/3)/2 = 5/6)
    assert s["iou_background"] == pytest.approx(4 / 5)
    assert s["pixel_accuracy"] == pytest.approx(7 / 8)
    assert s["map"] == pytest.approx(1.0)


def test_average_precision_matches_sklearn_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        scores = rng.integers(0, 4, size=30).astype(float)  # many ties
        truth = rng.random(30) < 0.4
        if not truth.any():
            continue
        assert M.average_precision(torch.tensor(scores), torch.tensor(truth)) == pytest.approx(
            average_precision_score(truth, scores)
        )
    assert math.isnan(M.average_precision(torch.ones(4), torch.zeros(4, dtype=torch.bool)))


def test_upsample_maps_bilinear():
    up = M.upsample_maps(torch.tensor([[[0.0, 1.0]]]), (1, 4))
    # align_corners=False: sample points at 0.25-step centres
    np.testing.assert_allclose(up[0, 0].numpy(), [0.0, 0.25, 0.75, 1.0])


# --------------------------------------------------------------------------
# rationales
# --------------------------------------------------------------------------
def test_word_scores_max_over_pieces_and_offsets_mapping():
    text = "the film was unwatchable ."
    words = text.split()
    spans = M.word_spans(text, words)
    assert spans[3] == (13, 24)
    # [CLS] the film was un ##watch ##able . [SEP] [PAD]
    offsets = [(0, 0), (0, 3), (4, 8), (9, 12), (13, 15), (15, 20), (20, 24), (25, 26), (0, 0), (0, 0)]
    wid = M.word_ids_from_offsets(offsets, spans)
    assert wid == [None, 0, 1, 2, 3, 3, 3, 4, None, None]
    tok = [9.0, 0.1, 0.2, 0.3, 0.5, 0.9, 0.4, 0.05, 9.0, 0.0]
    np.testing.assert_allclose(M.word_scores(tok, wid, 5), [0.1, 0.2, 0.3, 0.9, 0.05])
    # a word with no piece ranks last
    assert M.word_scores([1.0], [0], 2)[1] == -np.inf


def test_word_ids_from_a_real_fast_tokenizer_layout():
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "good": 1, "movie": 2, "!": 3, "bad": 4}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")
    text = "good movie!"
    enc = fast(text, return_offsets_mapping=True)
    words = ["good", "movie!"]  # the record's own word split differs from the tokenizer's
    assert M.word_ids_from_offsets(enc["offset_mapping"], M.word_spans(text, words)) == [0, 1, 1]


def test_rationale_f1_hand_computed():
    scores = [np.array([5.0, 4, 3, 2, 1, 0]), np.array([0.0, 1, 2])]
    gold = [np.array([1, 1, 0, 0, 0, 1], bool), np.array([1, 0, 0], bool)]
    out = M.rationale_scores(scores, gold, ks=(2, 4, 10))
    # k=2: doc0 picks {0,1}: P=1, R=2/3, F1=0.8; doc1 picks {2,1}: 0, 0, 0
    assert out[2]["precision"] == pytest.approx(0.5)
    assert out[2]["recall"] == pytest.approx(1 / 3)
    assert out[2]["f1"] == pytest.approx(0.4)
    # k=4: doc0 {0..3}: P=1/2, R=2/3, F1=4/7; doc1 has 3 words -> all: P=1/3, R=1, F1=1/2
    assert out[4]["f1"] == pytest.approx((4 / 7 + 0.5) / 2)
    # k=10: doc0 all 6 words: P=1/2, R=1, F1=2/3; doc1 as above
    assert out[10]["precision"] == pytest.approx((0.5 + 1 / 3) / 2)
    assert out[10]["f1"] == pytest.approx((2 / 3 + 0.5) / 2)


def test_rationale_f1_at_gold_size():
    scores = [np.array([5.0, 4, 3, 2, 1, 0]), np.array([0.0, 1, 2]), np.array([1.0, 2])]
    gold = [np.array([1, 1, 0, 0, 0, 1], bool), np.array([1, 0, 0], bool), np.array([0, 0], bool)]
    # doc0: k=3 -> {0,1,2}, 2 hits: 2/3; doc1: k=1 -> {2}: 0; doc2 has no rationale: left out
    assert M.rationale_f1_at_gold_size(scores, gold) == pytest.approx(1 / 3)
    assert math.isnan(M.rationale_f1_at_gold_size(scores[2:], gold[2:]))


def test_top_k_ties_by_position_and_errors():
    assert M.top_k_words(np.array([1.0, 2, 2, 0]), 2).tolist() == [False, True, True, False]
    assert M.top_k_words(np.array([1.0, 1, 1]), 1).tolist() == [True, False, False]
    with pytest.raises(InputError):
        M.rationale_scores([np.zeros(3)], [np.zeros(2, bool)])
    with pytest.raises(InputError):
        M.word_spans("a b", ["a", "c"])


# --------------------------------------------------------------------------
# class sensitivity
# --------------------------------------------------------------------------
def _two_objects():
    ma = torch.zeros(1, 4, 4, dtype=torch.bool)
    mb = torch.zeros(1, 4, 4, dtype=torch.bool)
    ma[0, :2, :2] = True
    mb[0, 2:, 2:] = True
    return ma, mb


def test_class_sensitivity_exact_maps_is_one():
    ma, mb = _two_objects()
    assert M.class_sensitivity(ma.float(), mb.float(), ma, mb) == 1.0
    # maps swapped: every target looks at the other object
    assert M.class_sensitivity(mb.float(), ma.float(), ma, mb) == 0.0


def test_class_sensitivity_class_agnostic_and_negative_relevance():
    ma, mb = _two_objects()
    both = (ma | mb).float()
    # the same map for both targets: half of it on each object
    assert M.class_sensitivity(both, both, ma, mb) == pytest.approx(0.5)
    assert M.class_map_correlation(both, both) == pytest.approx(1.0)
    # negative relevance is ignored: 3 on a, 1 on background, -5 on b -> 3/4
    m = torch.zeros(1, 4, 4)
    m[0, 0, 0], m[0, 0, 3], m[0, 3, 3] = 3.0, 1.0, -5.0
    assert M.own_mask_share(m, ma)[0] == pytest.approx(0.75)
    assert np.isnan(M.own_mask_share(-ma.float(), ma)[0])  # no positive relevance


def test_class_map_correlation_hand_computed():
    a = torch.tensor([[1.0, 2, 3, 4]])
    assert M.class_map_correlation(a, -a) == pytest.approx(-1.0)
    b = torch.tensor([[1.0, 3, 2, 4]])
    # dx = [-1.5,-.5,.5,1.5], dy = [-1.5,.5,-.5,1.5] -> (2.25-.25-.25+2.25)/5 = 0.8
    assert M.class_map_correlation(a, b) == pytest.approx(0.8)
    assert M.class_map_correlation(torch.stack([a[0], a[0]]), torch.stack([b[0], -a[0]])) == (
        pytest.approx((0.8 - 1.0) / 2)
    )


# --------------------------------------------------------------------------
# CDAM statistics
# --------------------------------------------------------------------------
def test_sparsity_hand_computed():
    s = torch.tensor(
        [
            [10.0, -0.4, 0.5, -3.0],  # |0.4| < 0.5 only: 1/4
            [0.0, 0.0, 0.0, 0.0],
        ]
    )  # all zero: fully sparse
    assert M.sparsity(s) == pytest.approx((0.25 + 1.0) / 2)
    assert M.sparsity(s[:1], rel_threshold=0.31) == pytest.approx(0.75)


def test_pooled_correlation_pools_images():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = torch.tensor([[2.0, 1.0], [4.0, 3.0]])
    # per image r = -1, pooled: x=[1,2,3,4], y=[2,1,4,3] -> (−1.5·−.5 + −.5·−1.5 + .5·1.5 + 1.5·.5)/5 = 0.6
    assert M.pooled_correlation(a, b) == pytest.approx(0.6)
    assert M.pearson(np.ones(3), np.ones(3)) == 1.0
    assert math.isnan(M.pearson(np.ones(3), np.arange(3.0)))
    with pytest.raises(InputError):
        M.pooled_correlation(a, b[:1])
