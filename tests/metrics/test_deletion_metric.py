"""The deletion check (metrics.deletion_*) on hand-built cases whose answer is known."""

import math

import numpy as np
import pytest
import torch

from lrp_core import metrics as M
from lrp_core.errors import InputError


def _masks():
    """Two 4x4 objects: object 0 = left column pair, object 1 = right column pair."""
    m = torch.zeros(2, 4, 4, dtype=torch.bool)
    m[0, :, :2] = True
    m[1, :, 2:] = True
    return m


def test_shares_order_and_distraction_by_hand():
    masks = _masks().expand(3, 2, 4, 4)
    maps = torch.zeros(3, 4, 4)
    maps[0, :, 0] = 3.0  # case 0: 12 on object 0, 4 on object 1
    maps[0, :, 3] = 1.0
    maps[1, :, 3] = 2.0  # case 1: everything on object 1, negatives ignored
    maps[1, :, 0] = -5.0
    maps[2, :, 1] = 1.0  # case 2: a tie of the masses
    maps[2, :, 2] = 1.0
    drops = torch.tensor([[2.0, 0.5], [3.0, 1.0], [0.0, 4.0]])
    own = torch.tensor([0, 0, 1])
    c = M.deletion_cases(maps, masks, drops, own)
    np.testing.assert_allclose(c["shares"], [[0.75, 0.25], [0.0, 1.0], [0.5, 0.5]])
    np.testing.assert_allclose(c["order"], [1.0, 0.0, 0.5])
    np.testing.assert_allclose(c["distraction"], [0.25, 1.0, 0.5])
    r = M.deletion_agreement(maps, masks, drops, own)
    assert r["deletion_order"] == pytest.approx(0.5)
    assert r["deletion_distraction"] == pytest.approx(1.75 / 3)
    x = np.array([0.75, 0.25, 0.0, 1.0, 0.5, 0.5])
    y = np.array([2.0, 0.5, 3.0, 1.0, 0.0, 4.0])
    assert r["deletion_correlation"] == pytest.approx(np.corrcoef(x, y)[0, 1])


def test_a_map_that_follows_the_drops_scores_perfectly_and_its_mirror_fails():
    g = torch.Generator().manual_seed(0)
    n = 20
    masks = _masks().expand(n, 2, 4, 4)
    drops = torch.rand(n, 2, generator=g) * 5
    follows = masks.float() * drops.view(n, 2, 1, 1)
    good = follows.sum(1)  # mass ∝ drop on each object
    bad = (masks.float() * drops.flip(1).view(n, 2, 1, 1)).sum(1)  # mass on the wrong object
    own = drops.argmax(1)
    rg = M.deletion_agreement(good, masks, drops, own)
    rb = M.deletion_agreement(bad, masks, drops, own)
    assert rg["deletion_order"] == 1.0 and rb["deletion_order"] == 0.0
    assert rg["deletion_correlation"] > 0.5 > -0.5 > rb["deletion_correlation"]
    assert rg["deletion_distraction"] < 0.5 < rb["deletion_distraction"]


def test_undefined_cases_are_left_out():
    masks = _masks().expand(2, 2, 4, 4)
    maps = torch.zeros(2, 4, 4)  # case 0: no positive relevance
    maps[1, :, 0] = 1.0
    drops = torch.tensor([[1.0, 0.0], [1.0, 1.0]])  # case 1: the drops tie
    c = M.deletion_cases(maps, masks, drops, torch.tensor([0, 0]))
    assert math.isnan(c["order"][0]) and math.isnan(c["order"][1])
    assert math.isnan(c["distraction"][0]) and c["distraction"][1] == 0.0


def test_drops_of_a_linear_model_equal_the_removed_contribution():
    """y = W·mean(x): removing an object changes y_c by exactly W_c·(mean(x) − mean(x without k))."""
    torch.manual_seed(0)
    w = torch.randn(3, 2)

    def model(x):
        return x.mean(dim=(2, 3)) @ w.T  # (B, 2 channels) -> (B, 3 classes)

    images = torch.rand(4, 2, 4, 4)
    removed = images.unsqueeze(1).repeat(1, 2, 1, 1, 1)
    removed[:, 0, :, :, :2] = 0.0  # object 0 taken out
    removed[:, 1, :, :, 2:] = 0.0
    classes = torch.tensor([[0, 2], [1, 0], [2, 1], [0, 1]])
    d = M.deletion_drops(model, images, removed, classes, batch_size=3)
    assert d.shape == (4, 2, 2) and d.dtype == torch.float64
    for i in range(4):
        for j in range(2):
            for k in range(2):
                c = classes[i, j]
                expect = (model(images[i : i + 1]) - model(removed[i, k : k + 1]))[0, c]
                assert d[i, j, k].item() == pytest.approx(expect.item(), abs=1e-6)


def test_shapes_are_checked():
    with pytest.raises(InputError):
        M.object_mass_shares(torch.zeros(2, 4, 4), torch.zeros(2, 4, 4, dtype=torch.bool))
    with pytest.raises(InputError):
        M.deletion_cases(torch.zeros(2, 4, 4), _masks().expand(2, 2, 4, 4), torch.zeros(2, 3), torch.zeros(2))
