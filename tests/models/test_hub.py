"""Hub loader: offline behaviour, random-weights path, ImageNet names from timm's files."""
import time

import pytest
import torch

from lrp_core.models import load
from lrp_core.models.hub import HubUnavailableError, hub_reachable, imagenet_class_names


@pytest.fixture
def offline(monkeypatch):
    """Make the hub unreachable and the caches empty, whatever the machine has."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent-hf-home")
    monkeypatch.setattr("lrp_core.models.hub._timm_cached_file", lambda name: None)
    import lrp_core.models.hub as hub

    real = hub._hf_config

    def no_cache(name, online):
        if not online:
            raise OSError("not cached (test)")
        return real(name, online)

    monkeypatch.setattr(hub, "_hf_config", no_cache)


def test_imagenet_names_come_from_timm_files():
    names = imagenet_class_names()
    assert len(names) == 1000
    assert names[0] == "tench" and names[1] == "goldfish"
    assert all(isinstance(n, str) and n for n in names)


def test_hub_reachable_respects_offline_flag(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t = time.perf_counter()
    assert hub_reachable() is False
    assert time.perf_counter() - t < 0.5


def test_random_weights_timm_model_works_offline(offline):
    m = load("deit_tiny_patch16_224", pretrained=False)
    assert m.kind == "image" and len(m.labels) == 1000 and m.labels[0] == "tench"
    assert not m.model.training
    x = m.preprocess(torch.rand(100, 120, 3).numpy())
    assert x.shape == (1, 3, 224, 224)
    with torch.no_grad():
        assert m.model(x).shape == (1, 1000)


@pytest.mark.parametrize("name,alternative", [
    ("deit_small_patch16_224", "toy-vit"),
    ("textattack/bert-base-uncased-SST-2", "minilm-sentiment"),
    ("google/vit-base-patch16-224", "dinov2-s14"),
])
def test_pretrained_fails_fast_offline_naming_the_embedded_model(offline, name, alternative):
    t = time.perf_counter()
    with pytest.raises(HubUnavailableError) as err:
        load(name)
    assert time.perf_counter() - t < 5
    assert alternative in str(err.value) and name in str(err.value)


def test_unknown_names_and_bad_pretrained_are_clear_errors():
    with pytest.raises(ValueError, match="timm model name"):
        load("definitely_not_a_model")
    with pytest.raises(ValueError, match="pretrained must be"):
        load("deit_tiny_patch16_224", pretrained="yes")


@pytest.mark.parametrize("name", ["facebook/deit-small-patch16-224", "facebook/deit-base-distilled-patch16-224",
                                  "facebook/dinov2-small-imagenet1k-1-layer"])
def test_known_vision_classifiers_fail_fast_offline_naming_the_embedded_models(offline, name):
    from lrp_core.models.hub import KNOWN_HF_MODELS
    assert KNOWN_HF_MODELS[name][0] == "image"
    t = time.perf_counter()
    with pytest.raises(HubUnavailableError) as err:
        load(name)
    assert time.perf_counter() - t < 5
    assert name in str(err.value) and "toy-vit" in str(err.value) and "dinov2-s14" in str(err.value)


@pytest.mark.parametrize("name", ["distilbert-base-uncased-finetuned-sst-2-english",
                                  "cardiffnlp/twitter-roberta-base-sentiment-latest",
                                  "textattack/albert-base-v2-SST-2"])
def test_known_text_classifiers_fail_fast_offline_naming_the_embedded_model(offline, name):
    from lrp_core.models.hub import KNOWN_HF_MODELS
    assert KNOWN_HF_MODELS[name][0] == "text"
    t = time.perf_counter()
    with pytest.raises(HubUnavailableError) as err:
        load(name)
    assert time.perf_counter() - t < 5
    assert name in str(err.value) and "minilm-sentiment" in str(err.value)
