#!/usr/bin/env bash
# GPU checks for one CUDA machine (H100/H200), under 8 minutes in all (each step has its own timeout):
#   1. the CUDA tests (bf16/fp16 training, compile, fused attention, fused AdamW);
#   2. FSDP2 on one GPU under torchrun (world size 1, bf16): train, sharded
#      checkpoint, resume, conversion to one file, torch.compile;
#   3. GPT-2 124M training speed at block 1024: ms/iter, tokens/s and MFU against
#      the datasheet bf16 peak (torch.compile on; its first steps are left out).
# Usage: bash scripts/gpu_check.sh   (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
timeout 240 python -m pytest -m gpu tests/test_gpu.py -q
timeout 120 python -m pytest -m gpu tests/train/test_fsdp_gpu.py -q
timeout 240 python bench.py --no-record train --model gpt2 --block_size 1024 --batch_size 16 --iters 40 --warmup 10
