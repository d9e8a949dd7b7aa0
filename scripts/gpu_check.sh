#!/usr/bin/env bash
# GPU checks for one CUDA machine: what the CPU test suite cannot see. Every step runs,
# whatever happened to the ones before it (no `set -e`), each under its own timeout;
# the timeouts add up to 480 s (8 minutes), and a summary table closes the output.
# Offline: every step trains on character data made on the spot, so nothing needs
# GPT-2's BPE files (TIKTOKEN_CACHE_DIR), Hugging Face's hub or wandb.
#
#   bash scripts/gpu_check.sh                                  # from anywhere
#   GPU_CHECK_LOGS=gpu-logs bash scripts/gpu_check.sh          # keep each step's full log there
#
# Steps (tests/test_gpu.py and tests/train/test_fsdp_gpu.py hold the checks):
#   cuda      the GPU torch sees: name, compute capability, memory, torch and CUDA versions
#   training  bf16 and fp16 training with torch.compile (the loss falls, compile really
#             ran), the quick-start recipe (Muon, RoPE, QK-norm, soft-cap) with dtype and
#             compile on auto, the flash attention kernel in training (bf16, dropout, GQA)
#   kernels   fused attention against the formula, fused AdamW, eval.py equal to
#             train.py's whole-split loss, sample.py's cached, uncached and compiled greedy
#             decoding (the same tokens; compiled decoding does not recompile per token)
#   parallel  torchrun on one GPU: DDP under NCCL with accumulation and resume, FSDP in bf16
#             (sharded checkpoint, resume, conversion), FSDP with activation checkpointing
#             and compile, Muon on FSDP shards
#   speed     GPT-2 124M at block 1024, compile on: ms/iter, tokens/s, MFU against the
#             datasheet bf16 peak, peak memory
# Exit status: the number of steps that did not pass (0: all passed).

cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
export GPTKIT_GPU_CHECK=1  # tests/conftest.py: without CUDA the GPU tests fail here instead of skipping
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
LOGS=${GPU_CHECK_LOGS:-$(mktemp -d -t gpu-check-XXXXXX)}
mkdir -p "$LOGS" || exit 1
NAMES=() RESULTS=() SECONDS_TAKEN=()

step() {  # step NAME LIMIT_SECONDS COMMAND...: run it, log it, remember how it ended
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS result
    echo "== $name (at most $limit s): $*"
    # timeout signals the command's whole process group: torchrun's workers go with it
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local code=$?
    if [ "$code" -eq 0 ]; then
        result=pass
        tail -n 4 "$LOGS/$name.log"
    else
        if [ "$code" -eq 124 ]; then result="TIMEOUT after $limit s"; else result="FAIL (exit $code)"; fi
        tail -n 40 "$LOGS/$name.log"
    fi
    NAMES+=("$name") RESULTS+=("$result") SECONDS_TAKEN+=($((SECONDS - start)))
}

step cuda 15 python -c "
import torch
assert torch.cuda.is_available(), 'torch sees no CUDA device'
p = torch.cuda.get_device_properties(0)
print(f'{torch.cuda.get_device_name()} | compute capability {p.major}.{p.minor} | {p.total_memory / 1e9:.0f} GB'
      f' | torch {torch.__version__} | CUDA {torch.version.cuda}')"
TRAINING="mixed_precision or recipe or flash"
step training 140 python -m pytest -m gpu tests/test_gpu.py -q -k "$TRAINING"
step kernels 95 python -m pytest -m gpu tests/test_gpu.py -q -k "not ($TRAINING)"
step parallel 140 python -m pytest -m gpu tests/train/test_fsdp_gpu.py -q
step speed 90 python bench.py --no_record train --device cuda --model gpt2 --block_size 1024 --batch_size 16 --iters 30 --warmup 10

echo
echo "## GPU check summary ($(tail -n 1 "$LOGS/cuda.log" 2>/dev/null))"
echo
echo "| step | result | seconds |"
echo "|---|---|---|"
failed=0
for i in "${!NAMES[@]}"; do
    echo "| ${NAMES[$i]} | ${RESULTS[$i]} | ${SECONDS_TAKEN[$i]} |"
    [ "${RESULTS[$i]}" = pass ] || failed=$((failed + 1))
done
echo
echo "full logs: $LOGS"
exit "$failed"
