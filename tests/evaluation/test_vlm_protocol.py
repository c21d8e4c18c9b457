"""The vision-language evidence protocol (docs/METHODS.md §3c) end to end with the embedded tiny-vlm."""

import dataclasses
import json

import numpy as np
import pytest
import torch

import lrp_core.api
from lrp_core import METHODS, explain, models
from lrp_core.adapters import get_adapter
from lrp_core.data.vqa import make_vqa
from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.evaluation import evaluate, vlm
from lrp_core.evaluation.__main__ import main
from lrp_core.models.tiny_vlm import HELD_OUT_SEED, prompt


@pytest.fixture(scope="module")
def loaded():
    return models.load("tiny-vlm")


@pytest.fixture(scope="module")
def tiny(loaded):
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
    results, curves, accuracy, answered = vlm.vlm_protocol(
        model, processor, records, ["attnlrp"], progress=False, K=4, curve_questions=2
    )
    assert answered == len(records) and accuracy == 1.0  # tiny-vlm answers these held-out questions
    assert set(results) == {"attnlrp", "attnlrp (pixels)", "random", "random (pixels)"}
    for method, c in curves.items():
        assert set(c["pointing_per_question"]) <= {0.0, 1.0} and len(c["pointing_per_question"]) == answered
        assert all(0.0 <= v <= 1.0 for v in c["mask_share_per_question"])
        if method.endswith(vlm.PIXEL_SUFFIX):
            assert set(c) == {f"{k}_per_question" for k in vlm.PIXEL_METRICS}
            assert results[method]["text_rank"] is None and results[method]["morf_auc"] is None
            continue
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
        return vlm.vlm_protocol(model, processor, records, [], progress=False, K=2, curve_questions=1, seed=seed)[1][
            "random"
        ]

    a, b, c = run(0), run(0), run(1)
    assert a == b
    assert a["mask_share_per_question"] != c["mask_share_per_question"]


def test_a_question_answered_wrongly_is_skipped(tiny):
    model, processor = tiny
    records = _records()
    wrong = "yes" if records[0].answer != "yes" else "no"
    changed = [dataclasses.replace(records[0], answer=wrong)] + records[1:]
    no_object = dataclasses.replace(records[1], has_evidence=False)
    _, curves, accuracy, answered = vlm.vlm_protocol(
        model, processor, changed + [no_object], [], progress=False, K=1, curve_questions=1
    )
    assert answered == len(records) - 1 and accuracy == pytest.approx((len(records) - 1) / len(records))
    assert len(curves["random"]["pointing_per_question"]) == len(records) - 1
    with pytest.raises(InputError, match="deciding object"):
        vlm.vlm_protocol(model, processor, [no_object], [], progress=False)


def test_the_cli_evaluates_tiny_vlm(tmp_path, capsys):
    out = tmp_path / "vlm.json"
    assert (
        main(
            [
                "--model",
                "tiny-vlm",
                "--n",
                "2",
                "--methods",
                "raw_attention",
                "--curve-questions",
                "1",
                "--quiet",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "tiny-vlm (vlm), n=2" in printed
    results = json.loads(out.read_text())
    assert set(results) == {"raw_attention", "random"}
    assert set(results["raw_attention"]) == set(vlm.VLM_METRICS) | {"seconds"}
    assert results["raw_attention"]["seconds"] > 0
    meta = json.loads(out.with_name("vlm.meta.json").read_text())
    assert meta["kind"] == "vlm" and meta["answered"] == meta["questions"] and meta["curve_questions"] == 1


class _HandMade:
    """What the protocol reads of an explanation, hand-made: zero token scores and patch maps, given pixel maps."""

    def __init__(self, inputs, pixels):
        self.scores = torch.zeros(inputs["input_ids"].shape, dtype=torch.float64)
        self.size = tuple(inputs["pixel_values"].shape[-2:])
        self.pixels = pixels

    def patch_map(self):
        return torch.zeros(self.scores.shape[0], self.size[0] // 14, self.size[1] // 14)

    def upsample(self):
        return torch.zeros(self.scores.shape[0], *self.size)


def test_pixel_rows_score_the_pixel_maps_at_pixel_resolution(tiny, monkeypatch):
    """A method with pixel maps gets the row '<method> (pixels)' scored on exactly those maps; the random row's
    counterpart scores seeded uniform pixels; a method without pixel maps gets no such row, nor does occlusion,
    whose pixel map is its patch map."""
    model, processor = tiny
    records = _records()
    masks = [torch.as_tensor(r.mask) for r in records]
    seen = {}

    def hand_made(model, inputs, method, target, **kwargs):
        seen["T"], seen["size"] = inputs["input_ids"].shape[1], tuple(inputs["pixel_values"].shape[-2:])
        if method == "rollout":
            return _HandMade(inputs, None)
        maps = []
        for i, m in enumerate(masks):  # +1 on the object, -1 elsewhere, one outside pixel 0.5 (even i) or 3 (odd)
            x = torch.where(m, 1.0, -1.0).double()
            r, c = torch.nonzero(~m)[0].tolist()
            x[r, c] = 0.5 if i % 2 == 0 else 3.0
            maps.append(x)
        return _HandMade(inputs, torch.stack(maps))

    monkeypatch.setattr(lrp_core.api, "explain", hand_made)
    results, curves, _, answered = vlm.vlm_protocol(
        model, processor, records, ["attnlrp", "rollout", "occlusion"], progress=False, K=1, curve_questions=1, seed=3
    )
    assert answered == len(records) and "rollout (pixels)" not in results and "occlusion (pixels)" not in results
    assert "occlusion" in results
    area = [float(m.sum()) for m in masks]
    c = curves["attnlrp (pixels)"]
    assert c["pointing_per_question"] == [1.0 if i % 2 == 0 else 0.0 for i in range(len(records))]
    assert c["mask_share_per_question"] == pytest.approx(
        [a / (a + (0.5 if i % 2 == 0 else 3.0)) for i, a in enumerate(area)], rel=1e-12
    )
    assert results["attnlrp (pixels)"]["pointing"] == pytest.approx(np.mean(c["pointing_per_question"]))
    assert results["attnlrp (pixels)"]["text_rank"] is None
    rng = np.random.default_rng(3)  # the random row's token scores are drawn first, then the pixels
    [rng.random(seen["T"]) for _ in records]
    noise = [torch.as_tensor(rng.random(seen["size"])) for _ in records]
    assert curves["random (pixels)"]["pointing_per_question"] == [vlm.pointing_hit(x, m) for x, m in zip(noise, masks)]
    assert curves["random (pixels)"]["mask_share_per_question"] == [vlm.mask_share(x, m) for x, m in zip(noise, masks)]


def test_the_default_methods_are_those_the_model_accepts(loaded, tiny, monkeypatch):
    """'all' on a VLM: every method the engine does not refuse for it (read from the adapter, so a method that
    becomes defined on VLMs joins), and explain refuses each one left out."""
    model, processor = tiny
    adapter = type(get_adapter(model))
    refused = dict(adapter.refused_methods)
    names = vlm.vlm_methods(model)
    assert {"input_x_gradient", "integrated_gradients", "lrp", "attnlrp", "cp_lrp", "token_ablation"} <= set(names)
    assert "pa_lrp" not in names and set(names) == set(METHODS) - set(refused)
    r = _records(1)[0]
    inputs = dict(processor(images=[r.image], text=[prompt(r.question)], return_tensors="pt"))
    for m in refused:
        with pytest.raises(UnsupportedModelError, match=f"method '{m}' is not defined"):
            explain(model, inputs, method=m, target=0)
    monkeypatch.setattr(
        adapter,
        "refused_methods",
        {**{k: v for k, v in refused.items() if k != "smoothgrad"}, "rollout": "refused for this test"},
    )
    assert "smoothgrad" in vlm.vlm_methods(model) and "rollout" not in vlm.vlm_methods(model)
    ran = {}

    def protocol(model, processor, records, methods, **kwargs):
        ran["methods"] = list(methods)
        return {}, {}, 1.0, 1

    monkeypatch.setattr(vlm, "vlm_protocol", protocol)
    evaluate(loaded, "all", n=2, progress=False)
    assert ran["methods"] == vlm.vlm_methods(model)
