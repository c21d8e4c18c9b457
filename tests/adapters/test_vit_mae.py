"""Hugging Face ``ViTMAEModel`` (the MAE encoder, docs/METHODS.md §2v): with ``mask_ratio=0`` the replay is the
model run with its own ``noise`` argument in ascending order (every patch kept, raster order); its headless readout
([CLS] after ``layernorm``, no classes) runs the class-agnostic methods; ``mask_ratio > 0`` is refused with the
reason. Tiny random models, seconds each."""

from __future__ import annotations

import pytest
import torch
from untouched import assert_untouched, snapshot
from vision_models import CFG, _perturb_norms, random_images

from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.methods import registry


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _mae(mask_ratio: float = 0.0, seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    cfg = {k: v for k, v in CFG.items() if k != "num_labels"}
    model = transformers.ViTMAEModel(transformers.ViTMAEConfig(**cfg, mask_ratio=mask_ratio)).eval()
    _perturb_norms(model, seed)
    return model


def _cls(model, x, noise):
    with torch.no_grad():
        return model(pixel_values=x, noise=noise).last_hidden_state[:, 0]


def test_replay_is_the_model_with_its_patches_in_order():
    model, x = _mae(), random_images(2)
    ordered = torch.arange(16, dtype=torch.float32).expand(2, -1)
    for method in registry.CLASS_AGNOSTIC:
        exp = explain(model, x, method=method)
        assert exp.logits.shape == (2, 48) and exp.scores.shape == (2, 16)
        assert rel_err(exp.logits, _cls(model, x, ordered)) <= 1e-5, method
    model, x = model.double(), x.double()
    assert rel_err(explain(model, x, method="rollout").logits, _cls(model, x, ordered)) <= 1e-10
    # any other order of the kept patches gives the same [CLS] (attention is permutation-equivariant): the
    # function the model computes with mask_ratio=0 whatever noise it draws
    shuffled = torch.rand(2, 16, generator=torch.Generator().manual_seed(3))
    assert rel_err(_cls(model, x, shuffled), _cls(model, x, ordered)) <= 1e-12


def test_the_headless_readout_has_no_classes_and_the_class_methods_say_so():
    model, x = _mae(), random_images(1)
    assert get_adapter(model).num_classes == 0
    with pytest.raises(InputError) as err:
        explain(model, x, method="attnlrp")
    assert "no classification head" in str(err.value)


@pytest.mark.parametrize("method", registry.CLASS_AGNOSTIC)
def test_batch_equals_single_in_float64(method):
    model, x = _mae().double(), random_images(3).double()
    batch = explain(model, x, method=method)
    for i in range(3):
        assert rel_err(batch.scores[i : i + 1], explain(model, x[i : i + 1], method=method).scores) <= 1e-8


def test_model_is_untouched():
    model = _mae()
    model.train()
    before = snapshot(model)
    for method in registry.CLASS_AGNOSTIC:
        explain(model, random_images(1), method=method)
    assert_untouched(before, snapshot(model))


def test_random_masking_is_refused_with_the_reason():
    with pytest.raises(UnsupportedModelError) as err:
        explain(_mae(mask_ratio=0.75), random_images(1), method="rollout")
    for w in ("mask_ratio=0.75", "random", "mask_ratio=0"):
        assert w in str(err.value)
