"""The widgets' class probabilities follow the model's training: softmax, or each class's sigmoid for a
model trained one-vs-rest (several objects in one picture can all be likely)."""

from __future__ import annotations

import pytest
import torch

import widgets
from lrp_core.errors import InputError
from lrp_core.models import LoadedModel, load, logits_to_probabilities
from widgets._common import class_options, resolve_model


def _loaded(vit: torch.nn.Module, probabilities: str | None) -> LoadedModel:
    info = {} if probabilities is None else {"probabilities": probabilities}
    return LoadedModel(name="tiny", model=vit, preprocess=lambda x: x, labels=list("ABCDE"), kind="image", info=info)


def test_embedded_classifiers_declare_how_they_were_trained():
    # dinov2-scenes is trained with one-vs-rest logistic losses; toy-vit and the MiniLM with cross-entropy
    assert load("dinov2-scenes", pretrained=False).info["probabilities"] == "sigmoid"
    assert load("dinov2-scenes-avg", pretrained=False).info["probabilities"] == "sigmoid"
    assert load("toy-vit", pretrained=False).info["probabilities"] == "softmax"


@pytest.mark.parametrize("probabilities", ["sigmoid", "softmax", None])
def test_explorer_shows_the_probabilities_of_the_training(vit, images, probabilities):
    w = widgets.RelevanceExplorer(_loaded(vit, probabilities), images[:1])
    assert w.last_error is None, w.last_error
    logits = vit(images[:1])[0].detach().double()
    want = torch.sigmoid(logits) if probabilities == "sigmoid" else torch.softmax(logits, 0)
    for label, c in w.class_selector.options:
        assert f"({want[c].item():.1%})" in label, (label, want)
    target = w.target
    assert f"(p = {want[target].item():.1%})" in w.info.value
    # the two readings differ on this model, so the test tells them apart
    other = torch.softmax(logits, 0) if probabilities == "sigmoid" else torch.sigmoid(logits)
    assert f"{other[target].item():.1%}" != f"{want[target].item():.1%}"


def test_grid_shows_the_probabilities_of_the_training(vit, images):
    g = widgets.MethodGrid(_loaded(vit, "sigmoid"), images[:1], methods=["rollout"])
    logits = vit(images[:1])[0].detach().double()
    for label, c in g.class_selector.options:
        assert f"({torch.sigmoid(logits)[c].item():.1%})" in label


def test_a_hugging_face_multi_label_config_means_sigmoid(bert):
    assert resolve_model(bert, "test").probabilities == "softmax"
    bert.config.problem_type = "multi_label_classification"
    try:
        assert resolve_model(bert, "test").probabilities == "sigmoid"
    finally:
        bert.config.problem_type = None


def test_an_unknown_reading_is_refused():
    with pytest.raises(InputError, match="softmax"):
        class_options(torch.zeros(3), list("abc"), probabilities="tanh")
    with pytest.raises(InputError, match="sigmoid"):
        logits_to_probabilities(torch.zeros(3), "tanh")
