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
    c = {m: {"positive_predicted_auc_per_image": [1.0, 2.0, 3.0],
             "deletion_order_per_case": [1.0, None, 0.0]} for m in ("transformer_attribution", "rollout")}
    t = comparison_table(c)
    assert "| rollout | +0.00 [+0.00, +0.00] | +0.000 [+0.000, +0.000] |" in t
