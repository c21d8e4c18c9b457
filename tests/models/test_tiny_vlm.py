"""tiny-vlm: an embedded LLaVA (HF LlavaForConditionalGeneration) with the real DINOv2 tower, answering make_vqa."""

import json

import numpy as np
import pytest
import torch

from lrp_core import models
from lrp_core.data import make_vqa
from lrp_core.errors import InputError
from lrp_core.models.hub import KNOWN_VLMS, HubUnavailableError
from lrp_core.models.tiny_vlm import HELD_OUT_SEED, META_FILE, prompt


@pytest.fixture(scope="module")
def vlm():
    return models.load("tiny-vlm")


@pytest.fixture(scope="module")
def held_out():
    return make_vqa(52, HELD_OUT_SEED)


def test_the_tower_is_the_timm_dinov2_of_dinov2_scenes(vlm, held_out):
    """The HF Dinov2Model holding the converted weights computes what the timm model computes."""
    from lrp_core.models.dinov2_scenes import build_dinov2_scenes, preprocess

    timm_model = build_dinov2_scenes()
    tower = vlm.model.model.vision_tower
    x = torch.cat([preprocess(r.image) for r in held_out[:4]])
    with torch.no_grad():
        ours = tower(x, output_hidden_states=True)
        ref = timm_model.forward_features(x)
        blocks = timm_model.blocks(timm_model.norm_pre(timm_model._pos_embed(timm_model.patch_embed(x))))
    assert ours.last_hidden_state.shape == ref.shape == (4, 65, 384)
    assert (ours.last_hidden_state - ref).abs().max() <= 1e-5
    # what LLaVA's projector reads (vision_feature_layer=-1): the last block's output, before the final norm
    last = ours.hidden_states[vlm.model.config.vision_feature_layer]
    assert (last - blocks).abs().max() <= 1e-5
    assert not any(p.requires_grad for p in tower.parameters())


def test_the_processor_gives_dinov2_scenes_pixels_and_64_image_tokens(vlm, held_out):
    from lrp_core.models.dinov2_scenes import preprocess

    r = held_out[0]
    batch = vlm.preprocess(r.image, r.question)
    assert sorted(batch) == ["attention_mask", "input_ids", "pixel_values"]
    assert (batch["pixel_values"] - preprocess(r.image)).abs().max() <= 1e-6
    ids = batch["input_ids"][0]
    assert int((ids == vlm.model.config.image_token_id).sum()) == 64
    words = vlm.tokenizer.convert_ids_to_tokens(ids[65:].tolist())
    assert ids[0] == vlm.tokenizer.bos_token_id and words == r.question.split()
    processor = vlm.info["processor"]
    assert type(processor).__name__ == "LlavaProcessor"
    direct = processor(images=r.image, text=prompt(r.question), return_tensors="pt")
    assert torch.equal(direct["input_ids"], batch["input_ids"])


def test_it_answers_held_out_questions(vlm, held_out):
    """Scenes of seeds >= HELD_OUT_SEED were never trained on; the answer is the argmax at the last position."""
    with torch.no_grad():
        batch = vlm.preprocess([r.image for r in held_out], [r.question for r in held_out])
        logits = vlm.model(**batch).logits[:, -1]
    predicted = vlm.tokenizer.convert_ids_to_tokens(logits.argmax(-1).tolist())
    accuracy = np.mean([p == r.answer for p, r in zip(predicted, held_out)])
    assert accuracy >= 0.9, accuracy
    meta = json.loads(META_FILE.read_text())
    assert meta["held_out_seed"] == HELD_OUT_SEED and meta["train_seed"] < HELD_OUT_SEED
    assert meta["held_out_accuracy"]["all"] >= 0.95


def test_batch_equals_single(vlm, held_out):
    part = held_out[:3]
    with torch.no_grad():
        batch = vlm.model(**vlm.preprocess([r.image for r in part], [r.question for r in part])).logits[:, -1]
        single = torch.cat([vlm.model(**vlm.preprocess(r.image, r.question)).logits[:, -1] for r in part])
    assert (batch - single).abs().max() <= 1e-4


def test_bad_input_and_random_weights():
    with pytest.raises(InputError, match="pretrained"):
        models.load("tiny-vlm", pretrained="yes")
    rand = models.load("tiny-vlm", pretrained=False)
    with pytest.raises(InputError, match="question"):
        rand.preprocess(["a"], ["what colour is the cross ?", "is there a disc ?"])
    assert rand.kind == "vlm" and "random" in rand.info["weights"]


@pytest.fixture
def offline(monkeypatch):
    """The hub unreachable and nothing cached, whatever the machine has."""
    import lrp_core.models.hub as hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    real = hub._hf_config

    def no_cache(name, online):
        if not online:
            raise OSError("not cached (test)")
        return real(name, online)

    monkeypatch.setattr(hub, "_hf_config", no_cache)


@pytest.mark.parametrize("name", list(KNOWN_VLMS) + ["someone/my-llava-finetune"])
def test_hub_vlms_fail_fast_offline_naming_tiny_vlm(offline, name):
    with pytest.raises(HubUnavailableError) as err:
        models.load(name)
    message = str(err.value)
    assert name in message and "unreachable" in message and "load('tiny-vlm')" in message


def test_a_vlm_saved_in_a_folder_loads_with_its_processor(tmp_path, vlm, held_out):
    """The hub path: AutoModelForImageTextToText + AutoProcessor: the saved weights and processor, and the same
    logits up to float32 round-off (the hub path loads the tower with eager attention, tiny-vlm with sdpa)."""
    vlm.model.save_pretrained(tmp_path)
    vlm.info["processor"].save_pretrained(tmp_path)
    loaded = models.load(str(tmp_path))
    assert loaded.kind == "vlm" and type(loaded.model).__name__ == "LlavaForConditionalGeneration"
    saved = vlm.model.state_dict()
    assert all(torch.equal(t, saved[n]) for n, t in loaded.model.state_dict().items())
    r = held_out[1]
    with torch.no_grad():
        ours = loaded.model(**loaded.preprocess(r.image, prompt(r.question))).logits
        ref = vlm.model(**vlm.preprocess(r.image, r.question)).logits
    assert (ours - ref).abs().max() <= 1e-4
    assert torch.equal(ours[0, -1].argmax(), ref[0, -1].argmax())
