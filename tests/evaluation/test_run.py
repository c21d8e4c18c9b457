"""One whole run (lrp_core.evaluation.run, .report): method names, tables."""

from __future__ import annotations

import pytest

from lrp_core import evaluation as E
from lrp_core.errors import UnknownMethodError


def test_method_names_and_tables():
    assert E.resolve_methods("rollout, cdam") == ["rollout", "cdam"]
    from lrp_core import METHODS

    assert tuple(E.resolve_methods("all")) == METHODS
    with pytest.raises(UnknownMethodError, match="choose from"):
        E.resolve_methods("rollout,gradcam++")
    table = E.format_table({"rollout": {"miou": 0.5, "cdam_sparsity": None}}, markdown=True)
    assert table.splitlines()[2] == "| rollout | 0.500 | — |"


def test_builtin_image_data_comes_from_the_model_info():
    from timm.models.vision_transformer import VisionTransformer

    from lrp_core.data import BUILTIN_IMAGE_SETS
    from lrp_core.errors import InputError
    from lrp_core.models import LoadedModel, load

    assert load("toy-vit", pretrained=False).info["evaluation_data"] in BUILTIN_IMAGE_SETS
    vit = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3).eval()
    other = LoadedModel("toy-vit-lookalike", vit, preprocess=None, labels=["a", "b", "c"], kind="image")
    with pytest.raises(InputError, match="no built-in evaluation data"):
        E.evaluate(other, methods="rollout", n=2, progress=False)
