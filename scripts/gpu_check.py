"""Developer check on a CUDA machine: every method the engine runs on each family, on the GPU against the same call
on the CPU, both in float64, for tiny random models (built in milliseconds, every parameter random).

    PYTHONPATH=. python scripts/gpu_check.py                   # cuda vs cpu
    PYTHONPATH=. python scripts/gpu_check.py --device cpu      # cpu vs cpu (a dry run of the machinery: all 0)

Families: decoders (Llama eager and sdpa, Qwen2 with a sliding layer, Qwen3-MoE, Mixtral, Gemma 2, Gemma 3,
GPT-OSS, Phi-3, GPT-2, GPT-NeoX; a left-padded batch of two rows), ModernBERT (right padded), timm EVA-02 and Swin,
the vision-language models (LLaVA with a CLIP and with a DINOv2 tower, SmolVLM / Idefics3, Qwen2.5-VL, Qwen2-VL,
Gemma 3 with images, PaliGemma 2), plus ``explain_generation`` on the Llama and on the LLaVA (three greedy steps).
The methods are those the family's adapter does not refuse (``adapter.refused_methods``); the Captum baselines run
with few steps / samples (``tests/decoders.py::QUICK``). Prints max|Δ| / max|CPU| per family × method (the map and,
where the method reaches them, the pixels) and the worst of them. SmoothGrad and KernelSHAP draw their noise /
coalitions from the device's generator, which differs between CPU and CUDA for the same seed: their rows are
printed but kept out of the worst (marked ``rng``). An exception in one case is printed and counted, not fatal.
``--budget`` seconds: the calls left after it are skipped and counted, and the summary is still printed (the
families of :data:`FIRST` and ``explain_generation`` run first). Exit status 1 if a call failed or was skipped, or
the worst exceeds ``--tol``.

Not a test (CI has no GPU); it needs the test builders (``tests/decoders.py``, ``tests/vlms.py``), not pytest.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import traceback
from typing import Any, Callable, Optional

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import decoders  # noqa: E402  (the test builders, found through the path above)
import vlms  # noqa: E402

from lrp_core import METHODS, explain, explain_generation  # noqa: E402
from lrp_core.adapters import get_adapter  # noqa: E402

#: methods whose draws come from the device's random generator (not comparable across devices)
STOCHASTIC = ("smoothgrad", "kernel_shap")


# --------------------------------------------------------------------------------------------------- builders
def _scaled(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Weights of std 1/√fan_in (q/k/v 3× larger, so attention shapes the logits), random biases, norm scales
    around 1 and position-bias tables of std 1 (timm's init leaves the logits nearly constant)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif p.dim() >= 2 and name.endswith("weight"):
                big = "qkv" in name or name.endswith(("q_proj.weight", "k_proj.weight"))
                p.copy_(torch.randn(p.shape, generator=g) * p[0].numel() ** -0.5 * (3.0 if big else 1.0))
            elif name.endswith("bias") or name.endswith(("gamma_1", "gamma_2")):
                p.copy_(
                    (0.5 + torch.rand(p.shape, generator=g))
                    if "gamma" in name
                    else 0.1 * torch.randn(p.shape, generator=g)
                )
    return model.eval()


def _images(n: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _eva() -> tuple:
    """EVA-02: rotary q/k, SwiGLU with a hidden norm, 2 registers, LayerScale, average pooling."""
    from timm.models.eva import Eva

    torch.manual_seed(0)
    model = Eva(
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=4,
        num_classes=5,
        use_rot_pos_emb=True,
        swiglu_mlp=True,
        scale_mlp=True,
        num_reg_tokens=2,
        init_values=0.3,
        global_pool="avg",
        scale_attn_inner=True,
    )
    return _scaled(model, 1).double(), _images()


def _swin() -> tuple:
    """Swin with windows of 2: shifted windows in both stages, relative position bias."""
    from timm.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    model = SwinTransformer(
        img_size=32, patch_size=4, window_size=2, embed_dim=16, depths=(2, 2), num_heads=(2, 4), num_classes=5
    )
    return _scaled(model, 1).double(), _images()


def _modernbert() -> tuple:
    """ModernBERT: a global then two sliding-window layers (±2 tokens), [CLS] pooling, a right-padded batch."""
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    torch.manual_seed(0)
    cfg = ModernBertConfig(
        attn_implementation="sdpa",
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=48,
        global_attn_every_n_layers=3,
        local_attention=4,
        classifier_pooling="cls",
        num_labels=3,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        max_position_embeddings=40,
    )
    model = decoders.perturb(ModernBertForSequenceClassification(cfg), 0).double().eval()
    ids = [[1, 5, 6, 7, 8, 9, 10, 11, 2], [1, 21, 22, 2, 0, 0, 0, 0, 0]]
    x = torch.tensor(ids)
    return model, {"input_ids": x, "attention_mask": (x != 0).long()}


def _decoder(family: str, attn: str = "eager") -> Callable[[], tuple]:
    def build() -> tuple:
        return decoders.make_decoder(family, attn=attn), decoders.batch(decoders.rows(lengths=(5, 8)), "left")

    return build


def _llava(tower: str = "clip") -> Callable[[], tuple]:
    def build() -> tuple:
        rows = [vlms.prompt([5, 6], [7, 8, 9]), vlms.prompt([10], [11, 12])]
        return vlms.make_llava(tower), vlms.inputs(rows, side="left")

    return build


def _smolvlm() -> tuple:
    rows = [vlms.smol_prompt([5, 6], [7, 8, 9]), vlms.smol_prompt([10], [11, 12])]
    return vlms.make_smolvlm("SmolVLM"), vlms.smol_inputs(rows, side="left")


def _qwen_vl(version: str = "2.5") -> Callable[[], tuple]:
    def build() -> tuple:
        rows = [vlms.qwen_prompt([5, 6], [7, 8, 9]), vlms.qwen_prompt([10], [11])]
        return vlms.make_qwen_vl(version=version), vlms.qwen_inputs(rows, side="left")

    return build


def _gemma3() -> tuple:
    rows = [vlms.gemma3_prompt([5, 6], [7, 8, 9]), vlms.gemma3_prompt([10], [11, 12])]
    return vlms.make_gemma3(), vlms.image_types(vlms.inputs(rows, side="left"))


def _paligemma() -> tuple:
    (r0, t0), (r1, t1) = vlms.paligemma_prompt([5, 6, 7]), vlms.paligemma_prompt([8], [9, 10])
    return vlms.make_paligemma(2), vlms.with_types(vlms.inputs([r0, r1], side="left"), [t0, t1], "left")


#: family -> builder of (float64 model on the CPU, its inputs)
CASES: dict[str, Callable[[], tuple]] = {
    "llama": _decoder("llama"),
    "llama_sdpa": _decoder("llama", "sdpa"),
    "qwen2": _decoder("qwen2"),
    "qwen3_moe": _decoder("qwen3_moe"),
    "mixtral": _decoder("mixtral"),
    "gemma2": _decoder("gemma2"),
    "gemma3": _decoder("gemma3"),
    "gpt_oss": _decoder("gpt_oss"),
    "phi3": _decoder("phi3"),
    "gpt2": _decoder("gpt2"),
    "gpt_neox": _decoder("gpt_neox"),
    "modernbert": _modernbert,
    "eva02": _eva,
    "swin": _swin,
    "llava": _llava("clip"),
    "llava_dinov2": _llava("dinov2"),
    "smolvlm": _smolvlm,
    "qwen2_5_vl": _qwen_vl("2.5"),
    "qwen2_vl": _qwen_vl("2"),
    "gemma3_vl": _gemma3,
    "paligemma2": _paligemma,
}
#: the families checked first (then explain_generation, then the others): the ones a run must not miss
FIRST = (
    "llama",
    "qwen3_moe",
    "gemma2",
    "gpt_oss",
    "modernbert",
    "eva02",
    "swin",
    "llava",
    "smolvlm",
    "qwen2_5_vl",
    "gemma3_vl",
    "paligemma2",
)
#: explain_generation cases: family of :data:`CASES` -> its prompts' builder
GENERATION = {
    "llama": lambda: decoders.batch(decoders.rows(lengths=(5, 8)), "left"),
    "llava": lambda: vlms.inputs([vlms.prompt([5, 6], [7, 8])], side="left"),
}


# --------------------------------------------------------------------------------------------------- comparing
def to(x: Any, device: str) -> Any:
    """``x`` (a tensor or a dict of them) on ``device``, floating tensors in float64."""
    if isinstance(x, dict):
        return {k: to(v, device) for k, v in x.items()}
    if torch.is_tensor(x):
        return x.to(device, torch.float64) if x.is_floating_point() else x.to(device)
    return x


def deviation(got: Optional[torch.Tensor], ref: Optional[torch.Tensor]) -> float:
    """max |got − ref| / max |ref| (``inf`` where one is missing, the shapes differ or ``got`` is not finite)."""
    if got is None and ref is None:
        return 0.0
    if got is None or ref is None or got.shape != ref.shape or not torch.isfinite(got).all():
        return float("inf")
    got = got.detach().cpu().double()
    ref = ref.detach().cpu().double()
    return float((got - ref).abs().max() / ref.abs().max().clamp(min=1e-300))


def compare(ref: Any, got: Any) -> float:
    """The worst deviation over the explanation's scores and, where present, its pixels."""
    return max(deviation(getattr(got, f, None), getattr(ref, f, None)) for f in ("scores", "pixels"))


def check_case(
    name: str,
    build: Callable[[], tuple],
    device: str,
    methods: list,
    record: Callable[[str, str, Optional[float], str], None],
    deadline: float = float("inf"),
) -> None:
    """Every method the case's adapter runs: CPU float64 against ``device`` float64; the methods left when the
    clock passes ``deadline`` (``time.perf_counter``) are recorded as skipped."""
    try:
        model, x = build()
        gpu_model = copy.deepcopy(model).to(device)
        refused = get_adapter(model).refused_methods
    except Exception as e:  # a failing builder is one failure, the other cases run
        record(name, "(build)", None, f"{type(e).__name__}: {e}")
        return
    gx = to(x, device)
    for m in methods:
        if m in refused:
            continue
        if time.perf_counter() > deadline:
            record(name, m, None, "skipped: --budget spent")
            continue
        opts = decoders.quick(m)
        try:
            t = time.perf_counter()
            ref = explain(model, x, method=m, **opts)
            t_ref = time.perf_counter() - t
            got = explain(gpu_model, gx, method=m, **opts)
            t_got = time.perf_counter() - t - t_ref
            note = f"{t_ref:5.2f} s / {t_got:5.2f} s" + (" rng" if m in STOCHASTIC else "")
            record(name, m, compare(ref, got), note)
        except Exception as e:
            record(name, m, None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            traceback.print_exc(limit=-3)


def check_generation(name: str, device: str, record: Callable[[str, str, Optional[float], str], None]) -> None:
    """``explain_generation`` (attnlrp, three greedy steps): the same tokens and maps on both devices."""
    try:
        model, _ = CASES[name]()
        x = GENERATION[name]()
        kw = dict(method="attnlrp", max_new_tokens=3, stop_at_eos=False)
        ref = explain_generation(model, None, x, **kw) if name == "llama" else explain_generation(model, x, **kw)
        gpu_model, gx = copy.deepcopy(model).to(device), to(x, device)
        got = (
            explain_generation(gpu_model, None, gx, **kw)
            if name == "llama"
            else explain_generation(gpu_model, gx, **kw)
        )
        same = torch.equal(ref.targets.cpu(), got.targets.cpu())
        err = compare(ref, got) if same else float("inf")
        record(name, "explain_generation", err, "" if same else "different greedy tokens")
    except Exception as e:
        record(name, "explain_generation", None, f"{type(e).__name__}: {e}")
        traceback.print_exc(limit=-3)


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="the device compared with the CPU (default cuda)")
    p.add_argument("--cases", default="all", help=f"'all' or comma-separated: {', '.join(CASES)}")
    p.add_argument("--methods", default="all", help="'all' or comma-separated method names")
    p.add_argument("--no-generation", action="store_true", help="skip the explain_generation cases")
    p.add_argument("--tol", type=float, default=1e-8, help="exit 1 if the worst deviation exceeds this")
    p.add_argument(
        "--budget",
        type=float,
        default=float("inf"),
        help="seconds: the calls left after this are skipped (and counted), the summary still printed",
    )
    a = p.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("no CUDA device here; use --device cpu for a dry run")
    cases = list(CASES) if a.cases == "all" else a.cases.split(",")
    methods = list(METHODS) if a.methods == "all" else a.methods.split(",")
    unknown = [c for c in cases if c not in CASES] + [m for m in methods if m not in METHODS]
    if unknown:
        p.error(f"unknown case(s) / method(s) {unknown}")
    torch.backends.cuda.matmul.allow_tf32 = False  # float64 anyway; no reduced-precision paths
    print(
        f"torch {torch.__version__}, device {a.device}"
        + (f" ({torch.cuda.get_device_name()})" if a.device.startswith("cuda") else ""),
        flush=True,
    )
    rows: list = []

    def record(case: str, method: str, err: Optional[float], note: str) -> None:
        rows.append((case, method, err, note))
        shown = f"{err:.2e}" if err is not None else "skipped" if note.startswith("skipped") else "FAILED"
        print(f"{case:12s} {method:24s} {shown:>9s} {note}", flush=True)

    t0 = time.perf_counter()

    def families(names: list) -> None:
        for name in names:
            t = time.perf_counter()
            check_case(name, CASES[name], a.device, methods, record, t0 + a.budget)
            print(f"# {name}: {time.perf_counter() - t:.1f} s", flush=True)

    families([c for c in cases if c in FIRST])
    if not a.no_generation:
        for name in GENERATION:
            if name in cases and time.perf_counter() > t0 + a.budget:
                record(name, "explain_generation", None, "skipped: --budget spent")
            elif name in cases:
                check_generation(name, a.device, record)
    families([c for c in cases if c not in FIRST])
    compared = [r for r in rows if r[2] is not None and r[1] not in STOCHASTIC]
    failed = [r for r in rows if r[2] is None and not r[3].startswith("skipped")]
    skipped = [r for r in rows if r[2] is None and r[3].startswith("skipped")]
    worst = max(compared, key=lambda r: r[2], default=None)
    rng = [r[2] for r in rows if r[2] is not None and r[1] in STOCHASTIC]
    print(
        f"worst {worst[2]:.2e} ({worst[0]} / {worst[1]}) over {len(compared)} family × method pairs"
        if worst
        else "worst: nothing compared"
    )
    if rng:
        print(
            f"stochastic methods (device generators differ; not in the worst): max {max(rng):.2e} over {len(rng)} pairs"
        )
    print(f"failed: {len(failed)}" + "".join(f"\n  {c} / {m}: {n}" for c, m, _, n in failed))
    if skipped:
        print(f"skipped (--budget): {len(skipped)}")
    print(f"total {time.perf_counter() - t0:.1f} s")
    return int(bool(failed) or bool(skipped) or (worst is not None and worst[2] > a.tol))


if __name__ == "__main__":
    sys.exit(main())
