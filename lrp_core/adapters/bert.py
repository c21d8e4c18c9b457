"""Post-LayerNorm BERT-family encoders from Hugging Face: sequence classifiers, the task heads, base models.

``BertForSequenceClassification`` and encoders with the same layout
(RoBERTa, XLM-R, ELECTRA); their ``*ForTokenClassification``, ``*ForQuestionAnswering``, ``*ForMaskedLM``
and ``*ForMultipleChoice`` through the hooks of :mod:`lrp_core.adapters.task_heads`; the base models
(``BertModel``, ``RobertaModel``, ...) have no classification head: their readout is the pooler on [CLS] (or
[CLS] itself), explained with a ``Projection`` / ``Similarity`` target (:mod:`lrp_core.adapters.embeddings`).
As for ViTs, the adapter names the model's own submodules and the engine replays them — whatever attention
implementation (eager, sdpa) the model is configured with — and never changes the model.

Shapes: B batch, T tokens (padding included), D width, C classes.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.ops import ADD, ELEMENTWISE, LINEAR, POS_ADD
from .base import Adapter
from .batches import TextBatch
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay
from .checks import input_keys, token_ids, tokenized
from .heads import hf_heads
from .mlp_head import head_layers, is_head
from .parts import ModelPart
from .predicates import is_base_model
from .readouts import HeadLayer
from .records import EmbeddingRecord, TokenLayout, Trace
from .task_heads import EncoderTaskHeads, task_of

#: Additive mask value of the reference implementation; softmax gives exactly 0 there.
MASK_VALUE = -10000.0


class BertAdapter(EncoderTaskHeads, Adapter[TextBatch]):
    """Hugging Face BERT-family encoders with a [CLS] classification head, or a task head
    (:class:`~lrp_core.adapters.task_heads.EncoderTaskHeads`)."""

    modality = "text"
    mask_value = MASK_VALUE

    def __init__(self, model: nn.Module):
        """The family's facts, each from its own hook: :meth:`_backbone` (checks the layout, returns the
        module holding ``embeddings``), :meth:`_layers`, :meth:`_block`, :meth:`_head` (a sequence or multiple-choice
        head on [CLS]) or :meth:`_task_head` (a per-token head), :meth:`_max_length`."""
        super().__init__(model)
        self.task = task_of(model)
        self.base = self._backbone()
        self.blocks = [self._block(i, layer) for i, layer in enumerate(self._layers())]
        self.pooler_layers = self._pooler()
        if is_base_model(model):
            head = list(self.pooler_layers)
        else:
            head = self._task_head(self.task) if self.task in ("token", "qa", "mlm") else self._head()
        self.readout = self._readout_of(head)
        self.max_length = self._max_length()
        self.vocab_size = int(getattr(model.config, "vocab_size", 0)) or None

    def _backbone(self) -> ModelPart:
        """The encoder holding ``embeddings`` (``model.base_model``), after checking the BERT layout."""
        model = self.model
        name = type(model).__name__
        cfg = getattr(model, "config", None)
        base = getattr(model, "base_model", None)
        if (
            cfg is None
            or base is None
            or not hasattr(base, "embeddings")
            or not hasattr(base, "encoder")
            or not hasattr(base.encoder, "layer")
        ):
            raise UnsupportedModelError(
                f"{name}: not a BERT-family encoder (expected base_model.embeddings and base_model.encoder.layer)"
            )
        if getattr(cfg, "is_decoder", False):
            raise UnsupportedModelError(f"{name}: decoder (causal) models are not supported")
        pet = getattr(cfg, "position_embedding_type", "absolute")
        if pet not in (None, "absolute"):
            raise UnsupportedModelError(f"{name}: position_embedding_type={pet!r} is not supported (only 'absolute')")
        return base

    def _layers(self) -> list:
        """The encoder layers in the order the model runs them."""
        return list(self.base.encoder.layer)

    def _max_length(self) -> int:
        """The longest input the position embeddings cover (RoBERTa's positions start after the padding index)."""
        cfg = self.model.config
        max_length = int(getattr(cfg, "max_position_embeddings", 512))
        # RoBERTa (CamemBERT, Data2Vec-text) positions start after the padding index: known by the embeddings' kind
        roberta_positions = hasattr(self.base.embeddings, "create_position_ids_from_input_ids")
        pad_offset = getattr(cfg, "pad_token_id", None) if roberta_positions else None
        return max_length - (int(pad_offset) + 1 if pad_offset is not None else 0)

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        if getattr(layer, "crossattention", None) is not None:
            raise UnsupportedModelError(f"layer {i} has cross-attention; only encoders are supported")
        try:
            sa, so = layer.attention.self, layer.attention.output
            d = self.model.config.hidden_size // self.model.config.num_attention_heads
            H, d, scale = hf_heads(sa, sa.query, sa.key, sa.value, so.dense, f"layer {i}", d)
            return BlockSpec(
                layout="post_ln",
                norm1=so.LayerNorm,
                norm2=layer.output.LayerNorm,
                attn=AttentionSpec(
                    q=sa.query, k=sa.key, v=sa.value, proj=so.dense, num_heads=H, head_dim=d, scale=scale
                ),
                mlp=MlpSpec(
                    fc1=layer.intermediate.dense, act=layer.intermediate.intermediate_act_fn, fc2=layer.output.dense
                ),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the BERT layout "
                f"(attention.self.query/key/value, attention.output, intermediate, output): {e}"
            ) from None

    def _pooler(self) -> list:
        """The pooler on [CLS] (dense + its activation), or ``[]`` where the model has none (RoBERTa's classifier,
        ``add_pooling_layer=False``): what ``Projection(v, pooling="pooler")`` reads, and a bare model's embedding."""
        pooler: ModelPart = getattr(self.base, "pooler", None)
        if pooler is None or not is_linear(getattr(pooler, "dense", None)):
            return []
        return [HeadLayer(LINEAR, pooler.dense), HeadLayer(ELEMENTWISE, pooler.activation)]

    def _head(self) -> list:
        """The classification head on [CLS], layer by layer (pooler dense + tanh + classifier, or RoBERTa's)."""
        model = self.model
        clf = getattr(model, "classifier", None)
        pooler: ModelPart = getattr(self.base, "pooler", None)
        where = f"{type(model).__name__}.classifier"
        if is_head(clf) and pooler is not None and is_linear(getattr(pooler, "dense", None)):
            # BERT: [CLS] -> dense -> tanh -> classifier (a Linear, or an MLP head)
            pooled = [HeadLayer(LINEAR, pooler.dense), HeadLayer(ELEMENTWISE, pooler.activation)]
            return pooled + head_layers(clf, where)
        if clf is not None and is_linear(getattr(clf, "dense", None)) and is_linear(getattr(clf, "out_proj", None)):
            act = getattr(clf, "activation", None) or nn.Tanh()  # RoBERTa's head uses tanh inline
            return [HeadLayer(LINEAR, clf.dense), HeadLayer(ELEMENTWISE, act), HeadLayer(LINEAR, clf.out_proj)]
        summary = getattr(model, "sequence_summary", None)  # ELECTRA's multiple-choice head
        if summary is not None and is_linear(clf):
            return self._summary_head(summary, clf)
        raise UnsupportedModelError(
            f"{type(model).__name__}: classification head not recognised (expected a pooler (dense + tanh) with a "
            "Linear classifier, or a classifier with dense and out_proj)"
        )

    def _summary_head(self, summary: ModelPart, clf: ModelPart) -> list:
        """ELECTRA's multiple-choice head on [CLS]: ``sequence_summary`` (its Linear and activation) → classifier."""
        kind = getattr(summary, "summary_type", None)
        if kind != "first":
            raise UnsupportedModelError(
                f"{type(self.model).__name__}.sequence_summary has summary_type={kind!r}: the replay reads the "
                "summary of the first token only (summary_type='first', ELECTRA's default)"
            )
        layers = [HeadLayer(LINEAR, summary.summary)] if is_linear(summary.summary) else []
        if not isinstance(summary.activation, nn.Identity):
            layers.append(HeadLayer(ELEMENTWISE, summary.activation))
        return layers + [HeadLayer(LINEAR, clf)]

    # ------------------------------------------------------------ validation
    #: the input keys the replay reads as the model does
    honoured_inputs: tuple = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
    #: input keys the model's forward reads that the replay does not, and what to pass instead
    refused_inputs: dict = {
        "inputs_embeds": "the token scores are read at the model's own word embeddings of input_ids, so embeddings "
        "given directly are refused: pass input_ids (and attention_mask)",
        "head_mask": "a head mask scales the heads' attention, and the replay runs every head as the model does "
        "without one: pass no head_mask",
    }

    def check_rows(self, inputs) -> TextBatch:
        """The tokenizer output (B, T) as a :class:`TextBatch` (``check_inputs``: the task's inputs, through this)."""
        ids, mask = tokenized(inputs, type(self.model).__name__)
        T = ids.shape[1]
        if T > self.max_length:
            raise InputError(
                f"the text is {T} tokens long; {type(self.model).__name__} accepts at most {self.max_length}. "
                f"Tokenize with truncation=True, max_length={self.max_length} to cut it"
            )
        if self.vocab_size is not None and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise InputError(f"input_ids must lie in [0, {self.vocab_size}) (the vocabulary size)")
        tt = inputs.get("token_type_ids")
        if tt is not None:
            tt = token_ids(tt, "token_type_ids").to(ids.device)
            if tt.shape != ids.shape:
                raise InputError(
                    f"token_type_ids has shape {tuple(tt.shape)}, input_ids {tuple(ids.shape)}: they "
                    "must be the same (one segment id per token)"
                )
            table = getattr(self.base.embeddings, "token_type_embeddings", None)
            if table is not None and (int(tt.min()) < 0 or int(tt.max()) >= table.num_embeddings):
                raise InputError(
                    f"token_type_ids must lie in [0, {table.num_embeddings}) (the model's segment "
                    f"table); got {int(tt.min())} … {int(tt.max())}"
                )
            if table is None and "token_type_ids" not in self.honoured_inputs and not bool(tt.any()):
                # a model without a segment table (DistilBERT, MPNet) given one segment only, as a BERT
                # tokenizer emits it: nothing it would compute with; any other segment id is refused below
                inputs = {k: v for k, v in inputs.items() if k != "token_type_ids"}
        input_keys(inputs, type(self.model).__name__, self.honoured_inputs, self.refused_inputs)
        pos = inputs.get("position_ids")
        if pos is not None:
            pos = self._given_positions(pos, ids)
        return TextBatch(input_ids=ids, attention_mask=mask, token_type_ids=tt, position_ids=pos)

    def _given_positions(self, value, ids: Tensor) -> Tensor:
        """The ``position_ids`` given with the inputs (B, T) or (1, T), checked to index the position table."""
        pos = token_ids(value, "position_ids").to(ids.device)
        if pos.shape[0] == 1 and pos.shape[1] == ids.shape[1]:
            pos = pos.expand(ids.shape)
        if pos.shape != ids.shape:
            raise InputError(
                f"position_ids has shape {tuple(pos.shape)}, input_ids {tuple(ids.shape)}: give one "
                "position per token, (B, T) or (1, T)"
            )
        n = self.base.embeddings.position_embeddings.num_embeddings
        if int(pos.min()) < 0 or int(pos.max()) >= n:
            raise InputError(
                f"position_ids must lie in [0, {n}) (the position table); got {int(pos.min())} … {int(pos.max())}"
            )
        return pos

    def text_layout(self, prepared: TextBatch) -> TokenLayout:
        """Every token scored, [CLS] read (``layout``: the task's, through this)."""
        mask = prepared.attention_mask
        return TokenLayout(
            modality="text", num_tokens=mask.shape[1], output_start=0, readout_tokens=self.readout.tokens, mask=mask
        )

    # --------------------------------------------------------------- forward
    def embed(self, prepared: TextBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """Word (+ token-type) + position embeddings, LayerNorm (+ projection) — the model's own order.

        ``embeds`` (B, T, E) are the word embeddings, the read-out of attnlrp/cp_lrp; ``x0``
        (B, T, D) is block 0's input (after the projection where E != D: ELECTRA, ALBERT).
        """
        emb = self.base.embeddings
        ids = prepared.input_ids
        words = emb.word_embeddings(ids)  # (B, T, E)
        if track:
            words = words.detach().requires_grad_(True)
        x = words
        types = getattr(emb, "token_type_embeddings", None)  # DistilBERT, MPNet have none
        if types is not None:
            tt = prepared.token_type_ids
            x = r(ADD, torch.add, x, types(torch.zeros_like(ids) if tt is None else tt))
        given = prepared.position_ids
        x = r(POS_ADD, torch.add, x, emb.position_embeddings(self._positions(ids) if given is None else given))
        x0 = r.norm(emb.LayerNorm, x)  # dropout: inference
        project = self.embedding_projection()
        if project is not None:
            x0 = r.module(LINEAR, project, x0)
        return EmbeddingRecord(x0=x0, embeds=words)

    def embedding_projection(self) -> Optional[ModelPart]:
        """The Linear from the embedding width to the hidden width, or ``None`` (ELECTRA's ``embeddings_project``)."""
        return getattr(self.base, "embeddings_project", None)

    def _positions(self, ids: Tensor) -> Tensor:
        emb = self.base.embeddings
        make = getattr(emb, "create_position_ids_from_input_ids", None)
        if make is not None:  # RoBERTa family: positions count real tokens after the padding index
            return make(ids, emb.padding_idx)
        return emb.position_ids[:, : ids.shape[1]]

    # ------------------------------------------------------------- relevance
    def input_relevance(self, trace: Trace, R: list, prepared: TextBatch) -> tuple[Tensor, None]:
        """Relevance at the embedding output, summed over channels; padding scores 0."""
        return R[0].sum(-1) * prepared.attention_mask.to(R[0].dtype), None


__all__ = ["BertAdapter", "MASK_VALUE"]
