#!/usr/bin/env python
"""Developer check: ``attnlrp`` / ``cp_lrp`` on decoder LMs against LXT at git HEAD; writes the test fixtures.

NOT a test, and LXT is never a dependency of the package or its tests. LXT lives in its own
virtualenv (``/work/lxt-venv``; recipe, commit and what LXT's decoder patches do, rule by rule:
scripts/lxt_findings.md, section "Decoders (LXT git HEAD)"). The encoder cases (BERT, ViT) stay in
the sibling ``scripts/check_against_lxt.py``; this script shares its helpers and runs it with
``--with-encoders``.

Run from the project venv::

    .venv/bin/python scripts/check_decoders_against_lxt.py [--lxt-python /work/lxt-venv/bin/python]
        [--families llama,qwen2,qwen3,gemma3,gpt2,qwen3_moe] [--methods attnlrp,cp_lrp]
        [--write-fixtures tests/fixtures/lxt/decoders | none] [--with-encoders]
    .venv/bin/python scripts/check_decoders_against_lxt.py --compare-only   # committed fixtures, no LXT

What it does:

1. here: builds a tiny seeded model per family (hidden 32, 2 blocks, 4 query / 2 key-value heads,
   vocabulary 64, RoPE; Qwen2 with q/k/v biases, Qwen3 with q/k norms, Gemma 3 text with its four
   norms per block, √D embedding scale, ``query_pre_attn_scalar`` ≠ head_dim and one sliding (window
   4) and one global layer; GPT-2; Qwen3-MoE with 4 experts, top-2, renormalised — attnlrp only: LXT's
   Qwen3-MoE module has no CP-LRP map), draws EVERY parameter at random (norm weights included) and
   saves config, float64 state dict and three unpadded sequences (5, 9, 12 tokens);
2. under the LXT python, once per (family, method) because LXT's patches are global: rebuilds the
   model, patches ``transformers.models.<family>.modeling_<family>`` with LXT's own map
   (``lxt.efficient.monkey_patch(module, lxt.efficient.models.<family>.<attnLRP|cp_LRP>)``) and
   explains each sequence alone exactly as LXT's examples do (``e = get_input_embeddings()(ids)``,
   ``model(inputs_embeds=e)``, backward of the max logit at the last position, relevance
   ``(e * e.grad).sum(-1)``), in float64 and float32, eager attention (the fixture) and sdpa (kept
   in the fixture under ``"sdpa"`` to compare); before patching it also records the plain
   gradient × input (float64, eager) to show that the patch changed the backward;
3. here: self-checks (model rebuilt from the fixture reproduces LXT's target logits; eager vs sdpa;
   Σ scores vs the logit where the model has no additive constant), writes the fixtures, and — if
   ``lrp_core`` can explain decoders — compares ``lrp_core.explain`` on the rows padded left and
   right with LXT (float64 ≤ 1e-8, float32 ≤ 1e-4 of max|ref|). Exit status 1 on a failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from check_against_lxt import DTYPES, METHODS_CHECKED, TOL, rel  # noqa: E402  (shared helpers)
from lxt_decoders import build_model, methods_of, pad  # noqa: E402  (the tests' loader: both sides build alike)

SEED = 20261124
FAMILIES = ("llama", "qwen2", "qwen3", "gemma3", "gpt2", "qwen3_moe")
LENGTHS = (5, 9, 12)  # three unpadded rows of different lengths
VOCAB = 64
FIRST_ID = 3  # sequences use ids >= 3 (0, 1, 2 are pad / bos / eos in the configs)
LXT_MAP_NAME = {"attnlrp": "attnLRP", "cp_lrp": "cp_LRP"}
MODEL_CLASS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
# families without any additive constant (no biases, no LayerNorm beta, no position embedding):
# CP-LRP's backward is then linear in the embeddings and sum(scores) = target logit.
BIAS_FREE = ("llama", "qwen3", "gemma3")

_RMS = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
CONFIGS = {
    "llama": _RMS,
    "qwen2": _RMS,  # Qwen2 attention always has q/k/v biases
    "qwen3": dict(_RMS, head_dim=8),  # per-head q_norm / k_norm
    "gemma3": dict(
        _RMS,
        head_dim=8,
        query_pre_attn_scalar=12,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        hidden_activation="gelu_pytorch_tanh",
    ),
    "gpt2": dict(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_inner=48, n_positions=64, bos_token_id=1, eos_token_id=2
    ),
    # 4 experts, top-2, renormalised; per-head q/k norms (LXT: attnLRP only)
    "qwen3_moe": dict(
        _RMS, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True
    ),
}


# ----------------------------------------------------------------------------- model building (both venvs)


def config_class(family: str):
    import transformers

    return {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "gemma3": transformers.Gemma3TextConfig,
        "gpt2": transformers.GPT2Config,
        "qwen3_moe": transformers.Qwen3MoeConfig,
    }[family]


def randomise_(model: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn at random (norm weights included); raises if one was left out."""
    from transformers.pytorch_utils import Conv1D

    g = torch.Generator().manual_seed(seed)
    done: set[int] = set()

    def rnd(p: torch.nn.Parameter, std: float, mean: float = 0.0) -> None:
        with torch.no_grad():
            p.copy_(mean + std * torch.randn(p.shape, generator=g, dtype=torch.float64))
        done.add(id(p))

    for name, mod in model.named_modules():
        own = dict(mod.named_parameters(recurse=False))
        if isinstance(mod, (torch.nn.Linear, Conv1D)):
            fan_in = mod.weight.shape[1] if isinstance(mod, torch.nn.Linear) else mod.weight.shape[0]
            rnd(mod.weight, fan_in**-0.5)
            if mod.bias is not None:
                rnd(mod.bias, 0.1)
        elif isinstance(mod, torch.nn.Embedding):
            rnd(mod.weight, 0.3 if name.endswith("wpe") else 1.0)
        elif isinstance(mod, torch.nn.LayerNorm):
            rnd(mod.weight, 0.2, 1.0)
            rnd(mod.bias, 0.1)
        elif type(mod).__name__.endswith("RMSNorm"):
            # Gemma multiplies by (1 + w) (w initialised at 0); the others by w (initialised at 1)
            rnd(mod.weight, 0.2, 0.0 if "Gemma" in type(mod).__name__ else 1.0)
        elif type(mod).__name__.endswith("Experts"):  # stacked (E, 2F, D) and (E, D, F) expert weights
            rnd(mod.gate_up_proj, mod.gate_up_proj.shape[-1] ** -0.5)
            rnd(mod.down_proj, mod.down_proj.shape[-1] ** -0.5)
        elif type(mod).__name__.endswith("TopKRouter"):  # the router's (E, D) weight (initialised at 0)
            rnd(mod.weight, mod.weight.shape[-1] ** -0.5)
        elif own:
            raise RuntimeError(f"randomise_: no rule for {name} ({type(mod).__name__})")
    left = [n for n, p in model.named_parameters() if id(p) not in done]
    if left:
        raise RuntimeError(f"randomise_: parameters left at their init: {left}")


def make_family(family: str, seed: int) -> dict:
    """Config, float64 state dict and unpadded sequences of one family (project side)."""
    cfg = config_class(family)(**CONFIGS[family])
    cfg._attn_implementation = "eager"
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, MODEL_CLASS[family])(cfg).double()
    randomise_(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    sequences = [torch.randint(FIRST_ID, VOCAB, (n,), generator=g) for n in LENGTHS]
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return dict(
        family=family,
        model_class=MODEL_CLASS[family],
        config=model.config.to_dict(),
        state_dict=state,
        sequences=sequences,
    )


# ----------------------------------------------------------------------------- reference side (LXT venv)


def explain_sequence(model: torch.nn.Module, ids: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
    """LXT's recipe for one unpadded sequence (T,): (target, target logit, scores (T,)), in the model dtype."""
    e = model.get_input_embeddings()(ids[None]).detach().requires_grad_(True)
    logits = model(inputs_embeds=e, use_cache=False).logits
    y, t = logits[0, -1].max(-1)
    y.backward()
    return int(t), y.detach(), (e * e.grad).sum(-1)[0].detach()


def explain_rows(model: torch.nn.Module, sequences: list) -> dict:
    for p in model.parameters():
        p.requires_grad_(False)
    rows = [explain_sequence(model, s) for s in sequences]
    return dict(
        targets=torch.tensor([r[0] for r in rows]),
        logits=torch.stack([r[1] for r in rows]),
        scores=[r[2] for r in rows],
    )


def lxt_commit() -> str:
    """The LXT commit the reference venv was installed from (written by the recipe in lxt_findings.md)."""
    f = Path(sys.prefix) / "LXT_COMMIT"
    return f.read_text().strip() if f.exists() else "unknown"


def patched_names(modeling, family: str) -> dict:
    """Which functions/classes now come from LXT (proof that the map was applied)."""
    mlp = {
        "llama": "LlamaMLP",
        "qwen2": "Qwen2MLP",
        "qwen3": "Qwen3MLP",
        "gemma3": "Gemma3MLP",
        "gpt2": "GPT2MLP",
        "qwen3_moe": "Qwen3MoeExperts",
    }[family]
    norm = {
        "gpt2": ("LayerNorm", "forward"),
        "gemma3": ("Gemma3RMSNorm", "_norm"),
        "llama": ("LlamaRMSNorm", "forward"),
        "qwen2": ("Qwen2RMSNorm", "forward"),
        "qwen3": ("Qwen3RMSNorm", "forward"),
        "qwen3_moe": ("Qwen3MoeRMSNorm", "forward"),
    }[family]
    norm_cls = torch.nn.LayerNorm if family == "gpt2" else getattr(modeling, norm[0])
    return {
        "eager_attention_forward": modeling.eager_attention_forward.__module__,
        "ALL_ATTENTION_FUNCTIONS[sdpa]": modeling.ALL_ATTENTION_FUNCTIONS["sdpa"].__module__,
        f"{mlp}.forward": getattr(modeling, mlp).forward.__module__,
        f"{norm[0]}.{norm[1]}": getattr(norm_cls, norm[1]).__module__,
        "Dropout.forward": torch.nn.Dropout.forward.__module__,
    }


def reference_mode(workdir: Path, family: str, method: str, dtypes: list) -> None:
    """Runs in the LXT venv, one process per (family, method): writes the fixtures of that pair."""
    import importlib

    import lxt
    import transformers
    from lxt.efficient import monkey_patch

    spec = torch.load(workdir / f"{family}__model.pt")
    assert all("lxt-venv" in p for p in lxt.__path__), lxt.__path__
    plain = None
    if "float64" in dtypes:  # plain gradient x input, before the patch (only to show the patch acts)
        plain = explain_rows(
            build_model(spec["model_class"], spec["config"], spec["state_dict"], torch.float64), spec["sequences"]
        )
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    lxt_family = importlib.import_module(f"lxt.efficient.models.{family}")
    monkey_patch(modeling, getattr(lxt_family, LXT_MAP_NAME[method]))
    patched = patched_names(modeling, family)
    assert all(v.startswith("lxt.") for v in patched.values()), patched
    for dn in dtypes:
        out = {}
        for attn in ("eager", "sdpa"):
            model = build_model(spec["model_class"], spec["config"], spec["state_dict"], DTYPES[dn], attn)
            out[attn] = explain_rows(model, spec["sequences"])
        fixture = dict(
            family=family,
            model_class=spec["model_class"],
            config=spec["config"],
            state_dict=spec["state_dict"],
            sequences=spec["sequences"],
            targets=out["eager"]["targets"],
            logits=out["eager"]["logits"],
            scores=out["eager"]["scores"],
            dtype=dn,
            method=method,
            lxt_commit=lxt_commit(),
            transformers_version=transformers.__version__,
            torch_version=str(torch.__version__),
            attn_implementation="eager",
            sdpa=out["sdpa"],
            lxt_map=f"lxt.efficient.models.{family}.{LXT_MAP_NAME[method]}",
            lxt_patched=patched,
        )
        if plain is not None and dn == "float64":
            fixture["gradient_x_input"] = plain["scores"]
        torch.save(fixture, workdir / f"{family}__{method}__{dn}.pt")


# ----------------------------------------------------------------------------- project side


def row_rel(got: list, ref: list) -> float:
    """max over rows of max|got - ref| / max|ref| (each row against its own scale)."""
    return max(rel(a, b) for a, b in zip(got, ref))


def self_checks(workdir: Path, families: list, methods: list, dtypes: list) -> bool:
    """LXT side facts: rebuilt logits, eager vs sdpa, conservation where there is no additive constant."""
    ok = True
    print("\nReference self-checks (LXT git HEAD):")
    for family in families:
        for method in [m for m in methods if m in methods_of(family)]:
            for dn in dtypes:
                fx = torch.load(workdir / f"{family}__{method}__{dn}.pt")
                model = build_model(fx["model_class"], fx["config"], fx["state_dict"], DTYPES[dn])
                with torch.no_grad():
                    y = torch.stack([model(s[None]).logits[0, -1, t] for s, t in zip(fx["sequences"], fx["targets"])])
                d_logit = ((y - fx["logits"]).abs() / fx["logits"].abs()).max().item()
                d_sdpa = row_rel(fx["sdpa"]["scores"], fx["scores"])
                same_t = torch.equal(fx["sdpa"]["targets"], fx["targets"])
                sums = torch.stack([s.sum() for s in fx["scores"]])
                gap = ((sums - fx["logits"]).abs() / fx["logits"].abs()).max().item()
                line = (
                    f"  {family:7s} {method:8s} {dn:8s} rebuilt logit {d_logit:.1e}  eager vs sdpa {d_sdpa:.1e}"
                    f"{'' if same_t else ' (TARGET DIFFERS)'}  |Σscores−y|/|y| {gap:.1e}"
                )
                if "gradient_x_input" in fx:
                    line += f"  vs plain grad×input {row_rel(fx['scores'], fx['gradient_x_input']):.1e}"
                print(line)
                ok &= d_logit <= TOL[dn] and same_t
                if method == "cp_lrp" and family in BIAS_FREE and dn == "float64" and gap > 1e-5:
                    print("  !! CP-LRP does not conserve on a model without additive constants")
                    ok = False
    return ok


def engine_rows(model: torch.nn.Module, sequences: list, method: str, batching: str) -> tuple:
    """lrp_core.explain on the rows padded left / right (one batch) or each alone: (targets, scores, pad max)."""
    import lrp_core

    batches = (
        [pad(sequences, batching, pad_id=0)]
        if batching != "single"
        else [pad([s], "right", pad_id=0) for s in sequences]
    )
    targets, scores, pad_max = [], [], 0.0
    for batch in batches:
        exp = lrp_core.explain(model, batch, method=method)
        mask = batch["attention_mask"].bool()
        s = exp.scores.detach().cpu()
        scores += [s[i][mask[i]] for i in range(len(s))]
        targets += exp.target.cpu().tolist()
        if (~mask).any():
            pad_max = max(pad_max, s[~mask].abs().max().item())
    return torch.tensor(targets), scores, pad_max


def compare(workdir: Path, families: list, methods: list, dtypes: list) -> bool:
    """lrp_core.explain (rows padded left, right, alone; eager and sdpa) vs LXT's per-row scores."""
    from lxt_decoders import reference

    from lrp_core.errors import LRPError

    ok = True
    print(f"\n{'family':7s} {'method':8s} {'dtype':8s} {'attn':6s} {'batch':6s} {'max|d|/max|ref| (per row)':>26s}")
    for family in families:
        for method in [m for m in methods if m in methods_of(family)]:
            for dn in dtypes:
                fx = torch.load(workdir / f"{family}__{method}__{dn}.pt")
                for attn in ("eager", "sdpa"):
                    model = build_model(fx["model_class"], fx["config"], fx["state_dict"], DTYPES[dn], attn)
                    ref = reference(fx, attn)
                    for batching in ("left", "right", "single"):
                        head = f"{family:7s} {method:8s} {dn:8s} {attn:6s} {batching:6s}"
                        try:
                            targets, scores, pad_max = engine_rows(model, fx["sequences"], method, batching)
                        except (LRPError, NotImplementedError) as err:
                            print(f"{head} engine cannot explain it: {type(err).__name__}: {str(err)[:80]}")
                            ok = False
                            break
                        r = row_rel(scores, ref["scores"])
                        same_t = torch.equal(targets, ref["targets"])
                        good = r <= TOL[dn] and pad_max == 0.0 and same_t
                        print(
                            f"{head} {r:26.3e}  padding {pad_max:.1e}"
                            f"{'' if same_t else '  TARGET DIFFERS'}  {'ok' if good else 'FAIL'}"
                        )
                        ok &= good
    print(f"(limits: float64 {TOL['float64']:g}, float32 {TOL['float32']:g})")
    return ok


def run_reference(workdir: Path, lxt_python: str, families: list, methods: list, dtypes: list) -> None:
    for family in families:
        for method in [m for m in methods if m in methods_of(family)]:
            print(f"[reference] LXT: {family} {method} ...", flush=True)
            cmd = [
                lxt_python,
                os.path.abspath(__file__),
                "--reference-mode",
                str(workdir),
                "--families",
                family,
                "--methods",
                method,
                "--dtype",
                ",".join(dtypes),
            ]
            env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
            env.pop("PYTHONPATH", None)  # the LXT process must not see the project's lrp_core
            subprocess.run(cmd, check=True, cwd=str(workdir), env=env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lxt-python", default="/work/lxt-venv/bin/python")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--methods", default=",".join(METHODS_CHECKED))
    ap.add_argument("--dtype", default="both", help="float64, float32 or both (comma list)")
    ap.add_argument(
        "--write-fixtures",
        default=str(Path(__file__).resolve().parents[1] / "tests/fixtures/lxt/decoders"),
        help="where the fixtures go ('none': do not write)",
    )
    ap.add_argument(
        "--compare-only",
        action="store_true",
        help="no LXT run: self-checks and engine comparison on the committed fixtures",
    )
    ap.add_argument("--with-encoders", action="store_true", help="also run scripts/check_against_lxt.py")
    ap.add_argument(
        "--lxt21-python",
        default="/work/lxt21-venv/bin/python",
        help="LXT 2.1 + transformers 4.51.3 venv for the encoder cases (LXT's BERT needs 4.x)",
    )
    ap.add_argument("--reference-mode", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    dtypes = ["float64", "float32"] if args.dtype == "both" else args.dtype.split(",")
    families, methods = args.families.split(","), args.methods.split(",")
    for name, given, known in (
        ("dtype", dtypes, DTYPES),
        ("family", families, FAMILIES),
        ("method", methods, METHODS_CHECKED),
    ):
        for v in given:
            if v not in known:
                ap.error(f"unknown {name} {v!r}; accepted: {', '.join(known)}")
    torch.set_num_threads(1)
    if args.reference_mode:
        reference_mode(Path(args.reference_mode), families[0], methods[0], dtypes)
        return 0

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.compare_only:
        fixtures = Path(args.write_fixtures)
        ref_ok = self_checks(fixtures, families, methods, dtypes)
        ok = compare(fixtures, families, methods, dtypes)
        return 0 if (ok and ref_ok) else 1
    with tempfile.TemporaryDirectory(prefix="lxt_decoders_") as tmp:
        workdir = Path(tmp)
        for k, family in enumerate(FAMILIES):
            if family in families:
                torch.save(make_family(family, SEED + 100 * k), workdir / f"{family}__model.pt")
        run_reference(workdir, args.lxt_python, families, methods, dtypes)
        ref_ok = self_checks(workdir, families, methods, dtypes)
        if args.write_fixtures.lower() != "none":
            dest = Path(args.write_fixtures)
            dest.mkdir(parents=True, exist_ok=True)
            for f in sorted(workdir.glob("*__*__*.pt")):
                shutil.copy2(f, dest / f.name)
            print(f"\nfixtures written to {dest}")
        ok = compare(workdir, families, methods, dtypes)
    enc_ok = True
    if args.with_encoders:
        enc = [
            sys.executable,
            str(Path(__file__).with_name("check_against_lxt.py")),
            "--lxt-python",
            args.lxt21_python,
            "--save-reference",
            "none",
        ]
        enc_ok = subprocess.run(enc).returncode == 0
    if not ref_ok:
        print("reference self-checks FAILED")
    return 0 if (ok and ref_ok and enc_ok) else 1


if __name__ == "__main__":
    sys.exit(main())
