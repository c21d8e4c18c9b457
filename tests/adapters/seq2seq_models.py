"""Tiny seeded encoder-decoders for the seq2seq tests (BART, Marian, mBART, Pegasus, T5), built from configs in ms.

Every model is float64 unless asked otherwise, its weights random (norm weights around 1, the biases, the
final-logits bias and the position rows not zero), so that a replay that dropped a constant would not match.
"""

from __future__ import annotations

import torch
import transformers as tf

VOCAB = 40
PAD = 1
COMMON = dict(vocab_size=VOCAB, d_model=16, max_position_embeddings=40, pad_token_id=PAD, decoder_start_token_id=2)
LAYERS = dict(
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=24,
    decoder_ffn_dim=24,
)
#: family -> (model class, config class, config keywords)
FAMILIES = {
    "bart": (tf.BartForConditionalGeneration, tf.BartConfig, {}),
    "marian": (tf.MarianMTModel, tf.MarianConfig, {"scale_embedding": True}),
    "mbart": (tf.MBartForConditionalGeneration, tf.MBartConfig, {"scale_embedding": True}),
    "pegasus": (tf.PegasusForConditionalGeneration, tf.PegasusConfig, {"scale_embedding": True}),
    "blenderbot_small": (
        tf.BlenderbotSmallForConditionalGeneration,
        tf.BlenderbotSmallConfig,
        {"scale_embedding": True},
    ),
}


T5 = dict(
    vocab_size=VOCAB,
    d_model=16,
    d_kv=8,
    d_ff=24,
    num_layers=2,
    num_decoder_layers=2,
    num_heads=2,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
    pad_token_id=PAD,
    decoder_start_token_id=PAD,
)
FAMILIES["t5"] = (tf.T5ForConditionalGeneration, tf.T5Config, {})
FAMILIES["t5_gated"] = (
    tf.T5ForConditionalGeneration,
    tf.T5Config,
    {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
)
FAMILIES["mt5"] = (tf.MT5ForConditionalGeneration, tf.MT5Config, {})


def make_seq2seq(family: str, dtype: torch.dtype = torch.float64, seed: int = 0, attn: str = "eager"):
    """A tiny ``family`` model in ``dtype``, every parameter (and the final-logits bias) random."""
    cls, config_cls, extra = FAMILIES[family]
    torch.manual_seed(seed)
    cfg = config_cls(**T5, **extra) if family in ("t5", "t5_gated", "mt5") else config_cls(**COMMON, **LAYERS, **extra)
    cfg._attn_implementation = attn
    model = cls(cfg).eval().to(dtype)
    perturb(model, seed)
    return model


def perturb(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every weight random, norm weights around 1; the final-logits bias random too; position tables kept."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "embed_positions" in name:
                continue  # sinusoidal tables are the model's; learned ones are random already
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            p.copy_(1.0 + 0.2 * noise if ("norm" in name and "weight" in name) else 0.3 * noise)
        bias = getattr(model, "final_logits_bias", None)
        if bias is not None:
            bias.copy_(0.5 * torch.randn(bias.shape, generator=g, dtype=torch.float64).to(bias.dtype))
    return model


def zero_constants(model: torch.nn.Module) -> torch.nn.Module:
    """Every additive constant zeroed: biases (LayerNorm β included), the final-logits bias, the position rows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "embed_positions" in name or "relative_attention_bias" in name:
                p.zero_()
        for name, b in model.named_buffers():
            if name.endswith("final_logits_bias") or "embed_positions" in name:
                b.zero_()
    return model


SOURCES = [[5, 6, 7, 8, 3], [9, 10, 3], [11, 12, 13, 3]]
PREFIXES = [[2, 14, 15], [2, 16], [2, 17, 18, 19]]


def pad(rows: list, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows padded on ``side`` -> (ids (B, T), mask (B, T))."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), PAD, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        sl = slice(T - len(r), T) if side == "left" else slice(0, len(r))
        ids[i, sl], mask[i, sl] = torch.tensor(r), 1
    return ids, mask


def batch(sources: list, prefixes: list, src_side: str = "right", dec_side: str = "right") -> dict:
    """The inputs of rows (source, prefix), each side padded on its own side."""
    ids, mask = pad(sources, src_side)
    dec, dec_mask = pad(prefixes, dec_side)
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec, "decoder_attention_mask": dec_mask}


def own_logits(model, sources: list, prefixes: list) -> torch.Tensor:
    """(B, V) the model's own next-token logits of each row alone, at its last prefix token."""
    out = []
    for s, p in zip(sources, prefixes):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([s]), decoder_input_ids=torch.tensor([p])).logits
        out.append(logits[0, -1])
    return torch.stack(out)


def input_x_gradient(model, source: list, prefix: list, target: int) -> torch.Tensor:
    """(S + P,) e · ∂y_t/∂e through the model's own forward at its word embeddings (source, then prefix)."""
    enc, dec = model.get_encoder(), model.get_decoder()
    ids, dids = torch.tensor([source]), torch.tensor([prefix])
    e = enc.embed_tokens(ids).detach().requires_grad_(True)  # BART: scaled inside the module
    d = dec.embed_tokens(dids).detach().requires_grad_(True)
    if getattr(enc, "embed_scale", None) is not None and not hasattr(enc.embed_tokens, "embed_scale"):
        # Marian / Pegasus: the encoder takes scaled embeddings
        e_in = e * enc.embed_scale
        d_in = d  # …and its decoder scales the embeddings it is given
    else:
        e_in, d_in = e, d
    logits = model(inputs_embeds=e_in, decoder_inputs_embeds=d_in).logits
    ge, gd = torch.autograd.grad(logits[0, -1, target], [e, d])
    return torch.cat([(e * ge).sum(-1)[0], (d * gd).sum(-1)[0]]).detach()
