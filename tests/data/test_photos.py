"""Bundled photos and the two-photo composition."""

import numpy as np
import pytest
from PIL import Image

from lrp_core.data import compose_pair, list_images, sample_image
from lrp_core.data.photos import as_pil_image


def test_every_listed_image_loads_as_rgb():
    names = list_images()
    assert {"chelsea", "coffee", "astronaut", "rocket", "china", "flower", "grace_hopper"} <= set(names)
    for name in names:
        img = sample_image(name)
        assert isinstance(img, Image.Image) and img.mode == "RGB"
        assert min(img.size) >= 100
        assert np.asarray(img).std() > 5  # a real picture, not a blank


def test_sources_are_the_package_files():
    import skimage.data
    from sklearn.datasets import load_sample_image

    assert np.array_equal(np.asarray(sample_image("chelsea")), skimage.data.chelsea())
    assert np.array_equal(np.asarray(sample_image("china")), load_sample_image("china.jpg"))
    gray = np.asarray(sample_image("camera"))
    assert np.array_equal(gray[..., 0], skimage.data.camera()) and np.array_equal(gray[..., 0], gray[..., 2])


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(KeyError) as err:
        sample_image("no-such-photo")
    msg = str(err.value)
    assert "no-such-photo" in msg and "chelsea" in msg and "grace_hopper" in msg


def test_compose_pair_halves_and_masks():
    pair, masks = compose_pair("chelsea", "coffee", size=224, return_masks=True)
    assert pair.size == (224, 224) and masks.shape == (2, 224, 224)
    assert not (masks[0] & masks[1]).any() and (masks[0] | masks[1]).all()
    arr = np.asarray(pair).astype(float)
    # each half equals the corresponding photo, centre-cropped and resized on its own
    left = np.asarray(compose_pair("chelsea", "chelsea", size=224)).astype(float)[:, :112]
    right = np.asarray(compose_pair("coffee", "coffee", size=224)).astype(float)[:, 112:]
    assert np.array_equal(arr[:, :112], left) and np.array_equal(arr[:, 112:], right)
    assert np.abs(arr[:, :112].mean((0, 1)) - arr[:, 112:].mean((0, 1))).max() > 1


def test_compose_pair_accepts_images_and_arrays():
    a = np.zeros((50, 80, 3), dtype=np.uint8)
    b = Image.new("RGB", (30, 90), (255, 0, 0))
    out = compose_pair(a, b, size=64)
    arr = np.asarray(out)
    assert (arr[:, :32] == 0).all() and (arr[:, 32:] == [255, 0, 0]).all()


def test_as_pil_image_formats():
    f = np.full((4, 5, 3), 0.5)
    assert np.asarray(as_pil_image(f))[0, 0, 0] == 128
    assert as_pil_image(np.zeros((4, 5), dtype=np.uint8)).mode == "RGB"
    assert as_pil_image(np.zeros((3, 6, 7), dtype=np.float32)).size == (7, 6)
    with pytest.raises(ValueError, match="expected an"):
        as_pil_image(np.zeros((5, 6, 7)))
    with pytest.raises(TypeError, match="PIL image"):
        as_pil_image("chelsea")
