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
from PIL import Image, ImageDraw  # noqa: E402

from lrp_core.viz import maps as viz  # noqa: E402


def decode(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_signed_norm_is_symmetric_and_centred_at_zero():
    norm = viz.signed_norm(np.array([-0.5, 2.0, 1.0]))
    assert (norm.vmin, norm.vmax) == (-2.0, 2.0)
    assert norm(0.0) == pytest.approx(0.5)
    assert viz.signed_norm(np.zeros(3)).vmax == 1.0  # all-zero maps still get a valid scale
    # with gamma the scale stays zero-centred and odd: norm(v) - 0.5 = 0.5 sign(v) |v/m| ** gamma
    g = viz.signed_norm(np.array([-4.0, 1.0]), gamma=0.5)
    assert (g.vmin, g.vmax) == (-4.0, 4.0)
    np.testing.assert_allclose(g(np.array([-4.0, -1.0, 0.0, 1.0, 4.0])), [0.0, 0.25, 0.5, 0.75, 1.0])


def test_colour_table_is_the_colormaps_table_without_matplotlib():
    """The numpy colour table (what ``colorize`` and the generation heat map colour with) is byte for byte the
    257-entry table of ``relevance_cmap``, the matplotlib colormap the figures' colour bars use."""
    from lrp_core.viz import colours

    table = (viz.relevance_cmap(np.linspace(0.0, 1.0, 257))[:, :3] * 255).round().astype(np.uint8)
    np.testing.assert_array_equal(colours._LUT, table)
    assert colours._LUT[128].tolist() == [255, 255, 255] and colours._LUT[64].tolist() == [128, 128, 255]


def test_colour_scale_is_the_numpy_percentile_and_reports_clipping():
    vals = np.random.default_rng(0).standard_normal((14, 14))
    vals[3, 5] = 50.0  # one extreme patch
    s = viz.colour_scale(vals)
    assert s.limit == pytest.approx(np.percentile(np.abs(vals), viz.DEFAULT_CLIP))
    assert s.maximum == 50.0 and s.clipped and s.percentile == viz.DEFAULT_CLIP
    assert s.describe() == f"clipped at p99 = {s.limit:.3g} (max 50)"
    assert viz.colour_scale(vals, clip=99.9).limit == pytest.approx(np.percentile(np.abs(vals), 99.9))
    exact = viz.colour_scale(vals, clip=None)
    assert exact.limit == 50.0 and not exact.clipped and exact.describe() == "max |R| = 50"
    assert viz.symmetric_limit(vals) == 50.0  # the plain helper keeps the exact maximum
    # mostly-zero maps fall back to the maximum (a zero limit would draw everything saturated)
    sparse = np.zeros(1000)
    sparse[0] = -3.0
    assert viz.colour_scale(sparse).limit == 3.0
    assert viz.colour_scale(np.zeros(5)).limit == 1.0
    # short inputs: a percentile within 5 % of the maximum is not called clipping
    three = np.array([0.0, -1.0, 2.0])
    assert np.percentile(np.abs(three), 99) < 2.0 and viz.colour_scale(three).limit == 2.0
    with pytest.raises(ValueError, match="percentile"):
        viz.colour_scale(vals, clip=0)


def test_colorize_zero_is_white_and_signs_are_red_and_blue():
    rgb = viz.colorize(np.array([-1.0, 0.0, 1.0, 0.5]))
    assert tuple(rgb[1]) == (255, 255, 255)
    assert rgb[2, 0] > 200 and rgb[2, 2] < 50  # positive: red
    assert rgb[0, 2] > 200 and rgb[0, 0] < 50  # negative: blue
    # equal magnitudes, equal saturation: the colours are mirror images
    assert tuple(rgb[0]) == tuple(rgb[2][::-1])
    # gamma 0.5: a tenth of the limit gets about a third of the full colour (linear: a tenth)
    weak = viz.colorize(np.array([0.1]), limit=1.0)[0]
    lin = viz.colorize(np.array([0.1]), limit=1.0, gamma=1.0)[0]
    assert 255 - weak[1] == pytest.approx(255 * 0.1**0.5, abs=2)
    assert 255 - lin[1] == pytest.approx(25.5, abs=2)
    # values beyond the limit take the end colour
    assert tuple(viz.colorize(np.array([7.0]), limit=1.0)[0]) == tuple(viz.colorize(np.array([1.0]), limit=1.0)[0])


def test_colorize_positive_view_is_the_clamped_map():
    vals = np.array([-2.0, -1.0, 0.5, 1.0])
    np.testing.assert_array_equal(viz.colorize(vals, signed=False), viz.colorize(np.clip(vals, 0, None), limit=1.0))


def test_one_huge_patch_does_not_blank_the_others():
    """The issue's blank maps: one extreme patch used to set the limit, everything else drew white."""
    rel = np.random.default_rng(1).uniform(0.2, 1.0, (14, 14))
    rel[7, 7] = 1000.0
    others = np.ones((14, 14), bool)
    others[7, 7] = False
    robust = viz.colorize(rel)[others]
    exact = viz.colorize(rel, clip=None, gamma=1.0)[others]  # the old behaviour
    # red: R stays 255, G and B fall with relevance; "non-white" = G at most 235
    assert (robust[:, 0] == 255).all() and (robust[:, 1] <= 235).all()
    assert (exact[:, 1] >= 254).all()  # the old picture: every other patch near-white
    # in the overlay the same: every other patch is tinted visibly red
    img = np.full((14, 14, 3), 200, np.uint8)
    out = viz.overlay(img, rel, alpha=0.7).astype(int)[others]
    assert ((out[:, 0] - out[:, 1]) >= 20).all()


def test_overlay_zero_relevance_shows_the_grey_photo():
    img = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    grey = viz.grey_photo(img)
    assert (grey[..., 0] == grey[..., 1]).all() and (grey[..., 1] == grey[..., 2]).all()
    assert grey.min() >= round(255 * viz.PHOTO_FLOOR) - 1  # black lifted: colours keep their hue
    np.testing.assert_array_equal(viz.overlay(img, np.zeros((4, 4))), grey)
    np.testing.assert_array_equal(viz.overlay(img, np.zeros((4, 4)), alpha=0.5), grey)
    # opacity 0: the photo as it is (the widgets' slider turned down)
    np.testing.assert_array_equal(viz.overlay(img, np.random.randn(4, 4), alpha=0.0), img)
    np.testing.assert_array_equal(viz.overlay(img, np.random.randn(4, 4), alpha=0.0, grey=False), img)
    rel = np.zeros((4, 4))
    rel[0, 0] = 1.0
    out = viz.overlay(np.full((16, 16, 3), 255, np.uint8), rel, alpha=1.0)
    assert tuple(out[0, 0]) == (255, 0, 0)  # the strongest patch is drawn in full red
    assert tuple(out[15, 15]) == (255, 255, 255)  # zero relevance: white stays white
    alone = viz.overlay(None, np.array([[-1.0, 0.0, 1.0]]))
    assert [tuple(p) for p in alone[0]] == [(0, 0, 255), (255, 255, 255), (255, 0, 0)]


def test_blue_relevance_stays_visible_on_a_blue_scene():
    """Negative relevance on a teal/blue background: tinted blue on the grey photo, distinct from zero."""
    scene = np.zeros((32, 32, 3), np.uint8)
    scene[...] = (40, 120, 200)  # a blue-teal background like the procedural scenes
    rel = np.zeros((4, 4))
    rel[0, 0], rel[3, 3] = -1.0, 1.0
    out = viz.overlay(scene, rel, alpha=0.7, clip=None).astype(int)
    neg, zero, pos = out[2, 2], out[16, 16], out[29, 29]
    assert neg[2] - neg[0] >= 60 and neg[2] - neg[1] >= 60  # clearly blue
    assert pos[0] - pos[2] >= 60  # clearly red
    assert zero[0] == zero[1] == zero[2]  # zero relevance: neutral grey
    # with the photo's own colours the blue patch is hardly different from the background
    plain = viz.overlay(scene, rel, alpha=0.7, clip=None, grey=False).astype(int)
    assert np.abs(plain[2, 2] - plain[16, 16]).sum() < np.abs(neg - zero).sum()


def test_overlay_rejects_bad_alpha_and_bad_maps():
    with pytest.raises(ValueError, match="alpha"):
        viz.overlay(np.zeros((8, 8, 3)), np.zeros((2, 2)), alpha=2)
    with pytest.raises(ValueError, match="2-D"):
        viz.overlay(np.zeros((8, 8, 3)), np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="gamma"):
        viz.overlay(np.zeros((8, 8, 3)), np.zeros((2, 2)), gamma=0)


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


def _colourbar(ax: plt.Axes):
    """The colourbar drawn next to ``ax`` (its mappable carries the norm)."""
    bars = [a for a in ax.figure.axes if a is not ax and hasattr(a, "_colorbar")]
    assert len(bars) == 1
    return bars[0]._colorbar


def test_show_relevance_draws_the_overlay_with_a_zero_centred_colourbar():
    fig, ax = plt.subplots()
    img, rel = np.random.rand(32, 32, 3), np.random.default_rng(3).uniform(-1, 1, (8, 8))
    rel[2, 2] = 9.0
    viz.show_relevance(img, rel, ax=ax, title="t")
    drawn = ax.images[-1].get_array()
    np.testing.assert_array_equal(drawn, viz.overlay(img, rel, size=(32, 32)))  # same pixels as widgets
    cb = _colourbar(ax)
    m = viz.colour_scale(rel).limit
    assert cb.norm.vmin == -cb.norm.vmax == pytest.approx(-m)
    assert cb.norm(0.0) == pytest.approx(0.5) and ax.get_title() == "t"
    notes = [t.get_text() for t in ax.texts]
    assert cb.extend == "both" and notes == ["clipped at p99 (max 9)"]  # max 9 > p99
    png = viz.render_png(fig, close=True)
    assert png[:4] == b"\x89PNG"


def test_show_relevance_exact_maximum_on_request():
    fig, ax = plt.subplots()
    viz.show_relevance(None, np.array([[-0.2, 1.0], [0.3, 0.0]]), ax=ax, clip=None)
    cb = _colourbar(ax)
    assert cb.norm.vmax == 1.0 and cb.extend == "neither" and not ax.texts
    plt.close(fig)


def test_show_relevance_positive_view_clamps():
    fig, ax = plt.subplots()
    viz.show_relevance(None, np.array([[-2.0, 1.0]]), ax=ax, signed=False, colorbar=False)
    drawn = ax.images[-1].get_array()
    assert tuple(drawn[0, 0]) == (255, 255, 255) and tuple(drawn[0, 1]) == (255, 0, 0)
    plt.close(fig)


def test_show_methods_draws_one_panel_per_method():
    maps = {"a": np.random.randn(4, 4), "b": np.random.randn(4, 4), "c": np.random.randn(8, 8)}
    fig = viz.show_methods(np.random.rand(16, 16, 3), maps, ncols=2)
    titled = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titled == ["a", "b", "c"]
    plt.close(fig)
    with pytest.raises(ValueError):
        viz.show_methods(None, {})


def test_overlay_image_wraps_long_titles_and_reports_clipping():
    rel = np.random.default_rng(2).random((8, 8))
    rel[0, 0] = 100.0
    short = viz.overlay_image(np.random.rand(16, 16, 3), rel, display_size=320, title="a")
    title = "cross | transformer_attribution | blocks 0..5, head 3 (a title longer than the picture)"
    long = viz.overlay_image(np.random.rand(16, 16, 3), rel, display_size=320, title=title)
    assert short.width == long.width == 320 and long.height > short.height  # more lines, not a cut
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    lines = viz._wrap(probe, title, viz._font(viz.TITLE_PX), 314)
    assert len(lines) >= 2 and " ".join(lines) == title
    assert all(probe.textlength(t, font=viz._font(viz.TITLE_PX)) <= 314 for t in lines)


def test_token_html_colours_escapes_and_explains():
    out = viz.token_html(["[CLS]", "<b>", "good"], [0.0, -1.0, 2.0])
    spans = re.findall(r'<span class="trl-token" style="background-color:rgb\((\d+),(\d+),(\d+)\)', out)
    assert len(spans) == 3
    assert spans[0] == ("255", "255", "255")  # zero is white
    assert int(spans[2][0]) > int(spans[2][2])  # positive is red
    assert int(spans[1][2]) > int(spans[1][0])  # negative is blue
    assert "&lt;b&gt;" in out and "<b>" not in out.split("trl-legend")[0]
    assert "colour scale -2" in out and "max |R| = 2" in out
    assert "(red, for the class)" in out  # a classifier's map speaks for the class; a language model's for the token
    lm = viz.token_html(["Paris"], [1.0], explained="the token")
    assert "(red, for the token)" in lm and "the class" not in lm


def test_token_html_says_when_scores_are_clipped():
    scores = np.r_[np.linspace(0.1, 1.0, 199), 40.0]
    out = viz.token_html([f"t{k}" for k in range(200)], scores)
    s = viz.colour_scale(scores)
    assert f"clipped at p99 = {s.limit:.3g} (max 40)" in out
    assert out.count("rgb(255,0,0)") >= 2  # the extreme token and the ones at the limit: full red


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
