"""The vision-language evidence metrics (docs/METHODS.md §3c) on hand-made maps, masks and a known model."""

import numpy as np
import pytest
import torch

from lrp_core.errors import InputError
from lrp_core.evaluation import vlm


def _mask(h=4, w=4, cells=((1, 1),)):
    m = torch.zeros(h, w, dtype=torch.bool)
    for r, c in cells:
        m[r, c] = True
    return m


def test_pointing_hits_only_when_every_maximum_is_inside():
    mask = _mask()
    m = torch.zeros(4, 4)
    m[1, 1] = 2.0
    assert vlm.pointing_hit(m, mask) == 1.0
    m[3, 3] = 2.0  # a tie outside the mask
    assert vlm.pointing_hit(m, mask) == 0.0
    assert vlm.pointing_hit(torch.ones(4, 4), mask) == 0.0  # a flat map points nowhere
    assert vlm.pointing_hit(torch.ones(4, 4), torch.ones(4, 4, dtype=torch.bool)) == 1.0


def test_mask_share_counts_positive_relevance_only():
    mask = _mask(cells=((0, 0), (0, 1)))
    m = torch.zeros(4, 4)
    m[0, 0], m[0, 1], m[2, 2], m[3, 3] = 3.0, -5.0, 1.0, -7.0
    assert vlm.mask_share(m, mask) == pytest.approx(3.0 / 4.0)
    assert vlm.mask_share(-m.abs(), mask) == 0.0  # no positive relevance: nothing points at the object


def test_text_rank_by_the_best_token_and_pessimistic_ties():
    scores = torch.tensor([9.0, 0.5, 3.0, 1.0, 2.0, 3.0])  # position 0: an image token, not text
    text = torch.tensor([1, 2, 3, 4, 5])
    assert vlm.text_rank(scores, text, torch.tensor([4])) == 3  # 3.0 and 3.0 above 2.0
    assert vlm.text_rank(scores, text, torch.tensor([1, 4])) == 3  # a two-token word ranks by its best token
    assert vlm.text_rank(scores, text, torch.tensor([2])) == 2  # tied with position 5: counted above
    assert vlm.text_rank(torch.zeros(6), text, torch.tensor([3])) == 5  # constant map: the last rank
    with pytest.raises(InputError, match="text positions"):
        vlm.text_rank(scores, text, torch.tensor([0]))


def test_patch_order_and_painting():
    pm = torch.tensor([[0.1, 0.9], [0.5, 0.9]])
    assert vlm.patch_order(pm).tolist() == [1, 3, 2, 0]  # stable among ties
    pixels = torch.zeros(3, 4, 4)
    out = vlm.paint_patches(pixels, torch.tensor([1, 2]), 2, torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(out[:, 0:2, 2:4], torch.tensor([1.0, 2.0, 3.0])[:, None, None].expand(3, 2, 2))
    assert torch.equal(out[:, 2:4, 0:2], torch.tensor([1.0, 2.0, 3.0])[:, None, None].expand(3, 2, 2))
    assert float(out[:, 0:2, 0:2].abs().sum()) == 0.0 and float(out[:, 2:4, 2:4].abs().sum()) == 0.0
    assert float(pixels.abs().sum()) == 0.0  # the input is not changed
    with pytest.raises(InputError, match="whole number"):
        vlm.paint_patches(torch.zeros(3, 5, 4), torch.tensor([0]), 2, torch.zeros(3))


def test_morf_drops_and_lerf_keeps_on_a_model_that_reads_one_patch():
    """A 'model' whose answer probability is the mean of patch 2's pixels: painting that patch (fill 0) kills
    the answer. A map that ranks patch 2 first: MoRF curve 1, 0, 0, 0, 0 (AUC ⅛), LeRF 1, 1, 1, 1, 0 (AUC ⅞)."""
    pixels = torch.ones(3, 4, 4)

    def probability(images: torch.Tensor) -> torch.Tensor:
        return images[:, :, 2:4, 0:2].mean(dim=(1, 2, 3))

    good = torch.tensor([[0.0, 0.1], [1.0, 0.2]])  # patch 2 first
    order = vlm.patch_order(good)
    morf = vlm.patch_curve(probability, pixels, order, 2, torch.zeros(3), K=4)
    lerf = vlm.patch_curve(probability, pixels, order.flip(0), 2, torch.zeros(3), K=4)
    np.testing.assert_array_equal(morf, [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(lerf, [1, 1, 1, 1, 0])
    from lrp_core.evaluation.lm import curve_auc

    assert curve_auc(morf) == pytest.approx(0.125)  # trapezoid over k/4: ½ · ¼
    assert curve_auc(lerf) == pytest.approx(0.875)
    values = vlm.question_values(
        image_map=good.repeat_interleave(2, 0).repeat_interleave(2, 1),
        mask=_mask(4, 4, ((2, 0), (2, 1), (3, 0), (3, 1))),
        patch_map=good,
        scores=torch.tensor([0.0, 1.0, 2.0]),
        text_positions=torch.tensor([1, 2]),
        word_positions=torch.tensor([2]),
        probability=probability,
        pixels=pixels,
        patch=2,
        fill=torch.zeros(3),
        K=4,
    )
    assert values == {
        "pointing": 1.0,
        "mask_share": pytest.approx(1.0 / 1.3),
        "text_rank": 1.0,
        "morf_auc": pytest.approx(0.125),
        "lerf_auc": pytest.approx(0.875),
    }


def test_bad_maps_and_masks_are_refused():
    with pytest.raises(InputError, match="same size"):
        vlm.pointing_hit(torch.zeros(4, 4), torch.zeros(4, 5, dtype=torch.bool))
    with pytest.raises(InputError, match="boolean"):
        vlm.mask_share(torch.zeros(4, 4), torch.zeros(4, 4))
    with pytest.raises(InputError, match="empty"):
        vlm.mask_share(torch.zeros(4, 4), torch.zeros(4, 4, dtype=torch.bool))
