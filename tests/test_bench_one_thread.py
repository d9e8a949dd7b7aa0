"""benchmarks/one_thread.py and bench_sample's --one_thread arithmetic: CPU seconds of a
child process, the nanoGPT checkout check, the whole-split loss, the per-token floor."""

import os
import sys

import numpy as np
import pytest
import torch

from benchmarks import one_thread
from benchmarks.bench_sample import floor_ms, per_token_cpu, save_nanogpt_baby
from gptkit.ops.errors import UserError
from train_helpers import write_char_dataset


def test_child_cpu_seconds_count_a_busy_child(tmp_path):
    busy = [sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"]
    r = one_thread.run_one_thread(busy, tmp_path, tmp_path / "log.txt")
    assert 0.25 < r["cpu_s"] < r["wall_s"] + 0.5
    with pytest.raises(RuntimeError, match="exited with 3"):
        one_thread.run_one_thread([sys.executable, "-c", "raise SystemExit(3)"], tmp_path, tmp_path / "log2.txt")


def test_a_folder_that_is_not_nanogpt_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv(one_thread.NANOGPT_ENV, raising=False)
    assert one_thread.nanogpt_dir(None) is None
    (tmp_path / "train.py").write_text("")
    with pytest.raises(UserError, match="not a nanoGPT checkout .missing model.py"):
        one_thread.nanogpt_dir(str(tmp_path))


def test_whole_split_loss_of_a_nanogpt_checkpoint(tmp_path):
    from benchmarks.bench_sample import write_char_meta

    folder = write_char_dataset(tmp_path / "data", "tiny")
    chars = __import__("json").loads((folder / "meta.json").read_text())["tokenizer"]["chars"]
    write_char_meta(tmp_path / "meta.pkl", chars)
    T = 16
    model = save_nanogpt_baby(tmp_path / "out", 0, n_layer=1, n_head=2, n_embd=16, block_size=T, vocab_size=len(chars))
    loss, iters = one_thread.full_split_val_loss(tmp_path / "out" / "ckpt.pt", tmp_path / "meta.pkl",
                                                 data_dir=tmp_path / "data", dataset="tiny", batch_size=5)
    # the same windows cut by hand: consecutive, non-overlapping, each with its next-token targets
    val = np.fromfile(folder / "val.bin", dtype=np.uint16).astype(np.int64)
    starts = range(0, len(val) - T, T)
    x = torch.tensor(np.stack([val[s : s + T] for s in starts]))
    y = torch.tensor(np.stack([val[s + 1 : s + T + 1] for s in starts]))
    with torch.no_grad():
        expected = model.eval()(x, y)[1].item()
    assert iters == 0 and loss == pytest.approx(expected, rel=1e-5)


def test_per_token_cost_and_floor():
    assert per_token_cpu(12.0, 2.0, 11) == pytest.approx(1000.0)  # start-up cancels
    # 1M weights: 4 MB at 4 GB/s is 1 ms; 2 MFLOP at 1 GFLOP/s is 2 ms: the slower wins
    assert floor_ms(1_000_000, 1, 4e9, 1e9) == pytest.approx(2.0)
    assert floor_ms(1_000_000, 1, 1e9, 1e12) == pytest.approx(4.0)
    assert floor_ms(1_000_000, 10, 1e9, 1e12) == pytest.approx(0.4)  # ten rows share one read


def test_the_one_thread_tables_leave_nothing_in_the_temporary_folder(tmp_path, monkeypatch):
    # bench.py sample --one_thread left its work folder (the baby GPT's 43 MB checkpoint) behind every run.
    import argparse
    import tempfile

    import torch

    from benchmarks import bench_sample

    def baby(folder, seed):
        folder.mkdir(parents=True)
        (folder / "ckpt.pt").write_bytes(b"x" * 1000)
        return torch.nn.Linear(4, 4)

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(bench_sample, "measure_floor_rates", lambda: (1e10, 1e10))
    monkeypatch.setattr(bench_sample, "save_nanogpt_baby", baby)
    monkeypatch.setattr(one_thread, "run_one_thread", lambda command, cwd, log: {"cpu_s": 2.0 if "40" in command[-1] else 1.0, "wall_s": 1.0})
    monkeypatch.setattr(bench_sample, "one_thread_batched_table", lambda *a: "batched")
    monkeypatch.setattr(bench_sample, "quick_start_checkpoint", lambda out_dir: None)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    args = argparse.Namespace(quick=True, nanogpt=None, new_tokens=40, repeats=1, seed=1, no_exact=False,
                              out_dir="out-shakespeare")
    tables = bench_sample.one_thread_tables(args)
    assert len(tables) == 2 and tables[1] == "batched"
    assert list(tmp_path.iterdir()) == [] and "TORCHINDUCTOR_CACHE_DIR" not in os.environ


def test_the_one_thread_tables_name_a_missing_quick_start_model_before_any_run(tmp_path, monkeypatch):
    # Its batched table needs the quick-start model: without one, the run measured the baby
    # GPT for minutes and only then failed. It must fail first, naming the command to run.
    import argparse
    import tempfile

    from benchmarks import bench_sample
    from gptkit.ops.errors import UserError

    ran = []
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(bench_sample, "measure_floor_rates", lambda: ran.append("floor") or (1e10, 1e10))
    monkeypatch.setattr(one_thread, "run_one_thread", lambda *a: ran.append("run"))
    args = argparse.Namespace(quick=True, nanogpt=None, new_tokens=40, repeats=1, seed=1, no_exact=False,
                              out_dir=str(tmp_path / "no-model-here"))
    with pytest.raises(UserError, match=r"no quick-start model in .*no-model-here.*python train.py configs/shakespeare.py"):
        bench_sample.one_thread_tables(args)
    assert ran == [] and list(tmp_path.iterdir()) == []
