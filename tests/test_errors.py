"""An input error is raised from the public call: its traceback ends at the caller's line, not in the library."""

from __future__ import annotations

import traceback

import pytest
import torch

from lrp_core import explain
from lrp_core.errors import InputError


def _frames(err: BaseException) -> list[str]:
    """The files of the traceback's frames, innermost last."""
    return [f.filename for f in traceback.extract_tb(err.__traceback__)]


def test_an_input_error_carries_no_library_frames_below_the_call(tiny_vit, images):
    with pytest.raises(InputError, match="target") as info:
        explain(tiny_vit, images, method="lrp", target=10**6)
    library = [f for f in _frames(info.value) if "lrp_core" in f]
    assert len(library) == 1 and library[0].endswith("errors.py"), library  # the one frame that raises it


def test_the_full_traceback_is_kept_on_request(tiny_vit, images, monkeypatch):
    monkeypatch.setenv("LRP_FULL_TRACEBACK", "1")
    with pytest.raises(InputError) as info:
        explain(tiny_vit, images, method="lrp", target=10**6)
    files = _frames(info.value)
    assert any(f.endswith("api.py") for f in files) and any(f.endswith("targets.py") for f in files)


def test_other_errors_keep_their_traceback(images):
    from lrp_core.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError) as info:  # not about the input: where it arose is kept
        explain(torch.nn.Linear(3, 3), images, method="lrp")
    assert any("adapters" in f for f in _frames(info.value))
