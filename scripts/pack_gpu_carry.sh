#!/usr/bin/env bash
# What the GPU table (scripts/bench_gpu_llama8b.py) needs on the device machine that is not installed there, copied
# into the ignored folder .gpu-carry/ (carry it: `carry: [".gpu-carry"]`, about 5 MB):
#   .gpu-carry/lxt/lxt             LXT's package from its source (--lxt-src .gpu-carry/lxt; LXT's efficient mode
#                                  needs torch and transformers only, both there)
#   .gpu-carry/site/bitsandbytes   bitsandbytes (pure Python + ctypes, no compiled extension module), with only
#                                  the CUDA 13.0 library (the device's torch is +cu130) and the CPU one
#                                  (--site .gpu-carry/site); the whole package is 125 MB, this copy about 4 MB
# Usage: scripts/pack_gpu_carry.sh [LXT_SRC (default /work/lxt-src)] [SITE_PACKAGES holding bitsandbytes]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lxt_src="${1:-/work/lxt-src}"
site="${2:-$(python -c 'import bitsandbytes, os; print(os.path.dirname(os.path.dirname(bitsandbytes.__file__)))')}"
out="$root/.gpu-carry"
rm -rf "$out" && mkdir -p "$out/lxt" "$out/site"
cp -r "$lxt_src/lxt" "$out/lxt/"
cp -r "$site/bitsandbytes" "$out/site/"
rm -f "$out"/site/bitsandbytes/libbitsandbytes_*
cp "$site"/bitsandbytes/libbitsandbytes_cpu.so "$site"/bitsandbytes/libbitsandbytes_cuda130.so "$out/site/bitsandbytes/"
find "$out" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$out"
