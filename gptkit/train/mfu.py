"""Model FLOPs utilisation (MFU): how much of a device's peak the training uses.

    mfu = estimate_mfu(config, tokens_per_second, peak_flops)

The peak is the datasheet figure on a known GPU (`peak_flops_for_device`) and,
on a CPU, where no datasheet number applies, the best fp32 matmul rate ever
measured on this machine (`cpu_peak_flops`). A rate measured once at start-up
swings with whatever else the cores are doing (25% to 86% MFU at the same speed
on a shared 2-core machine), so each run measures briefly and the best figure is
kept in a small JSON file, one entry per CPU model, core count, thread count and
torch version:

    ~/.cache/gptkit/cpu_peak.json     ($GPTKIT_CACHE_DIR or $XDG_CACHE_HOME move it; delete it to re-measure)

The peak only rises, so a run on a busy machine shows a lower MFU rather than a
lower peak: its training really does get less of the machine. A peak first measured
on a busy machine is too low; a run whose own training beats it has measured a better
one, which replaces it (`mfu_meter`), so MFU never reads above 100%. A run autocast to
bfloat16 is measured against bfloat16 products: an entry of its own.
"""

import dataclasses
import functools
import json
import os
import platform
import time
from pathlib import Path

import torch
import torch.nn as nn

from gptkit.ops.atomic import atomic_write
from gptkit.ops.device import cpu_computes_bf16
from gptkit.ops.errors import RunFailed
from gptkit.models.shapes import meta_model
from gptkit.ops.paths import cache_dir
from model import GPTConfig


# Peak dense bf16 tensor throughput, from NVIDIA's datasheets (they print the "with
# sparsity" figures, twice these). Matched as substrings of torch.cuda.get_device_name(),
# so the more specific names come first ("L40S" before "L40" before "L4"; "NVIDIA H100
# 80GB HBM3" is the SXM part).
GPU_PEAK_FLOPS = {
    "GB200": 2500e12,  # GB200 NVL72 datasheet: 5 PFLOPS bf16 a GPU with sparsity
    "B200": 2250e12,  # HGX B200 datasheet: 4.5 PFLOPS bf16 a GPU with sparsity
    "H200 NVL": 835e12,  # H200 datasheet, NVL column: 1,671 TFLOPS with sparsity
    "H200": 989e12,  # H200 datasheet, SXM column: 1,979 with sparsity (H100 SXM's tensor cores)
    "H100 PCIe": 756e12,  # H100 datasheet: 1,513 TFLOPS bf16 with sparsity
    "H100 NVL": 835e12,  # H100 datasheet: 1,671 TFLOPS bf16 with sparsity
    "H100": 989e12,  # H100 SXM: 1,979 with sparsity
    "H800 PCIe": 756e12,  # H800 PCIe datasheet: 1,513 with sparsity (H100 PCIe's figures)
    "H800": 989e12,  # H800 SXM datasheet: 1,979 with sparsity (H100 SXM's figures)
    "A100": 312e12,  # A100 datasheet: 312 TFLOPS bf16 dense
    "L40S": 362e12,  # L40S datasheet: 362.05 TFLOPS bf16 dense, 733 with sparsity
    "L40": 181e12,  # L40 datasheet: 181.05 TFLOPS bf16 dense, 362 with sparsity
    "L4": 121e12,  # L4 datasheet: 242 TFLOPS bf16 with sparsity
}


def flops_per_token(config):
    """Training FLOPs per token, 6N + 12*L*T*d: 6 per weight for the forward and backward
    matrix products plus the attention scores and mixing (PaLM, Chowdhery et al. 2022,
    appendix B; nanoGPT's estimate_mfu). N counts the weights used in matrix products:
    everything but the embedding lookups (a tied wte counts once, as the lm_head)."""
    return _flops_per_token(*dataclasses.astuple(config))  # cached: asked at every log line


@functools.lru_cache(maxsize=8)
def _flops_per_token(*fields):
    config = GPTConfig(*fields)
    model = meta_model(config)  # shapes only: no memory, even for 7B
    products = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}  # a tied wte among them
    lookups = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding)}
    n = sum(p.numel() for p in model.parameters()) - sum(v for k, v in lookups.items() if k not in products)
    return 6 * n + 12 * config.n_layer * config.block_size * config.n_embd


def estimate_mfu(config, tokens_per_second, peak_flops):
    """Model FLOPs utilization: the fraction of the device's peak that training uses."""
    return flops_per_token(config) * tokens_per_second / peak_flops


def peak_flops_for_device(device):
    """Peak bf16 FLOP/s of a known CUDA GPU, or None (CPU, unknown GPU: measure it)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in GPU_PEAK_FLOPS.items():
        if key in name:
            return flops
    return None


def measure_matmul_flops(device="cpu", n=1024, dtype=torch.float32, seconds=1.0):
    """Sustained FLOP/s of an n x n matmul: the peak that MFU is measured against
    on a CPU, where no datasheet number applies. Best of several timed bursts."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def sync():
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(3):  # warm up caches and the thread pool
        a @ b
    sync()
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        sync()
        dt = time.perf_counter() - t0
        best = max(best, 4 * 2 * n**3 / dt)
    return best


CPU_PEAK_FILE = "cpu_peak.json"
CPU_PEAK_FORMAT = 1  # bump to ignore files written by an older way of measuring


def cpu_model():
    """The CPU's model name (Linux's /proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_machine_key(dtype=torch.float32):
    """What the matmul peak depends on: a change of any of these is another entry."""
    key = f"{cpu_model()} | {os.cpu_count()} cores | {torch.get_num_threads()} threads | torch {torch.__version__}"
    return key if dtype == torch.float32 else f"{key} | {str(dtype).removeprefix('torch.')}"


def _read_peaks(path):
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, unreadable or damaged: measure afresh
    if not isinstance(data, dict) or data.get("format") != CPU_PEAK_FORMAT or not isinstance(data.get("peaks"), dict):
        return {}
    return data["peaks"]


def cpu_peak_flops(measure=None, dtype=torch.float32):
    """The best matmul FLOP/s in `dtype` measured on this machine: a short measurement now,
    raised to the best cached one; a new best is written back (atomically). A cache
    that cannot be written only costs the stability, never the run."""
    measured = (measure or (lambda: measure_matmul_flops("cpu", dtype=dtype, seconds=0.3)))()
    path = cache_dir(CPU_PEAK_FILE)
    peaks = _read_peaks(path)
    key = cpu_machine_key(dtype)
    cached = peaks.get(key)
    if isinstance(cached, (int, float)) and cached >= measured:
        return float(cached)
    peaks[key] = measured
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as tmp:
            tmp.write_text(json.dumps({"format": CPU_PEAK_FORMAT, "peaks": peaks}, indent=1) + "\n")
    except (OSError, RunFailed):
        pass
    return measured


def cpu_peak_dtype(dtype):
    """The dtype whose products are a CPU run's peak: bfloat16 where the CPU computes it,
    else float32 (emulated bfloat16 or float16 is slower than float32, and slow to measure)."""
    return torch.bfloat16 if dtype == torch.bfloat16 and cpu_computes_bf16() else torch.float32


_PEAKS = {}


def measure_peak(device, dtype=torch.float32):
    """Peak FLOP/s that MFU is measured against: the datasheet on CUDA, the best
    matmul rate in the run's dtype measured on this machine on a CPU (cpu_peak_flops);
    cached per process."""
    if (device, dtype) not in _PEAKS:
        peak = peak_flops_for_device(device)
        if peak is None and device == "cpu":
            with torch.random.fork_rng(devices=[]):  # its random matrices must not shift dropout's stream
                peak = cpu_peak_flops(dtype=cpu_peak_dtype(dtype))
        _PEAKS[device, dtype] = peak
    return _PEAKS[device, dtype]
