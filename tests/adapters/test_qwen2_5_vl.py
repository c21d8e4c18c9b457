"""Qwen2.5-VL and Qwen2-VL (``Qwen2_5_VLForConditionalGeneration``, ``Qwen2VLForConditionalGeneration``,
docs/METHODS.md §2g): the tower and the whole replay are the
model (2D rotary, window attention, the patch merger, M-RoPE), the language-model part of every method is the
decoder's at the same M-RoPE positions, CP-LRP conserves down to the pixels, a batch is its rows, and bad inputs are
refused. Tiny random models (tests/vlms.py), float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from vlms import (
    QWEN_END,
    QWEN_GRID,
    QWEN_IMAGE,
    QWEN_PATCH,
    QWEN_START,
    make_qwen_vl,
    qwen_inputs,
    qwen_prompt,
    qwen_tokens,
    relative_deviation,
)

import lrp_core
from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.methods.baselines import CAPTUM_METHODS

REFUSED = ("pa_lrp",)
RUN = tuple(m for m in lrp_core.METHODS if m not in REFUSED)


def _rows() -> list:
    return [qwen_prompt([5, 6], [7, 8, 9]), qwen_prompt([10], [11])]


_close = relative_deviation


def test_the_refused_methods_are_those_listed():
    assert set(REFUSED) == set(get_adapter(make_qwen_vl()).refused_methods)


# ------------------------------------------------------------------------------------------------ (a) the replay
@pytest.mark.parametrize("version,fullatt", [("2.5", (1,)), ("2.5", ()), ("2.5", (0, 1, 2)), ("2", ())])
@pytest.mark.parametrize("grid", [QWEN_GRID, (4, 4)])
def test_the_towers_image_features_are_the_models(version, fullatt, grid):
    """Window attention (uneven windows on the 6 × 8 grid: 3 × 4 merged tokens in windows of 2 × 2), full-attention
    blocks, the merger and the window order undone: the features equal ``get_image_features`` (one call over both
    images: the model's cu_seqlens keep each image to itself). Qwen2-VL: LayerNorm blocks, a GELU MLP, no windows."""
    model = make_qwen_vl(fullatt=fullatt, version=version)
    rows = [qwen_prompt([5], [6], grid), qwen_prompt([7, 8], [9], grid)]
    x = qwen_inputs(rows, grid=grid)
    adapter = get_adapter(model)
    with torch.no_grad():
        ours = adapter.embed(adapter.check_inputs(x)).features
        theirs = torch.cat(model.model.get_image_features(x["pixel_values"], x["image_grid_thw"]).pooler_output)
    assert ours.shape == (2, qwen_tokens(grid), 32)
    assert (ours.reshape(-1, 32) - theirs).abs().max() <= 1e-12


@pytest.mark.parametrize("version", ["2.5", "2"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_the_replay_gives_the_models_logits(side, version):
    """The model's own forward, whose M-RoPE positions (get_rope_index) follow the attention mask."""
    model = make_qwen_vl(version=version)
    x = qwen_inputs(_rows(), side=side)
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(x)
    with torch.no_grad():
        ref = model(**x).logits
        got = adapter.forward(prepared).logits
    assert (got - ref[torch.arange(2), prepared.read]).abs().max() <= 1e-10


@pytest.mark.parametrize("version", ["2.5", "2"])
def test_the_eager_replay_gives_the_eager_models_logits(version):
    """Eager attention: the tower's float32 softmax per window (over the masked row it is 8e-10 off in float64)."""
    model = make_qwen_vl(attn="eager", version=version)
    x = qwen_inputs([_rows()[0]])
    adapter = get_adapter(model)
    with torch.no_grad():
        ref = model(**x).logits[:, -1]
        got = adapter.forward(adapter.check_inputs(x)).logits
        features = adapter.embed(adapter.check_inputs(x)).features[0]
        theirs = model.model.get_image_features(x["pixel_values"], x["image_grid_thw"]).pooler_output[0]
    assert (got - ref).abs().max() <= 1e-10
    assert (features - theirs).abs().max() <= 1e-12


# ------------------------------------------------------------ (b) the language-model part is the decoder's (M-RoPE)
class _RopeAt(nn.Module):
    """The VLM's M-RoPE module read at the model's own ``get_rope_index`` positions: token id ``b·T + t`` (given as
    its position id) is row b's token t."""

    rope_type = "default"

    def __init__(self, rope: nn.Module, positions: torch.Tensor):
        super().__init__()
        self.rope, self.positions = rope, positions  # (3, B, T)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        T = self.positions.shape[-1]
        return self.rope(x, self.positions[:, position_ids // T, position_ids % T])


def _language_model_alone(model, x: dict, x0: torch.Tensor):
    """A Qwen2ForCausalLM with the VLM's language model and head, whose token ``b·T + t`` embeds to ``x0[b, t]`` and
    whose rotary module gives that token its M-RoPE tables: explaining it on those ids (and those position ids)
    gives the decoder's explanation of the same input embeddings at the same positions."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tcfg = model.config.text_config
    cfg = Qwen2Config(
        **{
            k: getattr(tcfg, k)
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "max_position_embeddings",
                "rms_norm_eps",
            )
        },
        tie_word_embeddings=False,
        attn_implementation=tcfg._attn_implementation,
    )
    lm = Qwen2ForCausalLM(cfg).to(torch.float64).eval()
    lm.model.load_state_dict(model.model.language_model.state_dict(), strict=False)
    lm.lm_head.load_state_dict(model.lm_head.state_dict())
    positions, _ = model.model.get_rope_index(
        x["input_ids"],
        mm_token_type_ids=x["mm_token_type_ids"],
        image_grid_thw=x["image_grid_thw"],
        attention_mask=x["attention_mask"],
    )
    lm.model.rotary_emb = _RopeAt(model.model.language_model.rotary_emb, positions)
    B, T, D = x0.shape
    with torch.no_grad():
        lm.model.embed_tokens.weight[: B * T] = x0.reshape(B * T, D)
    ids = torch.arange(B * T).reshape(B, T)
    return lm, {"input_ids": ids, "attention_mask": x["attention_mask"], "position_ids": ids}


@pytest.mark.parametrize("side,version", [("left", "2.5"), ("right", "2.5"), ("left", "2")])
def test_every_methods_language_model_part_is_the_decoders(side, version):
    """Each method's scores (every position, the image tokens' embeddings included), per-block token relevance and
    layers equal the Qwen2 decoder's explanation of the language model alone on the same ``x0`` at the same M-RoPE
    positions."""
    model = make_qwen_vl(version=version)
    x = qwen_inputs(_rows(), side=side)
    adapter = get_adapter(model)
    with torch.no_grad():
        x0 = adapter.embed(adapter.check_inputs(x)).x0
    lm, text = _language_model_alone(model, x, x0)
    with torch.no_grad():  # the decoder alone is the VLM: the same logits everywhere
        assert (lm(**text).logits - model(**x).logits).abs().max() <= 1e-10
    for method in (m for m in RUN if m not in CAPTUM_METHODS):  # the baselines' image tokens hold the pixels'
        ours, theirs = explain(model, x, method=method), explain(lm, text, method=method)
        assert torch.equal(ours.target, theirs.target), method
        _close(ours.scores, theirs.scores)
        for name in ("token_relevance", "layers"):
            a, b = getattr(ours, name), getattr(theirs, name)
            assert (a is None) == (b is None), (method, name)
            if a is not None:
                _close(a, b)


def _raster_pixels(pixel_values: torch.Tensor, model, grid: tuple) -> torch.Tensor:
    """(n · h · w, F) per-patch values -> (n, h · p, w · p): summed over channels and frames, each patch put at
    its (row, column) as the model's own ``get_vision_position_ids`` names it."""
    from transformers.vision_utils import get_vision_position_ids

    h, w = grid
    p = QWEN_PATCH
    n = pixel_values.shape[0] // (h * w)
    pos = get_vision_position_ids(torch.tensor([[1, h, w]]), model.config.vision_config.spatial_merge_size)
    per_patch = pixel_values.reshape(n, h * w, 3, 2, p, p).sum(dim=(2, 3))
    out = torch.zeros(n, h * p, w * p, dtype=pixel_values.dtype)
    for i, (r, c) in enumerate(pos.tolist()):
        out[:, r * p : (r + 1) * p, c * p : (c + 1) * p] = per_patch[:, i]
    return out


@pytest.mark.parametrize("version", ["2.5", "2"])
def test_the_replays_gradient_is_the_models_down_to_the_pixels(version):
    """With the plain gradient as every rule, the modified-gradient pass is gradient × input of the model itself:
    its scores equal autograd through Hugging Face's forward at the language model's input embeddings, and its
    pixels gradient × pixel_values laid on the image — the tower, the merger and the scatter are on the graph. The
    model's own backward runs its tower's rotation in float32 (q.float()), so its pixel gradient carries float32
    round-off the replay's (the exact rotation's gradient) does not: measured 6e-10 of the map's max."""
    from lrp_core.rules.composites import ATTNLRP
    from lrp_core.rules.gradient import Gradient
    from lrp_core.rules.ops import OP_KINDS

    gradient = ATTNLRP.with_rules("gradient", by_kind={kind: Gradient() for kind in OP_KINDS})
    model = make_qwen_vl(version=version)
    x = qwen_inputs(_rows(), side="left")
    ours = explain(model, x, method="attnlrp", composite=gradient)
    caught = {}
    hook = model.model.language_model.register_forward_pre_hook(
        lambda m, args, kw: caught.update(embeds=kw["inputs_embeds"]), with_kwargs=True
    )
    pixels = x["pixel_values"].clone().requires_grad_(True)
    try:
        logits = model(**dict(x, pixel_values=pixels)).logits
    finally:
        hook.remove()
    y = logits[:, -1].gather(1, ours.target[:, None]).sum()
    g_embeds, g_pixels = torch.autograd.grad(y, [caught["embeds"], pixels])
    _close(ours.scores, (caught["embeds"] * g_embeds).sum(-1).detach())
    _close(ours.pixels, _raster_pixels((pixels * g_pixels).detach(), model, QWEN_GRID), tol=1e-8)


# ------------------------------------------------------------------------------------------- (c) conservation
@pytest.mark.parametrize("version", ["2.5", "2"])
def test_cp_lrp_conserves_from_the_logit_to_the_pixels_and_the_text(version):
    """Bias-free model (no Linear biases): y_t = Σ over the text tokens + Σ over the pixels, and the image tokens'
    scores sum to the pixels' total — up to the float32 round-off of the RMSNorms (computed in float32 by the model)
    and the identity rule's stabiliser at the merger's GELU. With the biases kept, their share is missing."""
    x = qwen_inputs(_rows(), side="left")
    image = x["input_ids"] == QWEN_IMAGE
    for bias_free in (True, False):
        e = explain(make_qwen_vl(bias_free=bias_free, version=version), x, method="cp_lrp")
        text = (e.scores * ~image).sum(-1)
        y = e.conservation.output.abs()
        leak = ((text + e.pixels.sum(dim=(1, 2)) - e.conservation.output).abs() / y).max()
        tower_leak = ((e.scores[image].reshape(2, -1).sum(-1) - e.pixels.sum(dim=(1, 2))).abs() / y).max()
        if bias_free:
            assert leak <= 1e-6 and tower_leak <= 1e-6, (leak, tower_leak)
            assert e.pixels.abs().sum() > 0 and text.abs().sum() > 0
        else:
            assert tower_leak > 1e-3, tower_leak


# -------------------------------------------------------------------------------------------- (d) batch = single
@pytest.mark.parametrize("side,version", [("left", "2.5"), ("right", "2.5"), ("right", "2")])
def test_a_padded_batch_gives_each_row_its_explanation_alone(side, version):
    model = make_qwen_vl(version=version)
    rows = _rows()
    x = qwen_inputs(rows, side=side)
    T = x["input_ids"].shape[1]
    N = QWEN_GRID[0] * QWEN_GRID[1]
    for method in (m for m in RUN if m not in CAPTUM_METHODS):  # those: test_vlm_captum_features.py, fewer samples
        both = explain(model, x, method=method)
        for i, row in enumerate(rows):
            ids = torch.tensor([row])
            alone = explain(
                model,
                {
                    "input_ids": ids,
                    "attention_mask": torch.ones(1, len(row), dtype=torch.long),
                    "pixel_values": x["pixel_values"][i * N : (i + 1) * N],
                    "image_grid_thw": x["image_grid_thw"][i : i + 1],
                    "mm_token_type_ids": (ids == QWEN_IMAGE).long(),
                },
                method=method,
            )
            cols = slice(T - len(row), T) if side == "left" else slice(0, len(row))
            _close(both.scores[i : i + 1, cols], alone.scores)
            _close(both.upsample()[i : i + 1], alone.upsample())
            if alone.pixels is not None:
                _close(both.pixels[i : i + 1], alone.pixels)


# ------------------------------------------------------------------------------------------ the image's map
def test_each_patch_gets_a_quarter_of_its_merged_tokens_score():
    """patch_map: patch (r, c) carries the merged token (r // 2, c // 2) (raster order over the 3 × 4 merged grid,
    after the window order is undone), a quarter of its score each; the map covers the 24 × 32-pixel image."""
    model = make_qwen_vl()
    rows = _rows()
    x = qwen_inputs(rows, side="left")
    e = explain(model, x, method="attnlrp")
    T = x["input_ids"].shape[1]
    h, w = QWEN_GRID
    for i, row in enumerate(rows):
        start = T - len(row) + row.index(QWEN_IMAGE)
        tokens = e.scores[i, start : start + qwen_tokens()].reshape(h // 2, w // 2)
        want = tokens.repeat_interleave(2, 0).repeat_interleave(2, 1) / 4
        assert torch.allclose(e.patch_map()[i], want, rtol=1e-15, atol=0)
    assert e.upsample().shape == (2, h * QWEN_PATCH, w * QWEN_PATCH)
    assert e.pixels.shape == (2, h * QWEN_PATCH, w * QWEN_PATCH)


def test_the_widgets_show_the_image_tokens_on_the_patch_grid():
    """The widgets' patch view of a row is its patch map (each merged token's score split over its 4 patches)."""
    from widgets.views import _row

    e = explain(make_qwen_vl(), qwen_inputs(_rows(), side="left"), method="rollout")
    for i in range(2):
        assert torch.equal(torch.from_numpy(_row(e[i], e.scores[i])), e.patch_map()[i])


# ------------------------------------------------------------------------------- (e) the model is left as it was
def _state(model):
    return {
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "buffers": {k: v.clone() for k, v in model.named_buffers()},
        "rope_deltas": model.model.rope_deltas,
        "hooks": [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks)) for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [p.grad for p in model.parameters()],
    }


def test_every_call_leaves_the_model_bit_identical_and_without_hooks():
    model = make_qwen_vl()
    x = qwen_inputs(_rows(), side="left")
    before = _state(model)
    for method in lrp_core.METHODS:
        try:
            explain(model, x, method=method)
        except (InputError, UnsupportedModelError):
            assert method in REFUSED
        after = _state(model)
        for part in ("params", "buffers"):
            for k in before[part]:
                assert torch.equal(before[part][k], after[part][k]), (method, k)
        assert after["rope_deltas"] is before["rope_deltas"], method  # get_rope_index, not the caching forward
        for key in ("hooks", "requires_grad"):
            assert before[key] == after[key], (method, key)
        assert all(a is b for a, b in zip(before["grads"], after["grads"])), method


# ---------------------------------------------------------------------------------------------- (f) bad inputs
def _bad_cases():
    x = qwen_inputs(_rows(), side="left")
    ids = x["input_ids"]
    one_less = ids.clone()
    one_less[0, (ids[0] == QWEN_IMAGE).nonzero()[0, 0]] = 7
    padded_image = dict(x, attention_mask=x["attention_mask"].clone())
    padded_image["attention_mask"][1, (ids[1] == QWEN_IMAGE).nonzero()[0, 0]] = 0
    split = ids.clone()  # the image tokens of row 0 cut in two runs
    at = (ids[0] == QWEN_IMAGE).nonzero()[:, 0]
    split[0, at[2]] = 7
    split[0, (ids[0] == 9).nonzero()[0, 0]] = QWEN_IMAGE
    return {
        "no image_grid_thw": ({k: v for k, v in x.items() if k != "image_grid_thw"}, "image_grid_thw"),
        "no pixel_values": ({k: v for k, v in x.items() if k != "pixel_values"}, "pixel_values"),
        "no mm_token_type_ids": ({k: v for k, v in x.items() if k != "mm_token_type_ids"}, "mm_token_type_ids"),
        "mm_token_type_ids not the image tokens": (
            dict(x, mm_token_type_ids=torch.zeros_like(ids)),
            "mm_token_type_ids",
        ),
        "fewer image tokens than features": (
            dict(x, input_ids=one_less, mm_token_type_ids=(one_less == QWEN_IMAGE).long()),
            "image tokens",
        ),
        "the image tokens in two runs": (
            dict(x, input_ids=split, mm_token_type_ids=(split == QWEN_IMAGE).long()),
            "run",
        ),
        "a grid the patches do not fill": (dict(x, image_grid_thw=torch.tensor([[1, 4, 4]] * 2)), "pixel_values"),
        "grids that differ": (dict(x, image_grid_thw=torch.tensor([[1, 6, 8], [1, 8, 6]])), "same grid"),
        "a video grid": (dict(x, image_grid_thw=torch.tensor([[2, 6, 4]] * 2)), "t = 1"),
        "an odd grid": (dict(x, image_grid_thw=torch.tensor([[1, 3, 16]] * 2)), "multiples"),
        "three images for two rows": (
            dict(x, pixel_values=x["pixel_values"][:48], image_grid_thw=torch.tensor([[1, 4, 4]] * 3)),
            "same number",
        ),
        "an image token is padding": (padded_image, "padding"),
        "position_ids": (dict(x, position_ids=torch.zeros_like(ids)), "M-RoPE"),
        "inputs_embeds": (dict(x, inputs_embeds=torch.zeros(2, ids.shape[1], 32)), "inputs_embeds"),
        "pixel_values as images": (
            dict(x, pixel_values=torch.zeros(2, 3, 24, 32, dtype=torch.float64)),
            "flattened patches",
        ),
        "a tensor, not the processor's dict": (x["pixel_values"], "processor"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_inputs_are_refused_with_the_reason(case):
    model = make_qwen_vl()
    given, words = _bad_cases()[case]
    with pytest.raises(InputError, match=words):
        explain(model, given, method="attnlrp")


def test_two_images_per_row_are_replayed_and_scored():
    """Two images per row (each with its vision start / end tokens): the replay gives the model's logits, the image
    tokens are scored, and no pixel map is given."""
    model = make_qwen_vl()
    P = qwen_tokens()
    image = [QWEN_START] + [QWEN_IMAGE] * P + [QWEN_END]
    rows = [[1, 5, *image, 6, *image, 7], [1, *image, 8, *image, 9, 10]]
    x = qwen_inputs(rows, side="left")
    N = QWEN_GRID[0] * QWEN_GRID[1]
    g = torch.Generator().manual_seed(5)
    x["pixel_values"] = torch.randn(4 * N, x["pixel_values"].shape[1], generator=g, dtype=torch.float64)
    x["image_grid_thw"] = torch.tensor([[1, *QWEN_GRID]] * 4)
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(x)
    with torch.no_grad():
        ref = model(**x).logits
        got = adapter.forward(prepared).logits
    assert (got - ref[torch.arange(2), prepared.read]).abs().max() <= 1e-10
    e = explain(model, x, method="attnlrp")
    assert e.pixels is None and e.image_tokens.shape == (2, 2 * N)
    assert bool((x["input_ids"].gather(1, e.image_tokens) == QWEN_IMAGE).all())


def test_a_sliding_window_language_model_is_refused():
    model = make_qwen_vl()
    model.config.text_config.use_sliding_window = True
    with pytest.raises(UnsupportedModelError, match="sliding"):
        get_adapter(model)


def test_source_removal_is_refused_and_replacement_runs():
    """Removing a source's tokens would shift the packed (t, h, w) positions: leave-one-out without ``filler=`` is
    an InputError that names it; with a filler token (positions unchanged) it runs and gives finite scores."""
    model = make_qwen_vl()
    x = qwen_inputs(_rows())
    spans = [(1, 2)]
    with pytest.raises(InputError, match="filler="):
        explain(model, x, method="leave_one_out", sources=spans)
    e = explain(model, x, method="leave_one_out", sources=spans, filler=5)
    assert e.sources.shape == (2, 1) and torch.isfinite(e.sources).all()
