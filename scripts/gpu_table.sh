#!/usr/bin/env bash
# The GPU session's one command (issue #46 items 4 and 6), ≤ 9 minutes on one H200, from the repository root, with
# .gpu-carry carried (made here by scripts/pack_gpu_carry.sh): the bitsandbytes tests on CUDA (≤ 100 s), then the
# GPU table (scripts/bench_gpu_llama8b.py: 360 s of phases, ≤ 450 s with the last one's end). Everything lands in $OUT (3 files):
#   run(command="bash scripts/gpu_table.sh", carry=[".gpu-carry"], timeout_s=600)
set -o pipefail
out="${OUT:-/tmp/gpu-table}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/.gpu-carry/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu-tests.log"
python3 -c "import torch, transformers, bitsandbytes as b; print(torch.__version__, transformers.__version__, b.__version__)" \
    2>&1 | tail -1 | tee -a "$out/gpu-tests.log"
timeout 100 python3 -m pytest -p no:cacheprovider -q tests/adapters/test_quantised_cuda.py -k cuda 2>&1 | tail -25 \
    | tee -a "$out/gpu-tests.log"
python3 scripts/bench_gpu_llama8b.py --site .gpu-carry/site --lxt-src .gpu-carry/lxt --total-budget 360 \
    --json "$out/bench-gpu-llama8b.json" > "$out/bench-gpu-llama8b.log" 2>&1
tail -45 "$out/bench-gpu-llama8b.log"
