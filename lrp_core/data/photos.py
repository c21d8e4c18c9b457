"""Photos that ship inside installed packages (nothing is downloaded).

Sources and licences (as stated by the packages):

- scikit-image ``skimage.data`` (bundled files only): astronaut (public domain,
  NASA), chelsea / cat and coffee (CC0), rocket (public domain, SpaceX),
  camera (CC0), coins, immunohistochemistry (no known copyright restrictions),
  hubble_deep_field (public domain, NASA), retina (CC0), brick, grass, gravel
  (CC0 textures), motorcycle (Middlebury stereo dataset, left view).
- scikit-learn ``load_sample_image``: china.jpg, flower.jpg (CC BY 2.0, Flickr
  users danielbuechele / vultilion).
- matplotlib sample data: grace_hopper.jpg (U.S. Navy photograph, public domain).

>>> img = sample_image("chelsea")
>>> pair, masks = compose_pair("chelsea", "coffee", size=224, return_masks=True)
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from PIL import Image

from ..errors import InputError, InputTypeError, UnknownNameError
from ..runtime.extras import require

__all__ = ["PHOTO_SOURCES", "as_pil_image", "compose_pair", "list_images", "sample_image"]


def _skimage(fn_name: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        data = require("skimage.data", extra="photos", what=f"the sample photo from scikit-image's {fn_name!r}")
        out = getattr(data, fn_name)()
        return out[0] if isinstance(out, tuple) else out  # stereo_motorcycle: (left, right, disp)

    return load


def _sklearn(file_name: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        datasets = require("sklearn.datasets", extra="photos", what=f"the sample photo {file_name!r}")
        return datasets.load_sample_image(file_name)

    return load


def _matplotlib(file_name: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        cbook = require("matplotlib.cbook", extra="viz", what=f"the sample photo {file_name!r}")
        with cbook.get_sample_data(file_name) as f:
            return np.asarray(Image.open(f).convert("RGB"))

    return load


#: name -> (loader, source and licence)
PHOTO_SOURCES: dict[str, tuple[Callable[[], np.ndarray], str]] = {
    "astronaut": (_skimage("astronaut"), "scikit-image; NASA, public domain"),
    "chelsea": (_skimage("chelsea"), "scikit-image; CC0 (Stefan van der Walt)"),
    "cat": (_skimage("chelsea"), "scikit-image (same as chelsea); CC0 (Stefan van der Walt)"),
    "coffee": (_skimage("coffee"), "scikit-image; CC0 (Rachel Michetti)"),
    "rocket": (_skimage("rocket"), "scikit-image; SpaceX, public domain"),
    "motorcycle": (_skimage("stereo_motorcycle"), "scikit-image; Middlebury stereo dataset"),
    "camera": (_skimage("camera"), "scikit-image; CC0 (Lav Varshney), grayscale"),
    "coins": (_skimage("coins"), "scikit-image; no known copyright restrictions, grayscale"),
    "immunohistochemistry": (_skimage("immunohistochemistry"), "scikit-image; no known copyright restrictions"),
    "hubble_deep_field": (_skimage("hubble_deep_field"), "scikit-image; NASA, public domain"),
    "retina": (_skimage("retina"), "scikit-image; CC0 1.0"),
    "brick": (_skimage("brick"), "scikit-image; CC0 texture, grayscale"),
    "grass": (_skimage("grass"), "scikit-image; CC0 texture, grayscale"),
    "gravel": (_skimage("gravel"), "scikit-image; CC0 texture, grayscale"),
    "china": (_sklearn("china.jpg"), "scikit-learn; CC BY 2.0 (danielbuechele, Flickr)"),
    "flower": (_sklearn("flower.jpg"), "scikit-learn; CC BY 2.0 (vultilion, Flickr)"),
    "grace_hopper": (_matplotlib("grace_hopper.jpg"), "matplotlib sample data; U.S. Navy photograph, public domain"),
}


def list_images() -> list[str]:
    """Names accepted by :func:`sample_image`, sorted."""
    return sorted(PHOTO_SOURCES)


def as_pil_image(image: Any) -> Image.Image:
    """Convert an image to a PIL RGB image.

    Parameters
    ----------
    image : Any
        A PIL image, or an (H, W), (H, W, 3) or (H, W, 4) array, uint8 in 0..255 or float in 0..1 (bool
        arrays too). A torch tensor counts as an array (moved to the CPU); a (3, H, W) channel-first array is
        transposed; a fourth channel is dropped.

    Returns
    -------
    Image.Image
        The RGB image.

    Raises
    ------
    InputTypeError
        If ``image`` is neither a PIL image nor an array.
    InputError
        If the array has another shape.
    """
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if hasattr(image, "detach"):  # torch tensor
        image = image.detach().cpu().numpy()
    if not isinstance(image, np.ndarray):
        raise InputTypeError(
            f"expected a PIL image or an (H, W[, 3|4]) uint8 / float array, got {type(image).__name__}"
        )
    arr = image
    if arr.ndim == 3 and arr.shape[0] in (3, 4) and arr.shape[-1] not in (3, 4):
        arr = np.transpose(arr, (1, 2, 0))
    if arr.ndim == 2:
        arr = np.stack([arr] * 3, axis=-1)
    if arr.ndim != 3 or arr.shape[-1] not in (3, 4):
        raise InputError(f"expected an (H, W), (H, W, 3) or (H, W, 4) array, got shape {tuple(image.shape)}")
    arr = arr[..., :3]
    if arr.dtype == np.uint8:
        return Image.fromarray(np.ascontiguousarray(arr), "RGB")
    if arr.dtype == bool:
        return Image.fromarray(np.ascontiguousarray(arr.astype(np.uint8) * 255), "RGB")
    arr = arr.astype(np.float64)
    if np.issubdtype(image.dtype, np.integer) and arr.max(initial=0) > 1:  # e.g. int64 0..255
        arr = arr / 255.0
    return Image.fromarray((np.clip(arr, 0.0, 1.0) * 255 + 0.5).astype(np.uint8), "RGB")


def sample_image(name: str) -> Image.Image:
    """One of the bundled photos, as a PIL RGB image (grayscale photos converted to RGB).

    Parameters
    ----------
    name : str
        A name from :func:`list_images`.

    Returns
    -------
    Image.Image
        The photo.

    Raises
    ------
    UnknownNameError
        If the name is unknown (a ``KeyError``); the message lists :func:`list_images`.
    """
    try:
        loader, _ = PHOTO_SOURCES[name]
    except (KeyError, TypeError):
        raise UnknownNameError(f"unknown image {name!r}; available: {', '.join(list_images())}") from None
    return as_pil_image(loader())


def _center_crop_resize(img: Image.Image, width: int, height: int) -> Image.Image:
    """Crop the largest centred box with aspect width:height, then resize to (width, height)."""
    w, h = img.size
    target = width / height
    if w / h > target:  # too wide: crop the sides
        new_w = max(1, round(h * target))
        left = (w - new_w) // 2
        box = (left, 0, left + new_w, h)
    else:  # too tall: crop top and bottom
        new_h = max(1, round(w / target))
        top = (h - new_h) // 2
        box = (0, top, w, top + new_h)
    return img.crop(box).resize((width, height), Image.Resampling.BICUBIC)


def compose_pair(
    img_a: Any, img_b: Any, size: int = 224, return_masks: bool = False
) -> Image.Image | tuple[Image.Image, np.ndarray]:
    """Place two photos side by side in one ``size`` x ``size`` image.

    Each photo is centre-cropped to a half-width portrait and resized; ``img_a`` fills the left ``size // 2``
    columns, ``img_b`` the others.

    Parameters
    ----------
    img_a : Any
        The left photo: a name from :func:`list_images`, a PIL image or an array.
    img_b : Any
        The right photo, in the same forms.
    size : int, optional
        Side of the composed image, in pixels (at least 2).
    return_masks : bool, optional
        Also return the masks of the two halves.

    Returns
    -------
    Image.Image | tuple[Image.Image, np.ndarray]
        The PIL image; with ``return_masks=True`` the pair ``(image, masks)``, ``masks`` a (2, size, size) bool
        array marking the left and the right half.

    Raises
    ------
    InputError
        If ``size`` is not an integer of at least 2, or a photo is not an accepted image.
    UnknownNameError
        If a photo's name is unknown.
    """
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 2:
        raise InputError(f"size must be an integer >= 2, got {size!r}")
    a = sample_image(img_a) if isinstance(img_a, str) else as_pil_image(img_a)
    b = sample_image(img_b) if isinstance(img_b, str) else as_pil_image(img_b)
    left_w = size // 2
    canvas = Image.new("RGB", (size, size))
    canvas.paste(_center_crop_resize(a, left_w, size), (0, 0))
    canvas.paste(_center_crop_resize(b, size - left_w, size), (left_w, 0))
    if not return_masks:
        return canvas
    masks = np.zeros((2, size, size), dtype=bool)
    masks[0, :, :left_w] = True
    masks[1, :, left_w:] = True
    return canvas, masks
