"""MethodGrid and ConceptBuilder driven programmatically."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lrp_core
import widgets

METHODS = ["transformer_attribution", "rollout", "cdam", "lrp"]


@pytest.fixture(scope="module")
def grid(vit, images):
    g = widgets.MethodGrid(vit, images[:1], methods=METHODS, labels=list("ABCDE"), panel_size=96)
    assert g.last_error is None, g.last_error
    return g


def test_each_panel_is_the_engines_output_for_the_same_class(vit, images, grid):
    assert list(grid.maps) == METHODS
    for m in METHODS:
        ref = lrp_core.explain(vit, images[:1], method=m, target=grid.target)
        want = ref.pixels[0] if m == "lrp" else ref.scores[0].reshape(4, 4)
        np.testing.assert_allclose(grid.maps[m], want.numpy(), rtol=1e-4, atol=1e-9)


def test_grid_picture_has_one_tile_per_method(grid, decode_png):
    arr = decode_png(grid.image.value)
    assert grid.panel_size == 200  # 96 px asked for: raised to the readable minimum
    assert arr.shape[1] == 4 * 200 + 3 * 6  # four columns and the gaps between them


def test_class_switch_recomputes_every_panel(vit, images, grid):
    first = grid.target
    other = next(v for _, v in grid.class_selector.options if v != first)
    grid.class_selector.value = other
    ref = lrp_core.explain(vit, images[:1], method="cdam", target=other)
    np.testing.assert_allclose(grid.maps["cdam"], ref.scores[0].reshape(4, 4).numpy(), rtol=1e-4)
    grid.class_selector.value = first


def test_positive_toggle_clamps_every_panel(grid):
    grid.sign_toggle.value = False
    for m in METHODS:
        np.testing.assert_array_equal(grid.displayed_maps[m], np.clip(grid.maps[m], 0, None))
    grid.sign_toggle.value = True
    assert all(np.array_equal(grid.displayed_maps[m], grid.maps[m]) for m in METHODS)


def test_target_by_name(vit, images):
    g = widgets.MethodGrid(vit, images[:1], methods=["rollout"], target="D", labels=list("ABCDE"))
    assert g.target == 3


def test_text_grid_shows_a_row_of_tokens_per_method(bert, tokenizer):
    g = widgets.MethodGrid(bert, "the film was good", methods=["transformer_attribution", "cdam"], tokenizer=tokenizer)
    assert g.last_error is None
    assert g.html.value.count("<tr>") == 2 and g.html.value.count('class="trl-token"') == 2 * 6


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(methods=["nope"]), "nope"),
        (dict(target=9), "0..4"),
        (dict(target="Z"), "unknown class"),
    ],
)
def test_grid_bad_arguments_are_readable_messages(vit, images, kwargs, expected):
    g = widgets.MethodGrid(vit, images[:1], labels=list("ABCDE"), **kwargs)
    assert expected in g.last_error and "trl-error" in g.message.value


@pytest.fixture(scope="module")
def candidates():
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(11))


def test_concept_checkbox_labels_have_room_and_pictures_are_readable(vit, images, candidates):
    c = widgets.ConceptBuilder(vit, candidates, images[0], tile_size=48, display_size=144)
    assert (c.tile_size, c.display_size) == (96, 320)  # raised to the readable minimum
    # ipywidgets cuts a label that does not fit ("ex…"): each checkbox is a column wide
    assert all(int(b.layout.width.rstrip("px")) >= 120 for b in c.checkboxes)


def test_concept_map_is_cdam_with_the_mean_embedding_of_the_ticked_examples(vit, images, candidates):
    c = widgets.ConceptBuilder(vit, candidates, images[0])
    assert c.displayed_map is None and "Tick" in c.info.value
    c.checkboxes[0].value = True
    c.checkboxes[2].value = True
    assert c.selected == [0, 2]
    target = lrp_core.concept_target(vit, candidates[[0, 2]])
    ref = lrp_core.explain(vit, images[:1], method="cdam", target=target)
    np.testing.assert_allclose(c.displayed_map, ref.scores[0].reshape(4, 4).numpy(), rtol=1e-4)
    first = c.displayed_map.copy()
    c.select([1])
    assert c.selected == [1]
    assert not np.allclose(first, c.displayed_map)
    c.sign_toggle.value = False
    assert (c.displayed_map >= 0).all()


def test_concept_builder_refuses_mismatched_images(vit, candidates):
    c = widgets.ConceptBuilder(vit, candidates, torch.randn(1, 3, 48, 48))
    assert "32\u00d732" in c.last_error and list(c.children) == [c.message]


def test_head_less_backbone_concept_works_and_class_widgets_explain_why_not(make_vit, images, candidates):
    backbone = make_vit(num_classes=0)
    c = widgets.ConceptBuilder(backbone, candidates, images[:1], selected=[0, 1])
    assert c.last_error is None, c.last_error
    ref = lrp_core.explain(
        backbone, images[:1], method="cdam", target=lrp_core.concept_target(backbone, candidates[[0, 1]])
    )
    np.testing.assert_allclose(c.displayed_map, ref.scores[0].reshape(4, 4).numpy(), rtol=1e-4)
    for w in (widgets.RelevanceExplorer(backbone, images[:1]), widgets.MethodGrid(backbone, images[:1])):
        assert "no classification head" in w.last_error and "ConceptBuilder" in w.last_error


def test_concept_from_crops_of_any_size(vit, images):
    import torch.nn.functional as F

    big = torch.randn(3, 64, 64, generator=torch.Generator().manual_seed(5))
    crops = [big[:, :20, :30], big[:, 30:, 10:50]]
    c = widgets.ConceptBuilder(vit, crops, images[:1], selected=[0, 1])
    assert c.last_error is None, c.last_error
    resized = torch.stack(
        [F.interpolate(k[None], size=(32, 32), mode="bilinear", align_corners=False)[0] for k in crops]
    )
    ref = lrp_core.explain(vit, images[:1], method="cdam", target=lrp_core.concept_target(vit, resized))
    np.testing.assert_allclose(c.displayed_map, ref.scores[0].reshape(4, 4).numpy(), rtol=1e-4)
    bad = widgets.ConceptBuilder(vit, [torch.zeros(1, 8, 8)], images[:1])
    assert "crop 0" in bad.last_error
