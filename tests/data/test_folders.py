"""User data folders (lrp_core.data.folders): images with masks, ERASER, simple JSONL."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from lrp_core.data import load_data_folder
from lrp_core.errors import InputError


def _preprocess(img: Image.Image) -> torch.Tensor:
    """64 px -> area-downsample to 32 -> centre crop 24 -> normalise: (1, 3, 24, 24)."""
    x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)[None]
    x = F.interpolate(x, size=(32, 32), mode="area")[:, :, 4:28, 4:28]
    return (x - 0.5) / 0.25


def test_image_folder_masks_follow_the_preprocess(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    rng = np.random.default_rng(0)
    truth = []
    for i, name in enumerate(["a", "b"]):
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "images" / f"{name}.png")
        m = np.zeros((64, 64), np.uint8)
        m[8 + 8 * i : 40, 16:48] = 255  # even-aligned: exact after /2
        Image.fromarray(m).save(tmp_path / "masks" / f"{name}.png")
        truth.append(m[::2, ::2][4:28, 4:28] > 0)
    (tmp_path / "labels.csv").write_text("name,label\na.png,2\nb,dog\n")
    ds = load_data_folder(tmp_path, "image", _preprocess, labels=["cat", "fish", "bird", "dog"])
    assert ds.images.shape == (2, 3, 24, 24)
    assert ds.labels.tolist() == [[2], [3]]
    assert ds.masks.shape == (2, 1, 24, 24)
    assert np.array_equal(ds.masks[:, 0].numpy(), np.stack(truth))
    (tmp_path / "labels.csv").unlink()
    assert load_data_folder(tmp_path, "image", _preprocess).labels is None
    (tmp_path / "masks" / "b.png").unlink()
    with pytest.raises(InputError, match="no mask"):
        load_data_folder(tmp_path, "image", _preprocess)


def test_eraser_and_jsonl_folders(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "negR_1.txt").write_text("a dull ,\nlifeless film .\n")
    ann = {
        "annotation_id": "negR_1.txt",
        "classification": "NEG",
        "query": "?",
        "evidences": [
            [{"docid": "negR_1.txt", "start_token": 1, "end_token": 2, "text": "dull"}],
            [{"docid": "negR_1.txt", "start_token": 3, "end_token": 4, "text": "lifeless"}],
        ],
    }
    (tmp_path / "val.jsonl").write_text(json.dumps(ann) + "\n")
    ds = load_data_folder(tmp_path, "text", labels=["negative", "positive"])
    (rec,) = ds.records
    assert rec.words == ["a", "dull", ",", "lifeless", "film", "."]
    assert rec.rationale.tolist() == [False, True, False, True, False, False]
    assert rec.label == 0
    simple = tmp_path / "simple"
    simple.mkdir()
    (simple / "rationales.jsonl").write_text(
        json.dumps({"words": ["so", "good"], "rationale": [0, 1], "label": "positive"}) + "\n"
    )
    (rec,) = load_data_folder(simple, "text", labels=["negative", "positive"]).records
    assert (rec.text, rec.label, rec.rationale.tolist()) == ("so good", 1, [False, True])
    with pytest.raises(InputError):
        load_data_folder(tmp_path / "nowhere", "text")
