"""User data folders for the evaluation (``python -m lrp_core.evaluation --data PATH``).

``--data PATH`` evaluates on your own data instead (see :func:`load_data_folder`):

- images: ``PATH/images/<name>.<png|jpg|jpeg>`` and ``PATH/masks/<name>.png``
  (any non-zero pixel = object); optional ``PATH/labels.csv`` with rows
  ``name,label`` (class index or class name; a header row is allowed).
  Without labels the perturbation accuracy is measured against the model's
  clean prediction and the ``*_target`` metrics are ``null``. ImageNet-
  segmentation (Guillaumin et al.) exported to PNGs fits this layout.
- ERASER (e.g. ``movies``): ``PATH/docs/<docid>`` (whitespace-tokenised text)
  and ``PATH/val.jsonl`` or ``PATH/test.jsonl`` (choose with ``--split``;
  ``classification`` POS/NEG, ``evidences`` with ``start_token``/``end_token``).
- simple text JSONL: ``PATH/rationales.jsonl``, one ``{"words": [...],
  "rationale": [0/1 per word], "label": int|name}`` per line (``"text"``
  optional, default: words joined by spaces).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Literal, Sequence, overload

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from .rationales import RationaleRecord
from .sets import ImageSet, TextSet, as_record, label_id

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


@overload
def load_data_folder(
    path: str | Path, kind: Literal["image"], preprocess: Any = None, labels: Sequence[str] = (), split: str = "val"
) -> ImageSet: ...


@overload
def load_data_folder(
    path: str | Path, kind: Literal["text"], preprocess: Any = None, labels: Sequence[str] = (), split: str = "val"
) -> TextSet: ...


@overload
def load_data_folder(
    path: str | Path, kind: str, preprocess: Any = None, labels: Sequence[str] = (), split: str = "val"
) -> ImageSet | TextSet: ...


def load_data_folder(
    path: str | Path, kind: str, preprocess: Any = None, labels: Sequence[str] = (), split: str = "val"
) -> ImageSet | TextSet:
    """Load a user data folder (layouts in the module docstring).

    Parameters
    ----------
    path : str | Path
        the folder.
    kind : str
        ``"image"`` or ``"text"`` (the model's kind).
    preprocess : Any, optional
        image models: PIL image -> (1, 3, H, W) model input (the
        loaded model's ``preprocess``); masks go through it too, so crops
        and resizes apply to both alike.
    labels : Sequence[str], optional
        class names, to read labels given by name.
    split : str, optional
        ERASER split file (``val`` / ``test`` / ``train``).

    Returns
    -------
    ImageSet | TextSet
        An :class:`ImageSet` for ``kind="image"``, a :class:`TextSet` for ``kind="text"``.

    Raises
    ------
    InputError
        If the folder does not exist or does not hold one of the accepted layouts
        (or as :func:`load_image_folder` / :func:`load_eraser`).
    """
    root = Path(path)
    if not root.is_dir():
        raise InputError(f"--data {root}: not a folder")
    if kind == "image":
        return load_image_folder(root, preprocess, labels)
    if (root / "rationales.jsonl").is_file():
        with open(root / "rationales.jsonl", encoding="utf-8") as f:
            return TextSet([as_record(json.loads(line), labels) for line in f if line.strip()])
    if (root / "docs").is_dir() and (root / f"{split}.jsonl").is_file():
        return load_eraser(root, split, labels)
    raise InputError(f"--data {root}: expected rationales.jsonl, or ERASER's docs/ and {split}.jsonl")


# --------------------------------------------------------------------------
# images
# --------------------------------------------------------------------------
def load_image_folder(root: Path, preprocess: Any, names: Sequence[str]) -> ImageSet:
    """``root/images``, ``root/masks`` (and ``root/labels.csv``) -> one-object :class:`ImageSet`.

    Parameters
    ----------
    root : Path
        The folder, with ``images/``, ``masks/`` and optionally ``labels.csv``.
    preprocess : Any
        PIL image -> (1, 3, H, W) model input; applied to the masks too.
    names : Sequence[str]
        Class names, to read labels given by name.

    Returns
    -------
    ImageSet
        Images (N, 3, H, W), labels (N, 1) or ``None`` without ``labels.csv``,
        masks (N, 1, H, W), in file-name order.

    Raises
    ------
    InputError
        If ``preprocess`` is missing, the sub-folders are missing, there is no
        image, or an image has no mask or no row in ``labels.csv``.
    """
    from PIL import Image

    if preprocess is None:
        raise InputError("loading images needs the model's preprocess")
    img_dir, mask_dir = root / "images", root / "masks"
    if not img_dir.is_dir() or not mask_dir.is_dir():
        raise InputError(f"--data {root}: expected sub-folders images/ and masks/")
    files = sorted(p for p in img_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise InputError(f"no .png / .jpg images in {img_dir}")
    table = _read_labels(root / "labels.csv", names)
    images, masks, labels = [], [], []
    for p in files:
        mp = mask_dir / (p.stem + ".png")
        if not mp.is_file():
            raise InputError(f"no mask {mp} for image {p.name}")
        img = Image.open(p).convert("RGB")
        mask = np.asarray(Image.open(mp).convert("L").resize(img.size, Image.Resampling.NEAREST)) > 0
        images.append(_first(preprocess(img)))
        masks.append(_transform_mask(mask, preprocess))
        if table:
            if p.stem not in table:
                raise InputError(f"labels.csv has no row for {p.name}")
            labels.append(table[p.stem])
    return ImageSet(
        torch.stack(images), torch.tensor(labels).view(-1, 1) if table else None, torch.stack(masks).unsqueeze(1)
    )


def _read_labels(path: Path, names: Sequence[str]) -> dict[str, int]:
    """``name,label`` rows of ``labels.csv`` -> {file stem: class id}; empty without the file."""
    table: dict[str, int] = {}
    if not path.is_file():
        return table
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.reader(f):
            if len(row) < 2 or row[0].strip().lower() in ("name", "filename", "file", "image"):
                continue  # a header row or a blank line
            table[Path(row[0].strip()).stem] = label_id(row[1], names)
    return table


def _transform_mask(mask: np.ndarray, preprocess: Any) -> Tensor:
    """Send a bool mask (h, w) through an image preprocess (resize / crop / normalise).

    The mask becomes a black/white image; after ``preprocess`` a pixel is
    object where channel 0 is nearer the value of white than that of black.
    """
    from PIL import Image

    bw = Image.fromarray(np.where(mask, 255, 0).astype(np.uint8)).convert("RGB")
    black = Image.new("RGB", bw.size, (0, 0, 0))
    white = Image.new("RGB", bw.size, (255, 255, 255))
    x, lo, hi = (_first(preprocess(im))[0] for im in (bw, black, white))
    return (x - lo).abs() > (x - hi).abs()


def _first(x: Any) -> Tensor:
    """(1, C, H, W) or (C, H, W) preprocess output -> (C, H, W) float tensor."""
    x = torch.as_tensor(x, dtype=torch.float32)
    return x.reshape(-1, *x.shape[-3:])[0]


# --------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------
def load_eraser(root: Path, split: str, names: Sequence[str]) -> TextSet:
    """An ERASER folder (``docs/``, ``<split>.jsonl``) -> :class:`TextSet`, a record per annotation.

    Parameters
    ----------
    root : Path
        The ERASER folder.
    split : str
        The split file's name (``val`` / ``test`` / ``train``).
    names : Sequence[str]
        Class names, to read labels given by name.

    Returns
    -------
    TextSet
        A record per annotation.

    Raises
    ------
    InputError
        If the split has no annotations.
    """
    with open(root / f"{split}.jsonl", encoding="utf-8") as f:
        records = [_eraser_record(root, json.loads(line), names) for line in f if line.strip()]
    if not records:
        raise InputError(f"{root / (split + '.jsonl')} has no annotations")
    return TextSet(records)


def _eraser_record(root: Path, ann: dict[str, Any], names: Sequence[str]) -> RationaleRecord:
    """One ERASER annotation: its document's words, the evidence spans in that document."""
    evid = [e for group in ann.get("evidences", []) for e in group]
    docid = evid[0]["docid"] if evid else ann.get("docids", [ann["annotation_id"]])[0]
    words = (root / "docs" / docid).read_text(encoding="utf-8").split()
    rationale = np.zeros(len(words), dtype=bool)
    for e in evid:
        if e.get("docid", docid) == docid:
            rationale[int(e["start_token"]) : int(e["end_token"])] = True
    return RationaleRecord(" ".join(words), words, rationale, label_id(ann["classification"], names))


__all__ = ["load_data_folder", "load_image_folder", "load_eraser"]
