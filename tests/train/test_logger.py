"""gptkit/train/logger.py: the training line with and without CUDA memory, and the
memory fields of a CPU run's records."""

import pytest

import train
from gptkit.train import logger
from train_helpers import read_metrics, tiny_args, write_char_dataset

RECORD = {"kind": "train", "iter": 100, "loss": 1.23456, "lr": 1e-3, "grad_norm": 0.851, "ms_per_iter": 35.24,
          "tokens_per_s": 12345.0, "mfu": 0.312, "train_time_s": 3.5}


def test_the_line_shows_peak_cuda_memory_when_the_record_has_it():
    line = logger.format_train_line({**RECORD, "mem_peak_gb": 12.314, "mem_reserved_gb": 14.02}, 5000, eta_s=171)
    assert line == ("step 100/5000 | loss 1.2346 | lr 1.0e-03 | norm 0.85 | 35.2 ms | 12,345 tok/s | mfu 31.2% "
                    "| mem 12.31 GB (14.02 reserved) | eta 2m51s")


def test_no_memory_on_the_line_without_cuda():
    line = logger.format_train_line({**RECORD, "mem_peak_gb": None, "mem_reserved_gb": None}, 5000)
    assert line.endswith("| mfu 31.2%")


@pytest.mark.parametrize("initialized", [False, True])
def test_records_carry_memory_fields_null_on_cpu(tmp_path, monkeypatch, initialized):
    """A CPU run writes the fields as null; where CUDA is in use (patched here) they
    are torch.cuda's peaks, in GB."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3_500_000_000)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 4_000_000_000)
    write_char_dataset(tmp_path / "data")
    assert train.main(tiny_args(tmp_path / "data", tmp_path / "out", max_iters=2, eval_interval=2)) == 0
    records = read_metrics(tmp_path / "out", "train")
    expected = (3.5, 4.0) if initialized else (None, None)
    assert [(r["mem_peak_gb"], r["mem_reserved_gb"]) for r in records] == [expected] * 2
