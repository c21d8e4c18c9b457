"""The Captum baselines (lrp_core/methods/baselines.py): each equals Captum called directly on the same forward
function.

Every check runs in float64 on tiny random models (timm ViT, Hugging Face ViT, CLIP's image side, BERT). The
references below build their own baselines and feature masks by hand — only the forward function is shared,
and it is checked against the models' own forward passes first.
"""

from __future__ import annotations

import pytest
import torch
from captum.attr import FeatureAblation, InputXGradient, IntegratedGradients, KernelShap, NoiseTunnel
from conftest import make_tiny_bert, make_tiny_vit
from tiny_clip import make_clip
from untouched import assert_untouched, snapshot

from lrp_core import Contrast, InputError, explain
from lrp_core.adapters import get_adapter
from lrp_core.methods import registry
from lrp_core.methods.baselines import CAPTUM_METHODS, forward_function, gaussian_blur
from lrp_core.methods.call import Call

#: small settings so that the suite stays fast; batch_size 8 makes Captum split its passes
FAST = {
    "integrated_gradients": {"n_steps": 20, "batch_size": 8},
    "smoothgrad": {"n_samples": 6, "batch_size": 4},
    "occlusion": {"batch_size": 8},
    "kernel_shap": {"n_samples": 40, "batch_size": 16},
    "input_x_gradient": {},
}


def _hf_vit():
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=96,
        num_labels=5,
    )
    return ViTForImageClassification(cfg).eval()


def _images(n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _text() -> dict:
    ids = torch.tensor([[2, 11, 12, 13, 14, 15, 3], [2, 21, 22, 3, 0, 0, 0]])
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def _clip_inputs() -> dict:
    ids = torch.tensor([[1, 5, 6, 7, 98], [1, 8, 9, 98, 0], [1, 10, 98, 0, 0]])
    return {"pixel_values": _images(), "input_ids": ids, "attention_mask": (ids != 0).long()}


MODELS = {
    "timm": lambda: (make_tiny_vit().double(), _images()),
    "hf_vit": lambda: (_hf_vit().double(), _images()),
    "clip_image": lambda: (make_clip().double(), _clip_inputs()),
    "bert": lambda: (make_tiny_bert().double(), _text()),
}


def _logits(model, inputs) -> torch.Tensor:
    """The model's own forward pass."""
    with torch.no_grad():
        if isinstance(inputs, torch.Tensor):
            out = model(inputs)
            return getattr(out, "logits", out)
        if "pixel_values" in inputs:
            return model(**inputs).logits_per_image
        return model(**inputs).logits


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


# ----------------------------------------------------------------------------
# the forward function is the model
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_the_forward_function_reproduces_the_models_logits(name):
    model, inputs = MODELS[name]()
    adapter = get_adapter(model)
    a = forward_function(adapter, adapter.check_inputs(inputs))
    with torch.no_grad():
        assert rel(a.forward(a.inputs, *a.args), _logits(model, inputs)) < 1e-12


# ----------------------------------------------------------------------------
# each method equals Captum called directly
# ----------------------------------------------------------------------------
def _hand_baseline(model, x: torch.Tensor, mask) -> torch.Tensor:
    """Images: zeros. Text: the padding token's word embedding at real tokens, the input at padding."""
    if mask is None:
        return torch.zeros_like(x)
    pad = model.bert.embeddings.word_embeddings(torch.zeros(mask.shape, dtype=torch.long)).detach()
    return torch.where(mask.bool()[..., None], pad, x)


def _hand_features(x: torch.Tensor, mask) -> torch.Tensor:
    """Images: one id per 8×8 patch of the 4×4 grid (1, 1, 32, 32). Text: one id per real token (1, T, 1)."""
    if mask is None:
        return torch.kron(torch.arange(16).reshape(4, 4), torch.ones(8, 8, dtype=torch.long))[None, None]
    assert bool(mask.all()), "the reference explains one unpadded sample"
    return torch.arange(x.shape[1])[None, :, None]


def _captum(method: str, model, a, target: torch.Tensor, opts: dict) -> torch.Tensor:
    """``method`` computed by Captum itself on the forward function ``a`` (a batch of one for the random ones)."""
    x, args, f = a.inputs.detach(), a.args, a.forward
    if method == "input_x_gradient":
        return InputXGradient(f).attribute(x.requires_grad_(), target=target, additional_forward_args=args)
    if method == "integrated_gradients":
        return IntegratedGradients(f).attribute(
            x,
            baselines=_hand_baseline(model, x, a.mask),
            target=target,
            additional_forward_args=args,
            n_steps=opts["n_steps"],
            internal_batch_size=opts["batch_size"],
        )
    if method == "occlusion":
        return FeatureAblation(f).attribute(
            x,
            baselines=_hand_baseline(model, x, a.mask),
            target=target,
            additional_forward_args=args,
            feature_mask=_hand_features(x, a.mask),
            perturbations_per_eval=opts["batch_size"] // x.shape[0],
        )
    torch.manual_seed(0)  # the default seed
    if method == "smoothgrad":
        stdevs = 0.6 if a.mask is None else 0.02  # the registry's defaults
        return NoiseTunnel(InputXGradient(f)).attribute(
            x.requires_grad_(),
            nt_type="smoothgrad",
            nt_samples=opts["n_samples"],
            nt_samples_batch_size=opts["batch_size"],
            stdevs=stdevs,
            target=target,
            additional_forward_args=args,
        )
    return KernelShap(f).attribute(
        x,
        baselines=_hand_baseline(model, x, a.mask),
        target=target,
        additional_forward_args=args,
        feature_mask=_hand_features(x, a.mask),
        n_samples=opts["n_samples"],
        perturbations_per_eval=opts["batch_size"],
    )


def _scores(attr: torch.Tensor, per_feature: bool) -> torch.Tensor:
    """Scores from attributions by hand: patch sums of the channel sums (images), channel sums (text);
    occlusion / KernelSHAP: the value of the patch / token (every element carries it)."""
    if attr.dim() == 3:
        return attr[..., 0] if per_feature else attr.sum(-1)
    px = attr[:, 0] if per_feature else attr.sum(1)
    p = px.reshape(px.shape[0], 4, 8, 4, 8)
    return (p[:, :, 0, :, 0] if per_feature else p.sum(dim=(2, 4))).reshape(px.shape[0], 16)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("method", CAPTUM_METHODS)
def test_each_method_equals_captum_called_directly(method, name):
    model, inputs = MODELS[name]()
    opts = FAST[method]
    e = explain(model, inputs, method=method, target=[1, 2], **opts)
    adapter = get_adapter(model)
    per_feature = method in ("occlusion", "kernel_shap")
    text = name == "bert"
    if method in ("smoothgrad", "kernel_shap") or text:  # one sample at a time, unpadded (as explain does)
        for i, t in enumerate((1, 2)):
            one = (
                {k: v[i : i + 1] for k, v in inputs.items()}
                if text
                else (
                    inputs[i : i + 1]
                    if isinstance(inputs, torch.Tensor)
                    else dict(inputs, pixel_values=inputs["pixel_values"][i : i + 1])
                )
            )
            if text:
                n = int(one["attention_mask"].sum())
                one = {k: v[:, :n] for k, v in one.items()}
            a = forward_function(adapter, adapter.check_inputs(one))
            want = _scores(_captum(method, model, a, torch.tensor([t]), opts), per_feature)[0]
            got = e.scores[i, : want.shape[0]]
            assert rel(got, want) < 1e-9, (i, got, want)
            if text:
                assert (e.scores[i, want.shape[0] :] == 0).all()
    else:
        a = forward_function(adapter, adapter.check_inputs(inputs))
        attr = _captum(method, model, a, torch.tensor([1, 2]), opts)
        assert rel(e.scores, _scores(attr, per_feature)) < 1e-12
        assert rel(e.pixels, attr[:, 0] if per_feature else attr.sum(1)) < 1e-12
    assert e.scores.dtype == torch.float64 and torch.isfinite(e.scores).all()


# ----------------------------------------------------------------------------
# batch == single, padding
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ("timm", "bert"))
@pytest.mark.parametrize("method", CAPTUM_METHODS)
def test_batch_equals_single(method, name):
    model, inputs = MODELS[name]()
    both = explain(model, inputs, method=method, target=[0, 2], **FAST[method])
    for i, t in enumerate((0, 2)):
        one = inputs[i : i + 1] if name == "timm" else {k: v[i : i + 1] for k, v in inputs.items()}
        single = explain(model, one, method=method, target=t, **FAST[method])
        assert rel(both.scores[i], single.scores[0]) < 1e-9


def _direct_call(model, inputs: dict, method: str, targets: list, **options) -> Call:
    """A Call of ``method`` on a padded batch as given (``explain`` would explain each length alone)."""
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(inputs)
    layout = adapter.layout(prepared)
    opt = registry.parse_options(registry.get(method), options, adapter.num_blocks, "text")
    return Call(adapter, prepared, layout, lambda logits: torch.tensor(targets), opt)


@pytest.mark.parametrize("method", ("input_x_gradient", "integrated_gradients", "occlusion", "kernel_shap"))
def test_padding_scores_zero_and_leaves_the_real_tokens_unaffected(method):
    """On a padded batch as given (no length groups), padding scores 0 and the short text's real tokens get
    what they get unpadded: no method moves a padding position (its baseline is itself)."""
    model, inputs = MODELS["bert"]()
    spec = registry.get(method)
    padded = spec.run(_direct_call(model, inputs, method, [1, 2], **FAST[method]))
    short = {k: v[1:2, :4] for k, v in inputs.items()}
    alone = spec.run(_direct_call(model, short, method, [2], **FAST[method]))
    assert (padded.scores[1, 4:] == 0).all()
    assert rel(padded.scores[1, :4], alone.scores[0]) < 1e-9


# ----------------------------------------------------------------------------
# what the numbers mean
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("baseline", ("zeros", "blur"))
def test_integrated_gradients_is_complete_on_images(baseline):
    """Σ pixels = y_t(x) − y_t(x̄) up to the reported convergence delta, which is small (float64, 50 steps)."""
    model, x = MODELS["timm"]()
    e = explain(model, x, method="integrated_gradients", target=[3, 1], baseline=baseline)
    ref = torch.zeros_like(x) if baseline == "zeros" else gaussian_blur(x, sigma=8.0)
    drop = (_logits(model, x) - _logits(model, ref))[[0, 1], [3, 1]]
    total = e.pixels.sum(dim=(1, 2))
    assert torch.allclose(e.scores.sum(1), total, rtol=1e-12)
    assert torch.allclose(total - drop, e.convergence_delta, rtol=1e-6, atol=1e-14)
    assert (e.convergence_delta.abs() < 1e-4 * drop.abs().max()).all()


def test_integrated_gradients_is_complete_on_text_from_the_padding_token():
    """Σ scores = y_t(text) − y_t(every real token replaced by [PAD]): the baseline is a real input here."""
    model, inputs = MODELS["bert"]()
    e = explain(model, inputs, method="integrated_gradients", target=[0, 1], baseline="pad")
    blank = dict(inputs, input_ids=torch.zeros_like(inputs["input_ids"]))
    drop = (_logits(model, inputs) - _logits(model, blank))[[0, 1], [0, 1]]
    assert torch.allclose(e.scores.sum(1) - drop, e.convergence_delta, rtol=1e-6, atol=1e-14)
    assert (e.convergence_delta.abs() < 1e-4 * drop.abs().max()).all()


def test_occlusion_of_a_token_is_the_logit_drop_computed_by_hand():
    model, inputs = MODELS["bert"]()
    e = explain(model, inputs, method="occlusion", target=[2, 0])
    y = _logits(model, inputs)
    for i, t in enumerate((2, 0)):
        n = int(inputs["attention_mask"][i].sum())
        for j in range(n):
            ids = inputs["input_ids"][i : i + 1, :n].clone()
            ids[0, j] = 0  # the padding token in place of token j
            one = {"input_ids": ids, "attention_mask": inputs["attention_mask"][i : i + 1, :n]}
            assert abs(e.scores[i, j] - (y[i, t] - _logits(model, one)[0, t])) < 1e-12 * y.abs().max()


def test_occlusion_of_a_patch_is_the_logit_drop_computed_by_hand():
    model, x = MODELS["timm"]()
    e = explain(model, x, method="occlusion", target=[4, 4])
    y = _logits(model, x)[:, 4]
    for p in (0, 5, 15):
        r, c = divmod(p, 4)
        cut = x.clone()
        cut[:, :, 8 * r : 8 * r + 8, 8 * c : 8 * c + 8] = 0
        assert torch.allclose(e.scores[:, p], y - _logits(model, cut)[:, 4], rtol=1e-10, atol=1e-14)
        assert (e.pixels[:, 8 * r : 8 * r + 8, 8 * c : 8 * c + 8] == e.scores[:, p, None, None]).all()


@pytest.mark.parametrize("method", ("integrated_gradients", "occlusion"))
def test_a_contrast_is_the_difference_of_the_two_explanations(method):
    """Both are linear in the explained output: explaining y_2 − y_0 gives map(2) − map(0)."""
    model, x = MODELS["timm"]()
    c = explain(model, x, method=method, target=Contrast(2, 0)).scores
    d = explain(model, x, method=method, target=2).scores - explain(model, x, method=method, target=0).scores
    assert rel(c, d) < 1e-10


def test_blur_baseline_is_a_gaussian_blur():
    from torchvision.transforms.functional import gaussian_blur as tv_blur

    x = _images()
    assert rel(gaussian_blur(x, 2.0), tv_blur(x, kernel_size=13, sigma=2.0)) < 1e-12


def test_a_token_id_baseline_is_that_token():
    model, inputs = MODELS["bert"]()
    pad = explain(model, inputs, method="integrated_gradients", baseline="pad", n_steps=8)
    zero = explain(model, inputs, method="integrated_gradients", baseline=0, n_steps=8)
    other = explain(model, inputs, method="integrated_gradients", baseline=7, n_steps=8)
    assert torch.equal(pad.scores, zero.scores) and not torch.allclose(pad.scores, other.scores)
    assert pad.options["baseline"] == "pad" and other.options["baseline"] == 7


# ----------------------------------------------------------------------------
# options, the model and the generator left alone
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "method, options, words",
    [
        ("integrated_gradients", {"n_steps": 0}, "n_steps must be a positive int"),
        ("integrated_gradients", {"baseline": "noise"}, "baseline must be one of"),
        ("integrated_gradients", {"baseline": "pad"}, "not one for images"),
        ("occlusion", {"baseline": 3}, "not one for images"),
        ("smoothgrad", {"stdevs": -1.0}, "stdevs must be a positive number"),
        ("smoothgrad", {"seed": -1}, "seed must be an int >= 0"),
        ("kernel_shap", {"n_samples": 0}, "n_samples must be a positive int"),
        ("occlusion", {"n_steps": 5}, "does not take option(s) ['n_steps']"),
        ("input_x_gradient", {"baseline": "zeros"}, "accepts no options of its own"),
        ("smoothgrad", {"stdev": 0.1}, "unknown option(s) ['stdev']"),
    ],
)
def test_option_errors_name_what_is_accepted(method, options, words):
    model, x = MODELS["timm"]()
    with pytest.raises(InputError) as err:
        explain(model, x, method=method, **options)
    assert words in str(err.value)


@pytest.mark.parametrize(
    "options, words",
    [
        ({"baseline": "blur"}, "'blur' is for images"),
        ({"baseline": "mask"}, "tokenizer.mask_token_id"),
        ({"baseline": 60}, "outside the vocabulary"),
    ],
)
def test_text_baseline_errors(options, words):
    model, inputs = MODELS["bert"]()
    with pytest.raises(InputError) as err:
        explain(model, inputs, method="integrated_gradients", **options)
    assert words in str(err.value)


@pytest.mark.parametrize("method", CAPTUM_METHODS)
def test_the_model_and_the_global_generator_are_left_as_they_were(method):
    model, inputs = MODELS["bert"]()
    before = snapshot(model)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    explain(model, inputs, method=method, **FAST[method])
    assert torch.equal(torch.rand(3), expected)
    assert_untouched(before, snapshot(model))
