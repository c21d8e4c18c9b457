"""The per-step image maps of a vision-language model's generation page (lrp_core.viz.thumbnails): shown at
THUMB_PX (160) px without browser rescaling, in the zero-centred diverging colours over the photo in grey, one
colour limit per step or for all, and a boolean mask drawn as an outline of OUTLINE_PX px. Hand-made maps and masks,
and the page of a tiny random LLaVA (tests/vlms.py)."""

from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest
import torch
from decoders import make_decoder
from PIL import Image
from vlms import SIZE, inputs, make_llava, prompt

from lrp_core import explain_generation
from lrp_core.errors import InputError
from lrp_core.viz import colour_scale, grey_photo
from lrp_core.viz.thumbnails import OUTLINE_RGB, PHOTO_LIGHT, THUMB_PX, mask_outline, step_thumbnails


def pictures(fragment: str) -> list[np.ndarray]:
    """The inline PNGs of an HTML fragment, decoded (H, W, 3) uint8."""
    return [
        np.asarray(Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB"))
        for b in re.findall(r'src="data:image/png;base64,([^"]+)"', fragment)
    ]


def _square(n: int, a: int, b: int) -> np.ndarray:
    m = np.zeros((n, n), dtype=bool)
    m[a:b, a:b] = True
    return m


def test_a_square_mask_is_outlined_by_its_two_pixel_border_at_the_pictures_size():
    """A 56 px square of a 112 px mask is an 80 px square at 160 px: its 2 px border holds 80² − 76² pixels."""
    edge = mask_outline(_square(112, 28, 84), (160, 160))
    inside = _square(160, 40, 120)
    assert edge.sum() == 80**2 - 76**2
    assert not (edge & ~inside).any() and not (edge & _square(160, 42, 118)).any()


def test_the_thumbnails_are_the_signed_map_over_the_grey_photo_with_the_outline():
    """Zero relevance leaves the grey photo; positive relevance is red, negative blue; the outline is drawn in
    OUTLINE_RGB exactly on the mask's border; the picture is THUMB_PX px and shown at that size."""
    photo = np.full((112, 112, 3), 200, dtype=np.uint8)
    relmap = np.zeros((112, 112))
    relmap[:20] = 1.0  # for, at the top
    relmap[-20:] = -1.0  # against, at the bottom
    mask = _square(112, 28, 84)
    [fig] = step_thumbnails(relmap[None], image=photo, mask=mask)
    assert f'width="{THUMB_PX}" height="{THUMB_PX}"' in fig
    [pic] = pictures(fig)
    assert pic.shape == (THUMB_PX, THUMB_PX, 3)
    edge = mask_outline(mask, (THUMB_PX, THUMB_PX))
    assert (pic[edge] == OUTLINE_RGB).all()
    grey = grey_photo(photo, PHOTO_LIGHT)[0, 0]
    middle = pic[70:90, 20:30]  # relevance 0, off the outline: the grey photo as it is
    assert (middle == grey).all()
    top, bottom = pic[5, 80].astype(int), pic[-5, 80].astype(int)
    assert top[0] > top[2] + 50 and bottom[2] > bottom[0] + 50


def test_row_and_all_scales_give_each_step_its_limit_or_one():
    maps = np.stack([np.linspace(-1, 1, 64).reshape(8, 8), 5 * np.linspace(0, 1, 64).reshape(8, 8)])
    limits = [colour_scale(m).limit for m in maps]
    row = step_thumbnails(maps, scale="row")
    assert [f"\u00b1{v:.3g}<" in f for f, v in zip(row, limits)] == [True, True]
    shared = colour_scale(maps).limit
    assert all(f"\u00b1{shared:.3g}<" in f for f in step_thumbnails(maps, scale="all"))


def test_bad_thumbnail_arguments_are_input_errors():
    maps = np.zeros((2, 8, 8))
    with pytest.raises(InputError, match=r"\(K, H, W\)"):
        step_thumbnails(np.zeros((8, 8)))
    with pytest.raises(InputError, match="size of the maps"):
        step_thumbnails(maps, mask=np.zeros((4, 4), dtype=bool))
    with pytest.raises(InputError, match="size of the photo"):
        step_thumbnails(maps, image=np.zeros((16, 16, 3), dtype=np.uint8), mask=np.zeros((8, 8), dtype=bool))
    with pytest.raises(InputError, match="bool"):
        step_thumbnails(maps, mask=np.full((8, 8), 0.5))
    with pytest.raises(InputError, match="scale"):
        step_thumbnails(maps, scale="column")


def test_the_generation_page_draws_each_step_over_the_photo_with_the_mask_outlined(tmp_path):
    """save_html(images=, masks=): per step a THUMB_PX picture of that step's pixel map over the photo (the same
    picture step_thumbnails draws), the mask's outline in it; one entry per batch row is required."""
    model = make_llava("clip")
    x = inputs([prompt([5, 6], [7, 8])])
    gen = explain_generation(model, x, method="attnlrp", max_new_tokens=2, stop_at_eos=False)
    photo = (np.random.default_rng(0).random((SIZE, SIZE, 3)) * 255).astype(np.uint8)
    mask = _square(SIZE, 7, 21)
    assert all(p.shape == (THUMB_PX, THUMB_PX, 3) for p in pictures(gen.html()))  # without a photo too
    page = gen.save_html(tmp_path / "g.html", images=[photo], masks=[mask]).read_text()
    drawn = pictures(page)
    want = pictures("".join(step_thumbnails(gen.pixel_map()[0], image=photo, mask=mask)))
    assert len(drawn) == 2 and all(p.shape == (THUMB_PX, THUMB_PX, 3) for p in drawn)
    assert all(np.array_equal(a, b) for a, b in zip(drawn, want))
    edge = mask_outline(mask, (THUMB_PX, THUMB_PX))
    assert all((p[edge] == OUTLINE_RGB).all() for p in drawn)
    assert "width:64px" not in page and "outlined: the mask given" in page
    with pytest.raises(InputError, match="one entry per row"):
        gen.save_html(tmp_path / "h.html", images=photo)
    ids = torch.tensor([[1, 5, 6, 7]])
    text = explain_generation(make_decoder("llama"), None, {"input_ids": ids}, method="attnlrp", max_new_tokens=1)
    with pytest.raises(InputError, match="text"):
        text.html(image=photo)
