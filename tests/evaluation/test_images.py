"""The image protocols (lrp_core.evaluation.images) on a tiny random ViT (real engine)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lrp_core import evaluation as E
from lrp_core.evaluation import batching


def tiny_vit(num_classes: int = 6):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=num_classes
    ).eval()


def quadrant_sets(n: int = 6):
    """Random images with object a in the top-left and object b in the bottom-right quadrant."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 3, 32, 32, generator=g)
    masks = torch.zeros(n, 2, 32, 32, dtype=torch.bool)
    masks[:, 0, :16, :16] = True
    masks[:, 1, 16:, 16:] = True
    labels2 = torch.stack([torch.arange(n) % 6, (torch.arange(n) + 1) % 6], dim=1)
    return x, masks, labels2


def test_evaluate_images_tiny_vit():
    model = tiny_vit()
    x, masks, labels2 = quadrant_sets()
    pred = E.predict(model, x)
    one = E.ImageSet(x, pred.view(-1, 1), masks[:, :1])  # true label = prediction
    two = E.ImageSet(x, labels2, masks)
    methods = ["transformer_attribution", "rollout", "raw_attention", "cdam"]
    res, curves = E.evaluate_images(model, one, two, methods, batch_size=4, progress=False, baseline=True)
    assert res.pop("random")["class_map_correlation"] == 1.0  # a random map knows no class
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
        assert np.mean(per_image) == pytest.approx(r["perturbation_positive_auc_predicted"], abs=0.01)
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
    real = batching.explain_batch

    def spy(model, inputs, method, target):
        calls.append(None if target is None else target.tolist())
        return real(model, inputs, method, target)

    monkeypatch.setattr(batching, "explain_batch", spy)
    one = E.ImageSet(x, truth.view(-1, 1), masks[:, :1])
    res, _ = E.evaluate_images(model, one, None, ["transformer_attribution"], batch_size=8, progress=False)
    assert calls == [None, [int(truth[1])]]
    assert res["transformer_attribution"]["class_sensitivity"] is None
    # the merged curve equals the one computed from scratch with the true-class maps
    direct = E.image_maps(model, x, "transformer_attribution", truth)[0]
    from lrp_core import metrics as M

    for sign in ("positive", "negative"):
        acc = M.perturbation_curve(model, x, direct, truth, negative=sign == "negative")
        assert res["transformer_attribution"][f"perturbation_{sign}_auc_target"] == (
            pytest.approx(M.perturbation_auc(acc))
        )


def test_cdam_reuses_token_ablation_and_keeps_the_order(monkeypatch):
    model = tiny_vit()
    x, masks, _ = quadrant_sets(3)
    one = E.ImageSet(x, None, masks[:, :1])
    seen = []
    real = batching.explain_batch
    monkeypatch.setattr(
        batching, "explain_batch", lambda m, i, method, t: (seen.append(method), real(m, i, method, t))[1]
    )
    res, _ = E.evaluate_images(model, one, None, ["cdam", "token_ablation"], batch_size=8, progress=False)
    assert list(res) == ["cdam", "token_ablation"]
    assert seen == ["token_ablation", "cdam"]  # no second token_ablation pass
    assert res["cdam"]["perturbation_positive_auc_target"] is None  # no labels


def test_deletion_check_is_wired_into_the_image_protocol():
    """With removed-object scenes the run reports the deletion metrics and per-case values."""
    model = tiny_vit()
    x, masks, labels2 = quadrant_sets()
    removed = x.unsqueeze(1).repeat(1, 2, 1, 1, 1)
    removed[:, 0, :, :16, :16] = 0.0
    removed[:, 1, :, 16:, 16:] = 0.0
    one = E.ImageSet(x, None, masks[:, :1])
    two = E.ImageSet(x, labels2, masks, removed)
    res, curves = E.evaluate_images(
        model, one, two, ["rollout", "transformer_attribution"], batch_size=4, progress=False, baseline=True
    )
    from lrp_core import metrics as M

    drops = M.deletion_drops(model, x, removed, labels2)
    for m, r in res.items():
        assert 0.0 <= r["deletion_order"] <= 1.0 and 0.0 <= r["deletion_distraction"] <= 1.0
        assert -1.0 <= r["deletion_correlation"] <= 1.0
        c = curves[m]
        assert len(c["deletion_order_per_case"]) == 12 and len(c["deletion_shares"]) == 12
        # the stored drops are those of class j (case j*N + i) for each removed object
        np.testing.assert_allclose(c["deletion_drops"][:6], drops[:, 0].numpy(), atol=1e-4)
        np.testing.assert_allclose(c["deletion_drops"][6:], drops[:, 1].numpy(), atol=1e-4)
        # distraction = the share on the object of the other class
        sh = np.array(c["deletion_shares"], dtype=float)
        np.testing.assert_allclose(c["deletion_distraction_per_case"][:6], sh[:6, 1], atol=1e-4)
        np.testing.assert_allclose(c["deletion_distraction_per_case"][6:], sh[6:, 0], atol=1e-4)
    # rollout knows no class: the same shares for both classes of a scene
    sh = np.array(curves["rollout"]["deletion_shares"], dtype=float)
    np.testing.assert_allclose(sh[:6], sh[6:], atol=1e-4)
    # without removed scenes the metrics are not applicable
    res2, _ = E.evaluate_images(model, one, E.ImageSet(x, labels2, masks), ["rollout"], batch_size=4, progress=False)
    assert res2["rollout"]["deletion_order"] is None


def test_per_image_values_average_to_the_results():
    """The meta's per-image lists (bootstrap) reproduce the reported metrics."""
    from lrp_core import metrics as M

    model = tiny_vit()
    x, masks, _ = quadrant_sets()
    labels = (E.predict(model, x) + 1) % 6  # true class != predicted
    one = E.ImageSet(x, labels.view(-1, 1), masks[:, :1])
    res, curves = E.evaluate_images(
        model, one, None, ["transformer_attribution"], batch_size=8, progress=False, baseline=True
    )
    for m in ("transformer_attribution", "random"):
        r, c = res[m], curves[m]
        for sign in ("positive", "negative"):
            for which in ("predicted", "target"):
                per = c[f"{sign}_{which}_auc_per_image"]
                assert len(per) == 6  # rounded to 2 digits in the meta
                assert np.mean(per) == pytest.approx(r[f"perturbation_{sign}_auc_{which}"], abs=0.006)
        pa = c["segmentation_pixel_accuracy_per_image"]
        assert len(pa) == 6 and abs(np.mean(pa) - r["pixel_accuracy"]) < 1e-9
        ap = c["segmentation_ap_per_image"]
        assert len(ap) == 6 and abs(np.mean([a for a in ap if a is not None]) - r["map"]) < 1e-9
        counts = c["segmentation_iou_counts_per_image"]
        assert np.shape(counts) == (6, 4)
        assert abs(float(M.pooled_miou(counts)) - r["miou"]) < 1e-9  # pooled: recomputed


def test_segmentation_per_image_by_hand():
    from lrp_core import metrics as M

    maps = torch.zeros(2, 2, 2)
    maps[0, 0, 0] = 1.0  # predicts pixel (0, 0)
    maps[1, 1, 1] = 1.0  # predicts pixel (1, 1)
    masks = torch.zeros(2, 2, 2, dtype=torch.bool)
    masks[:, 0, 0] = True
    per = M.segmentation_per_image(maps, masks)
    np.testing.assert_allclose(per["pixel_accuracy"], [1.0, 0.5])
    assert per["iou_counts"].tolist() == [[1, 1, 3, 3], [0, 2, 2, 4]]
    seg = M.segmentation_scores(maps, masks)
    assert float(M.pooled_miou(per["iou_counts"])) == pytest.approx(seg["miou"])
    assert seg["miou"] == pytest.approx((1 / 3 + 5 / 7) / 2)
    assert np.mean(per["ap"]) == pytest.approx(seg["map"])
