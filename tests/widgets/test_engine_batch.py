"""Widgets run the batching methods (token ablation, Captum baselines) in small batches: bounded memory, same maps."""

from __future__ import annotations

import pytest
import torch

from lrp_core import explain
from lrp_core.methods import registry
from widgets import _engine

BATCHED = [name for name in registry.METHODS if registry.get(name).takes("batch_size")]


def test_the_batching_methods_are_the_perturbation_methods():
    assert sorted(BATCHED) == ["integrated_gradients", "kernel_shap", "occlusion", "smoothgrad", "token_ablation"]


@pytest.mark.parametrize("method", BATCHED)
def test_widget_call_batches_small_and_gives_the_engines_map(method, vit, images, monkeypatch):
    """The widget's call asks for WIDGET_BATCH copies per pass; its map equals the default call's (64 per pass)."""
    model, x = vit, images[:1]
    seen = {}
    real = _engine.api.explain

    def spy(model, inputs, **kwargs):
        seen.update(kwargs)
        return real(model, inputs, **kwargs)

    monkeypatch.setattr(_engine.api, "explain", spy)
    small = _engine.explain(model, x, method, target=2).scores
    assert seen["batch_size"] == _engine.WIDGET_BATCH
    default = explain(model, x, method=method, target=2).scores
    torch.testing.assert_close(small, default, rtol=1e-4, atol=1e-6 * float(default.abs().max()))


def test_methods_without_batches_get_no_batch_size(vit, monkeypatch):
    seen = {}
    monkeypatch.setattr(_engine.api, "explain", lambda model, inputs, **kw: seen.update(kw))
    _engine.explain(vit, torch.zeros(1, 3, 32, 32), "transformer_attribution", target=0)
    assert "batch_size" not in seen
