"""The type of a model's parts as an adapter reads them.

An adapter reads the user's model by attribute name (``model.vit.encoder.layer[i].attention.query``): a Hugging
Face, timm or peft module whose attributes torch's stubs type as ``Tensor | Module`` (``nn.Module.__getattr__``),
and whose classes the adapter does not import (transformers and timm load lazily; peft is never imported). The
parts are duck-typed on purpose: a ``Linear``, a GPT-2 ``Conv1D`` view or a peft LoRA layer all serve as a
projection. Each adapter checks the layout it reads and refuses another with
:class:`~lrp_core.errors.UnsupportedModelError` naming what does not match.
"""

from __future__ import annotations

from typing import Any

from torch import nn

#: a module of the user's model (or the model itself), read by attribute name; see the module docstring
ModelPart = Any
#: a part the model does not have (a norm, a LayerScale, a q/k norm): the replay skips identities
IDENTITY = nn.Identity()

__all__ = ["ModelPart", "IDENTITY"]
