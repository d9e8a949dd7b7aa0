"""Model FLOPs utilisation (MFU): how much of a device's peak the training uses.

    mfu = estimate_mfu(config, tokens_per_second, peak_flops)

The peak is the datasheet figure on a known GPU (`peak_flops_for_device`) and,
on a CPU, where no datasheet number applies, the fp32 matmul rate measured on
the spot (`measure_matmul_flops`).
"""

import dataclasses
import functools
import time

import torch

from model import GPT, GPTConfig


# Peak dense bf16 tensor throughput, from NVIDIA's datasheets (the "with sparsity"
# figures are twice these). More specific names come first: matched as substrings of
# torch.cuda.get_device_name(), e.g. "NVIDIA H100 80GB HBM3" is the SXM part.
GPU_PEAK_FLOPS = {
    "H100 PCIe": 756e12,  # H100 datasheet: 1,513 TFLOPS bf16 with sparsity
    "H100 NVL": 835e12,  # H100 datasheet: 1,671 TFLOPS bf16 with sparsity
    "H100": 989e12,  # H100 SXM: 1,979 with sparsity
    "H200": 989e12,  # H200 datasheet: same Hopper tensor cores as H100 SXM
    "A100": 312e12,  # A100 datasheet: 312 TFLOPS bf16 dense
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
    with torch.device("meta"):  # shapes only: no memory, even for 7B
        model = GPT(config)
    n = model.num_params(non_embedding=True) + model.lm_head.weight.numel()
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


_PEAKS = {}


def measure_peak(device):
    """Peak FLOP/s that MFU is measured against: the datasheet on CUDA, a short
    measured matmul rate on a CPU (no datasheet number applies); cached per process."""
    if device not in _PEAKS:
        peak = peak_flops_for_device(device)
        if peak is None and device == "cpu":
            with torch.random.fork_rng(devices=[]):  # its random matrices must not shift dropout's stream
                peak = measure_matmul_flops("cpu", seconds=0.3)
        _PEAKS[device] = peak
    return _PEAKS[device]
