"""The GPU table's script (``scripts/bench_gpu_llama8b.py``, issue #46 item 6) on the CPU: its lrp_core worker on
the tiny stand-in, in process (LXT's worker is not run here: LXT is never a dependency of the tests).

What it must get right before a GPU session spends its minutes on it: the model is built alike from the seed in
every process (the LXT worker's weights are the lrp_core worker's), each saved map is ``lrp_core.explain``'s map of
that model for the baseline's own top token, every cell is a row (measured, or skipped with the reason), and the
ratios and the agreement with a map the LXT worker would save are computed from them.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import bench_gpu_llama8b as bench  # noqa: E402
import gpu8b_model  # noqa: E402

from lrp_core import explain  # noqa: E402

LENGTHS = [8, 12]


def _settings(tmp_path, deadline: float) -> dict:
    return {
        "shape": "tiny",
        "device": "cpu",
        "variant": "bf16",
        "method": None,
        "methods": ["attnlrp", "cp_lrp"],
        "lengths": LENGTHS,
        "seed": 0,
        "rows": str(tmp_path / "rows.jsonl"),
        "maps": str(tmp_path / "maps"),
        "deadline": deadline,
        "repeat": 1,
        "budget": 1.0,
        "fast": False,
        "min_sweep": 0.0,
    }


def test_the_seeded_model_is_the_same_in_every_build_and_a_bfloat16_llama_3_shape():
    a, b = gpu8b_model.build("tiny", "cpu"), gpu8b_model.build("tiny", "cpu")
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert torch.equal(a.model.rotary_emb.inv_freq, b.model.rotary_emb.inv_freq)
    assert next(a.parameters()).dtype == torch.bfloat16 and not any(p.requires_grad for p in a.parameters())
    big = gpu8b_model.config("8b")
    assert (big.hidden_size, big.num_hidden_layers, big.num_attention_heads, big.num_key_value_heads) == (
        4096,
        32,
        32,
        8,
    )
    assert (big.intermediate_size, big.vocab_size, big.rope_parameters["rope_theta"]) == (14336, 128256, 500000.0)


def test_the_lrp_core_worker_saves_explains_maps_and_a_row_per_cell(tmp_path):
    import time

    s = _settings(tmp_path, time.time() + 600)
    assert bench.lrp_core_worker(s) == 0
    rows = bench.read_rows(s["rows"])
    setup = rows[0]
    assert setup["method"] == "(setup)" and setup["fast_mode"] is False and "not asked" in setup["fast_mode_note"]
    cells = {(r["method"], r["tokens"]): r for r in rows[1:]}
    assert set(cells) == {(m, t) for m in (bench.BASELINE, "attnlrp", "cp_lrp") for t in LENGTHS}
    assert all(r["ms"] > 0 and r["mode"] in ("plain", "default") for r in cells.values())
    model = gpu8b_model.build("tiny", "cpu")
    for t in LENGTHS:
        ids = gpu8b_model.token_ids(model.config.vocab_size, t)
        for m in ("attnlrp", "cp_lrp"):
            saved = torch.load(os.path.join(s["maps"], f"bf16-{m}-{t}-lrp_core.pt"))
            want = explain(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, m)
            assert torch.equal(saved["scores"], want.scores[0]), (m, t)
            assert saved["target"] == int(want.target[0]) == cells[(bench.BASELINE, t)]["target"]
        # the LXT worker's map of the same cell (here: ours again) is compared; the ratios use the baseline
        torch.save(
            torch.load(os.path.join(s["maps"], f"bf16-attnlrp-{t}-lrp_core.pt")), f"{s['maps']}/bf16-attnlrp-{t}-lxt.pt"
        )
    lxt = [
        {"side": "lxt", "variant": "bf16", "method": "attnlrp", "tokens": t, "ms": 2.0, "mode": "plain"}
        for t in LENGTHS
    ]
    out = bench.ratios(rows + lxt, s["maps"])
    ours = [r for r in out if r.get("side") == "lrp_core" and r.get("method") == "attnlrp"]
    assert len(ours) == len(LENGTHS)
    for r in ours:
        assert r["vs_lxt"] == {"max_rel": 0.0, "pearson": pytest.approx(1.0), "same_target": True}
        assert r["x_lxt"] == pytest.approx(r["ms"] / 2.0)
        assert r["x_fwd_bwd"] == pytest.approx(r["ms"] / cells[(bench.BASELINE, r["tokens"])]["ms"])
    assert bench.table(out).count("\n") == len(out) - 1  # a line per cell, the setup row left out, and the header
    json.dumps(out)  # what the driver writes


def test_a_worker_past_its_deadline_records_every_cell_as_skipped(tmp_path):
    s = _settings(tmp_path, 0.0)
    bench.lrp_core_worker(s)
    rows = bench.read_rows(s["rows"])[1:]
    assert len(rows) == 3 * len(LENGTHS) and all(r["note"].startswith("skipped: no time") for r in rows)
