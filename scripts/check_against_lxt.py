#!/usr/bin/env python
"""Developer check: ``attnlrp`` / ``cp_lrp`` of lrp_core against the authors' library LXT 2.1.

NOT a test, and LXT is never a dependency of the package: it lives in its own
virtualenv (``/work/lxt21-venv``: LXT 2.1 with transformers 4.51.3, because LXT's
copy of ``modeling_bert`` needs transformers 4.x — also at LXT's git HEAD; see
scripts/lxt_findings.md for how it is built and for what LXT's efficient mode
does, rule by rule). The decoder cases are in scripts/check_decoders_against_lxt.py
(LXT git HEAD, ``/work/lxt-venv``), which runs this script with ``--with-encoders``.

Run from the project venv::

    .venv/bin/python scripts/check_against_lxt.py [--lxt-python /work/lxt21-venv/bin/python]
                                                  [--dtype float64|float32|both]
                                                  [--save-reference /work/lxt_reference | none]

What it does:

1. builds small seeded models here (a tiny BERT classifier in eager and in sdpa
   attention, a tiny timm ViT, the same ViT with every additive constant zeroed,
   and a randomly initialised timm ``deit_tiny_patch16_224``), randomises every
   parameter (LayerNorm gamma/beta included) and saves weights (safetensors,
   float64), configs and inputs to a work directory;
2. runs *itself* under the LXT python (``--reference-mode DIR``), once per
   (model family, method) because LXT's patches are global and irreversible:
   the same models are rebuilt there from the saved weights, patched with
   ``lxt.efficient.monkey_patch`` and explained one unpadded sample at a time,
   exactly as LXT's own examples do (BERT: ``inputs_embeds`` from the word
   embeddings, relevance ``inputs_embeds * grad`` summed over channels; ViT:
   pixels ``x * grad`` summed over colour channels);
3. back here, if ``lrp_core.METHODS`` has the methods, explains the whole
   (padded) batch with ``lrp_core.explain`` and prints max|diff|/max|ref| per
   model / dtype / method / field; exit status 1 when float64 > 1e-8 or
   float32 > 1e-4 (or a target differs, or a padding score is not 0).

LXT 2.1 ships an efficient-mode patch map for Hugging Face BERT (AttnLRP only)
and for *torchvision*'s ViT (CP-LRP in the attention), none for timm. The
reference for the other cases is built from LXT's own building blocks
(``lxt.efficient.patches`` / ``lxt.efficient.rules``) through
``monkey_patch(module, patch_map)``, as LXT documents for unsupported models,
and the timm ViT reference is cross-checked against the torchvision ViT with the
same weights (LXT's official map for CP-LRP).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

METHODS_CHECKED = ("attnlrp", "cp_lrp")
DTYPES = {"float64": torch.float64, "float32": torch.float32}
TOL = {"float64": 1e-8, "float32": 1e-4}
SEED = 20240611

BERT_CONFIG = dict(
    vocab_size=60,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=40,
    type_vocab_size=2,
    num_labels=3,
    pad_token_id=0,
    hidden_act="gelu",
    layer_norm_eps=1e-12,
)
BERT_LENGTHS = (12, 7, 9)  # right-padded batch of three texts of different lengths
VIT_TINY = dict(
    img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=3, num_classes=5, qkv_bias=True, mlp_ratio=4.0
)

# name -> how to build it (family, constructor arguments)
MODELS = {
    "bert_eager": dict(family="bert", attn="eager"),
    "bert_sdpa": dict(family="bert", attn="sdpa", same_weights_as="bert_eager"),
    "vit_tiny": dict(family="vit", timm_kwargs=VIT_TINY, batch=3),
    "vit_tiny_nobias": dict(
        family="vit", timm_kwargs=VIT_TINY, batch=3, zero_constants=True, same_weights_as="vit_tiny"
    ),
    "deit_tiny": dict(family="vit", timm_name="deit_tiny_patch16_224", batch=2),
}


# ----------------------------------------------------------------------------- model building (both venvs)


def build_bert(spec: dict, bert_cls=None):
    from transformers import BertConfig

    if bert_cls is None:
        from transformers import BertForSequenceClassification as bert_cls
    config = BertConfig(**BERT_CONFIG)
    config._attn_implementation = spec["attn"]
    model = bert_cls(config)
    return model.eval()


def build_timm_vit(spec: dict):
    import timm
    from timm.models.vision_transformer import VisionTransformer

    if "timm_name" in spec:
        model = timm.create_model(spec["timm_name"], pretrained=False)
    else:
        model = VisionTransformer(**spec["timm_kwargs"])
    return model.eval()


def build(name: str, bert_cls=None):
    spec = MODELS[name]
    return build_bert(spec, bert_cls) if spec["family"] == "bert" else build_timm_vit(spec)


def randomise_(model: torch.nn.Module, seed: int, zero_constants: bool = False) -> None:
    """Seeded non-trivial parameters: LayerNorm gamma/beta, biases, embeddings all random."""
    g = torch.Generator().manual_seed(seed)

    def rnd(p, std, mean=0.0):
        with torch.no_grad():
            p.copy_(mean + std * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))

    for _, mod in model.named_modules():
        if isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)):
            fan_in = mod.weight[0].numel()
            rnd(mod.weight, fan_in**-0.5)
            if mod.bias is not None:
                rnd(mod.bias, 0.1)
        elif isinstance(mod, torch.nn.LayerNorm):
            rnd(mod.weight, 0.2, 1.0)
            rnd(mod.bias, 0.1)
        elif isinstance(mod, torch.nn.Embedding):
            rnd(mod.weight, 1.0)
    for pname in ("cls_token", "pos_embed"):
        p = getattr(model, pname, None)
        if isinstance(p, torch.nn.Parameter):
            rnd(p, 0.3)
    if zero_constants:
        with torch.no_grad():
            for mod in model.modules():
                if isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.LayerNorm)) and mod.bias is not None:
                    mod.bias.zero_()
            for pname in ("cls_token", "pos_embed"):
                p = getattr(model, pname, None)
                if isinstance(p, torch.nn.Parameter):
                    p.zero_()


def make_inputs(name: str, seed: int) -> dict:
    spec = MODELS[name]
    g = torch.Generator().manual_seed(seed + 1)
    if spec["family"] == "bert":
        T = max(BERT_LENGTHS)
        ids = torch.zeros(len(BERT_LENGTHS), T, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, n in enumerate(BERT_LENGTHS):
            ids[i, :n] = torch.randint(5, BERT_CONFIG["vocab_size"], (n,), generator=g)
            ids[i, 0], ids[i, n - 1] = 1, 2  # [CLS] ... [SEP]
            mask[i, :n] = 1
        return {"input_ids": ids, "attention_mask": mask}
    size = 224 if "timm_name" in spec else spec["timm_kwargs"]["img_size"]
    return {"images": torch.randn(spec["batch"], 3, size, size, generator=g, dtype=torch.float64)}


def load_model(workdir: Path, name: str, dtype: torch.dtype, bert_cls=None):
    from safetensors.torch import load_file

    model = build(name, bert_cls)
    state = load_file(str(workdir / f"{name}.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids") and not k.endswith("token_type_ids")]
    if missing or unexpected:
        raise RuntimeError(f"{name}: missing {missing}, unexpected {unexpected}")
    return model.to(dtype).eval()


# ----------------------------------------------------------------------------- reference side (LXT venv)


class _SDPAShim:
    """Stands in for ``torch.nn.functional`` inside timm's attention module; only SDPA is routed through LXT."""

    def __init__(self, lxt_wrapped):
        self._wrapped = lxt_wrapped
        self.calls = 0

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name)

    def scaled_dot_product_attention(self, q, k, v, *args, **kwargs):
        self.calls += 1
        return self._wrapped(None, q, k, v, *args, **kwargs)


def _plain_sdpa(module, q, k, v, *args, **kwargs):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, *args, **kwargs)


def patch_vit_family(method: str) -> dict:
    """Patch torchvision's ViT (LXT's map; AttnLRP variant built from LXT's pieces) and timm's ViT."""
    from functools import partial

    import timm.layers.attention as timm_attention
    import timm.layers.norm as timm_norm
    from lxt.efficient import monkey_patch
    from lxt.efficient.models import vit_torch
    from lxt.efficient.patches import (
        cp_wrap_attention_forward,
        dropout_forward,
        layer_norm_forward,
        non_linear_forward,
        patch_method,
        wrap_attention_forward,
    )
    from torchvision.models import vision_transformer

    info = {}
    if method == "cp_lrp":
        monkey_patch(vision_transformer)  # LXT's default map for torchvision ViT: GELU, LayerNorm, CP attention
        info["torchvision_map"] = "lxt.efficient.models.vit_torch.cp_LRP (default map)"
        lxt_sdpa = cp_wrap_attention_forward(_plain_sdpa)
    else:
        wrapped_mha = wrap_attention_forward(lambda mod, q, k, v, *a, **kw: mod.original_forward(q, k, v, *a, **kw))

        def attnlrp_mha_forward(self, query, key, value, *args, **kwargs):
            return wrapped_mha(self, query, key, value, *args, **kwargs)

        tv_map = dict(vit_torch.cp_LRP)
        tv_map[vision_transformer.nn.MultiheadAttention] = partial(
            patch_method, attnlrp_mha_forward, keep_original=True
        )
        monkey_patch(vision_transformer, tv_map)
        info["torchvision_map"] = "vit_torch.cp_LRP with MultiheadAttention -> lxt wrap_attention_forward"
        lxt_sdpa = wrap_attention_forward(_plain_sdpa)

    shim = _SDPAShim(lxt_sdpa)

    def install_shim(module):
        module.F = shim
        return True

    timm_map = {
        timm_norm.LayerNorm: partial(patch_method, layer_norm_forward),  # timm's subclass overrides forward
        torch.nn.Dropout: partial(patch_method, dropout_forward),
        timm_attention: install_shim,
    }
    monkey_patch(timm_attention, timm_map)
    assert torch.nn.GELU.forward is non_linear_forward and torch.nn.LayerNorm.forward is layer_norm_forward
    info["timm_map"] = (
        "GELU: non_linear_forward (from torchvision map, global), timm LayerNorm: "
        "layer_norm_forward, Dropout: dropout_forward, timm Attention SDPA: "
        + ("cp_wrap_attention_forward" if method == "cp_lrp" else "wrap_attention_forward")
    )
    return {"shim": shim, "info": info}


def timm_to_torchvision(model) -> torch.nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer as TV

    D = model.embed_dim
    img = model.patch_embed.img_size[0]
    p = model.patch_embed.patch_size[0]
    tv = TV(
        image_size=img,
        patch_size=p,
        num_layers=len(model.blocks),
        num_heads=model.blocks[0].attn.num_heads,
        hidden_dim=D,
        mlp_dim=model.blocks[0].mlp.fc1.out_features,
        num_classes=model.num_classes,
    )
    sd = {
        "conv_proj.weight": model.patch_embed.proj.weight,
        "conv_proj.bias": model.patch_embed.proj.bias,
        "class_token": model.cls_token,
        "encoder.pos_embedding": model.pos_embed,
        "encoder.ln.weight": model.norm.weight,
        "encoder.ln.bias": model.norm.bias,
        "heads.head.weight": model.head.weight,
        "heads.head.bias": model.head.bias,
    }
    for i, blk in enumerate(model.blocks):
        pre = f"encoder.layers.encoder_layer_{i}."
        sd.update(
            {
                pre + "ln_1.weight": blk.norm1.weight,
                pre + "ln_1.bias": blk.norm1.bias,
                pre + "self_attention.in_proj_weight": blk.attn.qkv.weight,
                pre + "self_attention.in_proj_bias": blk.attn.qkv.bias,
                pre + "self_attention.out_proj.weight": blk.attn.proj.weight,
                pre + "self_attention.out_proj.bias": blk.attn.proj.bias,
                pre + "ln_2.weight": blk.norm2.weight,
                pre + "ln_2.bias": blk.norm2.bias,
                pre + "mlp.0.weight": blk.mlp.fc1.weight,
                pre + "mlp.0.bias": blk.mlp.fc1.bias,
                pre + "mlp.3.weight": blk.mlp.fc2.weight,
                pre + "mlp.3.bias": blk.mlp.fc2.bias,
            }
        )
    tv.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=True)
    return tv.to(model.pos_embed.dtype).eval()


def _capture_outputs(modules, store: list):
    """Forward hooks that keep (and retain the gradient of) each module's output hidden state."""

    def hook(_m, _inp, out):
        h = out[0] if isinstance(out, tuple) else out
        h.retain_grad()
        store.append(h)

    return [m.register_forward_hook(hook) for m in modules]


def explain_vit_sample(model, x, kind: str):
    """One image (1,3,H,W) with the LXT-patched model: target, logits, token / pixel / per-block relevance."""
    x = x.clone().requires_grad_(True)
    tok, blocks = [], []
    if kind == "timm":
        hooks = _capture_outputs([model.patch_embed], tok) + _capture_outputs(list(model.blocks), blocks)
    else:
        hooks = _capture_outputs([model.conv_proj], tok) + _capture_outputs(list(model.encoder.layers), blocks)
    try:
        logits = model(x)
        t = int(logits[0].argmax())
        logits[0, t].backward()
    finally:
        for h in hooks:
            h.remove()
    e = tok[0]
    scores = (e * e.grad).sum(-1) if kind == "timm" else (e * e.grad).sum(1).flatten(1)
    return dict(
        target=t,
        logits=logits[0].detach(),
        scores=scores[0].detach(),
        pixels=(x * x.grad).sum(1)[0].detach(),
        token_relevance=torch.stack([(h * h.grad).sum(-1)[0] for h in blocks]).detach(),
    )


def explain_bert_sample(model, ids):
    """One unpadded text (1,n), LXT's BERT recipe: inputs_embeds from the word embeddings, inputs_embeds * grad."""
    embeds = model.bert.get_input_embeddings()(ids).detach().requires_grad_(True)
    blocks = []
    hooks = _capture_outputs(list(model.bert.encoder.layer), blocks)
    try:
        logits = model(inputs_embeds=embeds).logits
        t = int(logits[0].argmax())
        logits[0, t].backward()
    finally:
        for h in hooks:
            h.remove()
    return dict(
        target=t,
        logits=logits[0].detach(),
        scores=(embeds * embeds.grad).sum(-1)[0].detach(),
        token_relevance=torch.stack([(h * h.grad).sum(-1)[0] for h in blocks]).detach(),
    )


def stack_samples(samples: list, T: int = None) -> dict:
    """Per-sample results -> batch tensors (text: zero-padded to T)."""
    out = {
        "target": torch.tensor([s["target"] for s in samples]),
        "logits": torch.stack([s["logits"] for s in samples]),
    }
    out["y"] = out["logits"].gather(1, out["target"][:, None])[:, 0]
    for key in ("scores", "token_relevance", "pixels"):
        if key not in samples[0]:
            continue
        if T is None:
            out[key] = torch.stack([s[key] for s in samples])
        else:
            like = samples[0][key]
            full = torch.zeros((len(samples),) + tuple(like.shape[:-1]) + (T,), dtype=like.dtype)
            for i, s in enumerate(samples):
                full[i, ..., : s[key].shape[-1]] = s[key]
            out[key] = full
    return out


def reference_mode(workdir: Path, family: str, method: str, dtypes: list) -> None:
    from importlib.metadata import version

    import lxt

    versions = {p: version(p) for p in ("lxt", "torch", "transformers", "timm", "torchvision", "zennit")}
    assert versions["lxt"] == "2.1", versions
    for p in lxt.__path__:
        assert "lxt-venv" in p or "site-packages" in p
    report = {"versions": versions, "family": family, "method": method, "checks": []}
    torch.manual_seed(SEED)

    if family == "bert":
        import lxt.efficient.models.bert as lxt_bert
        import transformers.models.bert.modeling_bert as modeling_bert
        from lxt.efficient import monkey_patch
        from lxt.efficient.rules import stop_gradient

        if method == "cp_lrp":
            # LXT 2.1 has no CP-LRP map for BERT. Same BERT patch minus the uniform rule (no /2 anywhere),
            # plus LXT's CP-LRP attention rule: query and key detached (stop_gradient) right after their Linears.
            lxt_bert.divide_gradient = lambda tensor, factor=2: tensor
        monkey_patch(modeling_bert)  # LXT's default map for BERT (attnLRP): replaces the modeling_bert module
        bert_cls = modeling_bert.BertForSequenceClassification
        assert bert_cls.__module__ == "lxt.efficient.models.bert", bert_cls.__module__
        report["patch"] = (
            "lxt.efficient.models.bert.attnLRP"
            if method == "attnlrp"
            else "lxt.efficient.models.bert.attnLRP with divide_gradient -> identity and "
            "stop_gradient on the query/key Linear outputs"
        )
        names = [n for n, s in MODELS.items() if s["family"] == "bert"]
        for name in names:
            inputs = torch.load(workdir / f"{name}__inputs.pt")
            for dn in dtypes:
                model = load_model(workdir, name, DTYPES[dn], bert_cls)
                for prm in model.parameters():
                    prm.requires_grad_(False)
                sa_cls = type(model.bert.encoder.layer[0].attention.self).__name__
                assert sa_cls == ("BertSdpaSelfAttention" if MODELS[name]["attn"] == "sdpa" else "BertSelfAttention")
                if method == "cp_lrp":
                    for layer in model.bert.encoder.layer:
                        for lin in (layer.attention.self.query, layer.attention.self.key):
                            lin.register_forward_hook(lambda _m, _i, out: stop_gradient(out))
                samples = []
                for i, n in enumerate(inputs["attention_mask"].sum(1).tolist()):
                    samples.append(explain_bert_sample(model, inputs["input_ids"][i : i + 1, :n]))
                res = stack_samples(samples, T=inputs["input_ids"].shape[1])
                res["lengths"] = inputs["attention_mask"].sum(1)
                res["meta"] = dict(report, self_attention=sa_cls)
                torch.save(res, workdir / f"ref__{name}__{method}__{dn}.pt")
                report["checks"].append(
                    dict(
                        model=name,
                        dtype=dn,
                        kind="sum(scores) vs y_t (biases present)",
                        sum=res["scores"].sum(1).tolist(),
                        y=res["y"].tolist(),
                    )
                )
    else:
        from torchvision.models import vision_transformer  # noqa: F401  (patched below)

        patched = patch_vit_family(method)
        report["patch"] = patched["info"]
        shim = patched["shim"]
        names = [n for n, s in MODELS.items() if s["family"] == "vit"]
        for name in names:
            images = torch.load(workdir / f"{name}__inputs.pt")["images"]
            for dn in dtypes:
                model = load_model(workdir, name, DTYPES[dn])
                for prm in model.parameters():
                    prm.requires_grad_(False)
                assert all(b.attn.fused_attn for b in model.blocks), "timm must use its SDPA path here"
                assert type(model.blocks[0].mlp.act) is torch.nn.GELU
                calls0 = shim.calls
                x = images.to(DTYPES[dn])
                res = stack_samples([explain_vit_sample(model, x[i : i + 1], "timm") for i in range(len(x))])
                assert shim.calls - calls0 == len(model.blocks) * len(x), "LXT attention rule not applied"
                res["meta"] = report
                torch.save(res, workdir / f"ref__{name}__{method}__{dn}.pt")
                # cross-check: the torchvision ViT with the same weights through LXT's torchvision patch
                tv = timm_to_torchvision(model)
                for prm in tv.parameters():
                    prm.requires_grad_(False)
                tvr = stack_samples([explain_vit_sample(tv, x[i : i + 1], "torchvision") for i in range(len(x))])
                cross = {k: rel(res[k], tvr[k]) for k in ("logits", "scores", "pixels", "token_relevance")}
                cross["target_equal"] = bool(torch.equal(res["target"], tvr["target"]))
                total = res["pixels"].sum((1, 2))
                report["checks"].append(
                    dict(
                        model=name,
                        dtype=dn,
                        kind="conservation sum(pixels) vs y_t",
                        sum=total.tolist(),
                        y=res["y"].tolist(),
                        rel_gap=((total - res["y"]).abs() / res["y"].abs()).max().item(),
                        torchvision_cross_check=cross,
                    )
                )
    with open(workdir / f"report__{family}__{method}.json", "w") as f:
        json.dump(report, f, indent=1)


# ----------------------------------------------------------------------------- project side


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.detach().double().cpu(), ref.detach().double().cpu()
    if a.shape != ref.shape:
        return float("nan")
    scale = ref.abs().max().item()
    return (a - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def prepare_workdir(workdir: Path) -> None:
    from safetensors.torch import save_file

    order = list(MODELS)
    for name in MODELS:
        k = order.index(MODELS[name].get("same_weights_as", name))  # shared seed -> identical weights/inputs
        torch.manual_seed(SEED + k)
        model = build(name).double()
        randomise_(model, SEED + 100 * k, zero_constants=MODELS[name].get("zero_constants", False))
        save_file(
            {
                n: t.detach().contiguous()
                for n, t in model.state_dict().items()
                if not n.endswith("position_ids") and not (n.endswith("token_type_ids") and "embeddings" in n)
            },
            str(workdir / f"{name}.safetensors"),
        )
        torch.save(make_inputs(name, SEED + 100 * k), workdir / f"{name}__inputs.pt")
    manifest = dict(
        seed=SEED,
        bert_config=BERT_CONFIG,
        bert_lengths=BERT_LENGTHS,
        vit_tiny=VIT_TINY,
        models={n: {k: v for k, v in s.items()} for n, s in MODELS.items()},
        files=dict(
            weights="<model>.safetensors (float64; cast for float32)",
            inputs="<model>__inputs.pt (BERT: input_ids/attention_mask right-padded; ViT: images float64)",
            reference="ref__<model>__<method>__<dtype>.pt: target (B,), logits (B,C), y (B,), "
            "scores (B,T; BERT zero-padded), token_relevance (B,L,N), pixels (B,H,W) "
            "for ViTs, meta",
        ),
        built_by="scripts/check_against_lxt.py in the project venv; references by LXT 2.1",
    )
    (workdir / "manifest.json").write_text(json.dumps(manifest, indent=1))


def run_reference(workdir: Path, lxt_python: str, dtypes: list) -> None:
    for family in ("bert", "vit"):
        for method in METHODS_CHECKED:
            cmd = [
                lxt_python,
                os.path.abspath(__file__),
                "--reference-mode",
                str(workdir),
                "--family",
                family,
                "--method",
                method,
                "--dtype",
                ",".join(dtypes),
            ]
            print(f"[reference] LXT: {family} {method} ...", flush=True)
            env = dict(os.environ, PYTHONWARNINGS="ignore")
            subprocess.run(cmd, check=True, cwd=str(workdir), env=env)


def print_reference_checks(workdir: Path, dtypes: list) -> bool:
    ok = True
    print("\nReference self-checks (LXT side):")
    for method in METHODS_CHECKED:
        for dn in dtypes:
            a = torch.load(workdir / f"ref__bert_eager__{method}__{dn}.pt")
            b = torch.load(workdir / f"ref__bert_sdpa__{method}__{dn}.pt")
            worst = max(rel(b[k], a[k]) for k in ("logits", "scores", "token_relevance"))
            print(f"  bert eager vs sdpa (same weights) {method:8s} {dn:8s} max rel diff {worst:.2e}")
            if dn == "float64" and worst > 1e-8:
                ok = False
    for family in ("bert", "vit"):
        for method in METHODS_CHECKED:
            rep = json.loads((workdir / f"report__{family}__{method}.json").read_text())
            for c in rep["checks"]:
                if "rel_gap" in c:
                    cross = c["torchvision_cross_check"]
                    worst = max(v for k, v in cross.items() if k != "target_equal")
                    line = (
                        f"  {c['model']:16s} {method:8s} {c['dtype']:8s} |sum(pixels)-y|/|y| = "
                        f"{c['rel_gap']:.2e}   timm vs torchvision(LXT map): {worst:.2e}"
                        f"{'' if cross['target_equal'] else '  TARGET DIFFERS'}"
                    )
                    print(line)
                    if c["dtype"] == "float64" and worst > 1e-8:
                        ok = False
                    if (
                        c["model"] == "vit_tiny_nobias"
                        and method == "cp_lrp"
                        and c["dtype"] == "float64"
                        and c["rel_gap"] > 1e-8
                    ):
                        print("  !! CP-LRP does not conserve on the bias-free ViT")
                        ok = False
                else:
                    gaps = [abs(s - y) / abs(y) for s, y in zip(c["sum"], c["y"])]
                    print(
                        f"  {c['model']:16s} {method:8s} {c['dtype']:8s} |sum(scores)-y|/|y| = "
                        f"{max(gaps):.2e} (not conserved: biases, position/token-type embeddings)"
                    )
    return ok


def compare(workdir: Path, dtypes: list) -> bool:
    import lrp_core

    missing = [m for m in METHODS_CHECKED if m not in lrp_core.METHODS]
    if missing:
        print(f"\nlrp_core.METHODS has no {', '.join(missing)}: comparison skipped. Reference outputs:")
        for f in sorted(workdir.glob("ref__*.pt")):
            r = torch.load(f)
            parts = [
                f"{k}{tuple(r[k].shape)} sum={r[k].double().sum().item():+.6e}"
                for k in ("scores", "pixels", "token_relevance")
                if k in r
            ]
            print(f"  {f.name:42s} target={r['target'].tolist()} " + "  ".join(parts))
        return True
    ok = True
    rows = []
    for name, spec in MODELS.items():
        inputs = torch.load(workdir / f"{name}__inputs.pt")
        for dn in dtypes:
            model = load_model(workdir, name, DTYPES[dn])
            if spec["family"] == "vit":
                x = inputs["images"].to(DTYPES[dn])
            else:
                x = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
            for method in METHODS_CHECKED:
                ref = torch.load(workdir / f"ref__{name}__{method}__{dn}.pt")
                exp = lrp_core.explain(model, x, method=method, target=ref["target"].tolist())
                same_target = torch.equal(exp.target.cpu(), ref["target"])
                fields = {"logits": (exp.logits, ref["logits"]), "scores": (exp.scores, ref["scores"])}
                if "pixels" in ref:
                    fields["pixels"] = (exp.pixels, ref["pixels"])
                if getattr(exp, "token_relevance", None) is not None:
                    fields["token_relevance"] = (exp.token_relevance, ref["token_relevance"])
                for field, (got, want) in fields.items():
                    if got is None:
                        rows.append((name, dn, method, field, "missing", False))
                        ok = False
                        continue
                    if tuple(got.shape) != tuple(want.shape):
                        rows.append(
                            (name, dn, method, field, f"shape {tuple(got.shape)} != {tuple(want.shape)}", False)
                        )
                        ok = False
                        continue
                    r = rel(got, want)
                    good = r <= TOL[dn]
                    rows.append((name, dn, method, field, f"{r:.3e}", good))
                    ok &= good
                if spec["family"] == "bert":
                    pad = inputs["attention_mask"] == 0
                    pad_max = exp.scores.detach().cpu()[pad].abs().max().item() if pad.any() else 0.0
                    rows.append((name, dn, method, "padding |score|", f"{pad_max:.1e}", pad_max == 0.0))
                    ok &= pad_max == 0.0
                if not same_target:
                    rows.append(
                        (name, dn, method, "target", f"{exp.target.tolist()} != {ref['target'].tolist()}", False)
                    )
                    ok = False
    print(f"\n{'model':16s} {'dtype':8s} {'method':8s} {'field':16s} {'max|d|/max|ref|':>18s}")
    for name, dn, method, field, val, good in rows:
        print(f"{name:16s} {dn:8s} {method:8s} {field:16s} {val:>18s}  {'ok' if good else 'FAIL'}")
    print(f"(limits: float64 {TOL['float64']:g}, float32 {TOL['float32']:g})")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lxt-python", default="/work/lxt21-venv/bin/python")
    ap.add_argument("--dtype", default="both", help="float64, float32 or both (reference mode: comma list)")
    ap.add_argument(
        "--save-reference",
        default="/work/lxt_reference",
        help="copy weights, inputs and LXT outputs here ('none' to skip)",
    )
    ap.add_argument("--reference-mode", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--family", choices=("bert", "vit"), help=argparse.SUPPRESS)
    ap.add_argument("--method", choices=METHODS_CHECKED, help=argparse.SUPPRESS)
    args = ap.parse_args()
    dtypes = ["float64", "float32"] if args.dtype == "both" else args.dtype.split(",")
    for d in dtypes:
        if d not in DTYPES:
            ap.error(f"unknown dtype {d}")

    if args.reference_mode:
        reference_mode(Path(args.reference_mode), args.family, args.method, dtypes)
        return 0

    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo))
    with tempfile.TemporaryDirectory(prefix="lxt_check_") as tmp:
        workdir = Path(tmp)
        prepare_workdir(workdir)
        run_reference(workdir, args.lxt_python, dtypes)
        ref_ok = print_reference_checks(workdir, dtypes)
        if args.save_reference.lower() != "none":
            dest = Path(args.save_reference)
            dest.mkdir(parents=True, exist_ok=True)
            for f in workdir.iterdir():
                shutil.copy2(f, dest / f.name)
            print(f"\nreference files copied to {dest}")
        ok = compare(workdir, dtypes)
    if not ref_ok:
        print("reference self-checks FAILED")
    return 0 if (ok and ref_ok) else 1


if __name__ == "__main__":
    sys.exit(main())
