"""The probe of open recognition: a recognised decoder's replay checked against the model's own logits.

:func:`open_adapter` builds an :class:`~lrp_core.adapters.recognise.OpenDecoderAdapter` for a decoder no
``ADAPTERS`` row names and keeps it only if :func:`probe` finds the replay's logits within
:data:`~lrp_core.adapters.recognise.TOLERANCE` of the model's; :func:`verify` checks a listed family's adapter
the same way (a user's subclass may compute something else). Each model is probed once per configuration.
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch
from torch import nn

from ..errors import UnsupportedModelError
from ..runtime.guard import model_guard
from ..runtime.precision import compute_precision
from .decoder import DecoderAdapter
from .parts import ModelPart
from .positions import position_ids

#: What an unlisted decoder must look like to be recognised (the text of every refusal).
from .recognise import STRUCTURES, TOLERANCE, OpenDecoderAdapter, unreplayable

#: model -> {fingerprint: the probe's deviation, or the refusal}: each model checked once per configuration
_PROBED: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()

#: tokens per probe row (longer where a sliding window is short enough to be covered)
PROBE_TOKENS = 12


def _hooks(model: nn.Module) -> tuple:
    """The forward hooks and pre-hooks on the model's modules (they run in the model's own forward)."""
    return tuple(
        (name, tuple(map(id, m._forward_pre_hooks.values())), tuple(map(id, m._forward_hooks.values())))
        for name, m in model.named_modules()
        if m._forward_hooks or m._forward_pre_hooks
    )


def _fingerprint(model: ModelPart) -> tuple:
    """(dtype, device, attention implementation, config values, forward hooks): what the probe's verdict depends
    on."""
    p = next(model.parameters())
    cfg = model.config
    return (
        p.dtype,
        str(p.device),
        getattr(cfg, "_attn_implementation", None),
        cfg.to_json_string(use_diff=False),
        _hooks(model),
    )


def probe(adapter: DecoderAdapter) -> float:
    """The replay's deviation from the model's own logits on a fixed probe batch: max |replay − model| /
    max |model| over each row's logits at its last token.

    Two rows of :data:`PROBE_TOKENS` ids (seeded; no padding id), the second right-padded by three
    (a sequence classifier, which finds its last token by the padding id, gets unpadded rows — one row
    when it has no padding id); position ids from the mask. The model runs in eval mode, without a cache,
    under ``no_grad`` (the user's forward hooks run in it, under :func:`~lrp_core.runtime.guard.model_guard`), a
    half-precision model in float32 like its replay (:func:`~lrp_core.runtime.precision.compute_precision`);
    modules in training mode are put back. Cost: one forward pass of the model and one plain replay on the
    B·T probe tokens.

    Parameters
    ----------
    adapter : DecoderAdapter
        The adapter whose replay is measured.

    Returns
    -------
    float
        ``max |replay − model| / max |model|`` over each row's logits at its last token.
    """
    model, cfg = adapter.model, adapter.config
    windows = [s.attn.window for s in adapter.blocks if s.attn.window]
    T = PROBE_TOKENS if not windows or min(windows) + 4 > 64 else max(PROBE_TOKENS, min(windows) + 4)
    if adapter.max_length:
        T = min(T, adapter.max_length)
    pad = getattr(cfg, "pad_token_id", None)
    V = adapter.vocab_size
    ids = torch.randint(0, V - 1, (2, T), generator=torch.Generator().manual_seed(0))
    if isinstance(pad, int) and 0 <= pad < V:
        ids = ids + (ids >= pad).long()  # never the padding id inside a row
    mask = torch.ones_like(ids)
    classifier = hasattr(model, "score") and not hasattr(model, "lm_head")
    if not classifier:
        mask[1, -3:] = 0
        if isinstance(pad, int):
            ids[1, -3:] = pad
    elif pad is None:
        ids, mask = ids[:1], mask[:1]
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    training = [m for m in model.modules() if m.training]
    with model_guard(model):  # the model's own forward runs the user's hooks: what they change is undone
        try:
            for m in training:
                m.training = False
            with torch.no_grad():
                try:
                    with compute_precision(model):  # a half-precision model: its own forward in float32 too
                        own = model(
                            input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=False
                        )
                        out = _logits(own)
                except Exception as err:  # the model's own forward: any error of its code is a reason to refuse
                    raise UnsupportedModelError(
                        f"{type(model).__name__}'s own forward failed on the probe input ({type(err).__name__}: {err})"
                    ) from None
                got = adapter.forward(adapter.check_inputs({"input_ids": ids, "attention_mask": mask})).logits
        finally:
            for m in training:
                m.training = True
    if out.dim() == 3:
        last = (torch.arange(ids.shape[1], device=device)[None] * mask).argmax(-1)
        out = out[torch.arange(len(out), device=device), last]
    out, got = out.double(), got.double()
    return float((got - out).abs().max() / out.abs().max().clamp(min=1e-30))


def _logits(output) -> torch.Tensor:
    """The model's own logits (B, T, C) or (B, C); a question-answering head's start and end side by side."""
    if getattr(output, "start_logits", None) is not None:
        return torch.stack([output.start_logits, output.end_logits], dim=-1)
    return output.logits


#: the class-name endings of the decoders open recognition reads
OPEN_HEADS = (
    "ForCausalLM",
    "LMHeadModel",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
)


def open_adapter(model: nn.Module) -> Optional[DecoderAdapter]:
    """The adapter of an unlisted decoder, recognised by its structure.

    Parameters
    ----------
    model : nn.Module
        The (unwrapped) model no adapter row recognised.

    Returns
    -------
    DecoderAdapter or None
        The structural adapter, verified against the model's logits; ``None`` where ``model`` is no Hugging Face
        decoder (no config, not a ``…ForCausalLM`` / ``…LMHeadModel`` / ``…ForSequenceClassification`` /
        ``…ForTokenClassification`` / ``…ForQuestionAnswering``).

    Raises
    ------
    UnsupportedModelError
        Naming a block the engine cannot replay, the module that was not understood, or the probe's measured
        deviation (the message omits the supported families: the caller appends them).
    """
    cls = type(model).__name__
    if getattr(model, "config", None) is None or not cls.endswith(OPEN_HEADS):
        return None
    why = unreplayable(model)
    if why is not None:
        raise UnsupportedModelError(f"{cls} is not supported: {why}")
    try:
        adapter = OpenDecoderAdapter(model)
    except UnsupportedModelError as err:
        raise UnsupportedModelError(f"{cls} is not a decoder the engine recognises: {err}. {STRUCTURES}") from None
    except (AttributeError, TypeError, ValueError) as err:
        raise UnsupportedModelError(
            f"{cls} is not a decoder the engine recognises ({type(err).__name__}: {err}). {STRUCTURES}"
        ) from None
    return verify(adapter, norms=True)


def verify(adapter: DecoderAdapter, norms: bool = False) -> DecoderAdapter:
    """Check that an adapter's replay reproduces the model's own logits on the probe (:func:`probe`).

    The check runs once per model and configuration: the verdict is kept with the model as a weak key.

    Parameters
    ----------
    adapter : DecoderAdapter
        The adapter to check.
    norms : bool
        Whether to first check that the rules recompute every norm of the replay (an unlisted family's norms are
        not known in advance).

    Returns
    -------
    DecoderAdapter
        ``adapter`` itself, once verified.

    Raises
    ------
    UnsupportedModelError
        With the measured deviation, when the replay does not reproduce the logits beyond the dtype's tolerance
        (or a norm is not recomputed), and when the weights are on the meta device (nothing to compare).
    """
    model = adapter.model
    cls = type(model).__name__
    p = next(model.parameters(), None)
    if p is None or p.device.type == "meta":
        raise UnsupportedModelError(
            f"{cls} has the structure of a supported decoder, but its weights are on the meta "
            "device (or absent): the replay cannot be checked against the model's own logits; "
            "load the weights first"
        )
    key = _fingerprint(model)
    seen = _PROBED.setdefault(model, {})
    if key not in seen:
        try:
            if norms:
                assert isinstance(adapter, OpenDecoderAdapter), "only a recognised decoder's norms are checked"
                adapter.check_norms()
            seen[key] = probe(adapter)
        except UnsupportedModelError as err:
            seen[key] = f"{cls} is not a decoder the engine recognises: {err}. {STRUCTURES}"
    if isinstance(seen[key], str):
        raise UnsupportedModelError(seen[key])
    dev, tol = seen[key], TOLERANCE.get(p.dtype, 1e-5)
    if not dev <= tol:  # NaN too
        raise UnsupportedModelError(
            f"{cls} has the structure of a supported decoder, but the replay differs from the model's own logits by "
            f"{dev:.1e} relative on a probe input (tolerance {tol:.0e} in {str(p.dtype).replace('torch.', '')}"
            f"{', compared in float32' if p.dtype in (torch.float16, torch.bfloat16) else ''})"
            f"{_unreplayed_config(model)}{_hooked(key[-1])}: the model computes something the replay does not (a "
            "scaling, a rotary layout or a mask the structure does not show), so it is not explained approximately"
        )
    return adapter


def _hooked(hooks: tuple) -> str:
    """The hooked modules, where forward hooks ran in the model's own forward (a hint in the refusal)."""
    names = [name or "the model" for name, _, _ in hooks]
    return f" (forward hooks on {', '.join(names)} ran in the model's own forward)" if names else ""


def _unreplayed_config(model: nn.Module) -> str:
    """Config values that scale what the replay computes, where not neutral (a hint in the refusal)."""
    cfg = model.config
    neutral = {"embedding_multiplier": 1.0, "residual_multiplier": 1.0, "logits_scaling": 1.0, "logit_scale": 1.0}
    odd = [
        f"{k}={getattr(cfg, k)}"
        for k, v in neutral.items()
        if isinstance(getattr(cfg, k, None), (int, float)) and getattr(cfg, k) != v
    ]
    return f" (config values the replay does not apply: {', '.join(odd)})" if odd else ""


__all__ = ["open_adapter", "verify", "probe", "PROBE_TOKENS"]
