#!/usr/bin/env python
"""PA-LRP on the language-model evidence protocol (docs/METHODS.md §3.6) with tiny-lm: attnlrp, cp_lrp, pa_lrp.

tiny-lm's weights are not shipped (lrp_core/models/tiny_lm.py); train them first, deterministically::

    python scripts/train_tiny_lm.py --threads 1 --out /tmp/palrp_tiny_lm
    python scripts/eval_pa_lrp_lm.py --weights /tmp/palrp_tiny_lm --n 300

Besides the methods' own maps (``scores``: the token relevance), the row ``pa_lrp tokens+positions`` scores
``scores + positional`` — the relevance of each (token, position) pair, the map the authors display.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from lrp_core import explain
from lrp_core.data.facts import make_facts
from lrp_core.evaluation.lm import LM_METRICS, encode, filler_token, lm_protocol, prompt_values
from lrp_core.models.tiny_lm import HELD_OUT_SEED, build_model, build_tokenizer


def load(weights: Path):
    from safetensors.torch import load_file

    tok = build_tokenizer()
    model = build_model(len(tok.get_vocab()))
    model.load_state_dict(load_file(str(weights / "model.safetensors")), strict=False)
    model.tie_weights()
    return model.eval(), tok


def combined_row(model, tok, records, correct: list) -> dict:
    """The protocol's metrics for the map scores + positional of pa_lrp."""
    enc = encode(tok, records)
    filler = filler_token(tok)
    values = {m: [] for m in LM_METRICS}
    for start in range(0, len(correct), 16):
        rows = correct[start : start + 16]
        exp = explain(
            model,
            {"input_ids": enc["input_ids"][rows], "attention_mask": enc["attention_mask"][rows]},
            method="pa_lrp",
            target=enc["answers"][rows].tolist(),
            progress=False,
        )
        for b, m in zip(rows, (exp.scores + exp.positional).double().numpy()):
            for k, v in prompt_values(model, enc, b, m, filler).items():
                values[k].append(v)
    return {k: float(np.mean(v)) for k, v in values.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=Path, required=True)
    ap.add_argument("--n", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load(args.weights)
    records = make_facts(args.n, seed=HELD_OUT_SEED + 7)
    results, _, accuracy, n_correct = lm_protocol(model, tok, records, ["attnlrp", "cp_lrp", "pa_lrp"], progress=False)
    enc = encode(tok, records)
    with torch.no_grad():
        from lrp_core.evaluation.lm import _positions

        logits = model(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            position_ids=_positions(enc["attention_mask"]),
        ).logits[:, -1]
    correct = torch.nonzero(logits.argmax(-1) == enc["answers"]).flatten().tolist()
    results["pa_lrp tokens+positions"] = combined_row(model, tok, records, correct)
    print(f"accuracy {accuracy:.3f}, {n_correct} prompts answered correctly of {args.n}")
    print("| method | " + " | ".join(LM_METRICS) + " |")
    print("|---|" + "---:|" * len(LM_METRICS))
    for name, row in results.items():
        print(f"| {name} | " + " | ".join(f"{float(row[k]):.3f}" for k in LM_METRICS) + " |")


if __name__ == "__main__":
    main()
