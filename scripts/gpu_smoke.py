"""Developer check on a CUDA machine: every method on a tiny timm ViT, a right-padded BERT batch and CLIP
(image and text side, contrast targets), on the GPU, against the same call on the CPU, both in float64.

    PYTHONPATH=. python scripts/gpu_smoke.py      # prints max|Δ|/max|CPU| per family and method

Not a test (CI has no GPU). Measured on an H100: worst 3.2e-12 over 44 family × method pairs.
"""

import sys

import torch

sys.path.insert(0, "tests")
from conftest import make_tiny_bert, make_tiny_vit
from tiny_clip import make_clip

from lrp_core import METHODS, Contrast, explain

dev = "cuda"
ids = torch.tensor([[2, 11, 12, 13, 14, 15, 3], [2, 21, 22, 3, 0, 0, 0], [2, 31, 32, 33, 34, 3, 0]])
text = {"input_ids": ids, "attention_mask": (ids != 0).long()}
cids = torch.tensor([[1, 5, 6, 7, 98], [1, 8, 9, 98, 0]])
clip_in = {
    "pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3)),
    "input_ids": cids,
    "attention_mask": (cids != 0).long(),
}
cases = [
    ("vit", make_tiny_vit(), torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))),
    ("bert", make_tiny_bert(), text),
    ("clip", make_clip(), clip_in),
    ("clip-text", make_clip(), {**clip_in, "explain": "text"}),
]


def to(x, d, dt):
    if isinstance(x, dict):
        return {
            k: (v.to(d, dt) if torch.is_tensor(v) and v.is_floating_point() else v.to(d) if torch.is_tensor(v) else v)
            for k, v in x.items()
        }
    return x.to(d, dt)


worst = 0.0
for name, model, x in cases:
    for m in METHODS:
        contrast = m in ("cdam", "attnlrp") and name != "bert"
        tgt = None if m in ("rollout", "raw_attention") else Contrast(0, 1) if contrast else None
        ref = explain(model.double(), to(x, "cpu", torch.float64), method=m, target=tgt).scores
        got = explain(model.to(dev, torch.float64), to(x, dev, torch.float64), method=m, target=tgt).scores
        err = ((got.cpu() - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()
        worst = max(worst, err)
        print(f"{name:10s} {m:24s} {err:.2e}", flush=True)
        model.cpu()
print("worst", worst)
