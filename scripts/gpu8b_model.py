"""The GPU table's model, built alike in every process: a random Llama-3-8B-shaped decoder, seeded, on the device.

Imports torch, transformers and (for the 4-bit copy) bitsandbytes only — never ``lrp_core`` nor LXT — so that the
lrp_core worker and the LXT worker of ``scripts/bench_gpu_llama8b.py`` build the same weights from the same seed.

* :data:`SHAPES` — ``"8b"``: D 4096, 32 blocks, 32 query / 8 key-value heads (head 128), MLP 14336, vocabulary
  128,256, RoPE θ 500000 (default rope type), RMSNorm ε 1e-5, untied LM head; ``"tiny"``: the dry run's stand-in
  (D 64, 2 blocks, 4 / 2 heads, MLP 160, vocabulary 512).
* :func:`build` — the model made on the ``meta`` device, its storage allocated on the target device
  (``to_empty``), every parameter drawn there from one seeded generator (no copy of the weights on the CPU first),
  the rotary buffers recomputed; eval mode, no parameter requires a gradient (as LXT's examples set it).
* :func:`quantise_nf4` — every Linear of the blocks (not the LM head, as transformers' bitsandbytes loader leaves
  it) replaced in place by a bitsandbytes ``Linear4bit`` (NF4, compute dtype bfloat16, no double quantisation:
  transformers' ``BitsAndBytesConfig`` defaults but the quant type), one layer at a time.
* :func:`token_ids` — one seeded row of random ids, on the CPU.

Weights: a Linear ``W ~ N(0, 1/fan_in)``, an RMSNorm scale ``1 + N(0, 0.1²)``, the embedding ``N(0, 1)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: model shapes: the table's and the dry run's
SHAPES: dict[str, dict[str, Any]] = {
    "8b": dict(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        rope_theta=500000.0,
        max_position_embeddings=131072,
    ),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=160,
        vocab_size=512,
        rope_theta=500000.0,
        max_position_embeddings=4096,
    ),
}


def config(shape: str, attn: str = "sdpa") -> Any:
    """The ``LlamaConfig`` of ``shape`` (:data:`SHAPES`) with attention implementation ``attn``."""
    from transformers import LlamaConfig

    s = dict(SHAPES[shape])
    theta = s.pop("rope_theta")
    cfg = LlamaConfig(
        **s,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=None,
    )
    cfg._attn_implementation = attn
    assert cfg.rope_parameters["rope_theta"] == theta, cfg.rope_parameters
    return cfg


@torch.no_grad()
def fill(model: nn.Module, seed: int, device: torch.device) -> None:
    """Draw every parameter of ``model`` in place on ``device`` from one generator seeded with ``seed``, in
    ``named_parameters`` order (the same weights in every process)."""
    g = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 1:  # RMSNorm scales
            p.normal_(1.0, 0.1, generator=g)
        elif "embed_tokens" in name:
            p.normal_(0.0, 1.0, generator=g)
        else:  # Linear (out, in)
            p.normal_(0.0, p.shape[1] ** -0.5, generator=g)


def build(shape: str, device: str, dtype: torch.dtype = torch.bfloat16, seed: int = 0, attn: str = "sdpa") -> nn.Module:
    """The random Llama of ``shape`` in ``dtype`` on ``device`` (see the module docstring).

    Parameters
    ----------
    shape : str
        ``"8b"`` or ``"tiny"``.
    device : str
        Where the weights are allocated and drawn (``"cuda"``, ``"cpu"``).
    dtype : torch.dtype
        The weights' dtype (bfloat16 for the table).
    seed : int
        The generator's seed.
    attn : str
        ``"sdpa"`` or ``"eager"``.

    Returns
    -------
    nn.Module
        A ``LlamaForCausalLM`` in eval mode whose parameters require no gradient.
    """
    from transformers import LlamaForCausalLM

    cfg = config(shape, attn)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to(dtype).to_empty(device=device)
    fill(model, seed, torch.device(device))
    rotary = type(model.model.rotary_emb)(config=cfg)  # its buffers are computed, not drawn: made again (CPU, tiny)
    model.model.rotary_emb = rotary.to(device)
    model.eval().requires_grad_(False)
    return model


def quantise_nf4(model: nn.Module, compute_dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """Replace every Linear of ``model.model.layers`` in place by a bitsandbytes NF4 ``Linear4bit`` quantised from
    its weight where it lies (see the module docstring); the float weight of each is freed as it goes.

    Parameters
    ----------
    model : nn.Module
        A model of :func:`build`.
    compute_dtype : torch.dtype
        The layers' compute dtype.

    Returns
    -------
    nn.Module
        ``model``, quantised.
    """
    import bitsandbytes as bnb

    for block in model.model.layers:
        for name, m in list(block.named_modules()):
            if type(m) is not nn.Linear:
                continue
            device = m.weight.device
            layer = bnb.nn.Linear4bit(
                m.in_features,
                m.out_features,
                bias=m.bias is not None,
                compute_dtype=compute_dtype,
                compress_statistics=False,
                quant_type="nf4",
                device="meta",
            )
            layer.weight = bnb.nn.Params4bit(
                m.weight.data, requires_grad=False, compress_statistics=False, quant_type="nf4"
            )
            if m.bias is not None:
                layer.bias = nn.Parameter(m.bias.data, requires_grad=False)
            layer = layer.to(device).eval()  # Params4bit.to quantises (also where the data already lies)
            path, _, leaf = name.rpartition(".")
            setattr(block.get_submodule(path) if path else block, leaf, layer)
            del m
    model.requires_grad_(False)
    return model


def token_ids(vocab: int, tokens: int, seed: int = 0) -> torch.Tensor:
    """(1, tokens) random ids in ``[2, vocab)`` from a seeded CPU generator."""
    return torch.randint(2, vocab, (1, tokens), generator=torch.Generator().manual_seed(seed))


def fingerprint(model: nn.Module) -> float:
    """A float that differs when any of a few weights differ: the sum of |w| of the first and last block's first
    parameter and of the LM head (checks that two processes built the same model)."""
    with torch.no_grad():
        layers = model.model.layers
        parts = [next(layers[0].parameters()), next(layers[-1].parameters()), model.lm_head.weight]
        return float(sum(p.float().abs().sum() for p in parts))
