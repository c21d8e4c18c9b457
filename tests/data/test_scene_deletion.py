"""make_scenes(..., drop=j): the same scenes with object j left out (the deletion check's counterfactual)."""

import numpy as np
import pytest
import torch

from lrp_core.data import make_scenes


@pytest.mark.parametrize("size", [64, 112])
@pytest.mark.parametrize("drop", [0, 1])
def test_removed_object_changes_only_its_own_pixels(drop, size):
    full = make_scenes(40, seed=11, n_objects=2, size=size)
    cut = make_scenes(40, seed=11, n_objects=2, size=size, drop=drop)
    gone = full.masks[:, drop].numpy()  # (n, H, W)
    outside = ~gone[..., None].repeat(3, axis=-1)
    assert np.array_equal(cut.rgb[outside], full.rgb[outside])  # bit for bit
    # inside the object every scene changes somewhere (the object is gone)
    changed = (np.abs(cut.rgb - full.rgb).max(-1) > 0) & gone
    assert changed.reshape(40, -1).any(1).all()
    assert torch.equal(cut.labels, full.labels)
    assert not cut.masks[:, drop].any()


def test_the_remaining_object_is_drawn_whole():
    full = make_scenes(60, seed=5, n_objects=2)
    for drop in (0, 1):
        keep = 1 - drop
        cut = make_scenes(60, seed=5, n_objects=2, drop=drop)
        kept, before = cut.masks[:, keep], full.masks[:, keep]
        assert bool((kept | ~before).all())  # it still owns its visible pixels
        # where the dropped object was on top, the hidden part reappears, inside the dropped mask
        revealed = kept & ~before
        assert bool((~revealed | full.masks[:, drop]).all())
    # in some scenes an object was partly hidden: both cases occur in 60 scenes
    grew = [
        bool((make_scenes(60, seed=5, n_objects=2, drop=d).masks[:, 1 - d] & ~full.masks[:, 1 - d]).any())
        for d in (0, 1)
    ]
    assert any(grew)


def test_single_object_scene_without_its_object_is_the_background():
    full = make_scenes(8, seed=2, n_objects=1)
    cut = make_scenes(8, seed=2, n_objects=1, drop=0)
    out = ~full.masks[:, 0].numpy()
    assert np.array_equal(cut.rgb[out], full.rgb[out])
    assert not cut.masks.any()


def test_drop_is_validated():
    with pytest.raises(ValueError, match="drop"):
        make_scenes(2, seed=0, n_objects=1, drop=1)
    with pytest.raises(ValueError, match="drop"):
        make_scenes(2, seed=0, n_objects=2, drop=True)
