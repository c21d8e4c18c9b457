"""The command line (python -m lrp_core.evaluation): end to end on the embedded toy ViT."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lrp_core import evaluation as E
from lrp_core.evaluation.__main__ import main


def test_command_line_toy_vit(tmp_path, capsys):
    pytest.importorskip("lrp_core.models.toy_vit")
    out = tmp_path / "r" / "toy.json"
    threads = torch.get_num_threads()
    try:  # one thread: fastest on a busy CI machine
        rc = main(
            [
                "--model",
                "toy-vit",
                "--methods",
                "transformer_attribution,rollout,cdam",
                "--n",
                "16",
                "--batch-size",
                "16",
                "--quiet",
                "--threads",
                "1",
                "--out",
                str(out),
            ]
        )
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    res = json.loads(out.read_text())
    assert list(res) == ["transformer_attribution", "rollout", "cdam", "random"]
    meta = json.loads((out.parent / "toy.meta.json").read_text())
    assert meta["n"] == 16 and meta["seed"] == E.SCENE_SEED and 0 <= meta["accuracy"] <= 1
    assert res["cdam"]["cdam_sparsity"] is not None and res["rollout"]["cdam_sparsity"] is None
    assert res["rollout"]["class_map_correlation"] == pytest.approx(1.0)
    for r in res.values():
        assert all(v is None or math.isfinite(v) for v in r.values())
    assert (out.parent / "perturbation_toy-vit.png").stat().st_size > 1000
    assert "transformer_attribution" in capsys.readouterr().out


def test_command_line_reports_bad_input(capsys):
    assert main(["--model", "toy-vit", "--methods", "nope", "--quiet"]) == 2
    assert "unknown method" in capsys.readouterr().err
