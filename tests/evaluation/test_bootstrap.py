"""Paired bootstrap intervals of the paper's comparisons."""

import numpy as np
import pytest

from lrp_core.evaluation.bootstrap import comparison_table, paired_interval


def test_interval_of_a_constant_difference_is_that_difference():
    a = np.arange(50.0)
    mean, lo, hi = paired_interval(a + 2.0, a)
    assert mean == lo == hi == pytest.approx(2.0)


def test_undefined_cases_are_left_out_and_noise_gives_an_interval_around_the_mean():
    rng = np.random.default_rng(1)
    b = rng.normal(size=400)
    a = b + 1.0 + rng.normal(scale=0.5, size=400)
    a[:10] = np.nan
    mean, lo, hi = paired_interval(a, list(b[:5]) + [None] * 0 + list(b[5:]))
    assert lo < mean < hi and lo > 0.85 and hi < 1.15
    assert mean == pytest.approx(np.nanmean(a - b))


def test_table_rows_for_present_baselines():
    c = {
        m: {"positive_predicted_auc_per_image": [1.0, 2.0, 3.0], "deletion_order_per_case": [1.0, None, 0.0]}
        for m in ("transformer_attribution", "rollout")
    }
    t = comparison_table(c)
    assert "| rollout | +0.00 [+0.00, +0.00] | +0.000 [+0.000, +0.000] |" in t


def test_every_method_of_the_run_gets_a_row_paper_baselines_first_random_last():
    """token_ablation, cdam, pa_lrp and the Captum baselines were once left out of the table."""
    names = (
        "transformer_attribution",
        "kernel_shap",
        "token_ablation",
        "attnlrp",
        "cdam",
        "rollout",
        "pa_lrp",
        "random",
    )
    c = {m: {"evidence_ap_per_prompt": [float(i), 1.0, 0.5]} for i, m in enumerate(names)}
    rows = [line.split(" | ")[0][2:] for line in comparison_table(c, kind="lm").splitlines()[2:]]
    assert rows == ["rollout", "attnlrp", "kernel_shap", "token_ablation", "cdam", "pa_lrp", "random"]


def test_swapping_the_methods_negates_the_interval():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=80), rng.normal(size=80)
    mean, lo, hi = paired_interval(a, b)
    assert paired_interval(b, a) == pytest.approx((-mean, -hi, -lo))


def test_pooled_miou_is_recomputed_on_each_resample():
    from lrp_core.evaluation.bootstrap import paired_statistic_interval
    from lrp_core.metrics import pooled_miou

    same = [[1, 2, 3, 4], [2, 2, 1, 3]]
    assert paired_statistic_interval(same, same, pooled_miou) == (0.0, 0.0, 0.0)
    better = [[2, 2, 4, 4], [2, 2, 3, 3]]  # perfect segmentation
    mean, lo, hi = paired_statistic_interval(better, same, pooled_miou)
    assert mean == pytest.approx(1.0 - float(pooled_miou(same)))
    assert 0.0 < lo <= mean <= hi
    c = {
        m: {"segmentation_iou_counts_per_image": v} for m, v in (("transformer_attribution", better), ("rollout", same))
    }
    assert f"| rollout | {mean:+.3f}" in comparison_table(c)


def _tiny_text_run():
    """A tiny BERT, two documents: the text protocol with its per-document values."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    from lrp_core import evaluation as E

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "was", "great", "plot", "dull", "."]
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=len(vocab),
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            num_labels=2,
            max_position_embeddings=32,
        )
    ).eval()
    texts = [
        ("the film was great .", [0, 0, 0, 1, 0], 1),
        ("the plot was dull", [0, 1, 0, 1], 0),
        ("the film was dull .", [0, 0, 0, 0, 0], 0),
    ]
    data = E.TextSet([E.RationaleRecord(t, t.split(), np.array(g, bool), y) for t, g, y in texts])
    curves: dict = {}
    res, skipped = E.evaluate_text(
        model, tok, data, ["transformer_attribution", "rollout"], ks=(1,), progress=False, baseline=True, curves=curves
    )
    assert skipped == []
    return res, curves


def test_text_mode_per_document_values_and_table(tmp_path, capsys):
    import json

    from lrp_core.evaluation.bootstrap import main

    res, curves = _tiny_text_run()
    assert set(curves) == {"transformer_attribution", "rollout", "random"}
    for m, c in curves.items():
        f1 = c["f1_gold_per_document"]
        assert len(f1) == 3 and f1[2] is None  # no rationale words
        assert abs(np.mean(f1[:2]) - res[m]["token_f1@gold"]) < 1e-9
        for k in ("comprehensiveness", "sufficiency"):
            assert len(c[f"{k}_per_document"]) == 3
            assert abs(np.mean(c[f"{k}_per_document"]) - res[m][k]) < 1e-9
    meta = tmp_path / "run.meta.json"
    meta.write_text(json.dumps({"kind": "text", "curves": curves}))
    main([str(meta)])
    out = capsys.readouterr().out
    assert "| transformer_attribution − method | F1@gold ↑ | comprehensiveness ↑ | sufficiency ↓ |" in out
    assert "| rollout | " in out and "| random | " in out
    assert out.count("\n") == 4
