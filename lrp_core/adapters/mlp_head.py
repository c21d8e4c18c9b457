"""A classifier that is a small MLP, read as the head layers of a readout (docs/METHODS.md §2h, §1).

Users replace a model's classifier with an ``nn.Sequential`` — ``Sequential(Linear, ReLU, Dropout, Linear)``,
a LayerNorm before the Linear — on a BERT's ``classifier``, a timm ViT's ``head``, a Hugging Face ViT's
``classifier`` or a decoder's ``score``. :func:`head_layers` expands such a module into the readout's
:class:`~lrp_core.adapters.readouts.HeadLayer` list, each layer the model's own module under §1's rules:

* a Linear (or a Linear-like view: peft, Conv1D) — the Linear rule (ε / gradient);
* an element-wise activation with ``f(0) = 0`` (ReLU, GELU, tanh, SiLU, …) — the identity rule, as for the FFN
  activation (a sigmoid is refused: its identity rule ``f(x)/x`` is unbounded at 0);
* a LayerNorm — the LayerNorm rule;
* Dropout and Identity — nothing (inference), so they are left out.

Anything else inside the Sequential is refused by name: the replay would not be the model.
"""

from __future__ import annotations

from torch import nn

from ..errors import UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.ops import ELEMENTWISE, LAYERNORM, LINEAR
from .parts import ModelPart
from .readouts import HeadLayer

#: the element-wise activations a head may hold (each its own module: the replay calls it)
ACTIVATIONS: tuple[type, ...] = (
    nn.ReLU,
    nn.GELU,
    nn.Tanh,
    nn.SiLU,
    nn.LeakyReLU,
    nn.ELU,
    nn.Mish,
)
#: layers that compute nothing at inference
PASSIVE: tuple[type, ...] = (nn.Dropout, nn.Identity)


def _is_activation(module: ModelPart) -> bool:
    """A torch activation, or a transformers activation module (``GELUActivation``, ``ACT2FN[...]``)."""
    if isinstance(module, ACTIVATIONS):
        return True
    return type(module).__module__.startswith("transformers.activations")


def head_layers(module: ModelPart, where: str) -> list[HeadLayer]:
    """The head layers of a classifier: one Linear, or an ``nn.Sequential`` of Linear / activation / Dropout /
    LayerNorm (nested Sequentials flattened), in forward order.

    Parameters
    ----------
    module : nn.Module
        The model's classifier (``model.classifier``, ``model.head``, ``model.score``, …).
    where : str
        How to name it in a refusal (``"BertForSequenceClassification.classifier"``).

    Returns
    -------
    list[HeadLayer]
        The layers, Dropout and Identity left out; the last is the Linear that gives the logits.

    Raises
    ------
    UnsupportedModelError
        Naming the first layer that is none of these, or a head whose last computing layer is not a Linear.
    """
    if is_linear(module):
        return [HeadLayer(LINEAR, module)]
    if not isinstance(module, nn.Sequential):
        raise UnsupportedModelError(
            f"{where} is a {type(module).__name__}: a classifier is read as a Linear layer or an nn.Sequential "
            "of Linear, activation (ReLU, GELU, tanh, SiLU, ...), Dropout and LayerNorm layers"
        )
    out: list[HeadLayer] = []
    for name, layer in module.named_children():
        if isinstance(layer, nn.Sequential):
            out += head_layers(layer, f"{where}.{name}")
        elif is_linear(layer):
            out.append(HeadLayer(LINEAR, layer))
        elif isinstance(layer, nn.LayerNorm):
            out.append(HeadLayer(LAYERNORM, layer))
        elif _is_activation(layer):
            out.append(HeadLayer(ELEMENTWISE, layer))
        elif not isinstance(layer, PASSIVE):
            raise UnsupportedModelError(
                f"{where}.{name} is a {type(layer).__name__}: an MLP head is explained layer by layer and may hold "
                "Linear, activation (ReLU, GELU, tanh, SiLU, ...), Dropout and LayerNorm layers only"
            )
    if not out or out[-1].kind != LINEAR:
        raise UnsupportedModelError(f"{where}: an MLP head must end with the Linear layer that gives the logits")
    return out


def is_head(module: ModelPart) -> bool:
    """Whether ``module`` is a Linear or an ``nn.Sequential`` (a candidate for :func:`head_layers`)."""
    return is_linear(module) or isinstance(module, nn.Sequential)


__all__ = ["ACTIVATIONS", "PASSIVE", "head_layers", "is_head"]
