"""The explorers' cache: one bounded LRU of explanations and everything derived from them.

An explanation is computed once per (sample, target, method, start_layer) key
and kept, with its partial layer products and the arrays each view showed, in
an :class:`ExplanationCache` of :data:`CACHE_SIZE` entries. Moving the block
slider, switching the head, the view or the sign only re-slices the cached
tensors (no forward or backward pass).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from . import _engine, views

#: Explanations kept (least recently used first out), each with its derived views.
CACHE_SIZE = 48


@dataclass
class Cached:
    """One explanation and everything a widget derives from it (evicted together)."""

    explanation: Any
    readout: _engine.SampleReadout  # how the engine reads the sample's matrices (block / accumulated views)
    products: Optional[views.LayerProducts] = None
    values: dict = field(default_factory=dict)  # (view, block, start, head) -> shown array

    def layer_products(self) -> views.LayerProducts:
        """The partial products (built on first use)."""
        if self.products is None:
            self.products = views.LayerProducts(self.explanation, self.readout)
        return self.products

    def view(self, view: str, block: int, start: int, head: Optional[int]) -> np.ndarray:
        """The signed values of one view (memoised: a view seen before costs a dictionary look-up)."""
        key = (view, block, start, head)
        if key not in self.values:
            if view == "accumulated":  # from the partial products: one vector-matrix product at most
                self.values[key] = self.layer_products().view(block, start, head)
            else:
                self.values[key] = views.view_map(
                    self.explanation, view, block=block, start=start, head=head, readout=self.readout
                )
        return self.values[key]


class ExplanationCache:
    """A least-recently-used map key -> :class:`Cached`, at most ``size`` entries."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._entries: "OrderedDict[tuple, Cached]" = OrderedDict()

    def __contains__(self, key: tuple) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry (e.g. the inputs changed)."""
        self._entries.clear()

    def get(self, key: tuple, compute: Callable[[], Cached]) -> Cached:
        """The entry for ``key``, made by ``compute()`` on a miss (then the oldest beyond ``size`` go)."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        self._entries[key] = entry = compute()
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return entry


__all__ = ["CACHE_SIZE", "Cached", "ExplanationCache"]
