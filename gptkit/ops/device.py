"""Which device and number format a command runs on: `auto` picks the best one present."""

import ctypes
import os
import platform

import torch
from torch.torch_version import TorchVersion

from gptkit.ops.errors import UserError, same_on_every_rank

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SAMPLE_DTYPES = (*DTYPES, "int8")  # sample.py's and serve.py's: int8 matrices on a CPU (gptkit/fast/cpu_linears.py)
F16_MAX = 65504.0  # float16's largest finite value
F16_OVERFLOW = 65520.0  # the least value that rounds to float16's infinity (half-way to 2**16, ties to even)


def mps_available():
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def resolve_device(name, local_rank=None):
    """'auto' -> the best device present (CUDA, then MPS, then the CPU); an explicit
    device must exist. Under torchrun each process takes the GPU of its local rank."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise same_on_every_rank(UserError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps"))
    if device.type not in ("cpu", "cuda", "mps"):
        raise same_on_every_rank(UserError(f"device={name!r}: expected auto, cpu, cuda, cuda:N or mps"))
    # Under torchrun every rank finds the same: rank 0 alone prints it.
    if device.type == "cuda" and not torch.cuda.is_available():
        raise same_on_every_rank(UserError(f"device={name!r} but this PyTorch sees no CUDA GPU: use --device=cpu (or auto)"))
    if device.type == "mps" and not mps_available():
        raise same_on_every_rank(UserError(f"device={name!r} but MPS is not available here: use --device=cpu (or auto)"))
    if device.type == "cuda" and local_rank is not None:
        device = torch.device("cuda", local_rank)  # one process per device under torchrun
    return device


CPU_BUILD = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def cuda_build_on_a_cpu_note(device):
    """One line where a run on the CPU uses a CUDA build of torch on a machine without a
    CUDA GPU (pip's default torch on Linux), else None: our CPU figures come from the CPU
    build, and on an AVX2 AMD EPYC Zen 3 a CUDA build took 1.3-1.4x as long a quick-start
    step at two threads (equal on a Zen 4: BENCHMARKS.md)."""
    if device.type != "cpu" or not torch.version.cuda or torch.cuda.is_available():
        return None
    return (f"note: torch {torch.__version__} is a CUDA build and this machine has no CUDA GPU; our CPU figures "
            f"come from the CPU build, up to 1.4x faster on some CPUs (BENCHMARKS.md): {CPU_BUILD}")


def native_bf16(device):
    """Whether a CUDA GPU computes bfloat16 in hardware: compute capability 8.0
    (Ampere: A100, RTX 30xx) and later, and AMD's ROCm GPUs. Older ones (V100 7.0,
    T4 7.5, Colab's free GPU) only emulate it: torch.cuda.is_bf16_supported() says
    True there (it counts emulation), but matmuls run several times slower and
    SDPA falls back from flash attention to the slow kernel."""
    if torch.version.hip:
        return True
    return torch.cuda.get_device_capability(device) >= (8, 0)


def cpu_computes_bf16():
    """Whether this CPU has bfloat16 instructions (x86's AVX-512 BF16 or AMX), read from
    Linux's /proc/cpuinfo (False elsewhere). With them PyTorch's bfloat16 matrix products
    run at about twice float32's rate on a CPU; without them bfloat16 is emulated, and
    slower than float32 (configs/shakespeare_1200cpus.py chooses its dtype by this). False
    too when PyTorch is told to run its AVX2 kernels at most (ATEN_CPU_CAPABILITY=avx2 or
    default: how BENCHMARKS.md measures an AVX2 laptop's figures on a newer CPU)."""
    if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() in ("avx2", "default"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


MMAP_THRESHOLD = 32 << 20  # glibc's largest dynamic mmap threshold on 64-bit machines
TRIM_THRESHOLD = 1 << 30
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (glibc's malloc.h)


def runs_on_glibc():
    """Whether this process's C library is glibc (Linux's usual one; not musl, macOS, Windows)."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def keep_freed_memory():
    """Ask glibc's malloc to keep the memory a CPU training step frees for the next step.

    Every step allocates and frees the same large tensors (activations, gradients). By
    default glibc serves blocks above a threshold with mmap and gives them back to the
    kernel when freed, and trims free memory off its heap: the next step then faults every
    page in again, kernel time that ran to ~3% of a bfloat16 run's CPU seconds on
    2026-12-07's AMD EPYC (benchmarks/LOG.md). Blocks up to 32 MB now come from the heap
    and up to 1 GB of free heap is kept: the process stays at its peak memory instead of
    shrinking between steps. Returns a line for the run's header, or None where the C
    library is not glibc (macOS, Windows, musl), which is left as it is. Left alone too
    where the environment sets glibc's malloc (any MALLOC_* variable, or GLIBC_TUNABLES).
    Not the trim threshold alone: that switches glibc's dynamic mmap threshold off, and
    every large tensor is then mapped and unmapped (100 s of kernel time in a 70 s run)."""
    if not runs_on_glibc():
        return None
    if "GLIBC_TUNABLES" in os.environ or any(name.startswith("MALLOC_") for name in os.environ):
        return "memory: glibc's malloc as the environment sets it"
    libc = ctypes.CDLL(None)
    if not (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return None
    return ("memory: glibc keeps freed blocks for the next step (mallopt: mmap threshold 32 MB, "
            "trim threshold 1 GB; any MALLOC_* or GLIBC_TUNABLES variable leaves malloc to it)")


def training_dtype(name, device):
    """'auto' trains in bfloat16 on GPUs that compute it natively (native_bf16), in
    float16 with a GradScaler on older GPUs, in float32 elsewhere."""
    if name != "auto":
        return DTYPES[name]
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if native_bf16(device) else torch.float16
    return torch.float32


def inference_dtype(name, device):
    """The dtype the weights are cast to for generating. It needs no fp32 master copy,
    and one token at a time reads every weight once per step: half the bytes
    (bfloat16) is up to twice the speed where memory bandwidth is the limit. 'auto'
    keeps float32 on GPUs without native bfloat16: float16 weights of a model
    trained in bfloat16 or float32 can overflow."""
    device = torch.device(device)
    if name == "auto":
        name = "bfloat16" if device.type == "cuda" and native_bf16(device) else "float32"
    if name == "int8":  # a float32 model with int8 copies of its matrices (gptkit/fast/cpu_linears.py)
        if device.type != "cpu":
            raise UserError(f"--dtype int8 runs on a CPU (gptkit/fast/cpu_linears.py's Int8Linear), not {device.type}: "
                            "use --device cpu, or --dtype bfloat16 or float16 on a GPU")
        return torch.float32
    return DTYPES[name]


def matmul_dtype(device):
    """The dtype for matrix products that need no float32 precision (Muon's
    Newton-Schulz iteration): bfloat16 where the GPU computes it natively, float16
    on older GPUs (its range suffices for values normalised to at most 1), float32
    on CPUs and MPS (their bfloat16 matmuls are slower than float32)."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if native_bf16(device) else torch.float16


def enable_tf32():
    """TF32 for float32 matmuls and convolutions on CUDA GPUs that have it (Ampere and
    later): float32's range with 10 mantissa bits, several times float32's speed.
    torch 2.9 replaced the allow_tf32 flags by fp32_precision and warns about the old
    ones; reading a flag after the two were mixed is an error, so one API only."""
    if TorchVersion(torch.__version__) >= "2.9":
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
