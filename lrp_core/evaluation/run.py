"""One whole evaluation run: load the model and its data, run the protocol of its kind."""
from __future__ import annotations

import time
from typing import Any, Optional, Sequence

from .. import METHODS
from ..data.folders import load_data_folder
from ..data.sets import BUILTIN_IMAGE_SETS, SCENE_SEED, ImageSet, TextSet, rationale_set
from ..errors import InputError, UnknownMethodError
from .images import evaluate_images, predict
from .text import evaluate_text, text_accuracy


def resolve_methods(spec: str | Sequence[str]) -> list[str]:
    """``"all"``, a comma list or a sequence of names -> validated list."""
    names = list(METHODS) if spec == "all" else (
        [s.strip() for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec))
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise UnknownMethodError(f"unknown method(s) {bad or names}; choose from {list(METHODS)} "
                                 f"or 'all'")
    return names


def evaluate(model: str | Any = "toy-vit", methods: str | Sequence[str] = "all", n: int = 500,
             batch_size: int = 32, seed: int = SCENE_SEED, data: Optional[str] = None,
             split: str = "val", text_target: str = "true", progress: bool = True,
             baseline: bool = True, device: str = "cpu") -> dict[str, Any]:
    """Run the evaluation of ``model`` (a name for :func:`lrp_core.models.load` or a LoadedModel).

    ``baseline`` adds a reference row ``random`` (seeded uniform random maps
    / word scores). Returns a dict with ``results`` ({method: {metric:
    value}}), ``curves`` (image models: perturbation curves and per-image values; text
    models: per-document values), ``kind``, ``model``, ``n``,
    ``accuracy`` (clean accuracy on the evaluated data), ``skipped`` and
    ``seconds``. ``device`` is where the model runs (the data stay on the CPU
    and move batch by batch).
    """
    from ..models import load  # late: the model zoo pulls in timm / transformers
    t0 = time.perf_counter()
    names = resolve_methods(methods)
    if n < 1:
        raise InputError(f"n must be >= 1, got {n}")
    loaded = load(model) if isinstance(model, str) else model
    if device != "cpu":
        loaded.model.to(device)
    out: dict[str, Any] = {"model": getattr(loaded, "name", str(model)), "kind": loaded.kind,
                           "methods": names, "seed": seed, "device": str(device)}
    if loaded.kind == "image":
        out.update(_image_run(loaded, out["model"], names, n, batch_size, seed, data, progress,
                              baseline))
    elif loaded.kind == "text":
        out.update(_text_run(loaded, names, n, batch_size, data, split, text_target, progress,
                             baseline))
    else:
        raise InputError(f"unknown model kind {loaded.kind!r}")
    out["seconds"] = time.perf_counter() - t0
    return out


def _image_run(loaded: Any, name: str, methods: list[str], n: int, batch_size: int, seed: int,
               data: Optional[str], progress: bool, baseline: bool) -> dict[str, Any]:
    """``accuracy``, ``n``, ``results``, ``curves``, ``skipped`` of an image model, in this order.

    The order is that of the keys in ``<out>.meta.json``.
    """
    one, two = _image_sets(loaded, name, n, seed, data)
    pred = predict(loaded.model, one.images, batch_size)
    ref = one.labels[:, 0] if one.labels is not None else pred
    out: dict[str, Any] = {"accuracy": float((pred == ref).float().mean()), "n": len(one)}
    out["results"], out["curves"] = evaluate_images(loaded.model, one, two, methods, batch_size,
                                                    progress, baseline)
    out["skipped"] = []
    return out


def _image_sets(loaded: Any, name: str, n: int, seed: int, data: Optional[str],
                ) -> tuple[ImageSet, Optional[ImageSet]]:
    """The one-object set (and the two-object set, built-in data only) of an image run.

    ``data`` (a folder) wins; else the model's ``info["evaluation_data"]`` names
    its built-in sets (:data:`BUILTIN_IMAGE_SETS`, drawn with ``seed``).
    """
    if data is not None:
        return load_data_folder(data, "image", loaded.preprocess, loaded.labels).head(n), None
    source = (getattr(loaded, "info", None) or {}).get("evaluation_data")
    if source not in BUILTIN_IMAGE_SETS:
        raise InputError(f"{name} has no built-in evaluation data: pass --data with "
                         f"images/ and masks/ (see python -m lrp_core.evaluate --help)")
    return BUILTIN_IMAGE_SETS[source](n, seed)


def _text_run(loaded: Any, methods: list[str], n: int, batch_size: int, data: Optional[str],
              split: str, text_target: str, progress: bool, baseline: bool) -> dict[str, Any]:
    """``n``, ``accuracy``, ``results``, ``curves``, ``skipped`` of a text model, in this order.

    The order is that of the keys in ``<out>.meta.json``; ``curves[method]`` holds
    the per-document values for the bootstrap (see :func:`evaluate_text`).

    Without ``data`` every text model is scored on the shipped rationale set.
    """
    ds: TextSet = (load_data_folder(data, "text", labels=loaded.labels, split=split)
                   if data is not None else rationale_set(loaded.labels))
    ds = ds.head(n)
    out: dict[str, Any] = {"n": len(ds),
                           "accuracy": text_accuracy(loaded.model, loaded.tokenizer, ds)}
    curves: dict[str, dict[str, list]] = {}
    results, skipped = evaluate_text(
        loaded.model, loaded.tokenizer, ds, methods, target=text_target,
        batch_size=min(batch_size, 16), progress=progress, baseline=baseline, curves=curves)
    out["results"] = results
    out["curves"] = {m: curves[m] for m in results if m in curves}
    out["skipped"] = skipped
    return out


__all__ = ["resolve_methods", "evaluate"]
