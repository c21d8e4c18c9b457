"""CLIP (Hugging Face CLIPModel): image–text similarity explained on the image; contrast targets."""

from __future__ import annotations

import pytest
import torch
from tiny_clip import make_clip

from lrp_core import METHODS, ConceptTarget, Contrast, InputError, explain
from lrp_core.adapters import get_adapter


@pytest.fixture(scope="module")
def clip():
    return make_clip()


@pytest.fixture
def inputs():
    ids = torch.tensor([[1, 5, 6, 7, 98], [1, 8, 9, 98, 0], [1, 10, 98, 0, 0]])  # 98: end of text
    return {
        "pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3)),
        "input_ids": ids,
        "attention_mask": (ids != 0).long(),
    }


def test_replay_reproduces_the_similarity_logits(clip, inputs):
    a = get_adapter(clip)
    logits = a.forward(a.check_inputs(inputs)).logits
    assert torch.allclose(logits, clip(**inputs).logits_per_image, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_one_map_per_prompt_and_batch_equals_single(clip, inputs, method):
    model = make_clip().double()
    x = dict(inputs, pixel_values=inputs["pixel_values"].double())
    both = explain(model, x, method=method, target=[0, 2])
    assert both.scores.shape == (2, 16) and torch.isfinite(both.scores).all()
    one = explain(model, dict(x, pixel_values=x["pixel_values"][1:]), method=method, target=2)
    scale = both.scores[1].abs().max().clamp(min=1e-30)
    assert ((both.scores[1] - one.scores[0]).abs().max() / scale) < 1e-8


def test_cdam_with_the_text_embedding_as_concept_is_cdam_of_that_prompt(clip, inputs):
    a = get_adapter(clip)
    text = a.check_inputs(inputs).prompt_embeddings[1].clone()  # the normalised text embedding × logit scale
    by_prompt = explain(clip, inputs, method="cdam", target=1).scores
    by_concept = explain(clip, inputs, method="cdam", target=ConceptTarget(vector=text)).scores
    assert torch.allclose(by_prompt, by_concept, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("method", ["cdam", "lrp", "attnlrp", "cp_lrp", "token_ablation"])
def test_a_contrast_is_the_difference_of_the_two_explanations_for_linear_methods(inputs, method):
    model = make_clip(1).double()
    x = dict(inputs, pixel_values=inputs["pixel_values"].double())
    contrast = explain(model, x, method=method, target=Contrast(positive=0, negative=2))
    a, b = (explain(model, x, method=method, target=t).scores for t in (0, 2))
    assert torch.allclose(contrast.scores, a - b, rtol=1e-9, atol=1e-12)
    assert contrast.options["contrast_with"] == [2, 2]


def test_contrast_errors(clip, inputs):
    with pytest.raises(InputError, match="does not depend on the target"):
        explain(clip, inputs, method="rollout", target=Contrast(0, 1))
    with pytest.raises(InputError, match="needs the class to contrast with"):
        explain(clip, inputs, method="cdam", target=Contrast(0))
    with pytest.raises(InputError, match="out of range"):
        explain(clip, inputs, method="cdam", target=Contrast(0, 7))


def test_inputs_must_carry_images_and_prompts(clip, inputs):
    with pytest.raises(InputError, match="pixel_values"):
        explain(clip, inputs["pixel_values"])
    with pytest.raises(InputError, match="expects images of size"):
        explain(clip, dict(inputs, pixel_values=torch.randn(1, 3, 64, 64)))


def test_the_model_is_left_as_it_was(inputs):
    model = make_clip(2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modes = [m.training for m in model.modules()]
    for method in ("transformer_attribution", "attnlrp", "token_ablation"):
        explain(model, inputs, method=method)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert modes == [m.training for m in model.modules()]
    assert all(p.grad is None for p in model.parameters())


# ----------------------------------------------------------------------------
# the text side: the prompts' tokens given the images
# ----------------------------------------------------------------------------
def test_text_side_replay_reproduces_logits_per_text(clip, inputs):
    a = get_adapter(clip).for_inputs({**inputs, "explain": "text"})
    prepared = a.check_inputs({**inputs, "explain": "text"})
    one = prepared.take(torch.tensor([0]), 5)  # the first prompt is unpadded
    logits = a.forward(one).logits
    assert torch.allclose(logits, clip(**inputs).logits_per_text[:1], atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_text_side_every_method_scores_the_prompt_tokens_padding_zero(inputs, method):
    model = make_clip(4).double()
    x = {**inputs, "pixel_values": inputs["pixel_values"].double(), "explain": "text"}
    exp = explain(model, x, method=method, target=[1, 0, 1])
    mask = inputs["attention_mask"].bool()
    assert exp.scores.shape == (3, 5) and torch.isfinite(exp.scores).all()
    assert (exp.scores[~mask] == 0).all()
    single = explain(
        model,
        {**x, "input_ids": x["input_ids"][1:2, :4], "attention_mask": x["attention_mask"][1:2, :4]},
        method=method,
        target=0,
    )
    assert torch.allclose(exp.scores[1, :4], single.scores[0], rtol=1e-9, atol=1e-12)


def test_text_side_errors(clip, inputs):
    with pytest.raises(InputError, match=r"inputs\['explain'\] must be one of"):
        explain(clip, {**inputs, "explain": "both"})
    left = {
        **inputs,
        "input_ids": torch.tensor([[0, 1, 5, 98]]),
        "attention_mask": torch.tensor([[0, 1, 1, 1]]),
        "explain": "text",
    }
    with pytest.raises(InputError, match="end-of-text token must be the last real token"):
        explain(clip, left, method="cdam")
