"""Pieces every relevance widget shares: model facts, class lists, errors, static fallback."""

from __future__ import annotations

import base64
import html
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import ipywidgets as W
import numpy as np
import torch

from lrp_core.adapters import Adapter, get_adapter
from lrp_core.adapters.batches import Batch, ImageBatch
from lrp_core.errors import InputError, LRPError, UnsupportedModelError
from lrp_core.models import PROBABILITIES, LoadedModel, logits_to_probabilities
from lrp_core.viz import denormalize, to_rgb_uint8

from ._engine import torch_threads

TOP_K = 5

#: Smallest pictures the widgets draw (px, longest side), so that titles, colourbars and
#: their numbers stay readable on a projector: the main picture, a grid panel, a
#: thumbnail to tick. Smaller requests are raised to these.
MIN_PICTURE_PX, MIN_PANEL_PX, MIN_TILE_PX = 320, 200, 96


def readable_size(requested: int, minimum: int) -> int:
    """``requested`` px, raised to ``minimum`` (a picture smaller than that is unreadable in a room)."""
    return max(int(requested), int(minimum))


@dataclass
class ResolvedModel:
    """What a widget needs to know about the model it explains.

    ``adapter`` is the engine's (:func:`lrp_core.adapters.get_adapter`): the one
    place a model is dispatched, validated and described.
    """

    module: torch.nn.Module
    adapter: Adapter
    labels: list[str]
    tokenizer: Any = None
    mean: Optional[Sequence[float]] = None
    std: Optional[Sequence[float]] = None
    preprocess: Any = None
    probabilities: str = "softmax"  # how the model was trained to read its logits (lrp_core.models.PROBABILITIES)

    @property
    def kind(self) -> str:
        """``"image"`` or ``"text"``: the adapter's modality (``LoadedModel.kind`` uses the same words)."""
        return self.adapter.modality


def resolve_model(model: Any, widget: str) -> ResolvedModel:
    """Accept a ``lrp_core.models.LoadedModel`` or a bare torch module the engine supports."""
    loaded = model if isinstance(model, LoadedModel) else None
    module = loaded.model if loaded is not None else model
    try:
        adapter = get_adapter(module)
    except UnsupportedModelError as err:  # say which widget refused it; the engine says what is supported
        raise UnsupportedModelError(
            f"{widget} got {type(module).__name__}, not a model lrp_core can explain: {err}"
        ) from None
    if loaded is not None:
        info = dict(loaded.info or {})
        return ResolvedModel(
            module=module,
            adapter=adapter,
            labels=list(loaded.labels or []),
            tokenizer=loaded.tokenizer,
            mean=info.get("mean"),
            std=info.get("std"),
            preprocess=loaded.preprocess,
            probabilities=info.get("probabilities") or probabilities_of(module),
        )
    id2label = getattr(getattr(module, "config", None), "id2label", None)
    labels = [str(id2label[i]) for i in sorted(id2label)] if id2label else []
    pcfg = getattr(module, "pretrained_cfg", None) or {}
    return ResolvedModel(
        module=module,
        adapter=adapter,
        labels=labels,
        mean=pcfg.get("mean"),
        std=pcfg.get("std"),
        probabilities=probabilities_of(module),
    )


def probabilities_of(module: torch.nn.Module) -> str:
    """How a bare model turns logits into probabilities: ``"sigmoid"`` for a Hugging Face model whose
    config declares ``problem_type="multi_label_classification"`` (trained one-vs-rest), else ``"softmax"``."""
    problem = getattr(getattr(module, "config", None), "problem_type", None)
    return "sigmoid" if problem == "multi_label_classification" else "softmax"


#: The widget that explains each modality (named in the error when a model reaches the wrong one).
WIDGET_FOR = {"image": "widgets.RelevanceExplorer", "text": "widgets.TokenRelevance"}


def check_kind(facts: ResolvedModel, expected: str, widget: str) -> None:
    """Raise a readable error when the model's modality is not the one the widget explains."""
    kind = facts.kind
    if kind != expected:
        article = "an" if kind[0] in "aeiou" else "a"
        raise UnsupportedModelError(
            f"{widget} explains {expected} models; this is {article} {kind} "
            f"model ({type(facts.module).__name__}): use {WIDGET_FOR[kind]}"
        )


def is_clip(facts: ResolvedModel) -> bool:
    """Whether the model is a CLIP explained on its image side (prompts in place of classes)."""
    from lrp_core.adapters.clip import CLIPImageAdapter

    return isinstance(facts.adapter, CLIPImageAdapter)


def prepare_images(facts: ResolvedModel, inputs: Any) -> torch.Tensor:
    """Images (B, 3, H, W) as the engine takes them, validated by the model's adapter.

    Two conveniences of the widgets come first: a PIL image or array goes through
    the model's ``preprocess`` (where the ``LoadedModel`` has one), and a single
    (3, H, W) image gets a batch axis. Every other check, and its message, is the engine's.
    """
    if not isinstance(inputs, torch.Tensor) and facts.preprocess is not None:
        inputs = facts.preprocess(inputs)
    if isinstance(inputs, torch.Tensor) and inputs.dim() == 3:
        inputs = inputs.unsqueeze(0)
    return images_of(facts.adapter.check_inputs(inputs))


def images_of(batch: Batch) -> torch.Tensor:
    """The images (B, 3, H, W) of an image model's batch (the image widgets explain image models only)."""
    if not isinstance(batch, ImageBatch):
        raise InputError(f"this widget explains images; the model's inputs are a {type(batch).__name__}")
    return batch.images


def class_names(labels: Sequence[str], n_classes: int, strict: bool = False) -> list[str]:
    """``labels`` when they cover every class, else ``class i`` names.

    With ``strict=True`` (labels given by the user) a wrong count is an error.
    """
    if strict and len(labels) != n_classes:
        raise InputError(f"got {len(labels)} labels for a model with {n_classes} classes")
    if len(labels) == n_classes:
        return [str(x) for x in labels]
    return [f"class {i}" for i in range(n_classes)]


def class_options(
    logits: torch.Tensor, names: Sequence[str], k: int = TOP_K, probabilities: str = "softmax"
) -> list[tuple[str, int]]:
    """Dropdown options: the top-k classes by probability first, then every other class.

    ``probabilities`` (one of ``lrp_core.models.PROBABILITIES``) follows the model's training: a softmax over
    the classes, or each class's own sigmoid for a model trained one-vs-rest.
    """
    if probabilities not in PROBABILITIES:
        raise InputError(f"probabilities must be one of {PROBABILITIES}, got {probabilities!r}")
    probs = logits_to_probabilities(logits.detach().float().reshape(-1), probabilities)
    order = torch.argsort(probs, descending=True).tolist()
    top = order[:k]
    opts = [(f"#{r + 1} {names[c]}  ({probs[c].item():.1%})", c) for r, c in enumerate(top)]
    opts += [(f"{names[c]}  ({probs[c].item():.1%})", c) for c in range(len(names)) if c not in top]
    return opts


def image_rgb(inputs: torch.Tensor, facts: ResolvedModel) -> np.ndarray:
    """(B, H, W, 3) uint8 display images from normalised model inputs."""
    out = []
    for x in inputs.detach().cpu():
        if facts.mean is not None and facts.std is not None:
            rgb = denormalize(x, facts.mean, facts.std)
        else:  # unknown normalisation: stretch each image to [0, 1]
            lo, hi = x.min().item(), x.max().item()
            rgb = ((x - lo) / (hi - lo if hi > lo else 1.0)).permute(1, 2, 0).numpy()
        out.append(to_rgb_uint8(rgb))
    return np.stack(out)


def error_html(message: str, title: str = "Cannot show this explanation") -> str:
    """A readable red error box (no traceback)."""
    return (
        '<div class="trl-error" style="border:1px solid #c62828;background:#fdecea;'
        'color:#611a15;padding:8px 12px;border-radius:4px;max-width:640px">'
        f"<b>{html.escape(title)}</b><br>{html.escape(str(message))}</div>"
    )


def describe_error(err: BaseException) -> str:
    """One readable sentence for an exception: the library's own messages as they are."""
    if isinstance(err, (LRPError, ValueError, TypeError, RuntimeError)) and str(err):
        msg = str(err)
    else:
        msg = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return msg.strip().splitlines()[0] if len(msg) > 600 else msg.strip()


def token_page_bundle(widget: Any) -> dict[str, Any]:
    """The static view of a token widget (text, generation): its coloured tokens and info line, or its error."""
    if widget.displayed_map is None:
        return {"text/html": error_html(widget.last_error or "nothing to show")}
    body = widget.html.value + f'<div style="font-size:90%">{widget.info.value}</div>'
    if widget.last_error:
        body = error_html(widget.last_error) + body
    return {"text/html": body}


class RelevanceWidget(W.VBox):
    """Base class: an error area, a busy note, timings and a static fallback.

    Subclasses implement :meth:`_static_bundle` (the fallback shown where widgets
    cannot render, e.g. nbconvert / nbval / GitHub).

    ``threads``: CPU threads torch uses for this widget's computations: ``"auto"``
    (one thread for small models, see :func:`widgets._engine.torch_threads`),
    an int, or ``None`` for torch's own setting. Set it on the class or an instance.
    """

    threads: Any = "auto"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.message = W.HTML(value="", layout=W.Layout(width="auto"))
        self.last_error: Optional[str] = None
        #: the full traceback behind ``last_error`` (for debugging; never shown in the widget)
        self.last_traceback: Optional[str] = None
        #: seconds the last action of each kind took ("first", "compute", "redraw")
        self.timings: dict[str, float] = {}

    # -- errors ---------------------------------------------------------
    def show_error(self, message: str, title: str = "Cannot show this explanation") -> None:
        """Show ``message`` in the widget's red error box."""
        self.last_error = message
        self.message.value = error_html(message, title)

    def clear_error(self) -> None:
        self.last_error = None
        self.message.value = ""

    def _guarded(self, label: str, fn: Callable[[], None]) -> bool:
        """Run ``fn`` (on :attr:`threads` CPU threads); show a readable error if it fails."""
        t0 = time.perf_counter()
        try:
            with torch_threads(getattr(getattr(self, "facts", None), "module", None), self.threads):
                fn()
        except Exception as err:  # noqa: BLE001 - every failure becomes a message
            self.show_error(describe_error(err))
            self.last_traceback = traceback.format_exc()
            return False
        finally:
            self.timings[label] = time.perf_counter() - t0
        return True

    # -- static fallback ------------------------------------------------
    def _static_bundle(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        data = super()._repr_mimebundle_(**kwargs) or {}
        try:
            data.update(self._static_bundle())
        except Exception as err:  # noqa: BLE001 - a fallback must never break display
            data["text/html"] = error_html(describe_error(err))
        return data

    def static_display(self) -> Any:
        """The static picture as an IPython display object (``Image`` or ``HTML``)."""
        from IPython.display import HTML, Image

        bundle = self._static_bundle()
        if "image/png" in bundle:
            return Image(data=base64.b64decode(bundle["image/png"]), format="png")
        return HTML(bundle.get("text/html", ""))

    def show_static(self) -> None:
        """Display the static picture (for places where widgets cannot render)."""
        from IPython.display import display

        display(self.static_display())


def png_bundle(png: bytes, error: Optional[str] = None) -> dict[str, Any]:
    """A mimebundle with the PNG (and the error message as HTML, if any)."""
    data: dict[str, Any] = {"image/png": base64.b64encode(png).decode("ascii")}
    if error:
        data["text/html"] = error_html(error)
    return data
