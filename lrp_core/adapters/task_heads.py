"""Task heads on encoders and decoders: token classification, question answering, masked LM, multiple choice
(docs/METHODS.md §2h).

What each head explains, as the model's own forward computes it:

* **token classification** (``*ForTokenClassification``): the logit of class ``t`` at token ``p``,
  ``classifier(h_p)`` — ``explain(..., target=t, position=p)``; ``position`` is required.
* **question answering** (``*ForQuestionAnswering``): the start or the end logit at token ``p``,
  ``qa_outputs(h_p)[0 | 1]`` — ``target="start" | "end"`` (default ``"start"``), ``position=p`` (default: the
  argmax of that logit over the row's real tokens); ``exp.logits`` (B,) is the explained logit.
* **masked LM** (``*ForMaskedLM``): the logit of vocabulary entry ``t`` at the mask position ``p`` (required),
  the MLM head (transform dense → activation → LayerNorm, then the decoder Linear) replayed through its modules.
* **multiple choice** (``*ForMultipleChoice``): inputs (B, C, T); the logit of choice ``k`` (``target=k``,
  default the argmax), which reads row ``(b, k)`` only: the call explains that row with the sequence head and
  returns ``scores`` (B, C, T) (the other choices' rows 0), ``logits`` (B, C) and ``target`` (B,) the choice.

The per-token heads are a :class:`~lrp_core.adapters.readouts.PositionReadout` at ``p``; an adapter keeps the
head's layers (``_task_head``) and reads the position through :meth:`Adapter.task_inputs`. Every family of
:class:`~lrp_core.adapters.bert.BertAdapter` (and every :class:`~lrp_core.adapters.decoder.DecoderAdapter`)
gets the heads by the same hooks.

Shapes: B batch, C choices, T tokens, N tokens, D width.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..runtime.precision import compute_precision
from .mlp_head import head_layers
from .parts import ModelPart
from .readouts import HeadLayer
from .records import Trace

#: class-name suffix -> task
TASK_SUFFIXES = {
    "ForTokenClassification": "token",
    "ForQuestionAnswering": "qa",
    "ForMaskedLM": "mlm",
    "ForMultipleChoice": "choice",
}
#: the tasks read at one position per row
POSITION_TASKS = ("token", "qa", "mlm")
#: what a task explains, for messages
TASK_NAMES = {
    "token": "a token classifier (one prediction per token)",
    "qa": "a question-answering head (a start and an end logit per token)",
    "mlm": "a masked language model (a vocabulary logit per token)",
    "choice": "a multiple-choice head (one logit per choice)",
    "sequence": "a sequence classifier",
}
#: question answering: the target names and the head's output columns
QA_TARGETS = {"start": 0, "end": 1}


def task_of(model: nn.Module) -> str:
    """``"token" | "qa" | "mlm" | "choice"`` from the model's class name, else ``"sequence"``."""
    name = type(model).__name__
    return next((task for suffix, task in TASK_SUFFIXES.items() if name.endswith(suffix)), "sequence")


#: decoder families with token-classification / question-answering heads: class-name prefix -> (module, adapter)
DECODER_TASK_HEADS = {
    "Llama": ("llama", "LlamaAdapter"),
    "Mistral": ("mistral", "MistralAdapter"),
    "Qwen2": ("qwen2", "Qwen2Adapter"),
    "Qwen3": ("qwen3", "Qwen3Adapter"),
    "Qwen3Moe": ("qwen3_moe", "Qwen3MoeAdapter"),
    "Qwen2Moe": ("qwen2_moe", "Qwen2MoeAdapter"),
    "Mixtral": ("mixtral", "MixtralAdapter"),
    "GptOss": ("gpt_oss", "GptOssAdapter"),
    "GPT2": ("gpt2", "GPT2Adapter"),
    "Phi3": ("phi3", "Phi3Adapter"),
    "GPTNeoX": ("gpt_neox", "GPTNeoXAdapter"),
    "Phi": ("phi", "PhiAdapter"),
    "Falcon": ("falcon", "FalconAdapter"),
    "Gemma2": ("gemma2", "Gemma2Adapter"),
}


def decoder_task_family(model: nn.Module) -> Optional[tuple[str, str]]:
    """(adapter module, adapter class) of a transformers decoder task head (``LlamaForTokenClassification``,
    ``Qwen2ForQuestionAnswering``) whose family :data:`DECODER_TASK_HEADS` names; else ``None``."""
    name = type(model).__name__
    if not type(model).__module__.startswith("transformers.") or task_of(model) not in ("token", "qa"):
        return None
    return DECODER_TASK_HEADS.get(name[: name.index("For")])


# ---------------------------------------------------------------------------- positions
def read_positions(mask: Tensor, position: Any) -> Tensor:
    """(B,) long: ``position`` (an int for every row or one per row; negative counts from the end) checked to
    name a real token of each row.

    Raises
    ------
    InputError
        Naming ``position`` when it is not an int or B ints, lies past the row, or names padding.
    """
    B, T = mask.shape
    pos = torch.as_tensor(position, device=mask.device)
    if pos.dim() == 0:
        pos = pos.expand(B)
    if pos.shape != (B,) or pos.dtype not in (torch.int64, torch.int32):
        raise InputError(f"position must be an int or one int per row ({B} rows), got {position!r}")
    pos = torch.where(pos < 0, pos + T, pos).long()
    bad = torch.nonzero((pos < 0) | (pos >= T)).flatten().tolist()
    if bad:
        raise InputError(
            f"position {pos[bad[0]].item()} of row {bad[0]} is past the row (the batch has {T} "
            f"tokens: use 0 … {T - 1}, or -{T} … -1 from the end)"
        )
    pad = torch.nonzero(mask[torch.arange(B), pos] == 0).flatten().tolist()
    if pad:
        raise InputError(f"position {pos[pad[0]].item()} of row {pad[0]} is padding: name a real token")
    return pos


def one_hot_rows(mask: Tensor, pos: Tensor) -> Tensor:
    """(B, T) like ``mask``: 1 at each row's position ``pos`` (B,)."""
    read = torch.zeros_like(mask)
    read[torch.arange(mask.shape[0]), pos.to(mask.device)] = 1
    return read


def position_required(model: nn.Module, task: str) -> InputError:
    """The error of a per-token head called without ``position=``."""
    return InputError(
        f"position= is required: {type(model).__name__} is {TASK_NAMES[task]}; name the token whose prediction is "
        "explained, e.g. explain(..., target=t, position=p) (an int, or one int per row)"
    )


def qa_classes(target: Any, batch: int) -> Any:
    """A question-answering target as head columns: ``"start"`` → 0, ``"end"`` → 1 (one name or one per row);
    ``None`` → ``"start"``. Other values are passed on as class ids (0 / 1), checked by the target resolver."""
    if target is None:
        return 0
    if isinstance(target, str):
        target = [target] * batch
    if isinstance(target, (list, tuple)) and any(isinstance(t, str) for t in target):
        bad = [t for t in target if t not in QA_TARGETS]
        if bad:
            raise InputError(
                f"target {bad[0]!r}: a question-answering head explains target='start' or target='end' "
                "(one for every row, or one per row)"
            )
        return [QA_TARGETS[t] for t in target]
    return target


def best_positions(trace: Trace, mask: Tensor, column: Tensor) -> Tensor:
    """(B,) each row's real token with the largest logit of its head column ``column`` (B,): the head applied to
    every token of a plain replay's final hidden states (the readout's norm, then its layers)."""
    readout, record = trace.readout, trace.readout_record
    assert readout is not None and record is not None, "a replay's trace holds its readout and its record"
    h = readout.norm(record.hidden)
    for layer in readout.head_layers:
        h = layer.module(h)  # (B, N, 2)
    logit = h.gather(-1, column.to(h.device).view(-1, 1, 1).expand(-1, h.shape[1], 1)).squeeze(-1)
    logit = logit.masked_fill(mask.to(logit.device) == 0, float("-inf"))
    return logit.argmax(dim=1)


def qa_columns(target: Any, batch: int) -> Tensor:
    """(B,) long: a question-answering target (after :func:`qa_classes`) as head columns, checked to be 0 / 1."""
    try:
        column = torch.as_tensor(target)
    except (TypeError, ValueError, RuntimeError):
        column = None
    if column is not None and column.dim() == 0:
        column = column.expand(batch)
    if (
        column is None
        or column.shape != (batch,)
        or column.is_floating_point()
        or column.dtype == torch.bool
        or bool(((column < 0) | (column > 1)).any())
    ):
        raise InputError(
            f"target must be 'start' or 'end' (or the column 0 / 1), one for every row or one per row ({batch} "
            f"rows) for a question-answering head; got {target!r}"
        )
    return column.long()


def qa_task_inputs(adapter: Any, prepared: Any, position: Any, target: Any) -> tuple[Any, Any]:
    """(the batch read at ``position`` — default each row's argmax of the explained logit over its real tokens
    —, the target as head columns (B,)) for a question-answering head."""
    column = qa_columns(qa_classes(target, prepared.size), prepared.size)
    if position is None:
        with torch.no_grad(), compute_precision(adapter.model):
            trace = adapter.forward(prepared)
            position = best_positions(trace, prepared.attention_mask, column)
    return adapter.at_position(prepared, position), column


# ---------------------------------------------------------------------------- the heads' modules
def token_head(model: ModelPart, *names: str) -> list[HeadLayer]:
    """The per-token classifier: the first of ``names`` the model has (a Linear or an MLP head)."""
    for n in names:
        module = getattr(model, n, None)
        if module is not None:
            return head_layers(module, f"{type(model).__name__}.{n}")
    raise UnsupportedModelError(f"{type(model).__name__}: no per-token head ({' or '.join(names)})")


#: the MLM heads of the BERT family: (transform dense, activation, LayerNorm, decoder) as attribute paths;
#: ``None``: GELU applied inline (RoBERTa, XLM-R, MPNet)
MLM_LAYOUTS: tuple[tuple[str, Optional[str], str, str], ...] = (
    (
        "cls.predictions.transform.dense",
        "cls.predictions.transform.transform_act_fn",
        "cls.predictions.transform.LayerNorm",
        "cls.predictions.decoder",
    ),  # BERT  # fmt: skip
    ("lm_head.dense", None, "lm_head.layer_norm", "lm_head.decoder"),  # RoBERTa, XLM-R, CamemBERT, MPNet
    (
        "generator_predictions.dense",
        "generator_predictions.activation",
        "generator_predictions.LayerNorm",
        "generator_lm_head",
    ),  # ELECTRA  # fmt: skip
    ("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector"),  # DistilBERT
    ("predictions.dense", "predictions.activation", "predictions.LayerNorm", "predictions.decoder"),  # ALBERT
)
#: RoBERTa's and MPNet's inline ``gelu`` (transformers' GELUActivation: the exact erf GELU)
_GELU = nn.GELU()


def _part(model: ModelPart, path: str) -> Optional[ModelPart]:
    for name in path.split("."):
        model = getattr(model, name, None)
        if model is None:
            return None
    return model


def mlm_head(model: ModelPart) -> list[HeadLayer]:
    """The MLM head's layers: transform dense → activation → LayerNorm → decoder (tied to the embeddings)."""
    from ..rules.linear import is_linear
    from ..rules.ops import ELEMENTWISE, LAYERNORM, LINEAR

    for dense, act, norm, decoder in MLM_LAYOUTS:
        parts = [_part(model, dense), _GELU if act is None else _part(model, act), _part(model, norm)]
        out = _part(model, decoder)
        if is_linear(parts[0]) and parts[1] is not None and isinstance(parts[2], nn.LayerNorm) and is_linear(out):
            kinds = (LINEAR, ELEMENTWISE, LAYERNORM)
            return [HeadLayer(k, m) for k, m in zip(kinds, parts)] + [HeadLayer(LINEAR, out)]
    raise UnsupportedModelError(
        f"{type(model).__name__}: masked-LM head not recognised (expected a transform dense, an activation and a "
        "LayerNorm, then the decoder Linear: BERT's cls.predictions, RoBERTa's lm_head, ELECTRA's "
        "generator_predictions, DistilBERT's vocab_transform, ALBERT's predictions)"
    )


def qa_head(model: ModelPart) -> list[HeadLayer]:
    """The question-answering head ``qa_outputs`` (D → 2: start, end)."""
    layers = token_head(model, "qa_outputs")
    if layers[-1].module.out_features != 2:
        raise UnsupportedModelError(
            f"{type(model).__name__}.qa_outputs gives {layers[-1].module.out_features} columns: a question-answering "
            "head gives two (start, end)"
        )
    return layers


# ---------------------------------------------------------------------------- the model's own outputs
def own_at(output: Any, task: str, read: Tensor) -> Tensor:
    """(B, C) the model's own per-token output read at each row's position ``read`` (B,): the logits (token
    classification, masked LM) or the start and end logits side by side (question answering)."""
    from .verification import logits_of

    if task == "qa":
        full = torch.stack([output.start_logits, output.end_logits], dim=-1)
    else:
        full = logits_of(output)
    rows = torch.arange(read.shape[0], device=full.device)
    return full[rows, read.to(full.device)]


def explained_logit(logits: Tensor, target: Tensor) -> Tensor:
    """(B,) the explained column of (B, C) logits (question answering: the start or the end logit)."""
    return logits.gather(1, target.to(logits.device)[:, None]).squeeze(1)


def choice_scores(scores: Tensor, choice: Tensor, num_choices: int) -> Tensor:
    """(B, C, T): each row's scores (B, T) placed at its choice (B,), the other choices' rows 0."""
    out = scores.new_zeros((scores.shape[0], num_choices) + tuple(scores.shape[1:]))
    out[torch.arange(scores.shape[0]), choice.to(scores.device)] = scores
    return out


# ---------------------------------------------------------------------------- the hooks of an encoder
class EncoderTaskHeads:
    """The task heads of a BERT-family encoder, mixed into :class:`~lrp_core.adapters.bert.BertAdapter` (so into
    every subclass): ``self.task`` is set from the class name, the head's layers come from :meth:`_task_head`
    (per-token tasks) or the family's ``_head`` (sequence, multiple choice), and the position / target / result
    hooks of :class:`~lrp_core.adapters.base.Adapter` read them. A sequence classifier passes through unchanged."""

    model: ModelPart
    task: str = "sequence"

    def _task_head(self, task: str) -> list[HeadLayer]:
        """The head of a per-token task: the classifier (token classification), ``qa_outputs``, the MLM head."""
        if task == "token":
            return token_head(self.model, "classifier")
        if task == "qa":
            return qa_head(self.model)
        return mlm_head(self.model)

    def _readout_of(self, head: list[HeadLayer], norm: Optional[nn.Module] = None) -> Any:
        """The readout the head is read through (after the final ``norm``, default none): [CLS] (sequence, multiple
        choice) or one token per row."""
        from .readouts import PositionReadout, TokenReadout

        norm = nn.Identity() if norm is None else norm
        if self.task in POSITION_TASKS:
            return PositionReadout(norm, head, torch.zeros(1))
        return TokenReadout(norm=norm, head_layers=head)

    def sequence_readout(self, prepared: Any) -> Any:
        """The readout of a sequence or multiple-choice head for this batch (default: the one built, [CLS])."""
        return self.readout  # type: ignore[attr-defined]

    # ------------------------------------------------------------ the family's part
    def check_rows(self, inputs: Any) -> Any:
        """The family's check of a tokenizer output (B, T) -> its text batch."""
        raise NotImplementedError

    def text_layout(self, prepared: Any) -> Any:
        """The family's token layout of a text batch ([CLS] read)."""
        raise NotImplementedError

    # ------------------------------------------------------------ inputs
    def check_inputs(self, inputs: Any) -> Any:
        """A multiple-choice head's (B, C, T) inputs as the B·C rows of a :class:`ChoiceBatch`; else as the family
        checks them."""
        if self.task != "choice":
            return self.check_rows(inputs)
        from .batches import ChoiceBatch

        ids = inputs.get("input_ids") if hasattr(inputs, "get") else None
        if not isinstance(ids, Tensor) or ids.dim() != 3:
            raise InputError(
                f"{type(self.model).__name__} is {TASK_NAMES['choice']}: input_ids (B, C, T), C choices per sample, "
                f"as its tokenizer gives them; got {None if ids is None else tuple(getattr(ids, 'shape', ()))}"
            )
        B, C, T = ids.shape
        flat = {k: v.reshape(B * C, *v.shape[2:]) if isinstance(v, Tensor) and v.dim() >= 3 else v
                for k, v in inputs.items()}  # fmt: skip
        rows = self.check_rows(flat)
        return ChoiceBatch(**rows.entries(), num_choices=torch.tensor(C))

    def at_position(self, prepared: Any, position: Any) -> Any:
        """The batch read at ``position`` (per-token heads only)."""
        if self.task not in POSITION_TASKS:
            return super().at_position(prepared, position)  # type: ignore[misc]
        mask = prepared.attention_mask
        return prepared.replace(read_at=one_hot_rows(mask, read_positions(mask, position)))

    def task_inputs(self, prepared: Any, position: Any, target: Any) -> tuple[Any, Any]:
        """Token classification and masked LM: ``position`` required; question answering: ``"start" | "end"``
        and the default position; multiple choice: the choice explained (``target``, default the argmax)."""
        if self.task in ("token", "mlm"):
            if position is None:
                raise position_required(self.model, self.task)
            return self.at_position(prepared, position), target
        if self.task == "qa":
            return qa_task_inputs(self, prepared, position, target)
        if self.task == "choice":
            if position is not None:
                raise InputError(f"position= names a token; {TASK_NAMES['choice']} reads [CLS] of each choice")
            return choose(self, prepared, target), 0
        return super().task_inputs(prepared, position, target)  # type: ignore[misc]

    # ------------------------------------------------------------ readout, layout
    def readout_for(self, prepared: Any) -> Any:
        """Per-token heads: the head at each row's read token (token 0 before a position is named)."""
        if self.task not in POSITION_TASKS:
            return self.sequence_readout(prepared)
        from .readouts import PositionReadout

        read = prepared.read_at
        at = torch.zeros(prepared.size, dtype=torch.long) if read is None else read.argmax(dim=-1)
        readout = self.readout  # type: ignore[attr-defined]
        return PositionReadout(readout.norm, readout.head_layers, at)

    def layout(self, prepared: Any) -> Any:
        """Per-token heads: the read token of each row is the readout row (not [CLS]; no [CLS]-minimum)."""
        import dataclasses

        layout = self.text_layout(prepared)
        if self.task not in POSITION_TASKS or prepared.read_at is None:
            return layout
        return dataclasses.replace(
            layout, readout_tokens=(), readout_rows=prepared.read_at.argmax(dim=-1), readout_minimum_applies=False
        )

    # ------------------------------------------------------------ the model's own output, the result
    def own_output(self, prepared: Any) -> Tensor:
        """Per-token heads: the model's own output at the read tokens; multiple choice: each chosen row's logit as
        the model computes it for a sample of that one choice (its rows are independent)."""
        if self.task == "sequence":
            return super().own_output(prepared)  # type: ignore[misc]
        names = getattr(self, "honoured_inputs", ("input_ids", "attention_mask"))
        given = {k: v for k, v in prepared.entries().items() if k in names and v is not None}
        if self.task == "choice":
            from .verification import logits_of

            return logits_of(self.model(**{k: v[:, None] for k, v in given.items()}))
        assert prepared.read_at is not None, "task_inputs names the read token"
        return own_at(self.model(**given), self.task, prepared.read_at.argmax(dim=-1))

    def task_result(self, prepared: Any, result: Any) -> Any:
        """Question answering: ``logits`` (B,) the explained logit; multiple choice: ``scores`` (B, C, T) with the
        other choices' rows 0, ``logits`` (B, C) every choice's, ``target`` (B,) the choice explained."""
        import dataclasses

        if self.task == "qa":
            return dataclasses.replace(result, logits=explained_logit(result.logits, result.target))
        if self.task == "choice" and prepared.choice is not None:
            C = int(prepared.num_choices)
            return dataclasses.replace(
                result,
                scores=choice_scores(result.scores, prepared.choice, C),
                logits=prepared.choice_logits.to(result.logits.device),
                target=prepared.choice.to(result.target.device),
            )
        return result


def choose(adapter: Any, prepared: Any, target: Any) -> Any:
    """The choice rows explained: every choice's logit from a plain replay (B, C), the choice ``target`` (an int for
    every sample or one per sample; ``None``: the argmax), and the batch of each sample's chosen row."""
    from .batches import ChoiceBatch

    C = int(prepared.num_choices)
    B = prepared.size // C
    with torch.no_grad(), compute_precision(adapter.model):
        logits = adapter.forward(prepared).logits.reshape(B, C)
    if target is None:
        k = logits.argmax(dim=1)
    else:
        k = torch.as_tensor(target) if not isinstance(target, Tensor) else target
        if k.dim() == 0:
            k = k.expand(B)
        if k.shape != (B,) or k.is_floating_point() or k.dtype == torch.bool or bool(((k < 0) | (k >= C)).any()):
            raise InputError(
                f"target names the choice explained: an int in 0 … {C - 1} for every sample, or one per sample "
                f"({B} samples); got {target!r}"
            )
    k = k.long().to(logits.device)
    rows = torch.arange(B, device=k.device) * C + k
    chosen = prepared.take(rows.cpu())
    assert isinstance(chosen, ChoiceBatch)
    return chosen.replace(choice_logits=logits.detach(), choice=k)


__all__ = [
    "TASK_SUFFIXES",
    "DECODER_TASK_HEADS",
    "decoder_task_family",
    "POSITION_TASKS",
    "QA_TARGETS",
    "task_of",
    "read_positions",
    "one_hot_rows",
    "position_required",
    "qa_classes",
    "best_positions",
    "qa_columns",
    "qa_task_inputs",
    "token_head",
    "mlm_head",
    "qa_head",
    "own_at",
    "explained_logit",
    "choice_scores",
    "choose",
    "EncoderTaskHeads",
]
