"""scripts/train_tiny_s2s.py: a short run is reproducible bit for bit and writes what the loader reads."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_tiny_s2s.py"


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        yield importlib.import_module(SCRIPT.stem)
    finally:
        sys.path.remove(str(SCRIPT.parent))


def test_a_short_run_is_reproducible_and_its_files_load(script, tmp_path, monkeypatch):
    args = ["--steps", "30", "--batch", "16", "--eval", "20"]
    script.main([*args, "--out", str(tmp_path / "a")])
    script.main([*args, "--out", str(tmp_path / "b")])
    a, b = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["train_steps"] == 30 and 0 <= meta["held_out_exact_match"] <= 1 and meta["seed"] == 0
    # the loader reads the written folder: weights, tokenizer and meta
    from lrp_core.models import tiny_s2s

    for name in ("WEIGHTS_FILE", "TOKENIZER_FILE", "META_FILE"):
        monkeypatch.setattr(tiny_s2s, name, tmp_path / "a" / getattr(tiny_s2s, name).name)
    loaded = tiny_s2s.load_tiny_s2s()
    assert loaded.info["train_steps"] == 30
    state = loaded.model.state_dict()
    assert all((state[k] == v).all() for k, v in a.items())
