"""Every widget view reads through the model's readout, as ``lrp_core.explain`` does (issue #20, item 1).

For each readout kind — [CLS] token (timm, HF ViT, CLIP image), average pooling (timm ``global_pool='avg'``,
with and without a class token), two heads (timm distilled DeiT, HF DeiT with teacher), [CLS] ‖ mean
(HF DINOv2), BERT's [CLS] and CLIP's end-of-text token (padded and not) — and for every method with
per-block matrices, the views are compared with the engine's result and with the readout row ``wᵀM`` of
the engine's tensors computed here by plain torch. The weights ``w`` are written out below from the
table of docs/METHODS.md §4.2, not read from the adapter. The models are tiny, random and float64, so
"equal" means equal to float64 round-off.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pytest
import torch
from by_path import root_fixtures
from tiny_clip import make_clip

import lrp_core
import widgets
from lrp_core.methods import registry
from widgets import _engine, views

ROOT = root_fixtures()  # tests/conftest.py by path (the name ``conftest`` is this folder's own here)
GRID, P = (4, 4), 16
#: every map here is within this share of its largest entry of the reference (float64 throughout)
TOL = 1e-10

HF_CFG = dict(
    image_size=32,
    patch_size=8,
    hidden_size=48,
    num_hidden_layers=3,
    num_attention_heads=3,
    intermediate_size=96,
    num_labels=5,
    layer_norm_eps=1e-6,
)


def _hf(cls_name: str, config_name: str, **kw) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**{**HF_CFG, **kw})).eval()
    ROOT._perturb_norms(model, 0)
    return model


def _timm_distilled() -> torch.nn.Module:
    from timm.models.deit import VisionTransformerDistilled

    torch.manual_seed(0)
    model = VisionTransformerDistilled(
        img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=3, num_classes=5, qkv_bias=True
    ).eval()
    ROOT._perturb_norms(model, 0)
    return model


def _hf_deit_teacher() -> torch.nn.Module:
    model = _hf("DeiTForImageClassificationWithTeacher", "DeiTConfig")
    with torch.no_grad():  # HF initialises both tokens to zero: make the two readout rows differ
        model.deit.embeddings.distillation_token.normal_(generator=torch.Generator().manual_seed(5))
    return model


def _hf_dinov2() -> torch.nn.Module:
    model = _hf("Dinov2ForImageClassification", "Dinov2Config", mlp_ratio=2)
    with torch.no_grad():  # LayerScale away from its constant init
        for name, p in model.named_parameters():
            if name.endswith("lambda1"):
                p.copy_(0.5 + torch.rand(p.shape, generator=torch.Generator().manual_seed(7)))
    return model


def _onehot(N: int, *where: tuple) -> np.ndarray:
    """(N,) with ``value`` at each ``(positions, value)``."""
    w = np.zeros(N)
    for pos, v in where:
        w[pos] += v
    return w


# -------------------------------------------------------------------------- the cases
IMAGE = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)).double()
CLIP_IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3)).double()
CLIP_PROMPTS = torch.tensor([[1, 5, 6, 7, 98], [1, 8, 9, 98, 0], [1, 10, 98, 0, 0]])  # 98: end of text


def _clip_text(ids: list, length: int) -> dict:
    row = torch.tensor([ids + [0] * (length - len(ids))])
    return {"pixel_values": CLIP_IMAGES, "input_ids": row, "attention_mask": (row != 0).long(), "explain": "text"}


def _bert_text(ids: list, length: int) -> dict:
    row = torch.tensor([ids + [0] * (length - len(ids))])
    return {"input_ids": row, "attention_mask": (row != 0).long()}


#: case -> (model builder, inputs, prefix tokens (images) or real tokens n (text),
#:          the readout weights w(N) of docs/METHODS.md §4.2, the readout token scored in text (or None))
CASES: dict[str, tuple] = {
    "timm [CLS]": (lambda: ROOT.make_tiny_vit(), IMAGE, 1, lambda N: _onehot(N, (0, 1.0)), None),
    "timm avg + fc_norm": (
        lambda: ROOT.make_tiny_vit(global_pool="avg"),
        IMAGE,
        1,
        lambda N: _onehot(N, (slice(1, None), 1 / P)),
        None,
    ),
    "timm no class token": (
        lambda: ROOT.make_tiny_vit(global_pool="avg", class_token=False),
        IMAGE,
        0,
        lambda N: _onehot(N, (slice(None), 1 / P)),
        None,
    ),
    "timm distilled": (_timm_distilled, IMAGE, 2, lambda N: _onehot(N, (0, 0.5), (1, 0.5)), None),
    "HF ViT": (lambda: _hf("ViTForImageClassification", "ViTConfig"), IMAGE, 1, lambda N: _onehot(N, (0, 1.0)), None),
    "HF DeiT teacher": (_hf_deit_teacher, IMAGE, 2, lambda N: _onehot(N, (0, 0.5), (1, 0.5)), None),
    "HF DINOv2": (_hf_dinov2, IMAGE, 1, lambda N: _onehot(N, (0, 0.5), (slice(1, None), 0.5 / P)), None),
    "CLIP image": (
        make_clip,
        {"pixel_values": IMAGE, "input_ids": CLIP_PROMPTS, "attention_mask": (CLIP_PROMPTS != 0).long()},
        1,
        lambda N: _onehot(N, (0, 1.0)),
        None,
    ),
    "BERT": (
        lambda: ROOT.make_tiny_bert(),
        _bert_text([2, 11, 12, 13, 14, 3], 6),
        6,
        lambda N: _onehot(N, (0, 1.0)),
        0,
    ),
    "BERT padded": (lambda: ROOT.make_tiny_bert(), _bert_text([2, 21, 22, 3], 7), 4, lambda N: _onehot(N, (0, 1.0)), 0),
    "CLIP text (end of text)": (make_clip, _clip_text([1, 5, 6, 7, 98], 5), 5, lambda N: _onehot(N, (4, 1.0)), 4),
    "CLIP text padded": (make_clip, _clip_text([1, 8, 9, 98], 6), 4, lambda N: _onehot(N, (3, 1.0)), 3),
}

#: methods whose ``scores`` is the readout row of the whole product Π(I + Ā_b) from the start layer
PRODUCT_METHODS = ("transformer_attribution", "rollout", "generic_attention")
#: every method that returns per-block matrices (the views "accumulated" and "block")
LAYER_METHODS = tuple(n for n, s in registry.METHODS.items() if "layers" in s.returns)


def test_the_methods_with_layers_are_the_ones_this_file_knows():
    """A new method with per-block matrices must say here how its map relates to them."""
    assert set(LAYER_METHODS) == set(PRODUCT_METHODS) | {"raw_attention"}


_models: dict = {}
_explanations: dict = {}
_readouts: dict = {}


def model_of(case: str) -> torch.nn.Module:
    build = CASES[case][0]
    key = "CLIP" if build is make_clip else case  # one CLIP for its three cases
    if key not in _models:
        _models[key] = build().double()
    return _models[key]


def explanation(case: str, method: str, start: Optional[int] = None):
    """The engine's explanation of the case's sample, as the widget asks for it (per-head matrices kept)."""
    key = (case, method, start)
    if key not in _explanations:
        _explanations[key] = _engine.explain(model_of(case), CASES[case][1], method, target=0, start_layer=start)
    return _explanations[key]


def readout_of(case: str) -> _engine.SampleReadout:
    """What the widget reads the views through (``_engine.sample_readout``; checked against §4.2 below)."""
    if case not in _readouts:
        _readouts[case] = _engine.sample_readout(model_of(case), CASES[case][1])
    return _readouts[case]


# -------------------------------------------------------------------------- plain-torch references
def is_text(case: str) -> bool:
    return CASES[case][4] is not None


def weights(case: str, N: int) -> torch.Tensor:
    """The readout weights w (N,) of docs/METHODS.md §4.2; padded text: those of the real tokens."""
    n = CASES[case][2] if is_text(case) else N
    w = torch.zeros(N, dtype=torch.float64)
    w[:n] = torch.as_tensor(CASES[case][3](n))
    return w


def shown(case: str, row: torch.Tensor, minimum: bool = False) -> np.ndarray:
    """What a view shows of a token row (N,): the patches as the 4×4 grid, or the real tokens; ``minimum``:
    the readout token's entry replaced by the smallest real-token entry (docs/METHODS.md §5.6)."""
    _, _, k, _, readout_token = CASES[case]
    row = row.detach().double()
    if not is_text(case):
        return row[k:].reshape(GRID).numpy()
    out = row[:k].clone()
    if minimum:
        out[readout_token] = out.min()
    return out.numpy()


def factor(layer: torch.Tensor, norm: str) -> torch.Tensor:
    """I + Ā, divided by its row sums for ``norm == "row"`` (written out, not lrp_core.methods.products)."""
    f = layer.double() + torch.eye(layer.shape[-1], dtype=torch.float64)
    return f / f.sum(-1, keepdim=True) if norm == "row" else f


def product(layers: torch.Tensor, start: int, stop: int, norm: str) -> torch.Tensor:
    """(I+Ā_stop)…(I+Ā_start) of one sample's (L, N, N) matrices; the identity when stop < start."""
    c = torch.eye(layers.shape[-1], dtype=torch.float64)
    for b in range(start, stop + 1):
        c = factor(layers[b], norm) @ c
    return c


def rel(a: np.ndarray, want: np.ndarray) -> float:
    assert a.shape == want.shape, (a.shape, want.shape)
    return float(np.abs(a - want).max() / max(np.abs(want).max(), 1e-300))


def norm_of(method: str, exp) -> str:
    spec = registry.get(method)
    return exp.options["rollout_norm"] if spec.takes("rollout_norm") else spec.product_norm


# -------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("case", CASES)
def test_sample_readout_has_the_weights_of_the_readout_table(case):
    """``_engine.sample_readout`` (what every view reads through) gives the w of docs/METHODS.md §4.2."""
    ro = _engine.sample_readout(model_of(case), CASES[case][1])
    N = ro.layout.num_tokens
    np.testing.assert_allclose(ro.weights, weights(case, N).numpy(), rtol=0, atol=1e-15)
    assert ro.weights.sum() == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("method", PRODUCT_METHODS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("start", [0, 1])
def test_accumulated_view_at_the_last_block_is_explains_scores(case, method, start):
    exp = explanation(case, method, start)
    ro = readout_of(case)
    L = views.n_blocks(exp)
    got = views.view_map(exp, "accumulated", block=L - 1, start=start, readout=ro)
    want = shown(case, exp.scores[0]) if is_text(case) else exp.scores[0].double().reshape(GRID).numpy()
    assert rel(got, want) <= TOL, f"{case} {method} start {start}: {rel(got, want):.2e}"
    assert rel(views.view_map(exp, "output"), want) <= TOL


@pytest.mark.parametrize("case", CASES)
def test_raw_attentions_block_view_at_the_last_block_is_its_scores(case):
    exp = explanation(case, "raw_attention")
    ro = readout_of(case)
    got = views.view_map(exp, "block", block=views.n_blocks(exp) - 1, readout=ro)
    want = shown(case, exp.scores[0]) if is_text(case) else exp.scores[0].double().reshape(GRID).numpy()
    assert rel(got, want) <= TOL


@pytest.mark.parametrize("method", LAYER_METHODS)
@pytest.mark.parametrize("case", CASES)
def test_block_views_are_the_readout_rows_of_the_engines_matrices(case, method):
    """Block view: wᵀĀ_b (head mean) and wᵀĀ_b^h (each head), for every block."""
    exp = explanation(case, method)
    ro = readout_of(case)
    w = weights(case, exp.layers.shape[-1])
    H = views.n_heads(exp)
    assert H > 1
    for b in range(views.n_blocks(exp)):
        want = shown(case, w @ exp.layers[0, b].double())
        assert rel(views.view_map(exp, "block", block=b, readout=ro), want) <= TOL, (b, "mean")
        for h in range(H):
            want = shown(case, w @ exp.layers_per_head[0, b, h].double())
            assert rel(views.view_map(exp, "block", block=b, head=h, readout=ro), want) <= TOL, (b, h)


@pytest.mark.parametrize("method", LAYER_METHODS)
@pytest.mark.parametrize("case", CASES)
def test_accumulated_views_with_and_without_one_head_are_the_readout_rows_of_the_product(case, method):
    """Accumulated view from ``start`` to b: wᵀ(I+Ā_b)…(I+Ā_start); head h at block b: wᵀ(I+Ā_b^h)·P_{b-1}."""
    start = 1 if registry.get(method).takes("start_layer") else 0
    exp = explanation(case, method, start if start else None)
    ro = readout_of(case)
    prods = views.LayerProducts(exp, ro)
    w, norm = weights(case, exp.layers.shape[-1]), norm_of(method, exp)
    minimum = is_text(case) and method == "transformer_attribution"  # the engine's rule (docs/METHODS.md §5.6)
    layers = exp.layers[0]
    for b in range(views.n_blocks(exp)):
        want = shown(case, w @ product(layers, start, b, norm), minimum)
        assert rel(prods.view(b, start), want) <= TOL, (b, "mean")
        assert rel(views.view_map(exp, "accumulated", block=b, start=start, readout=ro), want) <= TOL
        if b < start:
            continue
        for h in range(views.n_heads(exp)):
            swapped = layers.clone()
            swapped[b] = exp.layers_per_head[0, b, h]
            want = shown(case, w @ product(swapped, start, b, norm), minimum)
            assert rel(prods.view(b, start, head=h), want) <= TOL, (b, h)


@pytest.mark.parametrize("method", ["transformer_attribution", "attnlrp", "lrp"])
@pytest.mark.parametrize("case", CASES)
def test_output_and_residual_views_are_the_engines_tensors(case, method):
    """Output: ``exp.scores`` (or ``exp.pixels``); residual: ``exp.token_relevance`` at block b, scored tokens."""
    exp = explanation(case, method)
    out = views.view_map(exp, "output")
    if exp.pixels is not None:
        assert rel(out, exp.pixels[0].double().numpy()) == 0.0
    elif is_text(case):
        assert rel(out, exp.scores[0, : CASES[case][2]].double().numpy()) == 0.0
    else:
        assert rel(out, exp.scores[0].double().reshape(GRID).numpy()) == 0.0
    for b in range(views.n_blocks(exp)):
        assert rel(views.view_map(exp, "residual", block=b), shown(case, exp.token_relevance[0, b])) == 0.0


def test_the_registry_says_which_method_replaces_the_readout_entry():
    """Only transformer attribution replaces the scored readout token's entry (BERT, CLIP text)."""
    assert [n for n, s in registry.METHODS.items() if s.readout_minimum] == ["transformer_attribution"]


def test_block_and_accumulated_views_refuse_to_guess_the_readout():
    exp = explanation("timm avg + fc_norm", "rollout")
    for view in ("block", "accumulated"):
        with pytest.raises(ValueError, match="readout"):
            views.view_map(exp, view, block=0)


# -------------------------------------------------------------------------- the widgets themselves
@pytest.mark.parametrize("case", ["timm avg + fc_norm", "timm distilled", "HF DINOv2"])
def test_the_explorer_shows_explains_map_for_other_readouts(case):
    """float32, as a person runs it: the accumulated view at the last block is ``explain(...).scores``."""
    model = CASES[case][0]()
    x = IMAGE.float()
    w = widgets.RelevanceExplorer(model, x, methods=list(PRODUCT_METHODS))
    assert w.last_error is None, w.last_error
    for method in PRODUCT_METHODS:
        w.method_selector.value = method
        w.view_selector.value = "accumulated"
        w.head_selector.value = "mean"
        w.layer_slider.value = w.layer_slider.max
        ref = lrp_core.explain(model, x, method=method, target=w.target)
        want = ref.scores[0].double().reshape(GRID).numpy()
        assert rel(w.displayed_map, want) <= 1e-5, (method, rel(w.displayed_map, want))


def test_the_text_widget_shows_explains_map_for_a_padded_sample_with_every_product_method(tokenizer):
    """BERT, the shorter of two texts (padded in the batch): rollout and generic attention keep the [CLS]
    entry, transformer attribution replaces it by the minimum — as the engine does."""
    model = ROOT.make_tiny_bert()
    w = widgets.TokenRelevance(
        model,
        texts=["the film was unbelievably good", "a bad story"],
        tokenizer=tokenizer,
        methods=list(PRODUCT_METHODS),
    )
    assert w.last_error is None, w.last_error
    w.sample_selector.value = 1
    for method in PRODUCT_METHODS:
        w.method_selector.value = method
        w.view_selector.value = "accumulated"
        w.layer_slider.value = w.layer_slider.max
        inputs = {k: v[1:2] for k, v in w.inputs.items()}
        ref = lrp_core.explain(model, inputs, method=method, target=w.target).scores[0]
        n = len(w.displayed_map)
        assert n == 5 and not ref[n:].any()
        assert rel(w.displayed_map, ref[:n].double().numpy()) <= 1e-5, method
