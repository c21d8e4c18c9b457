"""Procedural scenes: determinism, exact masks, valid labels."""

import numpy as np
import pytest
import torch

from lrp_core.data import CLASS_NAMES, MEAN, STD, make_scenes


@pytest.mark.parametrize("k", [1, 2])
def test_same_seed_same_arrays_different_seed_differs(k):
    a, b, c = make_scenes(40, 7, k), make_scenes(40, 7, k), make_scenes(40, 8, k)
    assert torch.equal(a.images, b.images) and torch.equal(a.masks, b.masks)
    assert torch.equal(a.labels, b.labels) and np.array_equal(a.rgb, b.rgb)
    assert not np.array_equal(a.rgb, c.rgb)
    assert not torch.equal(a.masks, c.masks)


@pytest.mark.parametrize("k", [1, 2])
def test_shapes_dtypes_and_normalisation(k):
    s = make_scenes(30, 1, k)
    assert s.images.shape == (30, 3, 64, 64) and s.images.dtype == torch.float32
    assert s.labels.shape == (30, k) and s.labels.dtype == torch.int64
    assert s.masks.shape == (30, k, 64, 64) and s.masks.dtype == torch.bool
    assert s.rgb.shape == (30, 64, 64, 3) and 0 <= s.rgb.min() and s.rgb.max() <= 1
    back = s.images * torch.tensor(STD).view(1, 3, 1, 1) + torch.tensor(MEAN).view(1, 3, 1, 1)
    assert torch.allclose(back, torch.from_numpy(s.rgb).permute(0, 3, 1, 2), atol=1e-5)
    assert s.class_names == CLASS_NAMES and len(CLASS_NAMES) >= 6


def test_labels_valid_and_two_objects_differ():
    s = make_scenes(300, 2, 2)
    assert s.labels.min() >= 0 and s.labels.max() < len(CLASS_NAMES)
    assert (s.labels[:, 0] != s.labels[:, 1]).all()
    # every class appears in both slots
    for j in range(2):
        assert set(s.labels[:, j].tolist()) == set(range(len(CLASS_NAMES)))


@pytest.mark.parametrize("k", [1, 2])
def test_masks_nonempty_and_disjoint(k):
    s = make_scenes(200, 3, k)
    assert (s.masks.sum((2, 3)) >= 30).all()
    if k == 2:
        assert not (s.masks[:, 0] & s.masks[:, 1]).any()


@pytest.mark.parametrize("k", [1, 2])
def test_solid_objects_masks_are_exact(k):
    # flat background, solid colours, no pixel noise: a pixel has the object's
    # colour exactly if and only if it lies in the object's mask
    s = make_scenes(100, 4, k, textures=False, clutter=False)
    rgb = s.rgb
    for j in range(k):
        same = np.all(rgb == s.colors[:, j, None, None, :], axis=-1)  # (n, H, W)
        assert np.array_equal(same, s.masks[:, j].numpy())


def test_occlusion_happens_and_is_resolved():
    # some two-object scenes overlap; the hidden part belongs to the object on top
    s = make_scenes(600, 5, 2, textures=False, clutter=False)
    rgb = s.rgb
    col = s.colors
    # pixels of either colour = union of masks; masks disjoint, so each visible pixel has one owner
    union = s.masks.any(1).numpy()
    either = np.zeros_like(union)
    for j in range(2):
        either |= np.all(rgb == col[:, j, None, None, :], axis=-1)
    assert np.array_equal(union, either)
    # the placement rule allows limited overlap: some scenes have touching objects
    touching = 0
    for i in range(len(s)):
        m0 = s.masks[i, 0].numpy()
        grown = m0.copy()
        grown[1:] |= m0[:-1]
        grown[:-1] |= m0[1:]
        grown[:, 1:] |= m0[:, :-1]
        grown[:, :-1] |= m0[:, 1:]
        touching += bool((grown & s.masks[i, 1].numpy()).any())
    assert touching > 0


def test_textured_masked_pixels_differ_from_background():
    # flat background: outside the mask one colour far from the object's; inside,
    # many pixels are close to the object's colour (the rest carry its texture)
    s = make_scenes(100, 6, 1, clutter=False)
    for i in range(len(s)):
        m = s.masks[i, 0].numpy()
        inside = s.rgb[i][m]
        outside = s.rgb[i][~m]
        d_in = np.linalg.norm(inside - s.colors[i, 0], axis=1)
        # flat background: a single colour outside the mask
        assert np.ptp(outside, axis=0).max() == 0
        assert np.linalg.norm(outside[0] - s.colors[i, 0]) >= 0.45
        # at least a third of the object pixels carry the main colour (+ texture noise)
        assert (d_in < 0.45).mean() > 0.3


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="n_objects must be 1 or 2"):
        make_scenes(4, 0, 3)
    with pytest.raises(ValueError, match="positive integer"):
        make_scenes(0, 0)
