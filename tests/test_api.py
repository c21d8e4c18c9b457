"""The public call: targets, options, errors, and a model left exactly as it was."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_bert, make_tiny_vit
from untouched import assert_untouched, snapshot

from lrp_core import METHODS, InputError, UnknownMethodError, UnsupportedModelError, explain


def test_methods_list_is_the_contract():
    assert set(METHODS) == {
        "transformer_attribution",
        "generic_attention",
        "rollout",
        "raw_attention",
        "attention_gradcam",
        "lrp",
        "partial_lrp",
        "cdam",
        "token_ablation",
        "attnlrp",
        "cp_lrp",
        "input_x_gradient",
        "integrated_gradients",
        "smoothgrad",
        "occlusion",
        "kernel_shap",
        "pa_lrp",
    }


def test_an_option_the_method_does_not_take_is_refused(tiny_vit, images):
    from lrp_core.methods import registry

    with pytest.raises(
        InputError,
        match=r"'rollout' does not take option\(s\) \['use_gradient'\]; "
        r"method 'rollout' accepts: start_layer",
    ):
        explain(tiny_vit, images, method="rollout", use_gradient=False)
    with pytest.raises(InputError, match="'cdam' accepts no options"):
        explain(tiny_vit, images, method="cdam", keep_heads=True)
    # the registry is the one source: every option a method declares is accepted by explain
    for name, spec in registry.METHODS.items():
        for option in spec.option_names():
            value = {
                "start_layer": 0,
                "end_layer": None,
                "rollout_norm": None,
                "use_gradient": True,
                "keep_heads": False,
                "progress": False,
                "batch_size": 64,
                "n_steps": 4,
                "baseline": "zeros",
                "n_samples": 8,
                "stdevs": 0.5,
                "seed": 1,
                "base": "cp_lrp",
                "composite": None,
            }[option]
            assert explain(tiny_vit, images[:1], method=name, **{option: value}).scores.shape == (1, 16)


def test_target_forms_agree(tiny_vit, images):
    t = [1, 2, 0]
    as_list = explain(tiny_vit, images, target=t)
    as_tensor = explain(tiny_vit, images, target=torch.tensor(t))
    assert torch.equal(as_list.scores, as_tensor.scores)
    assert as_list.target.tolist() == t
    as_int = explain(tiny_vit, images, target=2)
    assert as_int.target.tolist() == [2, 2, 2]
    default = explain(tiny_vit, images)
    assert torch.equal(default.target, default.logits.argmax(1))


def test_explanation_helpers(tiny_vit, images):
    exp = explain(tiny_vit, images)
    assert exp.scores.shape == (3, 16) and exp.grid == (4, 4)
    assert exp.patch_map().shape == (3, 4, 4)
    assert exp.upsample().shape == (3, 32, 32)
    assert torch.equal(exp[1].scores, exp.scores[1:2])
    assert exp.layers.shape == (3, 3, 17, 17)


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.randn(1, 3, 48, 48), "expects images of size"),
        (torch.randn(3, 32, 32), "batched"),
        (torch.randn(1, 1, 32, 32), r"\(B, 3, H, W\)"),
        (torch.full((1, 3, 32, 32), float("nan")), "NaN"),
        (torch.zeros(1, 3, 32, 32, dtype=torch.long), "float"),
        ({"input_ids": torch.tensor([[1, 2]])}, "images"),
    ],
)
def test_bad_images_are_refused_clearly(tiny_vit, bad, match):
    with pytest.raises(InputError, match=match):
        explain(tiny_vit, bad)


def test_bad_targets_and_options(tiny_vit, images):
    with pytest.raises(InputError, match=r"out of range: the model has 5 classes"):
        explain(tiny_vit, images, target=5)
    with pytest.raises(InputError, match="out of range"):
        explain(tiny_vit, images, target=[0, -1, 2])
    with pytest.raises(InputError, match="3 entries|batch of 3"):
        explain(tiny_vit, images, target=[0, 1])
    with pytest.raises(InputError, match="integer class ids"):
        explain(tiny_vit, images, target=torch.tensor([0.5, 1.0, 2.0]))
    with pytest.raises(UnknownMethodError, match="choose one of"):
        explain(tiny_vit, images, method="gradcam++")
    with pytest.raises(InputError, match="start_layer=7 is out of range"):
        explain(tiny_vit, images, start_layer=7)
    with pytest.raises(InputError, match="unknown option"):
        explain(tiny_vit, images, start_layr=1)
    with pytest.raises(InputError, match="rollout_norm"):
        explain(tiny_vit, images, rollout_norm="col")


def test_bad_text_is_refused_clearly(tiny_bert):
    with pytest.raises(InputError, match="tokenized first"):
        explain(tiny_bert, "a fine film")
    with pytest.raises(InputError, match="empty"):
        explain(tiny_bert, {"input_ids": torch.zeros(1, 0, dtype=torch.long)})
    with pytest.raises(InputError, match="empty"):
        explain(tiny_bert, {"input_ids": torch.tensor([[2, 5, 3]]), "attention_mask": torch.zeros(1, 3)})
    long_ids = torch.full((1, 41), 5)
    with pytest.raises(InputError, match="at most 40.*truncation=True, max_length=40"):
        explain(tiny_bert, {"input_ids": long_ids})
    with pytest.raises(InputError, match="vocabulary"):
        explain(tiny_bert, {"input_ids": torch.tensor([[2, 99, 3]])})
    with pytest.raises(InputError, match="batched"):
        explain(tiny_bert, {"input_ids": torch.tensor([2, 5, 3])})


def test_unsupported_models_are_named():
    # the versions it was read with are named where transformers / timm are imported
    named = r"Sequential is not supported( \(read with [^)]*\))?\. Supported: timm"
    with pytest.raises(UnsupportedModelError, match=named):
        explain(torch.nn.Sequential(torch.nn.Linear(3, 3)), torch.randn(1, 3))
    with pytest.raises(UnsupportedModelError, match="global_pool='max'"):  # average and attention pooling are (§4)
        explain(make_tiny_vit(global_pool="max"), torch.randn(1, 3, 32, 32))
    import timm

    resnet = timm.create_model("resnet18", pretrained=False, num_classes=3)
    with pytest.raises(UnsupportedModelError, match="ResNet"):
        explain(resnet, torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize("method", METHODS)
def test_model_is_untouched(method, images, text_batch):
    vit = make_tiny_vit()
    vit.train()  # unusual modes and flags must survive too
    vit.blocks[0].attn.fused_attn = False
    vit.blocks[1].mlp.fc1.weight.requires_grad_(False)
    before = snapshot(vit)
    explain(vit, images, method=method)
    assert_untouched(before, snapshot(vit))
    bert = make_tiny_bert(attn_implementation="sdpa")
    before = snapshot(bert)
    explain(bert, text_batch, method=method)
    assert_untouched(before, snapshot(bert))


def test_training_mode_gives_inference_explanations(images):
    vit = make_tiny_vit(drop_rate=0.5, attn_drop_rate=0.5)
    a = explain(vit, images).scores
    vit.train()
    b = explain(vit, images).scores
    assert torch.equal(a, b) and vit.training


def test_model_is_untouched_after_an_error(images):
    vit = make_tiny_vit()
    before = snapshot(vit)
    with pytest.raises(InputError):
        explain(vit, images, target=99)

    def boom(module, inputs, output):  # a user's hook that flips a mode and then fails mid-call
        module.train()
        raise RuntimeError("user hook failed")

    vit.patch_embed.proj.register_forward_hook(boom)  # a leaf the replay runs
    before = snapshot(vit)
    with pytest.raises(RuntimeError, match="user hook failed"):
        explain(vit, images)
    assert_untouched(before, snapshot(vit))


def test_frozen_model_still_explains(images):
    vit = make_tiny_vit()
    for p in vit.parameters():
        p.requires_grad_(False)
    for method in ("transformer_attribution", "generic_attention", "cdam", "attention_gradcam"):
        assert torch.isfinite(explain(vit, images, method=method).scores).all()
    assert not any(p.requires_grad for p in vit.parameters())


def test_headless_model_needs_a_concept(images):
    from lrp_core import concept_target

    vit = make_tiny_vit(num_classes=0)
    assert explain(vit, images, method="rollout").scores.shape == (3, 16)
    with pytest.raises(InputError, match="no classification head"):
        explain(vit, images, method="transformer_attribution")
    c = concept_target(vit, images[:2])
    assert explain(vit, images, method="cdam", target=c).scores.shape == (3, 16)
    with pytest.raises(InputError, match="concept target works with method='cdam' only"):
        explain(vit, images, method="rollout", target=c)


def test_attention_parts_are_what_transformer_attribution_combines(tiny_vit, images):
    from lrp_core import attention_parts

    parts = attention_parts(tiny_vit, images, target=[0, 1, 2])
    assert parts.attention.shape == (3, 3, 3, 17, 17)
    exp = explain(tiny_vit, images, target=[0, 1, 2])
    assert torch.allclose((parts.gradient * parts.relevance).clamp(min=0).mean(2), exp.layers, atol=1e-7)
    assert torch.allclose(parts.attention.sum(-1), torch.ones(3, 3, 3, 17), atol=1e-5)
