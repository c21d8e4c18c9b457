"""Decoder-only language models (docs/METHODS.md §2c): the base every decoder family builds on.

What is explained: the logit of a vocabulary entry (a causal LM's next-token
logit) or of a class (``*ForSequenceClassification``), read at one position
per row — by default each row's last real token, whichever side the batch is
padded on (a sequence classifier: where it pools, its rightmost token that is
not ``config.pad_token_id``); ``explain(..., position=p)`` names another.
Position ids follow the attention mask as ``generate`` computes them, so a
row's explanation does not depend on its padding — or are the ``position_ids``
given with the inputs. Rotary tables that depend on the longest position of
the batch (``dynamic``, ``longrope``) are chosen per row, as for the row
alone. Every input position gets a score; padding scores 0.

A family subclasses :class:`DecoderAdapter` and describes its blocks
(``_block(i, layer) -> BlockSpec``); the Llama layout (``model.model`` with
``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``; ``lm_head`` or ``score``)
is the default here.

Shapes: B batch, T tokens (padding included), D width, V vocabulary, H heads, d head width.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Optional, TypeVar

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.ops import LINEAR
from .base import Adapter
from .batches import DecoderBatch
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay
from .checks import NO_EFFECT, input_keys, token_ids, tokenized
from .kernels import eager_softmax_dtype
from .parts import ModelPart
from .readouts import HeadLayer, PositionReadout
from .records import EmbeddingRecord, TokenLayout, Trace


def position_ids(mask: Tensor) -> Tensor:
    """Position ids from the 0/1 mask, as ``generate`` computes them: real tokens count 0, 1, …

    Parameters
    ----------
    mask : Tensor
        The attention mask ``(B, T)``, 1 for a real token and 0 for padding.

    Returns
    -------
    Tensor
        The position ids ``(B, T)`` (padding before the first real token gets 0).
    """
    return (mask.cumsum(-1) - 1).clamp(min=0)


def last_real(mask: Tensor) -> Tensor:
    """The index of each row's last real token, with padding on either side.

    Parameters
    ----------
    mask : Tensor
        The attention mask ``(B, T)``, 1 for a real token and 0 for padding.

    Returns
    -------
    Tensor
        The indices ``(B,)``, long.
    """
    idx = torch.arange(mask.shape[1], device=mask.device)
    return (idx[None, :] * mask).argmax(dim=-1)


_CACHE = (
    "a cache holds the keys and values of earlier tokens, which the replay does not see, so the explanation "
    "would miss them: pass the whole sequence (the earlier tokens and the new ones) as input_ids with its "
    "attention_mask, without past_key_values / cache (use_cache may stay: it changes no logit)"
)

#: input keys a decoder's forward reads that the replay does not, and what to pass instead
REFUSED_INPUTS = {
    "past_key_values": _CACHE,
    "cache": _CACHE,
    "inputs_embeds": "the token scores are read at the model's own embeddings of input_ids (embed_tokens), so "
    "embeddings given directly are refused: pass input_ids (and attention_mask)",
    "encoder_hidden_states": "the replay explains a decoder-only model, without cross-attention",
}


def given_position_ids(value: Any, mask: Tensor, limit: Optional[int], has_mask: bool, windowed: bool) -> Tensor:
    """The ``position_ids`` given with the inputs, checked.

    They must be ``(B, T)`` or ``(1, T)`` (one row for all rows), integers in ``[0, limit)``.

    Parameters
    ----------
    value : Any
        The user's position ids.
    mask : Tensor
        The attention mask ``(B, T)``.
    limit : int or None
        The model's number of positions (``None``: no limit).
    has_mask : bool
        Whether an attention mask was given: without one, Hugging Face reads position ids that restart inside a
        row as packed sequences (a block-diagonal mask), which the replay does not build.
    windowed : bool
        Whether the model has a sliding window, which Hugging Face counts in tokens and the replay in positions:
        the two agree where consecutive real tokens are one position apart.

    Returns
    -------
    Tensor
        The position ids ``(B, T)``, long, on the mask's device.

    Raises
    ------
    InputError
        For a wrong shape, a value outside ``[0, limit)``, ids that restart or jump inside a row without a mask,
        or (with a sliding window) consecutive real tokens not one position apart.
    """
    pos = token_ids(value, "position_ids")
    B, T = mask.shape
    if pos.shape[0] == 1 and pos.shape[1] == T:
        pos = pos.expand(B, T)
    if pos.shape != (B, T):
        raise InputError(
            f"position_ids has shape {tuple(pos.shape)}, input_ids {(B, T)}: give one position per "
            "token, (B, T) or (1, T)"
        )
    pos = pos.to(mask.device)
    if int(pos.min()) < 0 or (limit is not None and int(pos.max()) >= limit):
        raise InputError(
            f"position_ids must lie in [0, {limit}) (max_position_embeddings); got {int(pos.min())} … {int(pos.max())}"
            if limit is not None
            else f"position_ids must be ≥ 0; got {int(pos.min())}"
        )
    step = pos[:, 1:] - pos[:, :-1]
    if not has_mask and bool((step != 1).any()):
        raise InputError(
            "position_ids restart or jump inside a row and no attention_mask is given: the model "
            "would read the row as packed sequences (attention within each run only). Pass each "
            "sequence as its own row, with an attention_mask"
        )
    real = (mask[:, 1:] * mask[:, :-1]).bool()
    if windowed and bool((step[real] != 1).any()):
        raise InputError(
            "position_ids of consecutive tokens differ by other than 1: the model's sliding window "
            "counts tokens, the explanation counts positions, and the two would disagree. Pass "
            "position ids that count 0, 1, … along each row's tokens, or none (they then follow the "
            "attention mask)"
        )
    return pos


def check_cache_position(value: Any, T: int) -> None:
    """Check the ``cache_position`` given with the inputs: it must be 0 … T−1 (a sequence without a cache).

    Other values count from the start of a cache the replay does not see.

    Parameters
    ----------
    value : Any
        The user's ``cache_position`` (``None``: nothing to check).
    T : int
        The sequence length.

    Raises
    ------
    InputError
        When the positions are not 0 … T−1.
    """
    if value is None:
        return
    pos = torch.as_tensor(value)
    if pos.shape[-1:] != (T,) or not bool((pos == torch.arange(T, device=pos.device)).all()):
        raise InputError(
            f"cache_position must be 0 … {T - 1} (the whole sequence, no cache); other values continue "
            f"a cache: {_CACHE}"
        )


def pooled_position(ids: Tensor, mask: Tensor, pad_id: Optional[int]) -> Tensor:
    """(B,) where a Hugging Face decoder ``*ForSequenceClassification`` reads each row.

    The rightmost token whose id is not ``pad_id``, whatever the attention mask (so where the padding id is
    also the end-of-text token, a row ending in it is read at the token before; a row of padding ids only
    at token 0); without a padding id the model reads the last column, here each row's last real token (the
    row alone). A read position that is padding (the batch padded with another id than ``pad_id``) is an
    :class:`InputError`: the model would pool a padding token there.

    Parameters
    ----------
    ids : Tensor
        The token ids ``(B, T)``.
    mask : Tensor
        The attention mask ``(B, T)``.
    pad_id : int or None
        The model's padding token id (``config.pad_token_id``), or ``None``.

    Returns
    -------
    Tensor
        The read positions ``(B,)``, long.

    Raises
    ------
    InputError
        When a read position is a padding token.
    """
    if pad_id is None:
        return last_real(mask)
    idx = torch.arange(ids.shape[1], device=ids.device)
    read = (idx[None, :] * (ids != pad_id)).argmax(dim=-1)
    bad = torch.nonzero(mask.gather(1, read[:, None])[:, 0] == 0).flatten().tolist()
    if bad:
        raise InputError(
            f"the classifier reads row {bad[0]} at its last token that is not config.pad_token_id "
            f"({pad_id}), position {int(read[bad[0]])}, which is padding (attention_mask 0): pad the "
            f"batch with the id {pad_id} (tokenizer.pad_token_id = model.config.pad_token_id)"
        )
    return read


#: rotary types whose tables depend on the longest position of the call (transformers' ``dynamic_rope_update``)
BATCH_DEPENDENT_ROPE = ("dynamic", "longrope")


class _RowRotary:
    """The model's rotary module seen with one row's inverse frequencies (read-only: writes nothing to it)."""

    def __init__(self, module: nn.Module, name: str, inv_freq: Tensor):
        self.__dict__["_module"] = module
        self.__dict__[name] = inv_freq

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_module"], name)


def _fresh_inv_freq(module: ModelPart, kind: str, seq_len: Tensor, layer_type: Optional[str]) -> Tensor:
    """The inverse frequencies the module uses, freshly loaded, for a call whose longest position is ``seq_len − 1``.

    ``longrope``: the long factors past ``original_max_position_embeddings``, else the short ones; ``dynamic``:
    the NTK-scaled base for ``seq_len`` past the original length, else the original frequencies — the
    choices of transformers' ``dynamic_rope_update``, without its state (a dynamic module keeps the longest
    length it has seen, so its tables depend on the calls before).
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    prefix = "" if layer_type is None else f"{layer_type}_"
    original = getattr(module, f"{prefix}original_inv_freq")
    params = module.config.rope_parameters if layer_type is None else module.config.rope_parameters[layer_type]
    if kind == "longrope":
        limit = int(params["original_max_position_embeddings"])
        if int(seq_len) <= limit:
            return original
        return ROPE_INIT_FUNCTIONS[kind](module.config, original.device, seq_len=limit + 1, layer_type=layer_type)[0]
    if int(seq_len) <= int(module.original_max_seq_len):
        return original
    return ROPE_INIT_FUNCTIONS[kind](module.config, original.device, seq_len=seq_len, layer_type=layer_type)[0]


def row_rotary_tables(
    module: ModelPart, x: Tensor, positions: Tensor, mask: Optional[Tensor], layer_type: Optional[str] = None
) -> tuple[Tensor, Tensor]:
    """The rotary tables of the model's rotary ``module`` at ``positions``, each row's as for the row alone.

    Parameters
    ----------
    module : nn.Module
        The model's rotary embedding (``rope_type`` a string, or a dict by layer type).
    x : Tensor
        Block 0's input ``(B, T, D)`` (for its dtype and device).
    positions : Tensor
        The position ids ``(B, T)``.
    mask : Tensor or None
        ``(B, T)``, 1 for a real token (``None``: all real): a row's longest position is that of its real tokens.
    layer_type : str or None
        The layer type the module takes (Gemma 3), or ``None``.

    Returns
    -------
    tuple of Tensor
        The module's own ``(cos, sin)``, each ``(B, T, r)``. Where its rotary type chooses its frequencies by the
        longest position of the call (:data:`BATCH_DEPENDENT_ROPE`), the choice is made per row, and the module's
        undecorated forward computes each row's tables with them (the module itself is not written to).
    """
    kinds: ModelPart = getattr(module, "rope_type", "default")  # a str, or a dict by layer type (Gemma 3)
    kind = kinds if layer_type is None else kinds[layer_type]
    args = () if layer_type is None else (layer_type,)
    if not isinstance(kind, str) or not any(k in kind for k in BATCH_DEPENDENT_ROPE):
        return module(x, positions, *args)
    kind = "longrope" if kind == "longrope" else "dynamic"
    real = positions if mask is None else positions.masked_fill(mask == 0, -1)
    longest = real.max(dim=1).values + 1  # (B,) long, as transformers' seq_len
    raw = inspect.unwrap(type(module).forward)
    name = "inv_freq" if layer_type is None else f"{layer_type}_inv_freq"
    tables = [
        raw(
            _RowRotary(module, name, _fresh_inv_freq(module, kind, longest[b], layer_type)),
            x[b : b + 1],
            positions[b : b + 1],
            *args,
        )
        for b in range(x.shape[0])
    ]
    return torch.cat([c for c, _ in tables]), torch.cat([s for _, s in tables])


def causal_bias(mask: Tensor, positions: Tensor, window: Optional[int], dtype: torch.dtype) -> Tensor:
    """The additive causal mask: 0 where query i may attend key j, the dtype's minimum elsewhere.

    Allowed: j ≤ i, key j real, and (sliding window) ``pos_i − pos_j < window``. A padding query row
    attends itself only, so no row is fully masked (its output reaches no real token either way).

    Parameters
    ----------
    mask : Tensor
        The attention mask ``(B, T)``, 1 for a real token.
    positions : Tensor
        The position ids ``(B, T)``, read by the sliding window.
    window : int or None
        The sliding window in positions, or ``None`` for none.
    dtype : torch.dtype
        The scores' dtype, whose minimum marks a forbidden pair.

    Returns
    -------
    Tensor
        The bias ``(B, 1, T, T)`` in ``dtype``.
    """
    T = mask.shape[1]
    idx = torch.arange(T, device=mask.device)
    allowed = (idx[None, :] <= idx[:, None])[None] & mask[:, None, :].bool()
    if window is not None:
        allowed &= (positions[:, :, None] - positions[:, None, :]) < window
    allowed |= torch.eye(T, dtype=torch.bool, device=mask.device)[None] & ~mask[:, :, None].bool()
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


#: a decoder's batch, or a VLM's (a decoder batch with images) read through the VLM's language model
D = TypeVar("D", bound=DecoderBatch)


class DecoderAdapter(Adapter[DecoderBatch]):
    """A Hugging Face decoder-only LM (``*ForCausalLM``) or its ``*ForSequenceClassification``."""

    modality = "text"
    is_decoder = True
    #: text with a padding mask; the additive values are the dtype's minimum (:func:`causal_bias`)
    mask_value = float("-inf")

    def __init__(self, model: ModelPart):
        super().__init__(model)
        self.config: ModelPart = getattr(model, "config", None)  # a transformers config, read by name
        self.base, layers, final_norm = self._stack()
        assert self.config is not None, "_stack refuses a model without a config"
        self.sdpa = getattr(self.config, "_attn_implementation", "eager") == "sdpa"
        self.blocks = [self._block(i, layer) for i, layer in enumerate(layers)]
        # the head; a batch is read at its rows' positions (readout_for), this one at token 0 only names the head
        self.readout = PositionReadout(final_norm, self._head_layers(), torch.zeros(1))
        self.vocab_size = int(self.config.vocab_size)
        self.max_length = int(getattr(self.config, "max_position_embeddings", 0) or 0) or None
        if self._dynamic_rope():  # dynamic NTK scaling is there to run past max_position_embeddings
            self.max_length = None
        #: a sequence classifier pools at its last token that is not the padding id (:func:`pooled_position`)
        self.pools = self.readout.head_layers[0].module is getattr(self.model, "score", None)

    # ------------------------------------------------------------ the family's part
    def _stack(self) -> tuple[ModelPart, Sequence[ModelPart], ModelPart]:
        """(the decoder stack, its layers, its final norm): the Llama layout ``model.model`` with ``layers``
        and ``norm`` (GPT-2 overrides: ``model.transformer`` with ``h`` and ``ln_f``)."""
        base = getattr(self.model, "model", None)
        if self.config is None or base is None or not hasattr(base, "layers"):
            raise UnsupportedModelError(
                f"{type(self.model).__name__}: not a decoder language model (expected model.model.layers)"
            )
        return base, base.layers, base.norm

    def _head(self) -> nn.Linear:
        """The LM head (``lm_head``, tied or not) or the sequence classifier (``score``)."""
        head: ModelPart = getattr(self.model, "lm_head", None) or getattr(self.model, "score", None)
        if not is_linear(head):
            raise UnsupportedModelError(f"{type(self.model).__name__}: no LM head (lm_head) or classifier (score)")
        return head

    def _head_layers(self) -> list[HeadLayer]:
        """The layers after the final norm: the head alone (Gemma 2 adds its logit soft-cap)."""
        return [HeadLayer(LINEAR, self._head())]

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """A Llama-layout decoder layer: RMSNorm → attention (GQA, RoPE) → RMSNorm → gated MLP, pre-norm."""
        try:
            att, mlp = layer.self_attn, layer.mlp
            return BlockSpec(
                layout="pre_ln",
                norm1=layer.input_layernorm,
                norm2=layer.post_attention_layernorm,
                attn=self._attention(att),
                mlp=MlpSpec(gate=mlp.gate_proj, fc1=mlp.up_proj, act=mlp.act_fn, fc2=mlp.down_proj),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the Llama layout (input_layernorm, self_attn "
                f"with q/k/v/o_proj, post_attention_layernorm, mlp with gate/up/down_proj): {e}"
            ) from None

    def _attention(self, att: ModelPart, **extra: Any) -> AttentionSpec:
        """An HF decoder attention: q/k/v/o projections, shared kv heads, RoPE, the model's scale and window."""
        cfg = self.config
        window = extra.pop("window", getattr(att, "sliding_window", None))
        return AttentionSpec(
            q=att.q_proj,
            k=att.k_proj,
            v=att.v_proj,
            proj=att.o_proj,
            num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=att.head_dim,
            scale=float(att.scaling),
            rotary=True,
            q_norm=getattr(att, "q_norm", nn.Identity()),
            k_norm=getattr(att, "k_norm", nn.Identity()),
            window=int(window) if window else None,
            softmax_dtype=eager_softmax_dtype(self.config),
            sdpa=self.sdpa,
            causal=True,
            **extra,
        )

    def embed_tokens(self, ids: Tensor) -> Tensor:
        """e = ``model.get_input_embeddings()(ids)`` (B, T, D): what AttnLRP / CP-LRP read relevance at."""
        return self.model.get_input_embeddings()(ids)

    def rotary_tables(
        self, x0: Tensor, positions: Tensor, key: str, mask: Optional[Tensor] = None
    ) -> tuple[Tensor, Tensor]:
        """(cos, sin) (B, T, r) of the rotary embedding ``key`` at ``positions``, from the model's own module
        (each row's as for the row alone: :func:`row_rotary_tables`; ``mask`` (B, T) 1 = real token)."""
        return row_rotary_tables(self.base.rotary_emb, x0, positions, mask)

    def _dynamic_rope(self) -> bool:
        """Whether a rotary table of the model uses dynamic NTK scaling (its length limit is then none)."""
        kinds = getattr(getattr(self.base, "rotary_emb", None), "rope_type", None)
        kinds = kinds.values() if isinstance(kinds, Mapping) else [kinds]
        return any(isinstance(k, str) and "dynamic" in k for k in kinds)

    # ------------------------------------------------------------ validation
    #: the input keys the replay reads as the model does (``cache_position`` only as 0 … T−1: no cache)
    honoured_inputs = ("input_ids", "attention_mask", "position_ids", "cache_position")

    def check_inputs(self, inputs) -> DecoderBatch:
        name = type(self.model).__name__
        ids, mask = tokenized(inputs, name)
        # token_type_ids: no decoder embedding but GPT-2's reads them (GPT2Adapter refuses them)
        input_keys(inputs, name, self.honoured_inputs, REFUSED_INPUTS, NO_EFFECT + ("token_type_ids",))
        B, T = ids.shape
        if self.max_length is not None and T > self.max_length:
            raise InputError(
                f"the text is {T} tokens long; {name} accepts at most {self.max_length} (max_position_embeddings)"
            )
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise InputError(f"input_ids must lie in [0, {self.vocab_size}) (the vocabulary size)")
        check_cache_position(inputs.get("cache_position"), T)
        given = inputs.get("position_ids")
        positions = (
            position_ids(mask)
            if given is None
            else given_position_ids(
                given,
                mask,
                self.max_length,
                inputs.get("attention_mask") is not None,
                any(s.attn.window is not None for s in self.blocks),
            )
        )
        pad = getattr(
            self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config,
            "pad_token_id",
            None,
        )
        at = pooled_position(ids, mask, pad) if self.pools else last_real(mask)
        read = torch.zeros_like(mask)
        read[torch.arange(B), at] = 1
        return DecoderBatch(input_ids=ids, attention_mask=mask, position_ids=positions, read_at=read)

    def at_position(self, prepared: D, position: Any) -> D:
        """``prepared`` read at ``position``: an int (every row) or one int per row; negative counts from the end.

        A position must be a real token of its row (not padding, not past the row).
        """
        mask = prepared.attention_mask
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
        read = torch.zeros_like(mask)
        read[torch.arange(B), pos] = 1
        return prepared.replace(read_at=read)

    def layout(self, prepared: DecoderBatch) -> TokenLayout:
        """The tokens a row's map covers: its real tokens up to the one read (``position=``), the context of the
        explained prediction — so a map read inside a longer sequence is that of the row cut after it (token
        ablation removes, and Grad-CAM averages and min-max scales over, the context only)."""
        mask, read = prepared.attention_mask, prepared.read
        context = mask * (torch.arange(mask.shape[1], device=mask.device)[None, :] <= read[:, None]).to(mask.dtype)
        return TokenLayout(
            modality="text",
            num_tokens=mask.shape[1],
            output_start=0,
            readout_tokens=(),
            mask=context,
            readout_rows=read,
            readout_minimum_applies=False,
        )

    def readout_for(self, prepared: DecoderBatch) -> PositionReadout:
        """The readout of this batch: the head at each row's read position."""
        return PositionReadout(self.readout.norm, self.readout.head_layers, prepared.read)

    # ------------------------------------------------------------ the model's own output
    @property
    def length_dependent(self) -> bool:
        """Whether a rotary table of the model depends on the length of the call (:data:`BATCH_DEPENDENT_ROPE`)."""
        kinds = getattr(getattr(self.base, "rotary_emb", None), "rope_type", None)
        kinds = kinds.values() if isinstance(kinds, Mapping) else [kinds]
        return any(isinstance(k, str) and any(d in k for d in BATCH_DEPENDENT_ROPE) for k in kinds)

    def own_pieces(self, prepared: DecoderBatch) -> list:
        """Rows without their padding, rows of one length together: each as the model computes it alone."""
        from .verification import unpadded_pieces

        return unpadded_pieces(prepared, self.length_dependent)

    def own_inputs(self, prepared: DecoderBatch) -> dict:
        """The model's own keyword inputs for the batch: ``input_ids``, ``attention_mask``, ``position_ids``."""
        return {
            "input_ids": prepared.input_ids,
            "attention_mask": prepared.attention_mask,
            "position_ids": prepared.position_ids,
        }

    def own_output(self, prepared: DecoderBatch) -> Tensor:
        """(B, C) the model's own logits at each row's read position (a classifier: its head's there)."""
        from .verification import read_logits

        head = self.readout.head_layers[0].module if self.pools else None
        return read_logits(self.model, {**self.own_inputs(prepared), "use_cache": False}, prepared.read, head)

    # ------------------------------------------------------------ forward
    def embed(self, prepared: DecoderBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        words = self.embed_tokens(prepared.input_ids)
        if track:
            words = words.detach().requires_grad_(True)
        return EmbeddingRecord(x0=words, embeds=words)

    def block_context(
        self, x0: Tensor, mask: Optional[Tensor], positions: Optional[Tensor], fused: bool = False
    ) -> list:
        """Per block (bias, rope): the causal (+ window) mask and the rotary tables of this batch.

        A fused replay of an unpadded batch gets no mask for its full-attention blocks: the kernel's own
        causal mask, so long sequences hold no N×N tensor at all.
        """
        assert mask is not None, "a decoder always has a padding mask (run_blocks makes one: mask_value is set)"
        if positions is None:
            positions = position_ids(mask)
        plain = fused and self.sdpa and bool(mask.all())
        biases = {
            w: None if plain and w is None else causal_bias(mask, positions, w, x0.dtype)
            for w in {s.attn.window for s in self.blocks}
        }
        ropes = {
            k: self.rotary_tables(x0, positions, k, mask)
            for k in {s.attn.rope_key for s in self.blocks if s.attn.rotary}
        }
        return [(biases[s.attn.window], ropes.get(s.attn.rope_key)) for s in self.blocks]

    # ------------------------------------------------------------ relevance
    def input_relevance(self, trace: Trace, R: list, prepared: DecoderBatch) -> tuple[Tensor, None]:
        """Relevance at the embedding output, summed over channels; padding scores 0."""
        return R[0].sum(-1) * prepared.attention_mask.to(R[0].dtype), None


__all__ = [
    "DecoderAdapter",
    "position_ids",
    "last_real",
    "causal_bias",
    "given_position_ids",
    "pooled_position",
    "check_cache_position",
    "row_rotary_tables",
    "REFUSED_INPUTS",
    "BATCH_DEPENDENT_ROPE",
]
