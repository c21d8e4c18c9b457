#!/usr/bin/env python
"""Developer check: ``pa_lrp`` on a tiny random Llama against the PA-LRP authors' code (YardenBakish/PE-AWARE-LRP).

NOT a test; the authors' code is never a dependency. It needs transformers 4.x and their own copy of an old
LXT (``NLP/lxt``, relevance carried in ``.grad``), so it runs under another python (default
``/work/lxt21-venv/bin/python``: transformers 4.51) with their ``NLP/`` folder first on ``sys.path``.
bitsandbytes and tabulate, imported by their files but unused here (quantised Linear classes in a rule map,
a table printer), are stubbed. Findings and figures: scripts/pa_lrp_findings.md.

Run from the project venv::

    .venv/bin/python scripts/check_against_pa_lrp.py [--ref-python /work/lxt21-venv/bin/python]
        [--authors /work/palrp-ref/NLP] [--write-fixture tests/fixtures/pa_lrp/llama.pt | none]

1. here: a tiny Llama (hidden 32, 2 blocks, 4 / 2 heads, vocabulary 64), every parameter random, float64,
   saved with three unpadded rows;
2. under the reference python: their ``LlamaForCausalLM`` (``lxt/models/llama_PE.py``) with their ``attnlrp``
   composite registered, explained as ``NLP_demo.py`` does (per-layer (cos, sin) made leaves, max logit at the
   last position, ``backward(max_logit)``; tokens ``input_embeds.grad.sum(-1)``, positions
   ``Σ_layers (cos.grad + sin.grad).sum(-1)``, both raw: before their normalisation and ``abs``). Their
   stabiliser ``x + eps`` (eps 1e-6 / 1e-8, not sign-matched) is made ``x``, our rules' eps → 0 limit
   (``--keep-eps`` keeps it);
3. here: ``explain(model, row, method="pa_lrp", target=their token)`` on the same weights, rows alone and
   padded left / right; max |ours − theirs| / max |theirs| for tokens and positions, and the logit.

Three modes, each a fresh pair of runs:

* "float64": their softmax's float32 cast (``attn_weights.float()``) removed from a copy of their file; ours
  with sdpa attention (the engine then keeps the softmax in float64). RMSNorm is float32 inside on both sides
  (transformers' arithmetic, theirs copies it). Writes the test fixture.
* "float64, RMSNorm in float64": as above with RMSNorm's float32 cast removed on both sides for this run
  only; the pass / fail of the script (float64 tolerance 1e-8).
* "float32 softmax (as written)": their file as it is; ours eager (Hugging Face's eager softmax is float32).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SEED = 20261124
LENGTHS = (5, 9, 12)
VOCAB = 64
TOL = 1e-8

REFERENCE = r'''
import importlib.machinery as M, importlib.util, json, sys, types
import torch
authors, data, out, keep32, no_eps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5] == "1"
rms64 = sys.argv[6] == "1"
sys.path.insert(0, authors)
for name, attrs in (("bitsandbytes", {}), ("bitsandbytes.nn", {"Linear4bit": type("Linear4bit", (), {}),
                    "Linear8bitLt": type("Linear8bitLt", (), {})}), ("tabulate", {"tabulate": lambda *a, **k: ""})):
    mod = types.ModuleType(name); mod.__spec__ = M.ModuleSpec(name, None); mod.__dict__.update(attrs)
    sys.modules[name] = mod
sys.modules["bitsandbytes"].nn = sys.modules["bitsandbytes.nn"]
if no_eps:  # their stabiliser adds +eps (1e-6 in Linear / AV / q·k rules, 1e-8 in add2); our rules are its eps -> 0 limit
    import lxt.functional as lf_, lxt.rules as rules_
    lf_._stabilize = rules_._stabilize = lambda x, epsilon=0.0, inplace=False: x
if rms64:  # RMSNorm in the model's dtype (transformers computes it in float32): the float64 comparison's 2nd mode
    import lxt.functional as lf_
    def _rms64(ctx, h, w, eps):
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))
    lf_.rms_norm_identity_fn.forward = staticmethod(_rms64)
src = open(f"{authors}/lxt/models/llama_PE.py").read()
cast = "attn_weights = self.softmax(attn_weights.float()).to(query_states.dtype)"
assert src.count(cast) == 1, "their softmax line moved: update the check"
if not keep32:
    src = src.replace(cast, "attn_weights = self.softmax(attn_weights).to(query_states.dtype)")
spec = importlib.util.spec_from_loader("lxt.models.llama_PE_checked", loader=None)
mod = importlib.util.module_from_spec(spec); mod.__file__ = f"{authors}/lxt/models/llama_PE.py"
exec(compile(src, mod.__file__, "exec"), mod.__dict__)
from transformers import LlamaConfig
d = torch.load(data)
model = mod.LlamaForCausalLM(LlamaConfig(**d["config"], attn_implementation="eager"))  # as NLP_demo.py: their
# attention code is eager; under sdpa their _update_causal_mask returns None and the attention is not causal
missing, unexpected = model.load_state_dict(d["state_dict"], strict=False)
assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
model = model.double().eval()
mod.attnlrp.register(model)
results = []
for ids in d["rows"]:
    ids = ids[None]
    e = model.get_input_embeddings()(ids)
    pos_ids = torch.arange(0.0, ids.shape[1], requires_grad=True, dtype=torch.float32).reshape(1, -1)
    pe = [model.get_input_pos_embeddings()(e, pos_ids) for _ in range(model.config.num_hidden_layers)]
    pe = [(c.requires_grad_(), s.requires_grad_()) for c, s in pe]
    logits = model(inputs_embeds=e.requires_grad_(), position_embeddings=pe, use_cache=False)["logits"]
    top, idx = torch.max(logits[0, -1, :], dim=-1)
    top.backward(top)
    tokens = e.grad.sum(-1)[0]
    per_layer = torch.stack([c.grad.sum(-1)[0] + s.grad.sum(-1)[0] for c, s in pe])
    results.append({"target": int(idx), "logit": float(top), "tokens": tokens.detach(), "positional_per_layer": per_layer})
torch.save(results, out)
'''


def make_llama(attn: str = "eager"):
    """The tiny random Llama (transformers 5 here), float64, and its config as a plain dict; ``attn``: "eager"
    (Hugging Face's softmax in float32, as their file) or "sdpa" (float64 throughout)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, pad_token_id=0,
               bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, rope_theta=10000.0)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**cfg, attn_implementation=attn))
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.copy_(1.0 + 0.2 * noise if "norm" in name else 0.3 * noise)
    return model.double().eval(), cfg


def rows() -> list:
    g = torch.Generator().manual_seed(SEED + 1)
    return [torch.randint(3, VOCAB, (n,), generator=g) for n in LENGTHS]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def ours(model, seqs: list, refs: list) -> dict:
    """Our pa_lrp per row alone and in padded batches, as relative differences to the reference."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from lxt_decoders import pad
    from lrp_core import explain
    worst = {"tokens": 0.0, "positional": 0.0, "tokens_padded": 0.0, "positional_padded": 0.0}
    for ids, ref in zip(seqs, refs):
        e = explain(model, {"input_ids": ids[None], "attention_mask": torch.ones(1, len(ids), dtype=torch.long)},
                    method="pa_lrp", target=ref["target"])
        worst["tokens"] = max(worst["tokens"], rel(e.scores[0], ref["tokens"]))
        worst["positional"] = max(worst["positional"], rel(e.positional[0], ref["positional_per_layer"].sum(0)))
    for side in ("left", "right"):
        inp = pad(seqs, side, 0)
        e = explain(model, inp, method="pa_lrp", target=[r["target"] for r in refs])
        for i, ref in enumerate(refs):
            m = inp["attention_mask"][i].bool()
            worst["tokens_padded"] = max(worst["tokens_padded"], rel(e.scores[i][m], ref["tokens"]))
            worst["positional_padded"] = max(worst["positional_padded"],
                                             rel(e.positional[i][m], ref["positional_per_layer"].sum(0)))
    return worst


def reference(args, model, cfg, seqs, float32_softmax: bool, keep_eps: bool, rms64: bool = False) -> list:
    """The authors' code on ``model``'s weights (see the module docstring), one result per row."""
    with tempfile.TemporaryDirectory() as tmp:
        data, out, script = Path(tmp, "in.pt"), Path(tmp, "out.pt"), Path(tmp, "ref.py")
        torch.save({"config": cfg, "state_dict": model.state_dict(), "rows": seqs}, data)
        script.write_text(REFERENCE)
        subprocess.run([args.ref_python, str(script), args.authors, str(data), str(out),
                        "1" if float32_softmax else "0", "1" if not keep_eps else "0", "1" if rms64 else "0"],
                       check=True)
        return torch.load(out)


@contextlib.contextmanager
def _rmsnorm_float64(on: bool):
    """For the check's 3rd mode only: transformers' LlamaRMSNorm and our DetachedRMSNorm without the float32 cast."""
    if not on:
        yield
        return
    from transformers.models.llama import modeling_llama
    from lrp_core import gradient_rules
    old_hf, old_rule = modeling_llama.LlamaRMSNorm.forward, gradient_rules.DetachedRMSNorm.forward

    def hf(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rule(self, fn, x, module=None):
        c = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon).detach()
        return module.weight.detach() * (x * c)
    modeling_llama.LlamaRMSNorm.forward, gradient_rules.DetachedRMSNorm.forward = hf, rule
    try:
        yield
    finally:
        modeling_llama.LlamaRMSNorm.forward, gradient_rules.DetachedRMSNorm.forward = old_hf, old_rule


def logit_gap(model, seqs: list, refs: list) -> float:
    """max relative difference of the explained logit: the two forwards agree before any rule is compared."""
    gap = 0.0
    for ids, ref in zip(seqs, refs):
        with torch.no_grad():
            gap = max(gap, abs(model(ids[None]).logits[0, -1].max().item() - ref["logit"]) / abs(ref["logit"]))
    return gap


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref-python", default="/work/lxt21-venv/bin/python")
    ap.add_argument("--authors", default="/work/palrp-ref/NLP", help="their NLP/ folder (git archive of NLP/lxt)")
    ap.add_argument("--write-fixture", default="tests/fixtures/pa_lrp/llama.pt")
    ap.add_argument("--keep-eps", action="store_true", help="their stabilisers as they are (+1e-6 / +1e-8)")
    args = ap.parse_args()
    seqs = rows()
    failed = False
    # 1. float64 throughout: their softmax cast removed; ours with sdpa (no float32 softmax in the model)
    # 2. as written: their softmax in float32; ours eager, where Hugging Face's softmax is float32 too
    # 3. float64 with RMSNorm in float64 on both sides (both patched for this run only): what is left in 1. is
    #    RMSNorm's float32 round-off, which their explicit rule passes on (R_in = R_out) and gradient × input
    #    reads at x (R_in = x·w·c versus w·fl32(x·c))
    for label, attn, f32, rms64 in (("float64", "sdpa", False, False), ("float64, RMSNorm in float64", "sdpa", False, True),
                                    ("float32 softmax (as written)", "eager", True, False)):
        model, cfg = make_llama(attn)
        refs = reference(args, model, cfg, seqs, float32_softmax=f32, keep_eps=args.keep_eps, rms64=rms64)
        with _rmsnorm_float64(rms64):
            worst = ours(model, seqs, refs)
            worst["logit"] = logit_gap(model, seqs, refs)
        print(label, json.dumps({k: f"{v:.2e}" for k, v in worst.items()}))
        if label == "float64, RMSNorm in float64":
            bad = {k: v for k, v in worst.items() if v > TOL}
            failed = bool(bad)
            print("FAIL" if bad else "OK", f"(float64 tolerance {TOL:g})", bad or "")
        if label == "float64":  # the fixture: the models as they are (the tests patch nothing)
            if args.write_fixture != "none" and not args.keep_eps:
                path = Path(args.write_fixture)
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save({"source": "YardenBakish/PE-AWARE-LRP NLP/lxt/models/llama_PE.py + NLP/lxt (their attnlrp "
                                      "composite), float64: softmax cast removed, stabilisers eps -> 0",
                            "config": cfg, "state_dict": model.state_dict(), "rows": seqs, "reference": refs}, path)
                print("wrote", path)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
