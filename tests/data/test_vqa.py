"""make_vqa: questions about the scenes whose answer one known object decides."""

import numpy as np
import pytest

from lrp_core.data import make_scenes, make_vqa
from lrp_core.data.scenes import DINOV2_SCENE_SIZE
from lrp_core.data.vqa import COLOUR_NAMES, KINDS, PALETTE, vocabulary
from lrp_core.errors import InputError
from lrp_core.models.tiny_vlm import HELD_OUT_SEED


@pytest.fixture(scope="module")
def records():
    return make_vqa(48, seed=5)


@pytest.fixture(scope="module")
def every():
    return make_vqa(6, seed=11, every_question=True)


def test_same_seed_same_records_other_seed_other_scenes(records):
    again = make_vqa(48, seed=5)
    for a, b in zip(records, again):
        assert (a.question, a.answer, a.kind, a.has_evidence) == (b.question, b.answer, b.kind, b.has_evidence)
        assert np.array_equal(np.asarray(a.image), np.asarray(b.image)) and np.array_equal(a.mask, b.mask)
    other = make_vqa(48, seed=6)
    assert not any(np.array_equal(np.asarray(a.image), np.asarray(b.image)) for a, b in zip(records, other))


def test_records_are_scenes_at_112_px_with_one_word_answers(records):
    vocab = set(vocabulary())
    assert [r.kind for r in records] == [KINDS[i % 4] for i in range(48)]
    for r in records:
        assert r.image.mode == "RGB" and r.image.size == (DINOV2_SCENE_SIZE, DINOV2_SCENE_SIZE)
        assert r.mask.shape == (DINOV2_SCENE_SIZE, DINOV2_SCENE_SIZE) and r.mask.dtype == bool
        assert r.answer in vocab and set(r.question.split()) <= vocab and r.question.endswith(" ?")
        assert r.has_evidence == (r.answer != "no") == bool(r.mask.any())


def test_masks_are_the_drawn_objects_visible_pixels(records):
    palette = np.array(list(PALETTE.values()))
    scenes = make_scenes(48, 5, 2, size=DINOV2_SCENE_SIZE, textures=False, palette=palette)
    for i, r in enumerate(records):
        assert np.array_equal(r.masks, scenes.masks[i].numpy())
        assert not (r.masks[0] & r.masks[1]).any()
        pixels = np.asarray(r.image, dtype=np.float64) / 255.0
        for j in range(2):
            # solid colour plus the scenes' pixel noise (sigma 0.02): each visible pixel is its object's colour
            colour = np.array(PALETTE[r.colours[j]])
            assert np.abs(pixels[r.masks[j]] - colour).max() < 0.13
        if r.has_evidence:
            assert any(np.array_equal(r.mask, r.masks[j]) for j in range(2))


def _expected(r):
    """(answer, deciding object index or None) recomputed from the scene's objects."""
    words = r.question.split()
    if r.kind == "where":
        anchor = r.shapes.index(words[-2])
        other = 1 - anchor
        rows, cols = np.mgrid[0 : r.mask.shape[0], 0 : r.mask.shape[1]]
        centre = [np.array([rows[m].mean(), cols[m].mean()]) for m in r.masks]
        d_row, d_col = centre[other] - centre[anchor]
        direction = (
            ("right" if d_col > 0 else "left") if abs(d_col) >= abs(d_row) else ("below" if d_row > 0 else "above")
        )
        assert direction in words and max(abs(d_row), abs(d_col)) >= 16  # a clear relation
        return r.shapes[other], other
    if r.kind == "which":
        j = r.colours.index(words[-2])
        return r.shapes[j], j
    if r.kind == "colour":
        j = r.shapes.index(words[-2])
        return r.colours[j], j
    shape = words[-2]
    return ("yes", r.shapes.index(shape)) if shape in r.shapes else ("no", None)


def test_answers_and_masks_follow_from_the_scene(records, every):
    for r in records + every:
        answer, j = _expected(r)
        assert r.answer == answer, r.question
        assert np.array_equal(r.mask, r.masks[j] if j is not None else np.zeros_like(r.mask))


def test_colour_names_are_the_colours_on_the_image(records):
    palette = np.array(list(PALETTE.values()))
    for r in records:
        pixels = np.asarray(r.image, dtype=np.float64) / 255.0
        for j in range(2):
            mean = pixels[r.masks[j]].mean(0)
            assert COLOUR_NAMES[int(np.abs(palette - mean).sum(1).argmin())] == r.colours[j]
        assert r.colours[0] != r.colours[1] and r.shapes[0] != r.shapes[1]


def test_every_question_covers_each_scene(every):
    assert len(every) == 6 * 14
    for i in range(6):
        mine = [r for r in every if r.index == i]
        assert [sum(r.kind == k for r in mine) for k in KINDS] == [2, 2, 2, 8]
        assert sum(r.answer == "no" for r in mine) == 6


def test_held_out_scenes_are_not_training_scenes():
    train = {np.asarray(r.image).tobytes() for r in make_vqa(300, 0)}
    held = make_vqa(40, HELD_OUT_SEED)
    assert not any(np.asarray(r.image).tobytes() in train for r in held)


def test_palette_colours_are_palette_rows_and_a_bad_palette_is_refused():
    palette = np.array(list(PALETTE.values()), dtype=np.float32)
    scenes = make_scenes(32, 0, 2, palette=palette)
    match = np.abs(scenes.colors[:, :, None] - palette[None, None]).max(-1) == 0  # (32, 2, 6)
    assert (match.sum(-1) == 1).all()  # each object's colour is exactly one palette row
    assert (match[:, 0].argmax(-1) != match[:, 1].argmax(-1)).all()  # two different colours per scene
    assert not (np.abs(make_scenes(32, 0, 2).colors[:, :, None] - palette[None, None]).max(-1) == 0).any()
    with pytest.raises(InputError, match="palette"):
        make_scenes(2, 0, 2, palette=np.ones((1, 3)))
    with pytest.raises(InputError, match="palette"):
        make_scenes(2, 0, 1, palette=np.full((3, 3), 2.0))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputError):
            make_vqa(bad)
    with pytest.raises(InputError):
        make_vqa(2, seed=-3)
