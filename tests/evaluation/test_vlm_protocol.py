"""The vision-language evidence protocol (docs/METHODS.md §3c) end to end with the embedded tiny-vlm."""
import dataclasses
import json

import numpy as np
import pytest
import torch

from lrp_core import models
from lrp_core.data.vqa import make_vqa
from lrp_core.errors import InputError
from lrp_core.evaluation import vlm
from lrp_core.evaluation.__main__ import main
from lrp_core.models.tiny_vlm import HELD_OUT_SEED


@pytest.fixture(scope="module")
def tiny():
    loaded = models.load("tiny-vlm")
    return loaded.model, loaded.info["processor"]


def _records(n=4):
    return [r for r in make_vqa(n, HELD_OUT_SEED + 11) if r.has_evidence]


def test_deciding_word_per_kind():
    assert vlm.deciding_word("what is left of the ring ?") == "ring"
    assert vlm.deciding_word("which shape is red ?") == "red"
    assert vlm.deciding_word("what colour is the cross ?") == "cross"
    assert vlm.deciding_word("is there a cross ?") == "cross"
    with pytest.raises(InputError, match="ending in"):
        vlm.deciding_word("what colour")


def test_background_fill_is_the_mean_outside_every_object():
    pixels = torch.zeros(3, 2, 2)
    pixels[:, 0, 0] = torch.tensor([1.0, 2.0, 3.0])  # background
    pixels[:, 0, 1] = torch.tensor([3.0, 4.0, 5.0])  # background
    pixels[:, 1, :] = 100.0  # the objects
    masks = np.zeros((2, 2, 2), dtype=bool)
    masks[0, 1, 0] = masks[1, 1, 1] = True
    assert torch.equal(vlm.background_fill(pixels, masks), torch.tensor([2.0, 3.0, 4.0]))
    with pytest.raises(InputError, match="whole image"):
        vlm.background_fill(pixels, np.ones((1, 2, 2), dtype=bool))


def test_protocol_runs_end_to_end_with_values_in_range(tiny):
    model, processor = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    records = _records()
    results, curves, accuracy, answered = vlm.vlm_protocol(model, processor, records, ["attnlrp"], progress=False,
                                                           K=4, curve_questions=2)
    assert answered == len(records) and accuracy == 1.0  # tiny-vlm answers these held-out questions
    assert set(results) == {"attnlrp", "random"}
    for method, c in curves.items():
        assert set(c["pointing_per_question"]) <= {0.0, 1.0} and len(c["pointing_per_question"]) == answered
        assert all(0.0 <= v <= 1.0 for v in c["mask_share_per_question"])
        assert all(1 <= v <= 7 for v in c["text_rank_per_question"])  # 5 to 7 text tokens (words and ?)
        assert len(c["morf_auc_per_question"]) == 2 and len(c["lerf_auc_per_question"]) == 2
        assert all(0.0 <= v <= 1.0 for v in c["morf_auc_per_question"] + c["lerf_auc_per_question"])
        for k in vlm.VLM_METRICS:
            assert results[method][k] == pytest.approx(np.mean(c[f"{k}_per_question"]))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_random_row_is_seeded(tiny):
    model, processor = tiny
    records = _records()

    def run(seed):
        return vlm.vlm_protocol(model, processor, records, [], progress=False, K=2, curve_questions=1,
                                seed=seed)[1]["random"]

    a, b, c = run(0), run(0), run(1)
    assert a == b
    assert a["mask_share_per_question"] != c["mask_share_per_question"]


def test_a_question_answered_wrongly_is_skipped(tiny):
    model, processor = tiny
    records = _records()
    wrong = "yes" if records[0].answer != "yes" else "no"
    changed = [dataclasses.replace(records[0], answer=wrong)] + records[1:]
    no_object = dataclasses.replace(records[1], has_evidence=False)
    _, curves, accuracy, answered = vlm.vlm_protocol(model, processor, changed + [no_object], [], progress=False,
                                                     K=1, curve_questions=1)
    assert answered == len(records) - 1 and accuracy == pytest.approx((len(records) - 1) / len(records))
    assert len(curves["random"]["pointing_per_question"]) == len(records) - 1
    with pytest.raises(InputError, match="deciding object"):
        vlm.vlm_protocol(model, processor, [no_object], [], progress=False)


def test_the_cli_evaluates_tiny_vlm(tmp_path, capsys):
    out = tmp_path / "vlm.json"
    assert main(["--model", "tiny-vlm", "--n", "2", "--methods", "raw_attention", "--curve-questions", "1",
                 "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tiny-vlm (vlm), n=2" in printed
    results = json.loads(out.read_text())
    assert set(results) == {"raw_attention", "random"} and set(results["raw_attention"]) == set(vlm.VLM_METRICS)
    meta = json.loads(out.with_name("vlm.meta.json").read_text())
    assert meta["kind"] == "vlm" and meta["answered"] == meta["questions"] and meta["curve_questions"] == 1
