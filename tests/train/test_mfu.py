"""mfu.py: FLOPs per token, datasheet peaks, and the measured CPU peak."""

import pytest
import torch

from gptkit.train.mfu import GPU_PEAK_FLOPS, estimate_mfu, flops_per_token, measure_matmul_flops, peak_flops_for_device
from model import GPTConfig


def test_flops_and_mfu():
    c = GPTConfig()
    n = 124_439_808 - 1024 * 768  # the position table is a lookup, not a matrix product
    assert flops_per_token(c) == 6 * n + 12 * 12 * 1024 * 768
    assert estimate_mfu(c, 1000.0, 312e12) == pytest.approx(flops_per_token(c) * 1000 / 312e12)
    assert GPU_PEAK_FLOPS["A100"] == 312e12 and GPU_PEAK_FLOPS["H100"] == 989e12 and GPU_PEAK_FLOPS["H200"] == 989e12
    assert peak_flops_for_device("cpu") is None


def test_peak_flops_matches_device_names(monkeypatch):
    for name, expected in [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                           ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA H200", 989e12), ("Tesla T4", None)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, n=name: n)
        assert peak_flops_for_device("cuda") == expected, name


def test_measured_cpu_peak_is_a_plausible_rate():
    flops = measure_matmul_flops("cpu", n=256, seconds=0.1)
    assert 1e8 < flops < 1e14  # between a slow laptop core and a GPU: FLOP/s, not FLOPs or ms
