"""Evaluation data sets (lrp_core.data.sets): one record type, records, held-out scenes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lrp_core.data import SCENE_SEED, RationaleRecord, as_record, label_id, load_rationales, rationale_set, scene_sets
from lrp_core.errors import InputError


def test_one_record_type_serves_loader_and_evaluation():
    rec = load_rationales()[0]
    norm = as_record(rec, ["negative", "positive"])
    assert isinstance(norm, RationaleRecord)
    assert (norm.text, norm.words, norm.label, norm.offsets, norm.id) == (
        rec.text,
        rec.words,
        rec.label,
        rec.offsets,
        rec.id,
    )
    assert norm.rationale.dtype == bool and norm.rationale.tolist() == rec.rationale
    assert [r.id for r in rationale_set(["negative", "positive"]).records] == [r.id for r in load_rationales()]


def test_labels_by_id_or_name():
    names = ["negative", "positive"]
    assert [label_id(x, names) for x in (1, "0", "POS", "neg", "Positive")] == [1, 0, 1, 0, 1]
    with pytest.raises(InputError):
        label_id("maybe", names)
    with pytest.raises(InputError, match="rationale flags"):
        as_record({"words": ["a", "b"], "rationale": [1], "label": 0}, names)


def test_scene_sets_are_held_out_and_head_slices():
    one, two = scene_sets(3)
    again, _ = scene_sets(3, seed=SCENE_SEED)
    assert torch.equal(one.images, again.images)
    assert one.labels.shape == (3, 1) and two.labels.shape == (3, 2)
    assert two.masks.shape[:2] == (3, 2)
    head = one.head(2)
    assert len(head) == 2 and torch.equal(head.masks, one.masks[:2])
    assert np.array_equal(head.labels.numpy(), one.labels[:2].numpy())
