"""lrp_core.viz: zero-centred colours, overlays, PNG rendering, token HTML, word-pieces."""
from __future__ import annotations

import io
import re
import time

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from lrp_core import viz  # noqa: E402


def decode(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_signed_norm_is_symmetric_and_centred_at_zero():
    norm = viz.signed_norm(np.array([-0.5, 2.0, 1.0]))
    assert (norm.vmin, norm.vmax) == (-2.0, 2.0)
    assert norm(0.0) == pytest.approx(0.5)
    assert viz.signed_norm(np.zeros(3)).vmax == 1.0  # all-zero maps still get a valid scale


def test_colorize_zero_is_white_and_signs_are_red_and_blue():
    rgb = viz.colorize(np.array([-1.0, 0.0, 1.0, 0.5]))
    assert tuple(rgb[1]) == (255, 255, 255)
    assert rgb[2, 0] > 200 and rgb[2, 2] < 50  # positive: red
    assert rgb[0, 2] > 200 and rgb[0, 0] < 50  # negative: blue
    # equal magnitudes, equal saturation: the colours are mirror images
    assert tuple(rgb[0]) == tuple(rgb[2][::-1])


def test_colorize_positive_view_is_the_clamped_map():
    vals = np.array([-2.0, -1.0, 0.5, 1.0])
    np.testing.assert_array_equal(viz.colorize(vals, signed=False),
                                  viz.colorize(np.clip(vals, 0, None), limit=1.0))


def test_upsample_map_keeps_constant_maps_and_reaches_the_size():
    up = viz.upsample_map(np.full((4, 4), 3.0), (32, 48))
    assert up.shape == (32, 48)
    np.testing.assert_allclose(up, 3.0, rtol=1e-6)


def test_overlay_leaves_zero_relevance_and_zero_alpha_untouched():
    img = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    np.testing.assert_array_equal(viz.overlay(img, np.zeros((4, 4))), img)
    np.testing.assert_array_equal(viz.overlay(img, np.random.randn(4, 4), alpha=0.0), img)
    rel = np.zeros((4, 4))
    rel[0, 0] = 1.0
    out = viz.overlay(np.full((16, 16, 3), 128, np.uint8), rel, alpha=1.0)
    assert out[0, 0, 0] > 200 and out[0, 0, 2] < 60  # the strongest patch is drawn in full red
    assert tuple(out[15, 15]) == (128, 128, 128)


def test_overlay_rejects_bad_alpha_and_bad_maps():
    with pytest.raises(ValueError, match="alpha"):
        viz.overlay(np.zeros((8, 8, 3)), np.zeros((2, 2)), alpha=2)
    with pytest.raises(ValueError, match="2-D"):
        viz.overlay(np.zeros((8, 8, 3)), np.zeros((2, 2, 2)))


def test_render_overlay_png_has_the_display_size_and_is_fast():
    img, rel = np.random.rand(64, 64, 3), np.random.randn(8, 8)
    t0 = time.perf_counter()
    for _ in range(5):
        png = viz.render_overlay_png(img, rel, display_size=256, title="class 3")
    ms = (time.perf_counter() - t0) / 5 * 1000
    arr = decode(png)
    assert arr.shape[1] == 256 and arr.shape[0] > 256
    print(f"render_overlay_png 256 px: {ms:.1f} ms")  # measured, reported, not asserted


def test_to_rgb_uint8_accepts_the_usual_layouts():
    chw = torch.rand(3, 8, 10)
    a = viz.to_rgb_uint8(chw)
    assert a.shape == (8, 10, 3) and a.dtype == np.uint8
    np.testing.assert_array_equal(viz.to_rgb_uint8(np.zeros((8, 10))), np.zeros((8, 10, 3), np.uint8))
    with pytest.raises(ValueError, match="RGB"):
        viz.to_rgb_uint8(np.zeros((2, 8, 10, 3)))


def test_show_relevance_uses_a_symmetric_colour_scale():
    fig, ax = plt.subplots()
    viz.show_relevance(np.random.rand(32, 32, 3), np.array([[-0.2, 1.0], [0.3, 0.0]]), ax=ax, title="t")
    im = ax.images[-1]
    assert im.norm.vmin == -im.norm.vmax == -1.0
    assert im.get_array().shape == (32, 32) and ax.get_title() == "t"
    png = viz.render_png(fig, close=True)
    assert png[:4] == b"\x89PNG"


def test_show_relevance_positive_view_clamps():
    fig, ax = plt.subplots()
    viz.show_relevance(None, np.array([[-2.0, 1.0]]), ax=ax, signed=False, colorbar=False)
    assert ax.images[-1].get_array().min() == 0.0 and ax.images[-1].norm.vmax == 1.0
    plt.close(fig)


def test_show_methods_draws_one_panel_per_method():
    maps = {"a": np.random.randn(4, 4), "b": np.random.randn(4, 4), "c": np.random.randn(8, 8)}
    fig = viz.show_methods(np.random.rand(16, 16, 3), maps, ncols=2)
    titled = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titled == ["a", "b", "c"]
    plt.close(fig)
    with pytest.raises(ValueError):
        viz.show_methods(None, {})


def test_token_html_colours_escapes_and_explains():
    out = viz.token_html(["[CLS]", "<b>", "good"], [0.0, -1.0, 2.0])
    spans = re.findall(r'<span class="trl-token" style="background-color:rgb\((\d+),(\d+),(\d+)\)', out)
    assert len(spans) == 3
    assert spans[0] == ("255", "255", "255")  # zero is white
    assert int(spans[2][0]) > int(spans[2][2])  # positive is red
    assert int(spans[1][2]) > int(spans[1][0])  # negative is blue
    assert "&lt;b&gt;" in out and "<b>" not in out.split("trl-legend")[0]
    assert "colour scale -2" in out


def test_token_html_positive_view_and_length_check():
    out = viz.token_html(["a", "b"], [-1.0, 1.0], signed=False)
    assert "rgb(255,255,255)" in out  # the negative token is clamped to zero
    with pytest.raises(ValueError, match="2 tokens but 3 scores"):
        viz.token_html(["a", "b"], [1, 2, 3])


def test_merge_wordpieces_max_and_sum():
    tokens = ["[CLS]", "un", "##believ", "##ably", "good", "[SEP]"]
    scores = [0.1, 1.0, -3.0, 2.0, 0.5, 0.0]
    words, s = viz.merge_wordpieces(tokens, scores)
    assert words == ["[CLS]", "unbelievably", "good", "[SEP]"]
    np.testing.assert_allclose(s, [0.1, 2.0, 0.5, 0.0])
    _, s_sum = viz.merge_wordpieces(tokens, scores, reduce="sum")
    np.testing.assert_allclose(s_sum, [0.1, 0.0, 0.5, 0.0])
    assert s_sum.sum() == pytest.approx(sum(scores))


def test_merge_wordpieces_errors_and_leading_piece():
    assert viz.merge_wordpieces(["##x", "y"], [1, 2])[0] == ["##x", "y"]
    with pytest.raises(ValueError, match="reduce"):
        viz.merge_wordpieces(["a"], [1], reduce="mean")
    with pytest.raises(ValueError, match="1 tokens but 2"):
        viz.merge_wordpieces(["a"], [1, 2])


def test_denormalize_inverts_normalisation():
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    rgb = np.random.default_rng(1).random((6, 7, 3))
    m, s = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]
    x = (torch.tensor(rgb).permute(2, 0, 1) - m) / s
    np.testing.assert_allclose(viz.denormalize(x.unsqueeze(0), mean, std), rgb, atol=1e-6)
    with pytest.raises(ValueError, match="one image"):
        viz.denormalize(torch.zeros(2, 3, 4, 4), mean, std)
    with pytest.raises(ValueError, match=r"\(3, H, W\)"):
        viz.denormalize(torch.zeros(4, 4), mean, std)


def test_tile_pngs_lays_out_a_grid():
    tiles = [Image.new("RGB", (10, 12), c) for c in ("red", "green", "blue")]
    arr = decode(viz.tile_pngs(tiles, ncols=2, pad=2))
    assert arr.shape == (12 * 2 + 2, 10 * 2 + 2, 3)
    assert tuple(arr[0, 0]) == (255, 0, 0) and tuple(arr[14, 0]) == (0, 0, 255)
