"""``TokenRelevance``: BERT text with each token coloured by its relevance."""

from __future__ import annotations

import html as _html
from typing import Any, Optional, Sequence

import ipywidgets as W
import numpy as np
import torch

from lrp_core.errors import InputError
from lrp_core.viz import merge_wordpieces, token_html

from . import _engine
from ._common import ResolvedModel, token_page_bundle
from ._layered import LayerExplorer

_TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def tokenize(texts: Sequence[str], tokenizer: Any) -> dict[str, torch.Tensor]:
    """Tokenise texts (padding to the longest); empty texts are an :class:`InputError`."""
    if tokenizer is None:
        raise InputError(
            "texts need a tokenizer: pass tokenizer=..., a LoadedModel, or "
            "already tokenised inputs (a dict with input_ids and attention_mask)"
        )
    if not texts:
        raise InputError("no text given: type a sentence to explain")
    for t in texts:
        if not isinstance(t, str):
            raise InputError(f"texts must be strings; got {type(t).__name__}")
        if not t.strip():
            raise InputError("the text is empty: type a sentence to explain")
    enc = tokenizer(list(texts), return_tensors="pt", padding=True, truncation=True)
    return {k: enc[k] for k in _TEXT_KEYS if k in enc}


def prepare_text(facts: ResolvedModel, inputs: Any, tokenizer: Any) -> dict[str, torch.Tensor]:
    """Tokenised text as the engine takes it, validated by the model's adapter.

    A text or a list of texts is tokenised first (the widgets take raw text, the
    engine token ids); every check of the ids, and its message, is the engine's.
    """
    if isinstance(inputs, str):
        inputs = [inputs]
    if isinstance(inputs, (list, tuple)):
        inputs = tokenize(inputs, tokenizer)
    prepared = facts.adapter.check_inputs(inputs)
    return {k: v for k, v in prepared.entries().items() if v is not None}  # no token_type_ids: the model's own


class TokenRelevance(LayerExplorer):
    """Text with every token coloured by relevance (red for, blue against the class).

    Args:
        model: a HF ``BertForSequenceClassification`` (BERT family) or a
            ``lrp_core.models.LoadedModel`` of kind ``"text"``.
        inputs: tokenised inputs (dict / BatchEncoding with ``input_ids``,
            ``attention_mask``), or a text / list of texts (then a tokenizer is needed).
        labels: class names (default: the model's).
        methods: the methods offered (default: all).
        texts: texts to tokenise (alternative to ``inputs``).
        tokenizer: the tokenizer (default: the LoadedModel's).
        target: a ``lrp_core.Projection`` / ``lrp_core.Similarity`` readout of an embedding model (a
            ``BertModel``, a ``SentenceTransformer``): the map of ``⟨e, v⟩`` / ``cos(e, e_ref)`` instead of a
            class (one vector for every text, or one per text); the class selector then names it.

    Controls as in :class:`RelevanceExplorer` plus ``word_toggle`` (word-pieces or
    whole words, a word's score being its largest piece score) and ``text_box``
    (type a new text; needs a tokenizer). The coloured text is ``html``; the values
    shown are ``displayed_map`` for the tokens ``displayed_tokens``.
    """

    expected_kind = "text"

    def __init__(
        self,
        model: Any,
        inputs: Any = None,
        labels: Optional[Sequence[str]] = None,
        methods: Optional[Sequence[str]] = None,
        texts: Any = None,
        tokenizer: Any = None,
        target: Any = None,
    ) -> None:
        self.embedding_target = target
        self._tokenizer_arg = tokenizer
        self._texts_arg = texts
        self.html = W.HTML(value="", layout=W.Layout(width="100%"))
        self.word_toggle = W.ToggleButtons(
            options=[("word-pieces", "pieces"), ("words", "words")], value="pieces", style={"button_width": "100px"}
        )
        self.text_box = W.Text(
            placeholder="type a text and press Enter", continuous_update=False, layout=W.Layout(width="520px")
        )
        self.displayed_tokens: list[str] = []
        super().__init__(model, inputs, labels=labels, methods=methods)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer_arg if self._tokenizer_arg is not None else self.facts.tokenizer

    def _prepare_inputs(self, inputs: Any) -> dict[str, torch.Tensor]:
        texts = self._texts_arg if inputs is None else inputs
        if texts is None:
            raise InputError("give the inputs (tokenised) or texts=... to explain")
        return prepare_text(self.facts, texts, self.tokenizer)

    def _sample(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i : i + 1] for k, v in self.inputs.items()}

    def tokens(self, i: Optional[int] = None) -> list[str]:
        """The real (non-padding) word-pieces of sample ``i`` (default: the selected one)."""
        i = self.sample_selector.value if i is None else i
        n = int(self.inputs["attention_mask"][i].sum())
        ids = self.inputs["input_ids"][i, :n].tolist()
        tok = self.tokenizer
        if tok is not None and hasattr(tok, "convert_ids_to_tokens"):
            return [str(t) for t in tok.convert_ids_to_tokens(ids)]
        return [f"[{t}]" for t in ids]

    def _extra_controls(self) -> list[W.Widget]:
        self.word_toggle.observe(self._on_redraw, names="value")
        self.text_box.observe(self._on_text, names="value")
        self.text_box.layout.display = None if self.tokenizer is not None else "none"
        return [self.word_toggle]

    def _build_layout(self) -> None:
        self.children = [self.text_box, *self._controls(), self.message, self.html, self.info, self.status]

    def _on_text(self, change: dict) -> None:
        def use_text() -> None:
            self.inputs = prepare_text(self.facts, [change["new"]], self.tokenizer)
            self.logits = self._forward_logits()
            self._cache.clear()  # every entry is of the old text
            self._quiet = True
            self.sample_selector.options = [("0", 0)]
            self.sample_selector.value = 0
            self.sample_selector.layout.display = "none"
            self._quiet = False
            self._fill_classes()
            self._recompute()

        self._guarded("compute", use_text)

    # -- an embedding readout (Projection / Similarity) in place of a class ----------------------------------
    def _forward_logits(self) -> torch.Tensor:
        if self.embedding_target is None:
            return super()._forward_logits()
        # the readout's values (B, K), as the engine verifies them (rollout: the cheapest method)
        return _engine.explain(self.facts.module, self.inputs, "rollout", target=self.embedding_target).logits.float()

    def _fill_classes(self) -> None:
        if self.embedding_target is None:
            return super()._fill_classes()
        self._quiet = True
        try:
            self.class_selector.options = [(self._target_name(), 0)]
            self.class_selector.value = 0
            self.class_search.layout.display = "none"
        finally:
            self._quiet = False

    def _target_key(self) -> Any:
        return super()._target_key() if self.embedding_target is None else ("embedding", self.sample_selector.value)

    def _engine_target(self, key: Any) -> Any:
        """The class; or the embedding target of the sample explained (its own row of the vectors)."""
        t = self.embedding_target
        if t is None:
            return key
        return type(t)(t.vectors[key[1]] if t.vectors.dim() == 2 else t.vectors, t.pooling)

    def _target_name(self) -> str:
        t = self.embedding_target
        if t is None:
            return super()._target_name()
        return "the similarity" if type(t).__name__ == "Similarity" else "the projection"

    def _render(self, values: np.ndarray, title: str) -> None:
        tokens = self.tokens()
        if len(tokens) != len(values):
            raise InputError(f"{len(tokens)} tokens but {len(values)} scores")
        if self.word_toggle.value == "words":
            tokens, values = merge_wordpieces(tokens, values, reduce="max")
            self.displayed_map = values
        self.displayed_tokens = list(tokens)
        explained = "the class" if self.embedding_target is None else self._target_name()
        self.html.value = f'<div style="color:#333;margin:4px 0">{_html.escape(title)}</div>' + token_html(
            tokens, values, signed=self.signed, explained=explained
        )

    def _static_bundle(self) -> dict[str, Any]:
        return token_page_bundle(self)
