"""mfu.py: FLOPs per token, datasheet peaks, and the measured CPU peak."""

import json

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
                           ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA H200", 989e12), ("NVIDIA H200 NVL", 835e12),
                           ("NVIDIA H800", 989e12), ("NVIDIA H800 PCIe", 756e12), ("NVIDIA B200", 2250e12),
                           ("NVIDIA L4", 121e12), ("NVIDIA L40S", 362e12), ("NVIDIA L40", 181e12), ("Tesla T4", None)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, n=name: n)
        assert peak_flops_for_device("cuda") == expected, name


def test_a_name_inside_another_comes_after_it():
    """Names are matched as substrings in order: "L4" first would take every L40S."""
    keys = list(GPU_PEAK_FLOPS)
    for i, short in enumerate(keys):
        assert not any(short in longer for longer in keys[i + 1:]), short


def test_measured_cpu_peak_is_a_plausible_rate():
    flops = measure_matmul_flops("cpu", n=256, seconds=0.1)
    assert 1e8 < flops < 1e14  # between a slow laptop core and a GPU: FLOP/s, not FLOPs or ms


def test_cpu_peak_is_the_best_measured_and_cached_per_machine(tmp_path, monkeypatch):
    from gptkit.train import mfu

    monkeypatch.setenv("GPTKIT_CACHE_DIR", str(tmp_path / "cache"))
    assert mfu.cpu_peak_flops(measure=lambda: 50e9) == 50e9  # first run: measured, and cached
    assert mfu.cpu_peak_flops(measure=lambda: 20e9) == 50e9  # a busy machine later: the peak stays
    assert mfu.cpu_peak_flops(measure=lambda: 80e9) == 80e9  # a better measurement raises it
    assert mfu.cpu_peak_flops(measure=lambda: 30e9) == 80e9
    saved = json.loads((tmp_path / "cache" / "cpu_peak.json").read_text())
    assert saved["peaks"] == {mfu.cpu_machine_key(): 80e9}

    monkeypatch.setattr(torch, "__version__", "9.9.9")  # another torch: an entry of its own
    assert mfu.cpu_peak_flops(measure=lambda: 10e9) == 10e9
    assert len(json.loads((tmp_path / "cache" / "cpu_peak.json").read_text())["peaks"]) == 2


def test_damaged_or_unwritable_cache_never_stops_a_run(tmp_path, monkeypatch):
    from gptkit.train import mfu

    (tmp_path / "cpu_peak.json").write_text("{not json")
    monkeypatch.setenv("GPTKIT_CACHE_DIR", str(tmp_path))
    assert mfu.cpu_peak_flops(measure=lambda: 40e9) == 40e9
    assert json.loads((tmp_path / "cpu_peak.json").read_text())["format"] == mfu.CPU_PEAK_FORMAT
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("GPTKIT_CACHE_DIR", str(blocker / "cache"))  # a folder below a file: cannot exist
    assert mfu.cpu_peak_flops(measure=lambda: 40e9) == 40e9


def test_cpu_peak_has_an_entry_per_dtype(tmp_path, monkeypatch):
    from gptkit.train import mfu

    monkeypatch.setenv("GPTKIT_CACHE_DIR", str(tmp_path))
    assert mfu.cpu_peak_flops(measure=lambda: 50e9) == 50e9
    assert mfu.cpu_peak_flops(measure=lambda: 90e9, dtype=torch.bfloat16) == 90e9  # bf16 products: their own
    assert mfu.cpu_peak_flops(measure=lambda: 10e9) == 50e9  # float32's entry is untouched
    peaks = json.loads((tmp_path / "cpu_peak.json").read_text())["peaks"]
    assert peaks == {mfu.cpu_machine_key(): 50e9, mfu.cpu_machine_key() + " | bfloat16": 90e9}
    assert mfu.cpu_machine_key(torch.bfloat16) == mfu.cpu_machine_key() + " | bfloat16"


def test_training_faster_than_a_busy_machines_peak_raises_it(tmp_path, monkeypatch):
    """A first peak measured while something else ran is too low: the run's own rate beats
    it, replaces it (in the cache too), and MFU reads 100%, never 150%."""
    from gptkit.train import logger, mfu

    monkeypatch.setenv("GPTKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(mfu, "_PEAKS", {})
    monkeypatch.setattr(mfu, "measure_matmul_flops", lambda *a, **k: 1e9)  # the busy start-up's measurement
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=65)
    meter = logger.mfu_meter(cfg, 1, "cpu", True)
    tokens_at_the_peak = 1e9 / flops_per_token(cfg)
    assert meter(0.5 * tokens_at_the_peak) == pytest.approx(0.5)
    assert meter(3 * tokens_at_the_peak) == pytest.approx(1.0)  # a better peak, measured by training
    assert meter(1.5 * tokens_at_the_peak) == pytest.approx(0.5)  # against it from now on
    saved = json.loads((tmp_path / "cpu_peak.json").read_text())["peaks"]
    assert saved == {mfu.cpu_machine_key(): pytest.approx(3e9)}  # the next run starts from it


@pytest.mark.parametrize("computes_bf16", [True, False])
def test_a_bfloat16_run_is_measured_against_bfloat16_where_the_cpu_computes_it(tmp_path, monkeypatch, computes_bf16):
    from gptkit.train import logger, mfu

    monkeypatch.setenv("GPTKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(mfu, "_PEAKS", {})
    monkeypatch.setattr(mfu, "cpu_computes_bf16", lambda: computes_bf16)
    measured = []
    monkeypatch.setattr(mfu, "measure_matmul_flops", lambda *a, dtype, **k: measured.append(dtype) or 1e9)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=65)
    meter = logger.mfu_meter(cfg, 1, "cpu", True, torch.bfloat16)
    assert meter(2e9 / flops_per_token(cfg)) == pytest.approx(1.0)
    peak_dtype = torch.bfloat16 if computes_bf16 else torch.float32  # emulated: float32 is the faster peak
    assert measured == [peak_dtype]
    saved = json.loads((tmp_path / "cpu_peak.json").read_text())["peaks"]
    assert saved == {mfu.cpu_machine_key(peak_dtype): pytest.approx(2e9)}
