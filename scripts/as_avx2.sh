#!/usr/bin/env bash
# Run a command as on an AVX2 laptop (no AVX-512), on a newer x86 CPU: how BENCHMARKS.md's
# "on AVX2" figures are measured.
#
#   scripts/as_avx2.sh python bench.py gpt2_cpu
#   LLAMA_CPP_AVX2=DIR scripts/as_avx2.sh python bench.py gpt2_cpu   # with llama.cpp built for AVX2 in DIR
#
# - PyTorch runs its AVX2 kernels (ATEN_CPU_CAPABILITY=avx2), and the recipes take their float32
#   branch (gptkit/ops/device.py's cpu_computes_bf16 says no under it);
# - gptkit/fast/int8_kernel.c is built for x86-64-v3 (AVX2, FMA): its AVX2 path;
# - MKL is held to AVX2 too (MKL_ENABLE_INSTRUCTIONS), oneDNN likewise (ONEDNN_MAX_CPU_ISA);
# - llama-cpp-python from DIR, built there with
#   CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF"
#   pip install --no-binary llama-cpp-python --no-deps --target DIR llama-cpp-python
# A newer core still runs these faster than an older one would: BENCHMARKS.md says how much.
set -euo pipefail
export ATEN_CPU_CAPABILITY=avx2 GPTKIT_INT8_ARCH=-march=x86-64-v3 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
if [ -n "${LLAMA_CPP_AVX2:-}" ]; then
  if [ ! -d "$LLAMA_CPP_AVX2/llama_cpp" ]; then
    echo "error: LLAMA_CPP_AVX2=$LLAMA_CPP_AVX2 holds no llama_cpp package (build it there: see this script's header)" >&2
    exit 2
  fi
  export PYTHONPATH="$LLAMA_CPP_AVX2${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$@"
