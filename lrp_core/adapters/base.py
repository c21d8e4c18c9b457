"""The typed seam between the methods and a model family.

An adapter says, for one model: how to validate and embed its inputs, which
of its submodules form each block (:class:`~lrp_core.adapters.blocks.BlockSpec`),
how it reads its prediction (:class:`~lrp_core.adapters.readouts.Readout`),
how its tokens are laid out (:class:`TokenLayout`), and how relevance at
block 0 reaches input space (pixels or embeddings). The replay, the
relevance pass and every method are shared; a new model family is one small
subclass plus a line in :data:`lrp_core.adapters.ADAPTERS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cached_property
from typing import Callable, Generic, Mapping, Optional, Sequence, TypeVar

import torch
from torch import Tensor, nn

from ..errors import InputError, RuleSetError
from ..rules.composites import Composite, check_pass
from ..rules.ops import EXPLICIT
from ..runtime.devices import Placement
from ..runtime.precision import compute_precision
from .batches import Batch, ImageBatch, TextBatch
from .blocks import NO_RECORD, BlockSpec, Replay, block_forward
from .parts import ModelPart
from .readouts import HeadLayer, PositionReadout, Readout
from .records import AttentionRecord, BlockRecord, BlockRelevance, EmbeddingRecord, ReadoutRecord, TokenLayout, Trace

BatchT = TypeVar("BatchT", bound=Batch)


class Adapter(ABC, Generic[BatchT]):
    """One model, replayed from its own submodules. Subclasses set the attributes and the abstract methods;
    ``BatchT`` is the batch type its :meth:`check_inputs` returns and every other method reads."""

    model: ModelPart  # the user's model, read by attribute name (lrp_core.adapters.parts)
    blocks: list  # BlockSpec per block, in forward order (a shared layer appears once per use)
    readout: Readout  # the readout, where it does not depend on the batch (else see readout_for)
    modality: str  # "image" | "text"
    #: additive value at padded key positions (text); ``None``: the model takes no padding mask
    mask_value: Optional[float] = None
    #: a decoder language model (lrp_core.adapters.decoder): methods declare whether they run on one
    is_decoder: bool = False
    #: a vision-language model (:mod:`lrp_core.adapters.vlm`): its batch is a :class:`VLMBatch`, text with images
    is_vlm: bool = False
    #: an encoder-decoder (:mod:`lrp_core.adapters.seq2seq`): its batch is a :class:`Seq2SeqBatch`, source and prefix
    is_seq2seq: bool = False
    #: method name -> why that method has no meaning on this model (``explain`` refuses it, naming the reason);
    #: empty: every method runs
    refused_methods: Mapping[str, str] = {}
    #: the pooler on [CLS] (dense + tanh) a ``Projection(v, pooling="pooler")`` reads; empty: the model has none
    pooler_layers: Sequence[HeadLayer] = ()
    #: a SentenceTransformer pipeline around the model (its own embedding), its Pooling mode and whether it ends in
    #: Normalize (:mod:`lrp_core.adapters.sentence`); ``None`` / ``False`` for a bare model
    sentence: Optional[nn.Module] = None
    sentence_pooling: Optional[str] = None
    normalised: bool = False

    def __init__(self, model: nn.Module):
        self.model = model

    # ------------------------------------------------------------------ facts
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_heads(self) -> int:
        return self.blocks[0].attn.num_heads

    @property
    def shares_weights(self) -> bool:
        """Whether some block's modules are used by another block too (a shared layer, e.g. ALBERT)."""
        fc1 = [id(spec.mlp.fc1) for spec in self.blocks]
        return len(set(fc1)) < len(fc1)

    @property
    def num_classes(self) -> int:
        return self.readout.num_classes

    @cached_property
    def module_names(self) -> dict:
        """The model's module → its qualified name (``"blocks.0.mlp.fc1"``), built once per adapter: what a
        composite's ``names`` patterns are matched against (a module used twice keeps its first name)."""
        return self._model_module_names()

    def _model_module_names(self) -> dict:
        """:attr:`module_names` of the model's own modules (a family adds its views' names to a copy)."""
        return {module: name for name, module in self.model.named_modules()}

    def module_name(self, module: nn.Module) -> str:
        """The qualified name of one of the model's modules (its class name where it is a view of the engine)."""
        name = self.module_names.get(module)
        return f"{type(self.model).__name__}.{name}" if name else type(module).__name__

    def _names_for(self, composite: Optional[Composite]) -> Optional[dict]:
        """The module names, where the composite chooses rules by name (built only then)."""
        return self.module_names if composite is not None and composite.names else None

    def for_inputs(self, inputs) -> "Adapter":
        """The adapter that explains these inputs: ``self``, or a sibling view of the same model
        (CLIP: the text side when ``inputs["explain"] == "text"``)."""
        return self

    # ------------------------------------------------------- the family's part
    @abstractmethod
    def _block(self, i: int, layer: nn.Module) -> BlockSpec:
        """The description of the model's block ``i`` (its module ``layer``); the configuration is read from
        ``self.model``. Raises :class:`~lrp_core.errors.UnsupportedModelError` naming what does not match."""

    @abstractmethod
    def check_inputs(self, inputs) -> Batch:
        """Validate user inputs; return the family's typed batch (:mod:`lrp_core.adapters.batches`)."""

    @abstractmethod
    def embed(self, prepared: BatchT, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """The input layer up to block 0's input. ``track``: make the input-space tensors
        (``images``, word ``embeds``) leaves that require gradients."""

    @abstractmethod
    def layout(self, prepared: BatchT) -> TokenLayout:
        """The token layout of a prepared batch."""

    @abstractmethod
    def input_relevance(self, trace: Trace, R: list, prepared: BatchT) -> tuple[Tensor, Optional[Tensor]]:
        """The relevance of :meth:`relevance_inputs` (block 0's input (B, N, D) first) -> (token scores (B, T),
        pixels (B, H, W) or ``None``)."""

    # --------------------------------------------------------------- readout
    def readout_for(self, prepared: BatchT) -> Readout:
        """The readout that reads this prepared batch: :attr:`readout`, unless the family's readout depends on
        the batch (CLIP: the other tower's embeddings; a token position that differs by row).

        A readout is an immutable object built for the batch; no adapter state changes per call.
        """
        return self.readout

    def at_position(self, prepared: BatchT, position) -> BatchT:
        """The batch read at another position (``explain(..., position=)``): decoder language models and per-token
        task heads (:mod:`lrp_core.adapters.task_heads`)."""
        raise InputError(
            f"position= names the token a decoder language model or a per-token head (token classification, "
            f"question answering, masked LM) is explained at; {type(self.model).__name__} reads its prediction "
            "from a fixed token"
        )

    def task_inputs(self, prepared: BatchT, position, target) -> tuple[BatchT, object]:
        """(the batch, the target) a call explains: the batch read at ``position`` (:meth:`at_position`; ``None``:
        as checked) and the target as class ids. A task head (:mod:`lrp_core.adapters.task_heads`: token
        classification, question answering, masked LM, multiple choice) requires or chooses the position and
        translates its targets here."""
        if position is not None:
            prepared = self.at_position(prepared, position)
        return prepared, target

    def task_result(self, prepared: BatchT, result):
        """The method's result as the task reports it (default: as is; question answering: ``logits`` (B,) the
        explained logit; multiple choice: ``scores`` (B, C, T), ``logits`` (B, C), ``target`` the choice)."""
        return result

    def token_embeddings(self, prepared: BatchT, token: int) -> Tensor:
        """(B, T, E) the word embedding of ``token`` at every scored position, for a family whose word embeddings
        no single module gives (an encoder-decoder's source and prefix: the Captum token baselines). Default: none."""
        raise InputError(f"{type(self.model).__name__}: its token baselines come from its word-embedding module")

    def context_row(self, prepared: BatchT, b: int) -> BatchT:
        """Sample ``b`` alone, cut to the tokens its prediction reads (an encoder-decoder's real source and
        prefix up to the read position). Default: the sample as it is."""
        return prepared.take(torch.tensor([b]))

    def block_context(
        self, x0: Tensor, mask: Optional[Tensor], positions: Optional[Tensor], fused: bool = False
    ) -> list:
        """Per block ``(bias, rope)``: the additive attention mask and the rotary tables (``None``: none).

        Default: every block gets :meth:`attention_bias` and no rotary tables (decoders override; ``fused``:
        the replay runs fused attention, which needs no mask tensor for plain causal attention).
        """
        bias = self.attention_bias(x0, mask)
        return [(bias, None)] * len(self.blocks)

    def embedding_readout(self, head: Readout, prepared: BatchT, pooling: Optional[str]) -> Readout:
        """The readout whose output is the pooled embedding e (B, D) a ``Projection`` / ``Similarity`` target
        projects (``head``: the family's readout of the batch), as :mod:`lrp_core.adapters.embeddings` builds it."""
        from .embeddings import embedding_readout

        return embedding_readout(self, head, prepared, pooling)

    def own_embedding(self, prepared: BatchT, pooling: Optional[str]) -> Tensor:
        """(B, D) the model's own forward's embedding for ``pooling`` (the end-to-end check of a ``Projection``):
        :func:`lrp_core.adapters.embeddings.own_embedding`."""
        from .embeddings import own_embedding

        return own_embedding(self, prepared, pooling)

    # ------------------------------------------------- the model's own output
    def own_inputs(self, prepared: BatchT) -> dict:
        """The keyword inputs of the model's own forward for a prepared batch: images ``pixel_values`` (Hugging
        Face), text the given inputs the replay honours."""
        if isinstance(prepared, ImageBatch):
            return {"pixel_values": prepared.images}
        names = getattr(self, "honoured_inputs", ("input_ids", "attention_mask"))
        given = prepared.entries()
        return {k: given[k] for k in names if given.get(k) is not None}

    def own_pieces(self, prepared: BatchT) -> list:
        """``(rows (K,), the batch of those rows)``: the groups the model's own forward runs in for the end-to-end
        check (:mod:`lrp_core.adapters.verification`). Default: the batch at once (decoders: unpadded rows)."""
        return [(torch.arange(prepared.size), prepared)]

    def own_output(self, prepared: BatchT) -> Tensor:
        """(B, C) what the model's own forward gives for the quantity the replay's readout explains.

        Called by the end-to-end check inside :func:`~lrp_core.runtime.own_forward.own_forward` (no gradients,
        eval semantics, the call's precision). Default: images ``model(images)`` (timm) or
        ``model(pixel_values=images).logits`` (Hugging Face); text ``model(**the given inputs).logits``. A family
        whose own forward reads something else (a similarity, a read position, images with text) overrides it.
        """
        from .verification import logits_of

        if isinstance(prepared, ImageBatch):
            images = prepared.images
            hf = hasattr(self.model, "config") and hasattr(self.model, "base_model_prefix")
            return logits_of(self.model(pixel_values=images) if hf else self.model(images))
        return logits_of(self.model(**self.own_inputs(prepared)))

    # --------------------------------------------------------------- forward
    def forward(
        self,
        prepared: BatchT,
        *,
        grad: bool = False,
        composite: Optional[Composite] = None,
        track: bool = False,
        readout: Optional[Readout] = None,
        read_rows: bool = False,
    ) -> Trace:
        """Replay the model. ``composite``: the rule set of the replay's operations — modified-gradient rules
        (their gradient is the relevance) or explicit rules (each operation's backward is its rule:
        :meth:`relprop` then runs the pass; ``grad``: plain gradients can be taken on the same graph, inside
        ``trace.replay.plain_gradients()``); ``None``: the plain replay. ``readout``: the batch's readout
        (default :meth:`readout_for`); the trace keeps it as ``trace.readout``. ``read_rows``: with a readout
        that reads one token per row (:class:`PositionReadout`), the last block is computed at those tokens only
        (:meth:`run_blocks`' ``rows``): the logits and every gradient are the full replay's, but the last
        block's record is not (a pass that reads only gradients and block outputs may ask for it)."""
        explicit = getattr(composite, "serves", None) == EXPLICIT
        # a modified-gradient pass never reads A: models that run sdpa may keep their fused attention
        fuse = composite is not None and not explicit
        r = Replay(composite, self._names_for(composite), fuse=fuse, where=self.module_name, cache=self.shares_weights)
        r.vjps = explicit and grad  # the plain gradients of an explicit replay: each operation keeps its own
        grad, track = grad or explicit, track or explicit  # an explicit pass reads its input-space leaves
        head = self.readout_for(prepared) if readout is None else readout
        # a half-precision model is replayed in float32 (lrp_core.runtime.precision; a no-op inside a method)
        with compute_precision(self.model), torch.set_grad_enabled(grad):
            emb = self.embed(prepared, r, track=track)
            x0 = emb.x0
            if grad and not x0.requires_grad:  # frozen models still need a graph to the attention maps
                x0 = x0.detach().requires_grad_(True)
                emb.x0 = x0
            rows = head.positions if read_rows and isinstance(head, PositionReadout) else None
            mask, positions = (
                (prepared.attention_mask, prepared.position_ids) if isinstance(prepared, TextBatch) else (None, None)
            )
            trace = self.run_blocks(x0, mask, r, readout=head, positions=positions, rows=rows)
            trace.embedding = emb
        return trace

    def run_blocks(
        self,
        x0: Tensor,
        mask: Optional[Tensor] = None,
        r: Replay = NO_RECORD,
        keep: bool = True,
        readout: Optional[Readout] = None,
        positions: Optional[Tensor] = None,
        rows: Optional[Tensor] = None,
    ) -> Trace:
        """Blocks and readout from the block-0 input ``x0`` (B, N, D); ``mask`` (B, N) 1 = real token.

        ``readout``: the batch's readout (default :attr:`readout`, for a family whose readout does not
        depend on the batch). ``keep=False`` drops each block's record once the next block has its output
        (the trace then has no ``blocks``): a logits-only pass holds one block's activations at a time.
        ``positions`` (B, N): position ids (decoders: default from the mask; token ablation keeps them).
        ``rows`` (B,): the only token of each row the readout reads; the last block's other rows reach
        nothing, so it computes that token's output alone, its queries against every key
        (:func:`~lrp_core.adapters.blocks.block_forward`), and its record's ``out`` is that output placed in
        an (B, N, D) zero tensor: the same logits, and 0 relevance at the rows left out, as the full block.
        """
        head = self.readout if readout is None else readout
        if self.mask_value is not None and mask is None:
            mask = torch.ones(x0.shape[:2], dtype=torch.long, device=x0.device)
        trace = Trace(
            x0=x0, mask=mask if self.mask_value is not None else None, readout=head, positions=positions, replay=r
        )
        x = x0
        last = len(self.blocks) - 1
        place = Placement(self.model, self.module_name)  # a model split over devices: each block where it computes
        for b, (spec, (bias, rope)) in enumerate(zip(self.blocks, self.block_context(x0, mask, positions, r.fuse))):
            device = place.device(f"block {b}", spec)
            x, bias, rope = place.move(x, device), place.move(bias, device, True), place.move(rope, device, True)
            if rows is not None and b == last:
                rec = block_forward(spec, x, bias, r, rope, rows)
                index = rows.to(x.device).view(-1, 1, 1).expand(-1, 1, x.shape[-1])
                rec.out = x.new_zeros(x.shape).scatter(1, index, rec.out)  # (B, N, D): the read tokens' rows
            else:
                rec = block_forward(spec, x, bias, r, rope)
            if keep:
                trace.blocks.append(rec)
            x = rec.out
        # the readout's modules may be on several devices (a tied head stays with the embedding): the replay moves
        # the input of each module of the readout to that module's device
        with place.replaying(r):
            trace.readout_record = place.returned(head.forward(x, r), x0.device)
        return trace

    def attention_bias(self, x0: Tensor, mask: Optional[Tensor]) -> Optional[Tensor]:
        """The constant every block adds to its scaled scores before the softmax (the MASK_ADD operand).

        Default: the padding mask ``(1 − mask) · mask_value`` (B, 1, 1, N), or ``None`` where the
        model takes no mask. A family with a position bias (MPNet) adds it here, (B, H, N, N).
        """
        if self.mask_value is None:
            return None
        assert mask is not None, "a model with a padding mask value gets a mask (run_blocks makes one)"
        return (1.0 - mask[:, None, None, :].to(x0.dtype)) * self.mask_value

    def block_tokens(self, b: int, row: Tensor) -> Tensor:
        """Block b's per-token row (B, N_b) on the tokens of block 0's input (B, N): the same row where every block
        has one token set (default); a hierarchical model maps its merged tokens back (Swin)."""
        return row

    def cdam_tokens(self, trace: Trace) -> Tensor:
        """CDAM's tokens: those entering the last block's attention (after its norm in pre-LN blocks)."""
        return trace.blocks[-1].attn.h

    # ------------------------------------------------------------- the blockwise pass
    @property
    def blockwise(self) -> bool:
        """Whether the blockwise relevance pass (:mod:`lrp_core.adapters.blockwise`) can re-enter this model block
        by block: :meth:`forward` and :meth:`run_blocks` not overridden (one stream of blocks), no shared layer."""
        cls = type(self)
        return cls.forward is Adapter.forward and cls.run_blocks is Adapter.run_blocks and not self.shares_weights

    @property
    def chunk_rows(self) -> int:
        """Query rows per attention chunk in the blockwise pass (:func:`lrp_core.adapters.attention.rows_per_chunk`)."""
        from .attention import rows_per_chunk

        return rows_per_chunk(self.blocks[0].attn)

    def blockwise_gradients(self, prepared: BatchT, composite: Composite, readout: Readout, resolve, output, **kw):
        """The gradients of a modified-gradient pass one block's graph at a time
        (:func:`lrp_core.adapters.blockwise.blockwise_gradients`, the same arguments)."""
        from .blockwise import blockwise_gradients

        return blockwise_gradients(self, prepared, composite, readout, resolve, output, **kw)

    # ------------------------------------------------------------- relevance
    def relevance_inputs(self, trace: Trace) -> list:
        """The tensors an explicit pass to input space reads the relevance of (handed to :meth:`input_relevance`):
        block 0's input first, then the family's input-space tensors (pixels: a tracked replay's leaf)."""
        return [trace.x0]

    def relprop(
        self,
        trace: Trace,
        R_out: Tensor,
        composite: Optional[Composite] = None,
        stop_block: int = 0,
        to_input: bool = False,
        prepared: Optional[BatchT] = None,
        on_attention: Optional[Callable[[int, Tensor], Optional[Tensor]]] = None,
        release: bool = False,
        on_block: Optional[Callable[[int], None]] = None,
    ) -> BlockRelevance:
        """The explicit relevance pass: the backward of a trace replayed with an explicit composite
        (``forward(prepared, composite=...)``), each operation's rule its backward.

        Args:
            R_out: (B, C) relevance of the logits (the one-hot target).
            composite: the rule set the trace was replayed with (``None``: the trace's); a modified-gradient
                one is refused at once.
            stop_block: the lowest block whose attention relevance is needed: the pass stops at its map.
            to_input: continue through every block to input space (``scores``, ``pixels``).
            on_attention: ``f(b, R_A)`` called with each block's attention relevance (B, H, N, N) as the
                pass reaches it; ``attn[b]`` keeps what it returns instead of R_A.
            release: the pass frees each block's saved tensors as it leaves it (the trace runs one pass), and
                the trace's block records are dropped before it (unless ``to_input``: then kept); without it the
                trace can run further passes.
            on_block: ``f(b)`` called when the pass reaches block b's output, before it enters the block.
        """
        if composite is not None:
            check_pass(composite, EXPLICIT, "Adapter.relprop")
        r = trace.replay
        if r is None or not r.explicit or (composite is not None and r.composite is not composite):
            raise RuleSetError(
                "Adapter.relprop runs the backward of an explicit replay: replay the batch with "
                "adapter.forward(prepared, composite=<the same explicit composite>) first"
            )
        with compute_precision(self.model):  # in float32 for a half-precision model (a no-op inside a method)
            return self._relprop(trace, R_out, stop_block, to_input, prepared, on_attention, release, on_block)

    def _relprop(
        self,
        trace: Trace,
        R_out: Tensor,
        stop_block: int,
        to_input: bool,
        prepared: Optional[BatchT],
        on_attention: Optional[Callable[[int, Tensor], Optional[Tensor]]],
        release: bool,
        on_block: Optional[Callable[[int], None]],
    ) -> BlockRelevance:
        L = self.num_blocks
        B, N = trace.x0.shape[:2]
        out = BlockRelevance(attn=[None] * L, tokens=torch.zeros(B, L, N, dtype=trace.x0.dtype, device=R_out.device))

        r = trace.replay
        assert r is not None, "relprop checked the replay"

        def leaving(b: int) -> Callable[[Tensor], None]:
            def hook(R: Tensor) -> None:
                if r.gradients:  # a plain-gradient pass on the same graph (transformer attribution's ∇A)
                    return
                out.tokens[:, b] = self.block_tokens(b, R.sum(-1))
                if on_block is not None:
                    on_block(b)

            return hook

        def reached(b: int) -> Callable[[Tensor], None]:
            def hook(R_A: Tensor) -> None:
                if r.gradients:
                    return
                out.attn[b] = R_A if on_attention is None else on_attention(b, R_A)

            return hook

        hooks = [trace.blocks[b].out.register_hook(leaving(b)) for b in range(stop_block, L)]
        hooks += [trace.blocks[b].attn.A.register_hook(reached(b)) for b in range(stop_block + (not to_input), L)]
        wanted = self.relevance_inputs(trace) if to_input else [trace.blocks[stop_block].attn.A]
        logits = trace.logits
        if release and not to_input:  # the graph holds what the pass needs, and frees it block by block
            trace.blocks = [None] * L
        try:
            # release: each block's saved tensors are freed as the pass leaves it; else the trace can run again
            R = torch.autograd.grad(logits, wanted, grad_outputs=R_out.to(logits.dtype), retain_graph=not release)
        finally:
            for h in hooks:
                h.remove()
        del logits, wanted
        if not to_input:
            out.attn[stop_block] = R[0] if on_attention is None else on_attention(stop_block, R[0])
            return out
        assert prepared is not None, "to input space: the prepared batch"
        out.inputs = R[0].sum(-1)
        out.scores, out.pixels = self.input_relevance(trace, list(R), prepared)
        return out


__all__ = [
    "Adapter",
    "AttentionRecord",
    "BlockRecord",
    "BlockRelevance",
    "BlockSpec",
    "EmbeddingRecord",
    "ReadoutRecord",
    "TokenLayout",
    "Trace",
]
