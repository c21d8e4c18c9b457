"""LXT's side of the GPU table: one (model variant, method) in a process of its own (LXT patches transformers'
Llama module globally). Started by ``scripts/bench_gpu_llama8b.py``; never imports lrp_core.

    python scripts/lxt_gpu_worker.py '<json settings>'

LXT's efficient mode as its examples run it (``examples/quantized_llama.py``): ``monkey_patch(modeling_llama,
attnLRP | cp_LRP)``, the model in bfloat16 (sdpa), no parameter gradient, ``e = get_input_embeddings()(ids)``,
``model(inputs_embeds=e.requires_grad_(), use_cache=False)``, backward of the largest logit at the last
position, relevance ``(e * e.grad).float().sum(-1)``. One change: ``logits_to_keep=1`` (the LM head on the
last position only; the relevance is the same, and the T × 128,256 logits of a long row are not made). Mode
``plain``: eval mode, no checkpointing; where that runs out of memory, ``checkpointed``: ``model.train()`` and
``gradient_checkpointing_enable()``, as the example does (its dropout is patched to the identity).

Settings (JSON): shape, device, variant ("bf16" | "nf4"), method ("attnlrp" | "cp_lrp"), lengths, seed, rows
(the JSON-lines file), maps (the folder of the maps), deadline (``time.time()``; the cells get at least
min_sweep seconds after the setup), repeat, budget.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu8b_model  # noqa: E402
from gpu_cells import Clock, Rows, save_map, sweep  # noqa: E402


def main() -> int:
    s = json.loads(sys.argv[1])
    t_start = time.time()
    import lxt
    import transformers
    from lxt.efficient import monkey_patch
    from lxt.efficient.models import llama as lxt_llama
    from transformers.models.llama import modeling_llama

    monkey_patch(modeling_llama, lxt_llama.attnLRP if s["method"] == "attnlrp" else lxt_llama.cp_LRP)
    rows = Rows(s["rows"])
    base = {"side": "lxt", "variant": s["variant"], "dtype": "bfloat16"}
    try:
        model = gpu8b_model.build(s["shape"], s["device"], torch.bfloat16, s["seed"], "sdpa")
        if s["variant"] == "nf4":
            model = gpu8b_model.quantise_nf4(model)
    except Exception as e:  # bitsandbytes missing or failing: the cells record why
        rows.emit({**base, "method": s["method"], "note": f"error building the model: {type(e).__name__}: {e}"})
        return 0
    rows.emit(
        {
            **base,
            "method": "(setup)",
            "fingerprint": gpu8b_model.fingerprint(model),
            "setup_s": time.time() - t_start,
            "lxt": os.path.dirname(os.path.abspath(lxt.__file__)),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }
    )
    clock = Clock(s["device"])
    embed = model.get_input_embeddings()

    def factory(tokens: int, mode: str):
        ids = gpu8b_model.token_ids(model.config.vocab_size, tokens, s["seed"]).to(s["device"])
        if mode == "checkpointed":
            model.train()
            model.gradient_checkpointing_enable()
        else:
            model.eval()

        def call() -> tuple:
            e = embed(ids).detach().requires_grad_()
            logits = model(inputs_embeds=e, use_cache=False, logits_to_keep=1).logits
            top, index = torch.max(logits[0, -1, :], dim=-1)
            top.backward()
            relevance = (e * e.grad).float().sum(-1).detach()[0]
            return relevance, int(index)

        return call

    def keep(method: str, tokens: int, r: dict) -> None:
        relevance, target = r.pop("out")
        r["target"] = target
        r["map"] = save_map(s["maps"], f"{s['variant']}-{method}-{tokens}-lxt", relevance, target)

    sweep(
        clock,
        rows,
        base,
        s["lengths"],
        [(s["method"], factory, ["plain", "checkpointed"])],
        max(s["deadline"], time.time() + s["min_sweep"]),
        s["repeat"],
        s["budget"],
        keep,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
