"""One whole evaluation run: load the model and its data, run the protocol of its kind.

A run is done in blocks of samples, possibly spread over processes (:mod:`.shards`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

import torch

from .. import METHODS
from ..data.folders import load_data_folder
from ..data.sets import BUILTIN_IMAGE_SETS, SCENE_SEED, ImageSet, TextSet, rationale_set
from ..errors import InputError, UnknownMethodError
from ..methods import registry
from .images import image_protocol
from .shards import Shard
from .text import text_protocol

#: a VLM run's questions whose patch MoRF / LeRF curves are computed (each costs 2·16 forwards per method)
VLM_CURVE_QUESTIONS = 16


def resolve_methods(spec: str | Sequence[str], protocol: str = "evidence") -> list[str]:
    """Turn a method specification into a checked list of names.

    Parameters
    ----------
    spec : str | Sequence[str]
        ``"all"``, a comma-separated list, or a sequence of names.
    protocol : str, optional
        ``"evidence"``, or ``"sources"``, which also accepts the source methods
        (:data:`lrp_core.api.SOURCE_METHODS`).

    Returns
    -------
    list[str]
        The method names.

    Raises
    ------
    UnknownMethodError
        If a name is unknown or none is given; the message lists the accepted names.
    """
    known = list(METHODS) + (list(registry.SOURCE_METHOD_NAMES) if protocol == "sources" else [])
    names = (
        list(known)
        if spec == "all"
        else ([s.strip() for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec))
    )
    bad = [m for m in names if m not in known]
    if bad or not names:
        raise UnknownMethodError(f"unknown method(s) {bad or names}; choose from {known} or 'all'")
    return names


def evaluate(
    model: str | Any = "toy-vit",
    methods: str | Sequence[str] = "all",
    n: int = 500,
    batch_size: int = 32,
    seed: int = SCENE_SEED,
    data: Optional[str] = None,
    split: str = "val",
    text_target: str = "true",
    progress: bool = True,
    baseline: bool = True,
    device: str = "cpu",
    shard: Optional[Shard] = None,
    protocol: str = "evidence",
    curve_questions: Optional[int] = VLM_CURVE_QUESTIONS,
) -> Optional[dict[str, Any]]:
    """Run the evaluation of a model.

    The samples are evaluated in blocks of ``batch_size`` (text: 16 at most). The per-sample values and the
    results do not depend on the number of processes.

    Parameters
    ----------
    model : str | Any
        A name for :func:`lrp_core.models.load`, or a :class:`LoadedModel`.
    methods : str | Sequence[str], optional
        As for :func:`resolve_methods`; ``"all"`` on a causal LM keeps the methods that run on decoders.
    n : int, optional
        Number of samples (at least 1).
    batch_size : int, optional
        Samples per block (at least 1).
    seed : int, optional
        Seed of the built-in data (scenes, facts).
    data : Optional[str], optional
        A folder of your own data (:func:`lrp_core.data.load_data_folder`) instead of the built-in data.
    split : str, optional
        The ERASER split read from ``data``.
    text_target : str, optional
        Text models: ``"true"`` (explain the label) or ``"predicted"``.
    progress : bool, optional
        Show progress bars.
    baseline : bool, optional
        Add the reference row ``random`` (seeded uniform random maps or word scores).
    device : str, optional
        Where the model runs; the data stay on the CPU and move batch by batch.
    shard : Optional[Shard], optional
        Spreads the blocks over the processes of a ``torchrun`` and keeps checkpoints (:mod:`.shards`);
        ``None``: one process.
    protocol : str, optional
        A causal LM's task: ``"evidence"`` (the evidence tokens, docs/METHODS.md §3.6) or ``"sources"`` (the
        deciding fact among the prompt's facts, §3.7). Image and text classifiers take ``"evidence"`` only.
    curve_questions : Optional[int], optional
        A VLM (§3c): the patch MoRF / LeRF curves are computed on the first this many answered questions
        (``None``: all); the other metrics on all ``n``.

    Returns
    -------
    Optional[dict[str, Any]]
        ``results`` ({method: {metric: value}}), ``curves`` (image models: the perturbation curves and per-image
        values; text models: per-document values), ``kind``, ``model``, ``n``, ``accuracy`` (the clean accuracy
        on the evaluated data), ``skipped``, ``seconds`` and ``processes``. With a ``shard``, only rank 0 gets
        the dict and the other ranks ``None``.

    Raises
    ------
    InputError
        If ``n``, ``batch_size`` or ``protocol`` is out of range, the model has no built-in data and no
        ``data`` is given, or the protocol, ``data`` or the processes do not fit the model's kind.
    UnknownMethodError
        If a method name is unknown.
    """
    from ..models import load  # late: the model zoo pulls in timm / transformers

    t0 = time.perf_counter()
    shard = shard or Shard()
    names = _checked_methods(methods, n, batch_size, protocol)
    loaded = load(model) if isinstance(model, str) else model
    names = _model_methods(loaded, methods, names)
    if protocol == "sources" and not _is_causal_lm(loaded):
        raise InputError("the sources protocol scores a causal language model's facts task (e.g. --model tiny-lm)")
    if device != "cpu":
        loaded.model.to(device)
    out: dict[str, Any] = {
        "model": getattr(loaded, "name", str(model)),
        "kind": loaded.kind,
        "methods": names,
        "seed": seed,
        "device": str(device),
    }
    part = _kind_run(
        loaded,
        out["model"],
        names,
        n,
        batch_size,
        seed,
        data,
        split,
        text_target,
        progress,
        baseline,
        device,
        shard,
        protocol,
        curve_questions,
    )
    if part is None:  # a rank other than 0: its blocks went to rank 0
        return None
    out.update(part)
    out["seconds"] = time.perf_counter() - t0
    out["processes"] = shard.world
    return out


def _checked_methods(methods: str | Sequence[str], n: int, batch_size: int, protocol: str) -> list[str]:
    """Check the options that do not depend on the model and resolve the method names.

    Parameters
    ----------
    methods : str | Sequence[str]
        As for :func:`resolve_methods`.
    n : int
        Number of samples (at least 1).
    batch_size : int
        Samples per block (at least 1).
    protocol : str
        ``"evidence"`` or ``"sources"``.

    Returns
    -------
    list[str]
        The method names, before the model narrows ``"all"`` (:func:`_model_methods`).

    Raises
    ------
    InputError
        If ``protocol``, ``n`` or ``batch_size`` is out of range.
    UnknownMethodError
        If a method name is unknown.
    """
    if protocol not in ("evidence", "sources"):
        raise InputError(f"protocol must be 'evidence' or 'sources', got {protocol!r}")
    names = resolve_methods(methods, protocol)
    if n < 1:
        raise InputError(f"n must be >= 1, got {n}")
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    return names


def _is_causal_lm(loaded: Any) -> bool:
    """Whether the loaded model is a causal LM (kind ``"lm"`` or ``info["task"] == "causal-lm"``).

    Parameters
    ----------
    loaded : Any
        A :class:`LoadedModel`.

    Returns
    -------
    bool
        ``True`` for a causal language model.
    """
    return loaded.kind == "lm" or (getattr(loaded, "info", None) or {}).get("task") == "causal-lm"


def _model_methods(loaded: Any, methods: str | Sequence[str], names: list[str]) -> list[str]:
    """The methods that run on the model: ``"all"`` keeps those its kind supports.

    Parameters
    ----------
    loaded : Any
        A :class:`LoadedModel`.
    methods : str | Sequence[str]
        The methods as asked (``"all"`` or names).
    names : list[str]
        The resolved names (:func:`_checked_methods`).

    Returns
    -------
    list[str]
        ``names``, except for ``"all"`` on a VLM (the methods its adapter does not refuse) or on a causal LM
        (the decoder and source methods; no Captum baselines yet).
    """
    if loaded.kind == "vlm" and methods == "all":  # 'all' on a VLM: the methods its adapter does not refuse
        from .vlm import vlm_methods

        names = vlm_methods(loaded.model)
    # 'all' on a decoder: the methods that run there (no Captum baselines yet)
    if _is_causal_lm(loaded) and methods == "all":
        names = [m for m in names if m in registry.DECODER_METHODS or m in registry.SOURCE_METHOD_NAMES]
    return names


def _kind_run(
    loaded: Any,
    name: str,
    names: list[str],
    n: int,
    batch_size: int,
    seed: int,
    data: Optional[str],
    split: str,
    text_target: str,
    progress: bool,
    baseline: bool,
    device: str,
    shard: Shard,
    protocol: str,
    curve_questions: Optional[int],
) -> Optional[dict[str, Any]]:
    """Run the protocol of the model's kind (image, text, VLM, causal LM or seq2seq).

    Parameters
    ----------
    loaded : Any
        A :class:`LoadedModel`, already on ``device``.
    name : str
        The model's name in the results.
    names : list[str]
        The method names.
    n, batch_size, seed, data, split, text_target, progress, baseline, device, shard, protocol, curve_questions
        As for :func:`evaluate` (``shard`` not ``None``).

    Returns
    -------
    Optional[dict[str, Any]]
        The kind's part of the run's dict (a causal LM's starts with ``protocol``); ``None`` on ranks other
        than 0.

    Raises
    ------
    InputError
        If the model's kind is unknown, or ``data``, ``protocol`` or the processes do not fit it.
    """
    config = {
        "model": name,
        "kind": loaded.kind,
        "methods": names,
        "n": n,
        "batch_size": batch_size,
        "seed": seed,
        "data": data,
        "split": split,
        "text_target": text_target,
        "baseline": baseline,
        "device": torch.device(device).type,
    }  # the image and text runs' checkpoint identity (cuda:0 and cuda:1 give the same values)
    if loaded.kind == "image":
        return _image_run(loaded, name, names, n, batch_size, seed, data, progress, baseline, shard, config)
    if loaded.kind == "text":
        return _text_run(loaded, names, n, batch_size, data, split, text_target, progress, baseline, shard, config)
    if loaded.kind == "vlm":
        return _vlm_run(loaded, names, n, batch_size, seed, data, progress, baseline, shard, protocol, curve_questions)
    if loaded.kind == "seq2seq":
        return _s2s_run(loaded, names, n, batch_size, seed, data, baseline, shard)
    if _is_causal_lm(loaded):
        part = _lm_run(loaded, names, n, batch_size, seed, data, progress, baseline, shard, protocol)
        return {"protocol": protocol, **part}
    raise InputError(f"unknown model kind {loaded.kind!r}")


def _image_run(
    loaded: Any,
    name: str,
    methods: list[str],
    n: int,
    batch_size: int,
    seed: int,
    data: Optional[str],
    progress: bool,
    baseline: bool,
    shard: Shard,
    config: dict[str, Any],
) -> Optional[dict[str, Any]]:
    """``accuracy``, ``n``, ``results``, ``curves``, ``skipped`` of an image model, in this order.

    The order is that of the keys in ``<out>.meta.json``. ``None`` on ranks other than 0.
    """
    one, two = _image_sets(loaded, name, n, seed, data)
    shard.start({**config, "samples": len(one)})
    done = image_protocol(loaded.model, one, two, methods, batch_size, progress, baseline, shard=shard)
    if done is None:
        return None
    results, curves, pred = done
    ref = one.labels[:, 0] if one.labels is not None else pred
    return {
        "accuracy": float((pred == ref).float().mean()),
        "n": len(one),
        "results": results,
        "curves": curves,
        "skipped": [],
    }


def _image_sets(
    loaded: Any,
    name: str,
    n: int,
    seed: int,
    data: Optional[str],
) -> tuple[ImageSet, Optional[ImageSet]]:
    """The one-object set (and the two-object set, built-in data only) of an image run.

    ``data`` (a folder) wins; else the model's ``info["evaluation_data"]`` names
    its built-in sets (:data:`BUILTIN_IMAGE_SETS`, drawn with ``seed``).
    """
    if data is not None:
        return load_data_folder(data, "image", loaded.preprocess, loaded.labels).head(n), None
    source = (getattr(loaded, "info", None) or {}).get("evaluation_data")
    if source not in BUILTIN_IMAGE_SETS:
        raise InputError(
            f"{name} has no built-in evaluation data: pass --data with "
            f"images/ and masks/ (see python -m lrp_core.evaluation --help)"
        )
    return BUILTIN_IMAGE_SETS[source](n, seed)


def _text_run(
    loaded: Any,
    methods: list[str],
    n: int,
    batch_size: int,
    data: Optional[str],
    split: str,
    text_target: str,
    progress: bool,
    baseline: bool,
    shard: Shard,
    config: dict[str, Any],
) -> Optional[dict[str, Any]]:
    """``n``, ``accuracy``, ``results``, ``curves``, ``skipped`` of a text model, in this order.

    The order is that of the keys in ``<out>.meta.json``; ``curves[method]`` holds
    the per-document values for the bootstrap (see :func:`evaluate_text`).
    ``None`` on ranks other than 0.

    Without ``data`` every text model is scored on the shipped rationale set.
    """
    ds: TextSet = (
        load_data_folder(data, "text", labels=loaded.labels, split=split)
        if data is not None
        else rationale_set(loaded.labels)
    )
    ds = ds.head(n)
    shard.start({**config, "samples": len(ds)})
    curves: dict[str, dict[str, list]] = {}
    done = text_protocol(
        loaded.model,
        loaded.tokenizer,
        ds,
        methods,
        target=text_target,
        batch_size=min(batch_size, 16),
        progress=progress,
        baseline=baseline,
        curves=curves,
        shard=shard,
    )
    if done is None:
        return None
    results, skipped, accuracy = done
    return {
        "n": len(ds),
        "accuracy": accuracy,
        "results": results,
        "curves": {m: curves[m] for m in results if m in curves},
        "skipped": skipped,
    }


def _lm_run(
    loaded: Any,
    methods: list[str],
    n: int,
    batch_size: int,
    seed: int,
    data: Optional[str],
    progress: bool,
    baseline: bool,
    shard: Shard,
    protocol: str = "evidence",
) -> dict[str, Any]:
    """``n``, ``accuracy``, ``answered``, ``results``, ``curves``, ``skipped`` of a causal LM on the facts task
    (:mod:`.lm`): prompts ``make_facts(n, seed)``, seeds at or above tiny-lm's held-out seed by default."""
    from ..data.facts import make_facts
    from ..models.tiny_lm import HELD_OUT_SEED
    from .lm import lm_protocol

    if data is not None:
        raise InputError(
            "a language model is evaluated on the built-in facts task; --data is for image and text classifiers"
        )
    if shard.world > 1:
        raise InputError("the language-model evaluation runs in one process; start it without torchrun")
    records = make_facts(n, HELD_OUT_SEED + seed if seed < HELD_OUT_SEED else seed)
    run_protocol: Callable[..., tuple] = lm_protocol
    if protocol == "sources":
        from .sources import sources_protocol

        run_protocol = sources_protocol
    results, curves, accuracy, answered = run_protocol(
        loaded.model,
        loaded.tokenizer,
        records,
        methods,
        batch_size=min(batch_size, 16),
        progress=progress,
        baseline=baseline,
    )
    return {"n": n, "accuracy": accuracy, "answered": answered, "results": results, "curves": curves, "skipped": []}


def _s2s_run(
    loaded: Any,
    methods: list[str],
    n: int,
    batch_size: int,
    seed: int,
    data: Optional[str],
    baseline: bool,
    shard: Shard,
) -> dict[str, Any]:
    """A translation model on the alignment task (:mod:`.alignment`, docs/METHODS.md §3.9): ``n`` held-out
    sentences of ``make_translations`` (seed ``HELD_OUT_SEED + seed``)."""
    from .alignment import s2s_run

    if data is not None:
        raise InputError("a translation model is evaluated on the built-in alignment task; --data is not for it")
    if shard.world > 1:
        raise InputError("the alignment evaluation runs in one process; start it without torchrun")
    return s2s_run(loaded, methods, n, batch_size=min(batch_size, 16), seed=seed, baseline=baseline)


def _vlm_run(
    loaded: Any,
    methods: list[str],
    n: int,
    batch_size: int,
    seed: int,
    data: Optional[str],
    progress: bool,
    baseline: bool,
    shard: Shard,
    protocol: str,
    curve_questions: Optional[int],
) -> dict[str, Any]:
    """``n``, ``questions``, ``accuracy``, ``answered``, ``curve_questions``, ``results``, ``curves``, ``skipped`` of
    a VLM on the scene questions (:mod:`.vlm`): ``make_vqa(n, seed)``, seeds at or above tiny-vlm's held-out seed
    by default; the questions with a deciding object are scored."""
    from ..data.vqa import make_vqa
    from ..models.tiny_vlm import HELD_OUT_SEED
    from .vlm import vlm_protocol

    if data is not None:
        raise InputError(
            "a vision-language model is evaluated on the built-in scene questions; --data is for image "
            "and text classifiers"
        )
    if protocol != "evidence":
        raise InputError("a vision-language model takes the evidence protocol only")
    if shard.world > 1:
        raise InputError("the vision-language evaluation runs in one process; start it without torchrun")
    processor = (getattr(loaded, "info", None) or {}).get("processor")
    if processor is None:
        raise InputError(f"{loaded.name} carries no processor (info['processor']) to encode the questions")
    records = make_vqa(n, HELD_OUT_SEED + seed if seed < HELD_OUT_SEED else seed)
    with_object = sum(r.has_evidence for r in records)
    results, curves, accuracy, answered = vlm_protocol(
        loaded.model,
        processor,
        records,
        methods,
        batch_size=min(batch_size, 8),
        progress=progress,
        baseline=baseline,
        curve_questions=curve_questions,
    )
    return {
        "n": n,
        "questions": with_object,
        "accuracy": accuracy,
        "answered": answered,
        "curve_questions": min(answered, curve_questions) if curve_questions is not None else answered,
        "results": results,
        "curves": curves,
        "skipped": [],
    }


__all__ = ["resolve_methods", "evaluate"]
