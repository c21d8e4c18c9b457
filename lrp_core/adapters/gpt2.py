"""GPT-2 (Hugging Face ``GPT2LMHeadModel``, ``GPT2ForSequenceClassification``).

GPT-2's projections are ``Conv1D`` layers: a Linear whose weight is stored transposed, ``(D_in, D_out)``.
:class:`Conv1DLinear` shows one to the engine as a Linear without touching the model.
"""
from __future__ import annotations

from torch import Tensor, nn

from ..errors import UnsupportedModelError


class Conv1DLinear(nn.Module):
    """A read-only Linear view of a GPT-2 ``Conv1D`` (``y = x W + b`` with ``W`` (D_in, D_out)).

    ``weight`` is ``conv.weight.T`` — a view (D_out, D_in), no copy — and ``bias`` the conv's own, so the Linear
    rules (signed, baseline, plain gradient) read the facts they expect. The conv is not registered as a
    submodule: the view owns no parameters, and always reads the conv's current tensors (after ``model.double()``
    too). ``forward`` runs the conv itself, so the replay computes exactly what the model does and hooks the user
    put on the conv fire as they would.
    """

    def __init__(self, conv: nn.Module):
        super().__init__()
        weight = getattr(conv, "weight", None)
        if weight is None or weight.dim() != 2:
            raise UnsupportedModelError(f"expected a transformers Conv1D with a 2-D weight (D_in, D_out), got {conv!r}")
        object.__setattr__(self, "conv", conv)  # plain attribute: not a child module, no parameters of its own

    @property
    def weight(self) -> Tensor:
        """(D_out, D_in): the conv's weight transposed, a view sharing its storage (a new view object per access:
        a pass that caches weight parts by identity, ``Propagation(cache=True)``, is for shared layers only)."""
        return self.conv.weight.t()

    @property
    def bias(self) -> Tensor | None:
        """(D_out,): the conv's bias."""
        return self.conv.bias

    @property
    def in_features(self) -> int:
        return int(self.conv.weight.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.conv.weight.shape[1])

    def forward(self, x: Tensor) -> Tensor:
        """(..., D_in) -> (..., D_out), by the conv itself (``addmm`` of the model, bit for bit)."""
        return self.conv(x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, view of {self.conv!r}"


__all__ = ["Conv1DLinear"]
