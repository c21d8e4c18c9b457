"""Hub loader: offline behaviour, random-weights path, ImageNet names from timm's files."""

import numpy as np
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
    # huggingface_hub read HF_HOME at import: the hub cache it looks in must be emptied here too
    monkeypatch.setattr("lrp_core.models.hub._timm_hub_cached_dir", lambda name: None)
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
    assert hub_reachable() is False


def test_random_weights_timm_model_works_offline(offline):
    m = load("deit_tiny_patch16_224", pretrained=False)
    assert m.kind == "image" and len(m.labels) == 1000 and m.labels[0] == "tench"
    assert not m.model.training
    x = m.preprocess(torch.rand(100, 120, 3).numpy())
    assert x.shape == (1, 3, 224, 224)
    with torch.no_grad():
        assert m.model(x).shape == (1, 1000)


@pytest.mark.parametrize("name", ["timm/deit_tiny_patch16_224.fb_in1k", "hf-hub:timm/deit_tiny_patch16_224.fb_in1k"])
def test_random_weights_from_a_timm_hub_name_of_a_registered_architecture_work_offline(offline, name):
    """timm/<arch>.<tag> with pretrained=False builds <arch> from timm's registry, no config.json needed."""
    import timm

    m = load(name, pretrained=False)
    reference = timm.create_model("deit_tiny_patch16_224", pretrained=False)
    assert type(m.model) is type(reference)
    assert {k: v.shape for k, v in m.model.state_dict().items()} == {
        k: v.shape for k, v in reference.state_dict().items()
    }


def test_random_weights_of_an_unregistered_timm_hub_name_need_the_hub(offline):
    with pytest.raises(HubUnavailableError, match="config.json") as err:
        load("timm/not_an_architecture.x", pretrained=False)
    assert "timm/not_an_architecture.x" in str(err.value)


@pytest.mark.parametrize(
    "name,alternative",
    [
        ("deit_small_patch16_224", "toy-vit"),
        ("textattack/bert-base-uncased-SST-2", "minilm-sentiment"),
        ("google/vit-base-patch16-224", "dinov2-s14"),
    ],
)
def test_pretrained_fails_fast_offline_naming_the_embedded_model(offline, name, alternative):
    with pytest.raises(HubUnavailableError) as err:
        load(name)
    assert alternative in str(err.value) and name in str(err.value)


def test_unknown_names_and_bad_pretrained_are_clear_errors():
    from lrp_core.errors import InputError

    with pytest.raises(InputError, match="timm model name"):
        load("definitely_not_a_model")
    with pytest.raises(ValueError, match="pretrained must be"):
        load("deit_tiny_patch16_224", pretrained="yes")


@pytest.mark.parametrize(
    "name",
    [
        "facebook/deit-small-patch16-224",
        "facebook/deit-base-distilled-patch16-224",
        "facebook/dinov2-small-imagenet1k-1-layer",
        "openai/clip-vit-base-patch32",
    ],
)
def test_known_vision_classifiers_fail_fast_offline_naming_the_embedded_models(offline, name):
    from lrp_core.models.hub import KNOWN_HF_MODELS

    assert KNOWN_HF_MODELS[name][0] == "image"
    with pytest.raises(HubUnavailableError) as err:
        load(name)
    assert name in str(err.value) and "toy-vit" in str(err.value) and "dinov2-s14" in str(err.value)


@pytest.mark.parametrize(
    "name",
    [
        "distilbert-base-uncased-finetuned-sst-2-english",
        "cardiffnlp/twitter-roberta-base-sentiment-latest",
        "textattack/albert-base-v2-SST-2",
        "microsoft/deberta-v3-base",
    ],
)
def test_known_text_classifiers_fail_fast_offline_naming_the_embedded_model(offline, name):
    from lrp_core.models.hub import KNOWN_HF_MODELS

    assert KNOWN_HF_MODELS[name][0] == "text"
    with pytest.raises(HubUnavailableError) as err:
        load(name)
    assert name in str(err.value) and "minilm-sentiment" in str(err.value)


def test_a_cached_clip_checkpoint_loads_with_its_processor_and_is_explained(tmp_path):
    """A CLIP repo saved locally (tiny, random, with a CLIP tokenizer built from a tiny vocabulary) loads as
    CLIPModel + processor; its preprocess gives what explain takes."""
    import json

    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    from lrp_core import explain

    words = ["a", "photo", "of", "dog", "cat"]
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, **{w + "</w>": i + 2 for i, w in enumerate(words)}}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    tok = CLIPTokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    proc = CLIPProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
        tokenizer=tok,
    )
    cfg = CLIPConfig(
        text_config=dict(
            vocab_size=len(vocab),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=16,
            bos_token_id=0,
            eos_token_id=1,
        ),
        vision_config=dict(
            image_size=32,
            patch_size=8,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
        ),
        projection_dim=8,
    )
    repo = tmp_path / "tiny-clip"
    CLIPModel(cfg).save_pretrained(repo)
    proc.save_pretrained(repo)
    loaded = load(str(repo))
    assert type(loaded.model).__name__ == "CLIPModel" and loaded.kind == "image"
    image = (np.random.default_rng(0).random((40, 40, 3)) * 255).astype(np.uint8)
    inputs = loaded.preprocess(image, ["a photo of a dog", "a photo of a cat"])
    exp = explain(loaded.model, inputs, method="generic_attention", target=[1])
    assert exp.scores.shape == (1, 16) and exp.logits.shape == (1, 2)
