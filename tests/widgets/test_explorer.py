"""RelevanceExplorer driven programmatically: the picture and the arrays follow the controls."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

import lrp_core
import widgets
from widgets import _engine

GRID = (4, 4)


def independent_product(layers: torch.Tensor, start: int, stop: int, norm: str = "none") -> torch.Tensor:
    """(I+Ā_stop)…(I+Ā_start) for sample 0, computed by hand (not with lrp_core.methods.products)."""
    n = layers.shape[-1]
    c = torch.eye(n, dtype=torch.float64)
    for b in range(start, stop + 1):
        f = layers[0, b].double() + torch.eye(n, dtype=torch.float64)
        if norm == "row":
            f = f / f.sum(-1, keepdim=True)
        c = f @ c
    return c


@pytest.fixture(scope="module")
def explorer(vit, images):
    w = widgets.RelevanceExplorer(vit, images[:1], labels=list("ABCDE"))
    assert w.last_error is None, w.last_error
    return w


@pytest.fixture(scope="module")
def reference(vit, images, explorer):
    """The explanation of the widget's class, computed directly with the engine."""
    return lrp_core.explain(vit, images[:1], method="transformer_attribution", target=explorer.target, keep_heads=True)


def test_first_picture_is_a_png_of_the_display_width(explorer, decode_png):
    arr = decode_png(explorer.image.value)
    assert arr.shape[1] == explorer.display_size >= 320
    assert arr.shape[0] > explorer.display_size  # title line and colourbar around the square image
    assert explorer.displayed_map.shape == GRID
    assert explorer.layer_slider.max == 2 and explorer.layer_slider.value == 2


def test_default_class_is_the_prediction_and_options_list_top_k_then_all(vit, images, explorer):
    logits = vit(images[:1])[0]
    assert explorer.target == int(logits.argmax())
    values = [v for _, v in explorer.class_selector.options]
    assert sorted(values) == list(range(5))
    probs = torch.softmax(logits, 0)
    assert values[:5] == torch.argsort(probs, descending=True).tolist()
    label = explorer.class_selector.options[0][0]
    assert f"{probs.max().item():.1%}" in label and "ABCDE"[values[0]] in label


@pytest.mark.parametrize("block", [0, 1, 2])
def test_accumulated_view_is_the_cls_row_of_the_hand_computed_product(explorer, reference, block):
    explorer.head_selector.value = "mean"
    explorer.view_selector.value = "accumulated"
    explorer.sign_toggle.value = True
    explorer.layer_slider.value = block
    want = independent_product(reference.layers, 0, block)[0, 1:].reshape(GRID).numpy()
    np.testing.assert_allclose(explorer.displayed_map, want, rtol=1e-4, atol=1e-9)


def test_last_block_of_the_accumulated_view_is_the_method_output(explorer, reference):
    explorer.view_selector.value = "accumulated"
    explorer.head_selector.value = "mean"
    explorer.layer_slider.value = explorer.layer_slider.max
    acc = explorer.displayed_map.copy()
    explorer.view_selector.value = "output"
    np.testing.assert_allclose(explorer.displayed_map, reference.scores[0].reshape(GRID).numpy(), rtol=1e-5)
    np.testing.assert_allclose(acc, explorer.displayed_map, rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("method", ["generic_attention", "rollout"])
def test_the_full_product_is_the_method_output_for_every_layer_product_method(vit, images, method):
    """The accumulated view multiplies the factors normalised as the engine's method did."""
    w = widgets.RelevanceExplorer(vit, images[:1], methods=[method])
    w.view_selector.value = "accumulated"
    w.layer_slider.value = w.layer_slider.max
    ref = lrp_core.explain(vit, images[:1], method=method, target=w.target)
    np.testing.assert_allclose(w.displayed_map, ref.scores[0].reshape(GRID).numpy(), rtol=1e-4, atol=1e-8)


def test_block_view_shows_the_blocks_own_cls_row_per_head_and_mean(explorer, reference):
    explorer.view_selector.value = "block"
    explorer.layer_slider.value = 1
    explorer.head_selector.value = "mean"
    np.testing.assert_allclose(explorer.displayed_map, reference.layers[0, 1, 0, 1:].reshape(GRID).numpy(), rtol=1e-5)
    for h in (0, 1):
        explorer.head_selector.value = h
        np.testing.assert_allclose(
            explorer.displayed_map, reference.layers_per_head[0, 1, h, 0, 1:].reshape(GRID).numpy(), rtol=1e-5
        )
    explorer.head_selector.value = "mean"


def test_head_in_the_accumulated_view_replaces_that_blocks_factor(explorer, reference):
    explorer.view_selector.value = "accumulated"
    explorer.layer_slider.value = 2
    explorer.head_selector.value = 1
    layers = reference.layers.clone()
    layers[:, 2] = reference.layers_per_head[:, 2, 1]
    want = independent_product(layers, 0, 2)[0, 1:].reshape(GRID).numpy()
    np.testing.assert_allclose(explorer.displayed_map, want, rtol=1e-4, atol=1e-9)
    explorer.head_selector.value = "mean"


def test_head_choices_come_from_the_per_head_matrices(explorer):
    assert [v for _, v in explorer.head_selector.options] == ["mean", 0, 1]


def test_moving_the_slider_changes_the_picture(explorer, decode_png):
    explorer.view_selector.value = "accumulated"
    explorer.layer_slider.value = 0
    a = decode_png(explorer.image.value)
    explorer.layer_slider.value = 2
    b = decode_png(explorer.image.value)
    assert a.shape == b.shape
    assert np.abs(a.astype(int) - b.astype(int)).sum() > 0


def test_moving_the_slider_from_the_output_view_switches_to_a_block_view(explorer):
    explorer.view_selector.value = "output"
    explorer.layer_slider.value = 1 if explorer.layer_slider.value != 1 else 0
    assert explorer.view_selector.value == "accumulated"


def test_positive_view_is_the_clamp_of_the_signed_view(explorer, decode_png):
    explorer.method_selector.value = "cdam"  # gradient x input: both signs
    explorer.sign_toggle.value = True
    signed, png_signed = explorer.displayed_map.copy(), explorer.image.value
    assert (signed < 0).any() and (signed > 0).any(), "the test needs a map with both signs"
    explorer.sign_toggle.value = False
    np.testing.assert_array_equal(explorer.displayed_map, np.clip(signed, 0, None))
    assert explorer.image.value != png_signed
    explorer.sign_toggle.value = True
    np.testing.assert_array_equal(explorer.displayed_map, signed)
    explorer.method_selector.value = "transformer_attribution"


def test_residual_view_shows_token_relevance_and_its_conserved_sum(explorer, reference):
    explorer.view_selector.value = "residual"
    explorer.sign_toggle.value = True
    b = 2
    explorer.layer_slider.value = b
    tr = reference.token_relevance[0, b]
    np.testing.assert_allclose(explorer.displayed_map, tr[1:].reshape(GRID).numpy(), rtol=1e-5)
    assert f"{tr.sum().item():.4g}" in explorer.info.value


def test_slider_head_and_sign_never_recompute_but_a_new_class_does_once(vit, images, monkeypatch):
    w = widgets.RelevanceExplorer(vit, images[:1])
    calls = []
    real = _engine.explain
    monkeypatch.setattr(_engine, "explain", lambda *a, **k: calls.append(k["target"]) or real(*a, **k))
    for b in (0, 1, 2, 0):
        w.layer_slider.value = b
    w.head_selector.value = 0
    w.sign_toggle.value = False
    w.view_selector.value = "block"
    w.opacity.value = 0.3
    assert calls == []
    first = w.target
    other = next(v for _, v in w.class_selector.options if v != first)
    w.class_selector.value = other
    assert calls == [other]
    w.layer_slider.value = 2
    w.class_selector.value = first  # cached
    assert calls == [other]


def test_switching_class_changes_the_map(explorer):
    explorer.view_selector.value = "output"
    explorer.sign_toggle.value = True
    before = explorer.displayed_map.copy()
    first = explorer.target
    other = next(v for _, v in explorer.class_selector.options if v != first)
    explorer.class_selector.value = other
    assert explorer.explanation.target.item() == other
    assert not np.allclose(before, explorer.displayed_map)
    explorer.class_selector.value = first


def test_class_search_by_name_selects_that_class(explorer):
    explorer.class_search.value = "C"
    assert explorer.target == 2


def test_start_layer_recomputes_and_the_product_starts_there(vit, images):
    w = widgets.RelevanceExplorer(vit, images[:1])
    w.start_layer.value = 1
    ref = lrp_core.explain(vit, images[:1], target=w.target, start_layer=1)
    w.view_selector.value = "output"
    np.testing.assert_allclose(w.displayed_map, ref.scores[0].reshape(GRID).numpy(), rtol=1e-5)
    w.view_selector.value = "accumulated"
    w.layer_slider.value = 2
    want = independent_product(ref.layers, 1, 2)[0, 1:].reshape(GRID).numpy()
    np.testing.assert_allclose(w.displayed_map, want, rtol=1e-4, atol=1e-9)
    w.layer_slider.value = 0  # before the start: empty product, nothing reaches the patches
    np.testing.assert_array_equal(w.displayed_map, np.zeros(GRID))


def test_methods_without_blocks_disable_the_block_controls(explorer):
    explorer.method_selector.value = "cdam"
    assert [v for _, v in explorer.view_selector.options] == ["output"]
    assert explorer.layer_slider.disabled and explorer.head_selector.disabled
    explorer.method_selector.value = "lrp"  # pixel map
    assert explorer.displayed_map.shape == (32, 32)
    explorer.method_selector.value = "rollout"
    assert not explorer.layer_slider.disabled
    explorer.method_selector.value = "transformer_attribution"


def test_opacity_zero_shows_the_plain_image(vit, images, decode_png):
    rgb = np.random.default_rng(0).integers(0, 256, (320, 320, 3), dtype=np.uint8)
    w = widgets.RelevanceExplorer(vit, images[:1], image=rgb, display_size=320)
    w.opacity.value = 0.0
    arr = decode_png(w.image.value)
    # the 320 px picture lies between the title lines above and the colourbar below
    top = [t for t in range(arr.shape[0] - 319) if np.array_equal(arr[t : t + 320], rgb)]
    assert len(top) == 1
    w.opacity.value = 1.0
    assert not np.array_equal(decode_png(w.image.value)[top[0] : top[0] + 320], rgb)


def test_small_display_size_is_raised_and_the_title_is_whole(vit, images, decode_png):
    w = widgets.RelevanceExplorer(vit, images[:1], display_size=144)
    assert w.display_size == 320 and decode_png(w.image.value).shape[1] == 320
    w.view_selector.value = "block"  # the longest title: class | method | block b, head h
    w.head_selector.value = w.head_selector.options[-1][1]
    one = decode_png(w.static_png()).shape[0]
    three = decode_png(w._png(w.displayed_map, title=" ".join([w._title()] * 3))).shape[0]
    assert three > one  # a title too long for one line gets more lines, it is not cut


def test_batch_inputs_get_a_sample_selector(vit, images):
    w = widgets.RelevanceExplorer(vit, images)
    assert w.sample_selector.layout.display != "none"
    w.view_selector.value = "output"
    a = w.displayed_map.copy()
    w.sample_selector.value = 1
    ref = lrp_core.explain(vit, images[1:2], target=w.target)
    np.testing.assert_allclose(w.displayed_map, ref.scores[0].reshape(GRID).numpy(), rtol=1e-5)
    assert not np.allclose(a, w.displayed_map)


def test_mimebundle_carries_a_static_png_next_to_the_widget_view(explorer, decode_png):
    data = explorer._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    arr = decode_png(base64.b64decode(data["image/png"]))
    assert arr.shape[1] == explorer.display_size


@pytest.mark.parametrize(
    "make_bad, expected",
    [
        (lambda vit, bert: (vit, torch.randn(1, 3, 64, 64)), "32\u00d732"),
        (lambda vit, bert: (torch.nn.Linear(3, 3), torch.randn(1, 3, 32, 32)), "not a model"),
        (lambda vit, bert: (bert, {"input_ids": torch.ones(1, 4, dtype=torch.long)}), "TokenRelevance"),
        (lambda vit, bert: (vit, torch.randn(1, 1, 32, 32)), "(B, 3, H, W)"),
        (lambda vit, bert: (vit, "a picture"), "tensor"),
        (lambda vit, bert: (vit, torch.zeros(0, 3, 32, 32)), "empty"),
    ],
)
def test_bad_input_shows_a_readable_message_in_the_widget(vit, bert, make_bad, expected):
    model, inputs = make_bad(vit, bert)
    w = widgets.RelevanceExplorer(model, inputs)
    assert expected in w.last_error
    assert "trl-error" in w.message.value and "Traceback" not in w.message.value
    assert list(w.children) == [w.message]
    assert "text/html" in w._repr_mimebundle_()


def test_unknown_method_is_a_readable_message(vit, images):
    w = widgets.RelevanceExplorer(vit, images[:1], methods=["rollout", "magic"])
    assert "magic" in w.last_error and "transformer_attribution" in w.last_error


def test_hugging_face_vit_works_too():
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=4,
    )
    model = ViTForImageClassification(cfg).eval()
    x = torch.randn(1, 3, 32, 32)
    w = widgets.RelevanceExplorer(model, x, methods=["transformer_attribution"])
    assert w.last_error is None, w.last_error
    ref = lrp_core.explain(model, x, target=w.target)
    w.view_selector.value = "output"
    np.testing.assert_allclose(w.displayed_map, ref.scores[0].reshape(GRID).numpy(), rtol=1e-5)
    bad = widgets.RelevanceExplorer(model, torch.randn(1, 3, 48, 48))
    assert "32\u00d732" in bad.last_error


@pytest.mark.parametrize("method, norm", [("transformer_attribution", "none"), ("rollout", "row")])
def test_layer_products_match_the_engines_accumulate(vit, images, method, norm):
    from widgets import views

    exp = lrp_core.explain(vit, images[:1], method=method, keep_heads=True)
    prods = views.LayerProducts(exp, _engine.sample_readout(vit, images[:1]))
    assert prods.norm == norm
    for start in (0, 1):
        for stop in range(start, 3):
            want = lrp_core.methods.products.accumulate(exp.layers, start, stop, norm=norm)[0].double().numpy()
            np.testing.assert_allclose(prods.prefix(start)[stop - start], want, rtol=1e-5, atol=1e-8)
    layers = exp.layers.clone()
    layers[:, 1] = exp.layers_per_head[:, 1, 0]
    want = lrp_core.methods.products.accumulate(layers, 0, 1, norm=norm)[0, 0].double().numpy()
    np.testing.assert_allclose(prods.readout_row(1, 0, head=0), want, rtol=1e-5, atol=1e-8)  # [CLS]: row 0


def test_small_models_compute_on_one_thread_and_the_setting_is_restored(vit, images, monkeypatch):
    from widgets import _engine

    before = torch.get_num_threads()
    seen = []
    real = _engine.explain
    monkeypatch.setattr(_engine, "explain", lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k))
    w = widgets.RelevanceExplorer(vit, images[:1])
    w.class_selector.value = next(v for _, v in w.class_selector.options if v != w.target)
    assert seen == [1, 1]
    assert torch.get_num_threads() == before
    w2 = widgets.RelevanceExplorer(vit, images[:1])
    w2.threads = None  # torch's own setting
    w2.class_selector.value = next(v for _, v in w2.class_selector.options if v != w2.target)
    assert seen[-1] == before


def test_static_display_objects(explorer, decode_png):
    from IPython.display import HTML, Image

    img = explorer.static_display()
    assert isinstance(img, Image)
    assert decode_png(img.data).shape[1] == explorer.display_size
    bad = widgets.RelevanceExplorer(torch.nn.Linear(2, 2), torch.zeros(1, 3, 32, 32))
    html = bad.static_display()
    assert isinstance(html, HTML) and "trl-error" in html.data


def test_wrong_number_of_labels_is_a_readable_message(vit, images):
    w = widgets.RelevanceExplorer(vit, images[:1], labels=["a", "b"])
    assert "2 labels for a model with 5 classes" in w.last_error


def test_info_says_whether_the_block_totals_are_conserved(vit, images):
    from widgets import views

    assert views.conservation_note(np.array([1.0, 1.0, 1.0])).startswith("conserved")
    assert views.conservation_note(np.array([6.3, 3.9, 2.0])).startswith("not conserved")
    assert views.conservation_note(np.array([0.0, 0.0, 2.0])) == "one block computed"
    w = widgets.RelevanceExplorer(vit, images[:1], methods=["transformer_attribution", "lrp"])
    totals = views.block_totals(w.explanation)
    assert views.conservation_note(totals) in w.info.value


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp"])
def test_attnlrp_and_cp_lrp_show_the_residual_stream_and_where_relevance_is_absorbed(vit, images, method):
    w = widgets.RelevanceExplorer(vit, images[:1], methods=[method])
    assert w.last_error is None, w.last_error
    ref = lrp_core.explain(vit, images[:1], method=method, target=w.target)
    w.view_selector.value = "residual"
    w.layer_slider.value = 1
    np.testing.assert_allclose(w.displayed_map, ref.token_relevance[0, 1, 1:].reshape(GRID).numpy(), rtol=1e-5)
    steps = (ref.conservation.absorbed()[0] / ref.conservation.output[0]).tolist()
    assert f"y_t = {ref.conservation.output[0].item():.4g}" in w.info.value
    assert f"block 1 {100 * steps[2]:+.1f}%" in w.info.value  # L = 3: readout, block 2, block 1, block 0 + embedding
