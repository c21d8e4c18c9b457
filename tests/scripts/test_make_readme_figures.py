"""scripts/make_readme_figures.py runs on the embedded models and writes real, readable PNGs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from by_path import registered_module
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_readme_figures.py"


@pytest.fixture(scope="module")
def script():
    with registered_module("make_readme_figures", SCRIPT) as mod:
        yield mod


def test_small_run_writes_two_valid_pngs(script, tmp_path):
    rc = script.main(
        [
            "--model",
            "toy-vit",
            "--methods",
            "transformer_attribution,rollout",
            "--out-dir",
            str(tmp_path),
            "--dpi",
            "50",
        ]
    )
    assert rc == 0
    for name in ("method_grid.png", "token_heatmap.png"):
        path = tmp_path / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = Image.open(path)
        img.verify()  # a complete, decodable file
        img = np.asarray(Image.open(path).convert("RGB"))
        assert img.shape[0] > 50 and img.shape[1] > 200
        assert img.std() > 10  # a picture, not a blank canvas
        assert path.stat().st_size < 300 * 1024


def test_the_grid_scene_is_one_the_model_gets_right(script):
    from lrp_core.models import load

    toy = load("toy-vit")
    scene = script.pick_scene(toy, "toy-vit", seed=0, size=64)
    with torch.no_grad():
        top2 = set(toy.model(scene.x).topk(2, dim=-1).indices[0].tolist())
    assert top2 == set(scene.classes) and scene.x.shape == (1, 3, 64, 64)


def test_word_scores_drop_special_tokens_and_merge_pieces(script):
    from lrp_core import explain
    from lrp_core.models import load

    text = load("minilm-sentiment")
    words, scores = script.word_scores(text, "An unbelievably dull film.", 1, "transformer_attribution")
    assert "[CLS]" not in words and "[SEP]" not in words and not any(w.startswith("##") for w in words)
    assert len(words) == len(scores) and "dull" in words
    # a word's score is its pieces' maximum (merge_wordpieces' default): compare with the engine directly
    batch = text.preprocess(["An unbelievably dull film."])
    exp = explain(text.model, batch, method="transformer_attribution", target=1)
    tokens = text.tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())
    i = tokens.index("dull")
    assert scores[words.index("dull")] == pytest.approx(float(exp.scores[0, i]), rel=1e-6, abs=1e-9)
