"""Qwen2-MoE decoders: ``Qwen2MoeForCausalLM`` and ``Qwen2MoeForSequenceClassification``.

Qwen2's attention (q/k/v biases, sliding windows on the layers ``config.layer_types`` marks) and a
mixture-of-experts MLP (docs/METHODS.md §2c.4) with a shared expert: every token also goes through
``mlp.shared_expert`` (a gated MLP), weighted by ``sigmoid(mlp.shared_expert_gate(x))`` — one more summand,
its gate a routing weight of its own.
"""

from __future__ import annotations

from torch import nn

from ..errors import UnsupportedModelError
from .blocks import MlpSpec, MoeSpec
from .moe import MoeDecoderAdapter
from .parts import ModelPart


class Qwen2MoeAdapter(MoeDecoderAdapter):
    """Hugging Face Qwen2-MoE decoders (eager or sdpa attention)."""

    family = "Qwen2-MoE"

    def _shared(self, mlp: ModelPart, spec: MoeSpec) -> None:
        shared, gate = mlp.shared_expert, mlp.shared_expert_gate
        if not isinstance(gate, nn.Linear) or gate.out_features != 1:
            raise UnsupportedModelError(f"mlp.shared_expert_gate ({type(gate).__name__}) is not a Linear to one logit")
        spec.shared = MlpSpec(gate=shared.gate_proj, fc1=shared.up_proj, act=shared.act_fn, fc2=shared.down_proj)
        spec.shared_gate = gate


__all__ = ["Qwen2MoeAdapter"]
