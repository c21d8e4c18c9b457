"""The VLM evidence protocol on another device: every tensor it makes or feeds the model follows the model's device.

No GPU is needed. :class:`FakeDevice` stands a device in for CUDA on the CPU: a tensor "on the device" is a CPU tensor
of the subclass :class:`OnDevice` whose ``.device`` reads ``meta``; ``.to(device)``, ``device=`` of a factory and
``.to(other)`` put tensors there, ``.cpu()`` / ``.to("cpu")`` bring them back. What CUDA refuses is refused: an
operation mixing a tensor on the device with a CPU tensor of one or more dimensions (CPU index tensors excepted, as
CUDA takes them), ``.numpy()`` of a tensor on the device, and a CPU tensor reaching the model or ``explain``.
"""

import contextlib
import dataclasses

import pytest
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

import lrp_core.api
from lrp_core import models
from lrp_core.data.vqa import make_vqa
from lrp_core.evaluation import vlm
from lrp_core.models.tiny_vlm import HELD_OUT_SEED

DEVICE = torch.device("meta")


class OnDevice(Tensor):
    """A CPU tensor standing for one on the device (the mode below does the bookkeeping)."""

    __torch_function__ = torch._C._disabled_torch_function_impl


class DeviceMixError(AssertionError):
    """What CUDA would raise: a CPU tensor met one on the device."""


def _device_type(x):
    """The device type ``x`` names (a device or its string), else ``None`` (e.g. a mode string like 'bilinear')."""
    if isinstance(x, torch.device):
        return x.type
    return x.split(":")[0] if isinstance(x, str) and x.split(":")[0] in ("cpu", "cuda", DEVICE.type) else None


def _is_device(x):
    return _device_type(x) == DEVICE.type


def _is_cpu(x):
    return _device_type(x) == "cpu"


def _wrap(out):
    if isinstance(out, Tensor):
        return out.as_subclass(OnDevice)
    if type(out) in (tuple, list):
        return type(out)(_wrap(o) for o in out)
    return out


def _tensors(x):
    if isinstance(x, Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _plain(ts):
    return [t for t in ts if not isinstance(t, OnDevice) and t.dim() > 0]


class FakeDevice(TorchFunctionMode):
    """Runs everything on the CPU while keeping track of which tensors stand for the device's."""

    def __init__(self):
        super().__init__()
        self.paused = False

    @contextlib.contextmanager
    def pause(self):
        """Plain CPU inside (the real model and engine run there on the unwrapped tensors)."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        if func == Tensor.device.__get__:
            return DEVICE if isinstance(args[0], OnDevice) else func(*args)
        if func == Tensor.numpy and isinstance(args[0], OnDevice):
            raise DeviceMixError(".numpy() of a tensor on the device")
        moved = any(_is_device(v) for v in list(args) + list(kwargs.values()))
        args = tuple("cpu" if _is_device(a) else a for a in args)
        kwargs = {k: "cpu" if _is_device(v) else v for k, v in kwargs.items()}
        if func in (Tensor.to, Tensor.cpu):
            other = [a for a in list(args[1:]) + list(kwargs.values()) if isinstance(a, Tensor)]
            to_cpu = func == Tensor.cpu or any(_is_cpu(v) for v in list(args[1:]) + list(kwargs.values()))
            there = isinstance(other[0], OnDevice) if other else moved or (isinstance(args[0], OnDevice) and not to_cpu)
            out = func(*args, **kwargs)
            return _wrap(out) if there else out.as_subclass(Tensor)
        if moved:  # a factory's device=
            return _wrap(func(*args, **kwargs))
        tensors = _tensors((args, kwargs))
        on = any(isinstance(t, OnDevice) for t in tensors)
        if func in (Tensor.__getitem__, Tensor.__setitem__) and isinstance(args[0], OnDevice):
            mixed = func == Tensor.__setitem__ and _plain(_tensors(args[2]))  # index tensors may be on the CPU
        else:
            mixed = on and _plain(tensors)
        if mixed:
            raise DeviceMixError(f"{getattr(func, '__name__', func)} mixes a tensor on the device with a CPU tensor")
        out = func(*args, **kwargs)
        return _wrap(out) if on else out


def _require_on_device(inputs, who):
    cpu = [k for k, v in inputs.items() if isinstance(v, Tensor) and not isinstance(v, OnDevice)]
    if cpu:
        raise DeviceMixError(f"CPU tensors {cpu} reached {who}")


class ModelOnDevice:
    """The model as if on the device: its inputs must be there, and its logits are."""

    def __init__(self, model, mode):
        self.model, self.mode, self.config = model, mode, model.config

    def parameters(self):
        with self.mode.pause():
            return iter([next(self.model.parameters()).detach().as_subclass(OnDevice)])

    def __call__(self, **inputs):
        _require_on_device(inputs, "the model")
        with self.mode.pause():
            logits = self.model(**{k: v.as_subclass(Tensor) for k, v in inputs.items()}).logits
            return dataclasses.make_dataclass("Out", ["logits"])(logits.as_subclass(OnDevice))


@pytest.fixture(scope="module")
def tiny():
    loaded = models.load("tiny-vlm")
    return loaded.model, loaded.info["processor"]


def _on_device(monkeypatch, mode):
    """``lrp_core.api.explain`` as if the model were on the device (the protocol imports it at each call)."""
    explain = lrp_core.api.explain

    def on_device(model, inputs, **kwargs):
        _require_on_device(inputs, "explain")
        with mode.pause():
            exp = explain(model.model, {k: v.as_subclass(Tensor) for k, v in inputs.items()}, **kwargs)
            for f in dataclasses.fields(exp):
                if isinstance(getattr(exp, f.name), Tensor):
                    setattr(exp, f.name, getattr(exp, f.name).as_subclass(OnDevice))
        return exp

    monkeypatch.setattr(lrp_core.api, "explain", on_device)


def test_the_fake_device_refuses_what_cuda_refuses():
    with FakeDevice():
        x = torch.ones(3).to(DEVICE)
        assert x.device == DEVICE and torch.zeros(2, device=x.device).device == DEVICE
        assert (x + torch.tensor(2.0)).device == DEVICE  # a 0-d CPU tensor is a scalar, as on CUDA
        assert x[torch.tensor([0, 2])].device == DEVICE  # CPU index tensors are taken, as on CUDA
        assert x.cpu().numpy().tolist() == [1.0, 1.0, 1.0]
        with pytest.raises(DeviceMixError):
            x + torch.ones(3)
        with pytest.raises(DeviceMixError):
            x.numpy()


def test_every_tensor_of_the_protocol_follows_the_model_device(tiny, monkeypatch):
    """The protocol with the model "on the device" runs, never mixes devices, and gives the CPU run's values."""
    model, processor = tiny
    records = [r for r in make_vqa(4, HELD_OUT_SEED + 11) if r.has_evidence]
    run = dict(methods=["attnlrp"], progress=False, K=3, curve_questions=2, batch_size=2)
    on_cpu = vlm.vlm_protocol(model, processor, records, **run)
    mode = FakeDevice()
    _on_device(monkeypatch, mode)
    with mode:
        on_device = vlm.vlm_protocol(ModelOnDevice(model, mode), processor, records, **run)
    assert on_device[1] == on_cpu[1]  # every per-question value, the pixel rows and both random rows included
    assert on_device[2:] == on_cpu[2:]
    assert {"attnlrp (pixels)", "random (pixels)"} <= set(on_device[1])
