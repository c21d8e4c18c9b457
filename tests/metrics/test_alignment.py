"""Alignment metrics on hand-made maps with known answers: top-1 links, thresholds, AER (Och & Ney, S = P)."""

import numpy as np
import pytest
import torch

from lrp_core import metrics
from lrp_core.errors import InputError


def _case():
    """Two sentences; sentence 0: 3 target words over 4 source words (word 2 unaligned: not scored);
    sentence 1: 2 target words over 3 source words, the last source position is padding."""
    gold = torch.zeros(2, 3, 4, dtype=torch.bool)
    gold[0, 0, 1] = gold[0, 1, 0] = True
    gold[1, 0, 2] = gold[1, 1, 0] = gold[1, 1, 1] = True  # target word 1 of sentence 1 has two gold links
    scored = gold.any(-1)
    candidates = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    return gold, scored, candidates


def test_a_perfect_map_scores_top1_one_and_aer_zero_when_each_word_has_one_link():
    gold, scored, cand = _case()
    gold[1, 1, 1] = False  # one link per word
    maps = gold.double() * 5 + 0.01 * torch.rand(gold.shape, generator=torch.Generator().manual_seed(0))
    acc = metrics.top1_accuracy_per_sentence(maps, gold, scored, cand)
    assert acc.tolist() == [1.0, 1.0]
    assert metrics.alignment_error_rate(metrics.top1_links(maps, cand), gold, scored) == 0.0
    assert metrics.alignment_error_rate(metrics.threshold_links(maps, cand), gold, scored) == 0.0


def test_aer_counts_by_hand():
    gold, scored, cand = _case()
    maps = torch.zeros(2, 3, 4, dtype=torch.float64)
    maps[0, 0, 1] = 1  # right
    maps[0, 1, 3] = 1  # wrong
    maps[1, 0, 2] = 1  # right
    maps[1, 1, 1] = 1  # right (one of its two links)
    links = metrics.top1_links(maps, cand)
    counts = metrics.alignment_counts(links, gold, scored)
    assert counts.tolist() == [[1, 2, 2], [2, 2, 3]]  # [|A∩G|, |A|, |G|]; unscored word 2 of sentence 0 ignored
    assert metrics.aer_from_counts(counts) == pytest.approx(1 - 2 * 3 / (4 + 5))
    assert metrics.top1_accuracy_per_sentence(maps, gold, scored, cand).tolist() == [0.5, 1.0]


def test_ties_go_to_the_lowest_position_and_padding_is_never_linked():
    gold, scored, cand = _case()
    maps = torch.zeros(2, 3, 4, dtype=torch.float64)
    maps[1, :, 3] = 100.0  # the padding position of sentence 1 scores highest: never a link
    links = metrics.top1_links(maps, cand)
    assert links[0].nonzero()[:, 1].tolist() == [0, 0, 0]  # all zeros: the first position
    assert not links[1, :, 3].any() and links[1].sum() == 3


def test_threshold_links_take_every_word_above_the_share_of_the_largest():
    cand = torch.ones(1, 4, dtype=torch.bool)
    maps = torch.tensor([[[1.0, 0.6, 0.4, -2.0]]], dtype=torch.float64)
    assert metrics.threshold_links(maps, cand, rel=0.5)[0, 0].tolist() == [True, True, False, False]
    assert not metrics.threshold_links(-maps.abs(), cand).any()  # no positive score: no link
    with pytest.raises(InputError, match="rel"):
        metrics.threshold_links(maps, cand, rel=0.0)


def test_aer_pools_over_a_leading_resample_axis():
    counts = np.array([[[1, 2, 2], [2, 2, 3]], [[2, 2, 2], [2, 2, 2]]])  # (R=2, N=2, 3)
    assert metrics.aer_from_counts(counts).tolist() == pytest.approx([1 - 6 / 9, 0.0])


def test_shapes_and_gold_outside_the_candidates_are_refused():
    gold, scored, cand = _case()
    with pytest.raises(InputError, match="maps"):
        metrics.top1_accuracy_per_sentence(torch.zeros(2, 3, 5), gold, scored, cand)
    gold[1, 0, 3] = True  # a gold link on padding
    with pytest.raises(InputError, match="candidate"):
        metrics.alignment_scores(torch.zeros(2, 3, 4), gold, gold.any(-1), cand)
