"""Loader of the LXT decoder reference fixtures (``tests/fixtures/lxt/decoders``).

Each fixture ``<family>__<method>__<dtype>.pt`` was written by ``scripts/check_decoders_against_lxt.py``
with LXT at git HEAD (its own virtualenv; LXT is not a dependency of the tests). It is a dict:

* ``family``, ``model_class`` (a ``transformers`` class name), ``config`` (``config.to_dict()``),
  ``state_dict`` (float64 tensors), ``dtype`` ("float64" / "float32": the dtype LXT ran in),
  ``method`` ("attnlrp" / "cp_lrp"), ``lxt_commit``, ``transformers_version``;
* ``sequences``: list of R unpadded 1-D LongTensors (T_r,), R ≥ 3, all lengths different;
* ``targets`` (R,): argmax of the logits at each row's last position; ``logits`` (R,): that logit;
* ``scores``: list of R tensors (T_r,): LXT's Σ_channels e ⊙ ∂y_t/∂e, e = get_input_embeddings()(ids);
* these three with eager attention (``attn_implementation``); ``sdpa``: the same three computed with
  sdpa attention; ``gradient_x_input`` (float64 only): the unpatched gradient × input (eager).

This module only needs torch and transformers; the check script uses ``build_model`` and ``pad``
from here too, in the LXT venv, so both sides rebuild the model the same way.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

FIXTURES = Path(__file__).parent / "fixtures" / "lxt" / "decoders"
FAMILIES = ("llama", "qwen2", "qwen3", "gemma3", "gpt2", "qwen3_moe")
METHODS = ("attnlrp", "cp_lrp")
#: the methods LXT has a patch for, where not both (LXT's Qwen3-MoE module defines attnLRP only)
FAMILY_METHODS = {"qwen3_moe": ("attnlrp",)}


def methods_of(family: str) -> tuple:
    """The methods of :data:`METHODS` with an LXT fixture for ``family``."""
    return FAMILY_METHODS.get(family, METHODS)


DTYPES = {"float64": torch.float64, "float32": torch.float32}
ATTN = ("eager", "sdpa")


def build_model(
    model_class: str, config: dict, state_dict: dict, dtype: torch.dtype, attn: str = "eager"
) -> torch.nn.Module:
    """``transformers.<model_class>`` from ``config`` (a ``to_dict()``), weights loaded, in eval mode.

    Built in float32 (as ``from_pretrained`` does), cast to ``dtype``, then the float64 state dict
    loaded (in that order, so that a float64 model gets the float64 weights, not float32-rounded
    ones). Non-persistent buffers (RoPE ``inv_freq``, Gemma 3's ``embed_scale``) keep the float32
    values they are created with, as in the LXT process.
    """
    import transformers

    cls = getattr(transformers, model_class)
    conf = cls.config_class.from_dict(dict(config))
    conf._attn_implementation = attn
    if any(getattr(conf, k, None) for k in ("num_experts", "num_local_experts")):
        conf._experts_implementation = "eager"  # the experts one by one (grouped_mm takes no float64)
    model = cls(conf).to(dtype)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = [k for k in missing if k not in getattr(model, "_tied_weights_keys", {})]
    if missing or unexpected:
        raise RuntimeError(f"{model_class}: missing {missing}, unexpected {unexpected}")
    model.eval()
    if model.config._attn_implementation != attn:
        raise RuntimeError(f"{model_class}: attention is {model.config._attn_implementation}, wanted {attn}")
    return model


def pad(sequences: list[torch.Tensor], side: str, pad_id: int) -> dict[str, torch.Tensor]:
    """Rows (T_r,) -> ``{"input_ids", "attention_mask"}``, both (R, max T_r), padded on ``side``."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    T = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), T), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(sequences):
        cols = slice(T - len(s), T) if side == "left" else slice(0, len(s))
        ids[i, cols] = s
        mask[i, cols] = 1
    return {"input_ids": ids, "attention_mask": mask}


@lru_cache(maxsize=None)
def _read(family: str, method: str, dtype: str) -> dict:
    path = FIXTURES / f"{family}__{method}__{dtype}.pt"
    if not path.exists():
        raise FileNotFoundError(
            f"no LXT fixture {path.name}; families {FAMILIES}, methods {METHODS}, "
            f"dtypes {tuple(DTYPES)} (written by scripts/check_decoders_against_lxt.py)"
        )
    return torch.load(path, weights_only=True)


def load_fixture(family: str, method: str, dtype: str, attn: str = "eager") -> tuple[torch.nn.Module, dict]:
    """(model in ``dtype`` with ``attn`` attention, fixture dict). A new model on every call."""
    if attn not in ATTN:
        raise ValueError(f"attn must be one of {ATTN}, got {attn!r}")
    fx = _read(family, method, dtype)
    return build_model(fx["model_class"], fx["config"], fx["state_dict"], DTYPES[dtype], attn), fx


def reference(fixture: dict, attn: str = "eager") -> dict:
    """LXT's ``targets``, ``logits``, ``scores`` for the model run with ``attn`` attention."""
    return fixture["sdpa"] if attn == "sdpa" else {k: fixture[k] for k in ("targets", "logits", "scores")}
