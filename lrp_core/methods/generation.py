"""Explaining what a language model writes: one relevance map per generated token.

For a prompt of P tokens and a continuation ``g_1 … g_K`` (the model's greedy
choice, or given), step k explains the logit of ``g_k`` at the last position
of the prefix "prompt + g_1 … g_{k−1}" (teacher forcing): a row of P+K−1
scores, zero from the prefix's end on (``docs/METHODS.md`` §2c, Generation). A
step may be a contrast: ``y_{g_k} − y_{a_k}``, "this token rather than that".

All steps of all prompts are explained in one :func:`lrp_core.explain` call:
each (prompt, step) is a row over the whole sequence, read at its own
position with its own target — the causal mask keeps later tokens out of every
map, so the row equals the explanation of the prefix alone (up to round-off).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from ..errors import InputError
from .call import Contrast
from ..viz.text import generation_html, page

TokenLike = Union[int, str]


@dataclass
class GenerationExplanation:
    """Relevance maps of a generated continuation, one per step.

    Attributes:
        method: the method used.
        input_ids: (B, P+K) prompt and continuation, left-padded (the prompts end at column P).
        attention_mask: (B, P+K) 1 = real token.
        prompt_length: P, the padded prompt width (every row's prompt ends at column P − 1).
        scores: (B, K, P+K−1) row k: the relevance of each input position for step k; padding and positions from
            P+k on are 0.
        tokens: per row, the P+K pieces (padding as the tokenizer's pad token).
        targets: (B, K) the explained token ids; ``contrasts`` (B, K) the contrasted ids (−1: none), or ``None``.
        logits: (B, K) the explained quantity: the target logit (minus the contrast's) at each step.
    """

    method: str
    input_ids: Tensor
    attention_mask: Tensor
    prompt_length: int
    scores: Tensor
    tokens: list
    targets: Tensor
    logits: Tensor
    contrasts: Optional[Tensor] = None
    options: dict = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return self.scores.shape[1]

    def generated(self, row: int = 0) -> list[str]:
        """The K generated pieces of a row."""
        return self.tokens[row][self.prompt_length:]

    def html(self, row: int = 0, scale: str = "row", merge: bool = False) -> str:
        """The heat map of one row as an HTML fragment (context tokens × generated tokens)."""
        if not 0 <= row < len(self.tokens):
            raise InputError(f"row must be in 0 … {len(self.tokens) - 1}, got {row}")
        keep = self.attention_mask[row, :-1].bool().cpu()
        start = int(torch.nonzero(keep)[0]) if keep.any() else 0  # drop the left padding from the picture
        context = self.tokens[row][start:-1]
        scores = self.scores[row, :, start:].detach().double().cpu().numpy()
        contrasts = None
        if self.contrasts is not None:
            contrasts = [None if c < 0 else self._piece(row, int(c)) for c in self.contrasts[row].tolist()]
        return generation_html(context, self.generated(row), scores, scale=scale, contrasts=contrasts,
                               title=f"{self.method}: why the model wrote what it wrote")

    def _piece(self, row: int, token_id: int) -> str:
        return self.options.get("id_to_token", {}).get(token_id, str(token_id))

    def show(self, row: int = 0, scale: str = "row") -> Any:
        """Display the heat map in Jupyter (returns the ``IPython.display.HTML`` object)."""
        from IPython.display import HTML, display
        out = HTML(self.html(row, scale))
        display(out)
        return out

    def _repr_html_(self) -> str:
        return self.html(0)

    def save_html(self, path: Union[str, Path], rows: Optional[Sequence[int]] = None, scale: str = "row") -> Path:
        """Write a self-contained page (no script, font or style from elsewhere) with the rows' heat maps."""
        rows = range(len(self.tokens)) if rows is None else rows
        path = Path(path)
        path.write_text(page("".join(self.html(r, scale) for r in rows), title=f"{self.method} — generation"),
                        encoding="utf-8")
        return path


def _left_padded(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """The same rows re-padded on the left (so every prompt ends at the last column)."""
    order = torch.argsort(mask.to(torch.int8), dim=1, stable=True)  # padding (0) first, real tokens in order
    return ids.gather(1, order), mask.gather(1, order)


@torch.no_grad()
def greedy_continuation(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, steps: int) -> Tensor:
    """``steps`` greedy tokens after left-padded prompts (B, P): (B, steps). No stopping at end-of-text.

    Rows of equal length run together and unpadded, so each row continues exactly as it would alone: the model
    never sees a padding position (Hugging Face's eager attention in float64 turns fully masked padding rows
    into NaN, and 0 × NaN reaches the real rows of a padded batch).
    """
    out = torch.zeros(input_ids.shape[0], steps, dtype=torch.long, device=input_ids.device)
    lengths = attention_mask.sum(1)
    for n in lengths.unique().tolist():
        rows = (lengths == n).nonzero().squeeze(1)
        ids = input_ids[rows, input_ids.shape[1] - n:]  # left-padded: the real tokens are the last n columns
        for k in range(steps):
            nxt = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1].argmax(-1, keepdim=True)
            out[rows, k] = nxt[:, 0]
            ids = torch.cat([ids, nxt], 1)
    return out


def _token_ids(tokenizer: Any, values: Any, what: str) -> list:
    """Token ids from ids or single-token strings (``None`` kept)."""
    out = []
    for v in values:
        if v is None or (isinstance(v, int) and not isinstance(v, bool)):
            out.append(v)
        elif isinstance(v, str):
            ids = tokenizer.convert_tokens_to_ids([v])
            if ids[0] is None or ids[0] == tokenizer.unk_token_id:
                enc = tokenizer(v, add_special_tokens=False)["input_ids"]
                if len(enc) != 1:
                    raise InputError(f"{what} {v!r} is {len(enc)} tokens; give single tokens (ids or pieces)")
                ids = enc
            out.append(int(ids[0]))
        else:
            raise InputError(f"{what} must be token ids (int) or single-token strings, got {type(v).__name__}")
    return out


def _step_groups(negative: Optional[Tensor], steps: int, size: int) -> list[list[int]]:
    """Steps in runs of at most ``size`` that agree on having a contrast (one explain call each)."""
    has = [negative is not None and bool((negative[:, k] >= 0).all()) for k in range(steps)]
    if negative is not None and any(bool((negative[:, k] >= 0).any()) and not has[k] for k in range(steps)):
        raise InputError("within one step, give a contrast for every prompt or for none")
    groups: list[list[int]] = []
    for k in range(steps):
        if groups and len(groups[-1]) < size and has[groups[-1][0]] == has[k]:
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


class _StepBar:
    """A progress bar over the steps (tqdm, notebook-aware), or nothing."""

    def __init__(self, total: int, show: bool, method: str):
        self.bar = None
        if show:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, desc=f"{method}: steps", unit="step", leave=False)

    def __enter__(self) -> "_StepBar":
        return self

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()


def _prompts(tokenizer: Any, prompts: Any) -> tuple[Tensor, Tensor]:
    """Prompts (a string, a list of strings, or a tokenizer dict) -> left-padded (input_ids, attention_mask)."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if isinstance(prompts, (list, tuple)):
        if not prompts or not all(isinstance(p, str) and p for p in prompts):
            raise InputError("prompts must be a non-empty string, a list of non-empty strings, or a tokenizer's "
                             "output dict with 'input_ids' (and 'attention_mask')")
        if tokenizer is None:
            raise InputError("text prompts need the model's tokenizer: explain_generation(model, tokenizer, prompts)")
        enc = tokenizer(list(prompts), return_tensors="pt", padding=True)
        ids, mask = enc["input_ids"], enc["attention_mask"]
    elif isinstance(prompts, dict) or hasattr(prompts, "keys"):
        if "input_ids" not in prompts:
            raise InputError("a prompts dict needs 'input_ids' (B, P) and, if padded, 'attention_mask'")
        ids = torch.as_tensor(prompts["input_ids"])
        mask = torch.as_tensor(prompts.get("attention_mask", torch.ones_like(ids)))
    else:
        raise InputError(f"prompts must be a string, a list of strings or a tokenizer dict, got {type(prompts).__name__}")
    if ids.dim() != 2 or mask.shape != ids.shape:
        raise InputError(f"input_ids must be (B, P) with an attention_mask of the same shape, got {tuple(ids.shape)} "
                         f"and {tuple(mask.shape)}")
    if bool((mask.sum(1) == 0).any()):
        raise InputError("a prompt has no real token (its attention_mask row is all 0)")
    return _left_padded(ids.long(), mask.long())


def _continuation(tokenizer: Any, continuation: Any, batch: int, steps: Optional[int]) -> Tensor:
    """A given continuation: a string / token ids for every prompt, or one per prompt -> (B, K)."""
    rows = continuation if isinstance(continuation, (list, tuple)) and continuation and \
        isinstance(continuation[0], (list, tuple, str)) and not isinstance(continuation, str) else [continuation]
    if len(rows) == 1 and batch > 1:
        rows = rows * batch
    ids = []
    for r in rows:
        if isinstance(r, str):
            if tokenizer is None:
                raise InputError("a text continuation needs the tokenizer")
            ids.append(tokenizer(r, add_special_tokens=False)["input_ids"])
        else:
            ids.append(_token_ids(tokenizer, list(torch.as_tensor(r).reshape(-1).tolist()), "continuation"))
    if len(ids) != batch or len({len(r) for r in ids}) != 1 or not ids[0]:
        raise InputError(f"continuation must give the same, non-zero number of tokens for each of the {batch} prompts "
                         f"(got lengths {[len(r) for r in ids]})")
    if steps is not None and steps != len(ids[0]):
        raise InputError(f"max_new_tokens={steps} but the continuation has {len(ids[0])} tokens; give one or the other")
    return torch.tensor(ids, dtype=torch.long)


def _contrasts(tokenizer: Any, contrast: Any, batch: int, steps: int) -> Optional[Tensor]:
    """Per-step contrasted token ids (B, K), −1 where a step has none; ``None`` without contrasts."""
    if contrast is None:
        return None
    if isinstance(contrast, (int, str)) and not isinstance(contrast, bool):
        grid = [[contrast] * steps] * batch
    elif isinstance(contrast, (list, tuple)) and len(contrast) == steps and not \
            any(isinstance(c, (list, tuple)) for c in contrast):
        grid = [list(contrast)] * batch
    elif isinstance(contrast, (list, tuple)) and len(contrast) == batch and \
            all(isinstance(c, (list, tuple)) and len(c) == steps for c in contrast):
        grid = [list(c) for c in contrast]
    else:
        raise InputError(f"contrast must be one token (id or piece) for every step, a list of {steps} (one per step, "
                         f"None for none) or {batch} such lists (one per prompt)")
    ids = [[-1 if v is None else v for v in _token_ids(tokenizer, row, "contrast")] for row in grid]
    return torch.tensor(ids, dtype=torch.long)


def explain_generation(model: nn.Module, tokenizer: Any, prompts: Any, method: str = "attnlrp",
                       max_new_tokens: Optional[int] = None, continuation: Any = None, contrast: Any = None,
                       progress: Optional[bool] = None, step_batch: int = 8, **options: Any) -> GenerationExplanation:
    """Explain each token a causal LM writes after ``prompts`` (``docs/METHODS.md`` §2c, Generation).

    Args:
        model: a causal LM the engine supports (``LlamaForCausalLM``, ``GPT2LMHeadModel``, …).
        tokenizer: its tokenizer (text prompts, pieces for the pictures); may be ``None`` for id inputs.
        prompts: a string, a list of strings, or a tokenizer dict (padded on either side).
        method: any method of :func:`lrp_core.explain` that takes a target.
        max_new_tokens: K, the greedy steps (default 1 without a continuation).
        continuation: the tokens to explain instead of the greedy ones (text or ids; one for all prompts or one
            per prompt).
        contrast: per step the token to contrast with (``y_{g_k} − y_{a_k}``): one for every step, a list per step
            (``None`` for none) or one such list per prompt.
        progress: a progress bar over the steps (default: when there are 8 or more).
        step_batch: how many steps are explained in one call (their rows batched; memory grows with it).
        options: the method's options (see ``lrp_core.METHODS``).

    Returns a :class:`GenerationExplanation`: ``scores`` (B, K, P+K−1), ``.show()``, ``.save_html(path)``.
    """
    from ..api import explain

    if isinstance(step_batch, bool) or not isinstance(step_batch, int) or step_batch < 1:
        raise InputError(f"step_batch must be a positive integer, got {step_batch!r}")
    ids, mask = _prompts(tokenizer, prompts)
    B, P = ids.shape
    if continuation is None:
        K = 1 if max_new_tokens is None else max_new_tokens
        if isinstance(K, bool) or not isinstance(K, int) or K < 1:
            raise InputError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        gen = greedy_continuation(model, ids, mask, K)
    else:
        gen = _continuation(tokenizer, continuation, B, max_new_tokens)
        K = gen.shape[1]
    full_ids = torch.cat([ids, gen.to(ids.device)], 1)  # (B, P+K)
    full_mask = torch.cat([mask, torch.ones_like(gen)], 1)
    negative = _contrasts(tokenizer, contrast, B, K)
    inputs = {"input_ids": full_ids[:, :-1], "attention_mask": full_mask[:, :-1]}  # (B, P+K−1)
    scores = torch.zeros(B, K, P + K - 1, dtype=torch.float64)
    logits = torch.zeros(B, K, dtype=torch.float64)
    groups = _step_groups(negative, K, step_batch)
    with _StepBar(K, progress or (progress is None and K >= 8), method) as bar:
        for steps in groups:  # steps as rows: (step, prompt) pairs, each read at its own position
            rows = {k: v.repeat(len(steps), 1) for k, v in inputs.items()}
            t = torch.cat([gen[:, k] for k in steps]).tolist()
            target: Any = t if negative is None or negative[0, steps[0]] < 0 else \
                Contrast(t, torch.cat([negative[:, k] for k in steps]).tolist())
            position = [P - 1 + k for k in steps for _ in range(B)]
            exp = explain(model, rows, method=method, target=target, position=position, **options)
            got = exp.scores.detach().to(torch.float64).cpu().reshape(len(steps), B, -1)
            lg = exp.logits.detach().to(torch.float64).cpu().reshape(len(steps), B, -1)
            for j, k in enumerate(steps):
                scores[:, k] = got[j]
                scores[:, k, P + k:] = 0.0  # after the step's prefix (the causal mask keeps them out already)
                picked = lg[j].gather(1, gen[:, k:k + 1].cpu())[:, 0]
                if negative is not None and negative[0, k] >= 0:
                    picked = picked - lg[j].gather(1, negative[:, k:k + 1])[:, 0]
                logits[:, k] = picked
            bar.update(len(steps))
    used = sorted(set(full_ids.flatten().tolist()) | set([] if negative is None else negative.flatten().tolist()) - {-1})
    vocab = {} if tokenizer is None else dict(zip(used, tokenizer.convert_ids_to_tokens(used)))
    pieces = [[str(t) for t in (tokenizer.convert_ids_to_tokens(r.tolist()) if tokenizer is not None else r.tolist())]
              for r in full_ids]
    return GenerationExplanation(method=method, input_ids=full_ids, attention_mask=full_mask, prompt_length=P,
                                 scores=scores, tokens=pieces, targets=gen, logits=logits, contrasts=negative,
                                 options={"id_to_token": vocab, **options})


__all__ = ["explain_generation", "GenerationExplanation", "greedy_continuation"]
