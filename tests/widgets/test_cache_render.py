"""The explorers' explanation cache (widgets._cache) and title line (widgets._render), without a widget."""

from __future__ import annotations

from widgets._cache import ExplanationCache
from widgets._render import view_title


def test_cache_computes_once_and_evicts_the_least_recently_used():
    cache = ExplanationCache(size=2)
    made = []

    def maker(key):
        def compute():
            made.append(key)
            return f"entry {key}"

        return compute

    assert cache.get(("a",), maker("a")) == "entry a"
    assert cache.get(("b",), maker("b")) == "entry b"
    assert cache.get(("a",), maker("a")) == "entry a"  # a hit: not recomputed, now most recent
    cache.get(("c",), maker("c"))  # evicts b, the least recently used
    assert ("a",) in cache and ("c",) in cache and ("b",) not in cache and len(cache) == 2
    assert made == ["a", "b", "c"]
    cache.clear()
    assert len(cache) == 0 and ("a",) not in cache


def test_view_title_names_the_blocks_and_the_head_of_per_head_views():
    assert view_title("cat", "rollout", "output", 3, 1, 2) == "cat | rollout |"
    assert view_title("cat", "rollout", "accumulated", 3, 1, None) == "cat | rollout | blocks 1..3"
    assert view_title("cat", "lrp", "block", 2, 0, 5) == "cat | lrp | block 2, head 5"
    assert view_title("cat", "lrp", "residual", 4, 0, 5) == "cat | lrp | residual stream, block 4"
