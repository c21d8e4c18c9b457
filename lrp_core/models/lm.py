"""Decoder language models from the Hugging Face hub: the names people use, loaded as causal LMs.

A repo whose ``config.json`` declares a causal-LM architecture (``...ForCausalLM``, ``GPT2LMHeadModel``) is
loaded with ``AutoModelForCausalLM`` and its tokenizer — not as a sequence classifier, which would put a random
classification head on the language model. :data:`KNOWN_DECODERS` lists the names the course and the README use,
so that they are known (and fail fast offline) before any download.

A loaded LM is ``kind = "text"`` with ``info["task"] = "causal-lm"``; its ``labels`` are the vocabulary
(``labels[i]`` = the text of token ``i``, decoded on demand), so ``labels[exp.target[0]]`` names the explained
next token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, SupportsIndex, overload

import torch

from ..errors import InputError

#: decoder repos people explain, by hub name -> what they are (architecture; the hub id if the name is an alias)
KNOWN_DECODERS = {
    "gpt2": "GPT2LMHeadModel (GPT-2 small, 124 M; the hub's openai-community/gpt2)",
    "openai-community/gpt2": "GPT2LMHeadModel (GPT-2 small, 124 M)",
    "distilgpt2": "GPT2LMHeadModel (DistilGPT-2, 82 M; the hub's distilbert/distilgpt2)",
    "distilbert/distilgpt2": "GPT2LMHeadModel (DistilGPT-2, 82 M)",
    "HuggingFaceTB/SmolLM2-135M": "LlamaForCausalLM (SmolLM2, 135 M)",
    "HuggingFaceTB/SmolLM2-135M-Instruct": "LlamaForCausalLM (SmolLM2 instruct, 135 M)",
    "Qwen/Qwen2.5-0.5B": "Qwen2ForCausalLM (Qwen2.5, 0.5 B)",
    "Qwen/Qwen2.5-0.5B-Instruct": "Qwen2ForCausalLM (Qwen2.5 instruct, 0.5 B)",
    "Qwen/Qwen3-0.6B": "Qwen3ForCausalLM (Qwen3, 0.6 B, q/k norms)",
    "meta-llama/Llama-3.2-1B": "LlamaForCausalLM (Llama 3.2, 1 B; gated: accept the licence on the hub)",
    "meta-llama/Llama-3.2-1B-Instruct": "LlamaForCausalLM (Llama 3.2 instruct, 1 B; gated)",
    "google/gemma-3-270m": "Gemma3ForCausalLM (Gemma 3 text, 270 M; gated: accept the licence on the hub)",
    "microsoft/Phi-3-mini-4k-instruct": "Phi3ForCausalLM (Phi-3 mini, 3.8 B, fused qkv and gate_up)",
}

#: substrings of repo ids that are (almost always) decoder LMs: used to name the right alternative offline
LM_HINTS = ("gpt2", "gpt-2", "llama", "qwen", "smollm", "gemma", "phi-3", "phi3", "mistral", "tinyllama")

_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def lm_alternative() -> str:
    """What to load offline instead of a hub decoder: the embedded LM once one ships, else the embedded text model."""
    from .base import EMBEDDED

    if "tiny-lm" in EMBEDDED:
        return "load('tiny-lm') (an embedded Llama-family language model)"
    return (
        "load('minilm-sentiment') (an embedded text classifier; no language model is embedded yet), or a "
        "decoder saved on this machine: load('/path/to/folder')"
    )


def is_causal_lm(config: Any) -> bool:
    """Whether a transformers config declares a causal language model.

    Parameters
    ----------
    config : Any
        A transformers config; its ``architectures`` are read (``LlamaForCausalLM``, ``GPT2LMHeadModel``, ...).

    Returns
    -------
    bool
        ``True`` when one of the architectures is a causal LM.
    """
    return any(str(a).endswith(_LM_SUFFIXES) for a in (getattr(config, "architectures", None) or ()))


class TokenIdError(InputError, IndexError):
    """A token id outside the vocabulary (an ``IndexError`` too, as the sequence protocol expects)."""


class Vocabulary(Sequence[str]):
    """The labels of a causal LM: ``vocab[i]`` is the text of token ``i`` (decoded when asked, not stored)."""

    def __init__(self, tokenizer: Any, size: int):
        self.tokenizer, self.size = tokenizer, int(size)

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, i: SupportsIndex) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: SupportsIndex | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.size))]
        i = int(i)
        if not -self.size <= i < self.size:
            raise TokenIdError(f"token id {i} outside the vocabulary [0, {self.size})")
        return self.tokenizer.decode([i % self.size])

    def __repr__(self) -> str:
        return f"Vocabulary({self.size} tokens)"


def lm_preprocess(tokenizer: Any) -> Callable[[Any], Any]:
    """Build ``preprocess(texts)`` for a causal LM.

    Decoder tokenizers often lack a padding token (GPT-2, Llama); the end-of-text token pads then, as in
    ``generate``. The attention mask marks the padding, so the id used never affects the explanation.

    Parameters
    ----------
    tokenizer : Any
        The LM's tokenizer.

    Returns
    -------
    Callable[[Any], Any]
        ``preprocess(texts)``: one text or a list of B texts to padded (B, T) ``input_ids`` /
        ``attention_mask``.
    """
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token

    def preprocess(texts: str | Sequence[str]) -> Any:
        """One text or a list of texts -> padded batch (``input_ids``, ``attention_mask``), (B, T)."""
        if isinstance(texts, str):
            texts = [texts]
        return tokenizer(list(texts), padding=True, return_tensors="pt")

    return preprocess


def lm_labels(model: torch.nn.Module, tokenizer: Any) -> Vocabulary:
    """The LM's vocabulary as its labels.

    Parameters
    ----------
    model : torch.nn.Module
        The causal LM.
    tokenizer : Any
        Its tokenizer.

    Returns
    -------
    Vocabulary
        As long as the LM head, which may be padded past the tokenizer's size; ``vocab[i]`` is token ``i``'s
        text.
    """
    lm: Any = model  # a transformers PreTrainedModel: its get_output_embeddings is read by name
    size = lm.get_output_embeddings().weight.shape[0] if lm.get_output_embeddings() is not None else len(tokenizer)
    return Vocabulary(tokenizer, size)


__all__ = [
    "KNOWN_DECODERS",
    "LM_HINTS",
    "TokenIdError",
    "Vocabulary",
    "is_causal_lm",
    "lm_alternative",
    "lm_labels",
    "lm_preprocess",
]
