"""The evaluation runner (lrp_core.evaluate): data loading, the text pipeline, end to end."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from lrp_core import evaluate as E
from lrp_core.errors import InputError, UnknownMethodError


def tiny_vit(num_classes: int = 6):
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(0)
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                             num_classes=num_classes).eval()


def quadrant_sets(n: int = 6):
    """Random images with object a in the top-left and object b in the bottom-right quadrant."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 3, 32, 32, generator=g)
    masks = torch.zeros(n, 2, 32, 32, dtype=torch.bool)
    masks[:, 0, :16, :16] = True
    masks[:, 1, 16:, 16:] = True
    labels2 = torch.stack([torch.arange(n) % 6, (torch.arange(n) + 1) % 6], dim=1)
    return x, masks, labels2


# --------------------------------------------------------------------------
# image evaluation on a tiny random ViT (real engine)
# --------------------------------------------------------------------------
def test_evaluate_images_tiny_vit():
    model = tiny_vit()
    x, masks, labels2 = quadrant_sets()
    pred = E.predict(model, x)
    one = E.ImageSet(x, pred.view(-1, 1), masks[:, :1])     # true label = prediction
    two = E.ImageSet(x, labels2, masks)
    methods = ["transformer_attribution", "rollout", "raw_attention", "cdam"]
    res, curves = E.evaluate_images(model, one, two, methods, batch_size=4, progress=False,
                                    baseline=True)
    assert res.pop("random")["class_map_correlation"] == 1.0   # a random map knows no class
    curves.pop("random")
    assert list(res) == methods
    for m, r in res.items():
        assert set(r) == set(E.IMAGE_METRICS)
        for k in ("perturbation_positive_auc_predicted", "perturbation_negative_auc_target"):
            assert 0.0 <= r[k] <= 90.0
        # the labels are the predictions: both targets give the same maps and AUCs
        assert r["perturbation_positive_auc_target"] == r["perturbation_positive_auc_predicted"]
        assert r["perturbation_negative_auc_target"] == r["perturbation_negative_auc_predicted"]
        # clean accuracy is 1 (labels = predictions)
        assert curves[m]["positive_predicted"][0] == 1.0
        per_image = curves[m]["positive_predicted_auc_per_image"]
        assert len(per_image) == 6
        assert np.mean(per_image) == pytest.approx(r["perturbation_positive_auc_predicted"],
                                                   abs=0.01)
        assert 0.0 <= r["pixel_accuracy"] <= 1.0 and 0.0 <= r["miou"] <= 1.0
        assert 0.0 <= r["class_sensitivity"] <= 1.0
        if m != "cdam":
            assert r["cdam_sparsity"] is None and r["tam_correlation"] is None
    # class-agnostic methods: identical maps for both classes
    for m in ("rollout", "raw_attention"):
        assert res[m]["class_map_correlation"] == pytest.approx(1.0, abs=1e-9)
    assert res["transformer_attribution"]["class_map_correlation"] < 0.999
    assert 0.0 <= res["cdam"]["cdam_sparsity"] <= 1.0
    assert -1.0 <= res["cdam"]["tam_correlation"] <= 1.0


def test_true_class_maps_are_recomputed_only_where_needed(monkeypatch):
    model = tiny_vit()
    x, masks, _ = quadrant_sets(4)
    pred = E.predict(model, x)
    truth = pred.clone()
    truth[1] = (pred[1] + 1) % 6
    calls = []
    real = E._explain

    def spy(model, inputs, method, target):
        calls.append(None if target is None else target.tolist())
        return real(model, inputs, method, target)

    monkeypatch.setattr(E, "_explain", spy)
    one = E.ImageSet(x, truth.view(-1, 1), masks[:, :1])
    res, _ = E.evaluate_images(model, one, None, ["transformer_attribution"], batch_size=8,
                               progress=False)
    assert calls == [None, [int(truth[1])]]
    assert res["transformer_attribution"]["class_sensitivity"] is None
    # the merged curve equals the one computed from scratch with the true-class maps
    direct = E.image_maps(model, x, "transformer_attribution", truth)[0]
    from lrp_core import metrics as M
    for sign in ("positive", "negative"):
        acc = M.perturbation_curve(model, x, direct, truth, negative=sign == "negative")
        assert res["transformer_attribution"][f"perturbation_{sign}_auc_target"] == (
            pytest.approx(M.perturbation_auc(acc)))


def test_cdam_reuses_token_ablation_and_keeps_the_order(monkeypatch):
    model = tiny_vit()
    x, masks, _ = quadrant_sets(3)
    one = E.ImageSet(x, None, masks[:, :1])
    seen = []
    real = E._explain
    monkeypatch.setattr(E, "_explain", lambda m, i, method, t: (seen.append(method),
                                                                real(m, i, method, t))[1])
    res, _ = E.evaluate_images(model, one, None, ["cdam", "token_ablation"], batch_size=8,
                               progress=False)
    assert list(res) == ["cdam", "token_ablation"]
    assert seen == ["token_ablation", "cdam"]            # no second token_ablation pass
    assert res["cdam"]["perturbation_positive_auc_target"] is None   # no labels


# --------------------------------------------------------------------------
# the text pipeline, with a fake explainer whose scores are known
# --------------------------------------------------------------------------
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "was", "great", "plot",
         "un", "##watch", "##able", "."]


@pytest.fixture()
def tokenizer():
    from transformers import BertTokenizerFast
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(VOCAB)}, do_lower_case=True)


# score of each vocabulary entry; specials score highest and must be ignored
TOKEN_SCORE = {"[CLS]": 100.0, "[SEP]": 100.0, "[PAD]": 0.0, "the": 1.0, "film": 3.0,
               "was": 1.5, "great": 4.0, "plot": 2.0, "un": 0.0, "##watch": 5.0, "##able": 0.0,
               ".": 0.5}


def fake_explain(tokenizer):
    ids = tokenizer.convert_tokens_to_ids(list(TOKEN_SCORE))
    table = torch.zeros(len(VOCAB))
    table[ids] = torch.tensor(list(TOKEN_SCORE.values()))

    def explain(model, inputs, method, target):
        return SimpleNamespace(scores=table[inputs["input_ids"]])
    return explain


def test_text_pipeline_hand_computed(monkeypatch, tokenizer):
    monkeypatch.setattr(E, "_explain", fake_explain(tokenizer))
    data = E.TextSet([
        E.TextRecord("The film was great.", ["The", "film", "was", "great", "."],
                     np.array([0, 0, 0, 1, 0], bool), 1),
        E.TextRecord("the plot was unwatchable", ["the", "plot", "was", "unwatchable"],
                     np.array([0, 0, 0, 1], bool), 0),
    ])
    ws, ts = E.text_word_scores(None, tokenizer, data.records, "x", batch_size=2)
    np.testing.assert_allclose(ws[0], [1.0, 3.0, 1.5, 4.0, 0.5])
    np.testing.assert_allclose(ws[1], [1.0, 2.0, 1.5, 5.0])     # max over un ##watch ##able
    assert len(ts[0]) == 5 and len(ts[1]) == 6                   # specials, padding dropped
    res, skipped = E.evaluate_text(None, tokenizer, data, ["x"], ks=(1, 2, 10), progress=False,
                                   baseline=True)
    r = res["x"]
    # every word is taken at k=10, whatever the ranking: the random row agrees
    assert list(res) == ["x", "random"]
    assert res["random"]["token_f1@10"] == pytest.approx(r["token_f1@10"])
    assert skipped == []
    assert r["token_f1@1"] == pytest.approx(1.0)                 # great; unwatchable
    # k=2: {great, film} and {unwatchable, plot}: P=1/2, R=1, F1=2/3 each
    assert r["token_f1@2"] == pytest.approx(2 / 3)
    assert r["token_precision@2"] == pytest.approx(0.5)
    # k=10 takes every word: P = 1/5 and 1/4, R = 1 -> F1 = 1/3 and 2/5
    assert r["token_f1@10"] == pytest.approx((1 / 3 + 0.4) / 2)
    assert r["token_recall@10"] == 1.0
    assert r["cdam_sparsity"] is None
    # k = |gold| = 1: great, unwatchable are both top-1 -> 1
    assert r["token_f1@gold"] == 1.0


def test_text_evaluation_tiny_bert_real_engine(tokenizer):
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=32, num_labels=2,
                     max_position_embeddings=32)
    model = BertForSequenceClassification(cfg).eval()
    data = E.TextSet([E.TextRecord("the film was great", "the film was great".split(),
                                   np.array([0, 0, 0, 1], bool), 1),
                      E.TextRecord("the plot was unwatchable .",
                                   "the plot was unwatchable .".split(),
                                   np.array([0, 0, 0, 1, 0], bool), 0)])
    res, skipped = E.evaluate_text(model, tokenizer, data, ["transformer_attribution", "rollout"],
                                   ks=(1, 10), progress=False)
    assert set(res) | {s.split(":")[0] for s in skipped} == {"transformer_attribution",
                                                             "rollout"}
    for r in res.values():
        assert 0.0 <= r["token_f1@1"] <= 1.0
        assert r["token_recall@10"] == 1.0      # every word taken


# --------------------------------------------------------------------------
# data folders
# --------------------------------------------------------------------------
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
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
            tmp_path / "images" / f"{name}.png")
        m = np.zeros((64, 64), np.uint8)
        m[8 + 8 * i:40, 16:48] = 255                       # even-aligned: exact after /2
        Image.fromarray(m).save(tmp_path / "masks" / f"{name}.png")
        truth.append(m[::2, ::2][4:28, 4:28] > 0)
    (tmp_path / "labels.csv").write_text("name,label\na.png,2\nb,dog\n")
    ds = E.load_data_folder(tmp_path, "image", _preprocess, labels=["cat", "fish", "bird", "dog"])
    assert ds.images.shape == (2, 3, 24, 24)
    assert ds.labels.tolist() == [[2], [3]]
    assert ds.masks.shape == (2, 1, 24, 24)
    assert np.array_equal(ds.masks[:, 0].numpy(), np.stack(truth))
    (tmp_path / "labels.csv").unlink()
    assert E.load_data_folder(tmp_path, "image", _preprocess).labels is None
    (tmp_path / "masks" / "b.png").unlink()
    with pytest.raises(InputError, match="no mask"):
        E.load_data_folder(tmp_path, "image", _preprocess)


def test_eraser_and_jsonl_folders(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "negR_1.txt").write_text("a dull ,\nlifeless film .\n")
    ann = {"annotation_id": "negR_1.txt", "classification": "NEG", "query": "?",
           "evidences": [[{"docid": "negR_1.txt", "start_token": 1, "end_token": 2,
                           "text": "dull"}],
                         [{"docid": "negR_1.txt", "start_token": 3, "end_token": 4,
                           "text": "lifeless"}]]}
    (tmp_path / "val.jsonl").write_text(json.dumps(ann) + "\n")
    ds = E.load_data_folder(tmp_path, "text", labels=["negative", "positive"])
    (rec,) = ds.records
    assert rec.words == ["a", "dull", ",", "lifeless", "film", "."]
    assert rec.rationale.tolist() == [False, True, False, True, False, False]
    assert rec.label == 0
    simple = tmp_path / "simple"
    simple.mkdir()
    (simple / "rationales.jsonl").write_text(json.dumps(
        {"words": ["so", "good"], "rationale": [0, 1], "label": "positive"}) + "\n")
    (rec,) = E.load_data_folder(simple, "text", labels=["negative", "positive"]).records
    assert (rec.text, rec.label, rec.rationale.tolist()) == ("so good", 1, [False, True])
    with pytest.raises(InputError):
        E.load_data_folder(tmp_path / "nowhere", "text")


def test_method_names_and_tables():
    assert E.resolve_methods("rollout, cdam") == ["rollout", "cdam"]
    assert len(E.resolve_methods("all")) == 9
    with pytest.raises(UnknownMethodError, match="choose from"):
        E.resolve_methods("rollout,gradcam++")
    table = E.format_table({"rollout": {"miou": 0.5, "cdam_sparsity": None}}, markdown=True)
    assert table.splitlines()[2] == "| rollout | 0.500 | — |"


# --------------------------------------------------------------------------
# end to end on the embedded toy ViT (the CI check of the command line)
# --------------------------------------------------------------------------
def test_command_line_toy_vit(tmp_path, capsys):
    pytest.importorskip("lrp_core.models.toy_vit")
    out = tmp_path / "r" / "toy.json"
    threads = torch.get_num_threads()
    try:  # one thread: fastest on a busy CI machine
        rc = E.main(["--model", "toy-vit", "--methods", "transformer_attribution,rollout,cdam",
                     "--n", "16", "--batch-size", "16", "--quiet", "--threads", "1",
                     "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    res = json.loads(out.read_text())
    assert list(res) == ["transformer_attribution", "rollout", "cdam", "random"]
    meta = json.loads((out.parent / "toy.meta.json").read_text())
    assert meta["n"] == 16 and meta["seed"] == E.SCENE_SEED and 0 <= meta["accuracy"] <= 1
    assert res["cdam"]["cdam_sparsity"] is not None and res["rollout"]["cdam_sparsity"] is None
    assert res["rollout"]["class_map_correlation"] == pytest.approx(1.0)
    for r in res.values():
        assert all(v is None or math.isfinite(v) for v in r.values())
    assert (out.parent / "perturbation_toy-vit.png").stat().st_size > 1000
    assert "transformer_attribution" in capsys.readouterr().out


def test_command_line_reports_bad_input(capsys):
    assert E.main(["--model", "toy-vit", "--methods", "nope", "--quiet"]) == 2
    assert "unknown method" in capsys.readouterr().err
