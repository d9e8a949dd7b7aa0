"""gptkit/dataset.py: dataset checks, the batch sampler as a pure function, window reads."""

import json

import numpy as np
import pytest
import torch

from gptkit import dataset as data
from gptkit.errors import UserError
from train_helpers import write_char_dataset


def test_global_batch_offsets_is_a_pure_function_of_seed_and_step():
    a = data.global_batch_offsets(1337, 5, 10_000, 32, 64)
    assert a.dtype == np.int64 and a.shape == (64,)
    assert np.array_equal(a, data.global_batch_offsets(1337, 5, 10_000, 32, 64))
    assert not np.array_equal(a, data.global_batch_offsets(1337, 6, 10_000, 32, 64))
    assert not np.array_equal(a, data.global_batch_offsets(1338, 5, 10_000, 32, 64))
    many = data.global_batch_offsets(0, 0, 100, 32, 100_000)
    assert many.min() == 0 and many.max() == 100 - 32 - 1  # every window fits, both ends reachable


def test_ranks_share_exactly_the_windows_of_one_process():
    B, G = 4, 8  # global: 8 micro-batches of 4 windows
    offsets = data.global_batch_offsets(1, 3, 50_000, 16, B * G)
    one_process = [data.micro_batch_offsets(offsets, B, m) for m in range(G)]
    for world in (2, 4, 8):
        local = G // world
        shares = [data.micro_batch_offsets(offsets, B, r * local + m) for r in range(world) for m in range(local)]
        assert np.array_equal(np.concatenate(shares), np.concatenate(one_process))


@pytest.mark.parametrize("dtype, top", [("uint16", 65_535), ("uint32", 70_000)])
def test_token_bin_reads_windows_exactly(tmp_path, dtype, top):
    ids = np.arange(1000, dtype=np.int64) * (top // 999)
    ids[-1] = top  # 70000 must survive (a uint16 would wrap it to 4464)
    path = tmp_path / "x.bin"
    ids.astype(dtype).tofile(path)
    bin_ = data.TokenBin(path, dtype)
    assert bin_.n_tokens == 1000
    got = bin_.read_windows(np.array([0, 500, 989]), 11)
    assert got.dtype == np.int64
    assert np.array_equal(got, np.stack([ids[0:11], ids[500:511], ids[989:1000]]))
    bin_.close()


def test_batches_give_inputs_and_next_token_targets(tmp_path):
    folder = write_char_dataset(tmp_path)
    meta = data.load_meta(tmp_path, "tiny", block_size=8)
    batches = data.Batches(tmp_path, "tiny", meta, 8, "cpu")
    x, y = batches.get("train", np.array([0, 100]))
    raw = np.fromfile(folder / "train.bin", dtype=np.uint16).astype(np.int64)
    assert x.shape == y.shape == (2, 8) and x.dtype == torch.int64
    assert torch.equal(x[1], torch.from_numpy(raw[100:108])) and torch.equal(y[1], torch.from_numpy(raw[101:109]))
    batches.close()


def test_eval_windows_whole_split_and_fixed_sample():
    whole = data.eval_offsets(0, "val", 1000, 32, 8, eval_iters=0)
    starts = np.concatenate(whole)
    assert np.array_equal(starts, np.arange(0, 1000 - 32, 32))  # consecutive, non-overlapping
    assert starts[-1] + 33 <= 1000 and starts[-1] + 32 + 33 > 1000  # nothing left that fits
    assert all(len(b) == 8 for b in whole[:-1]) and 1 <= len(whole[-1]) <= 8
    sample = data.eval_offsets(0, "val", 10_000, 32, 8, eval_iters=5)
    assert len(sample) == 5 and all(len(b) == 8 for b in sample)
    assert all(np.array_equal(a, b) for a, b in zip(sample, data.eval_offsets(0, "val", 10_000, 32, 8, 5)))
    other = data.eval_offsets(0, "train", 10_000, 32, 8, eval_iters=5)
    assert not np.array_equal(sample[0], other[0])


def test_load_meta_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(UserError, match=r"dataset folder .*shakespeare_char does not exist: run python prepare.py shakespeare_char"):
        data.load_meta(tmp_path, "shakespeare_char")
    folder = write_char_dataset(tmp_path)
    with open(folder / "val.bin", "r+b") as f:
        f.truncate(101)
    with pytest.raises(UserError, match="val.bin holds 101 bytes but meta.json says .* truncated or stale"):
        data.load_meta(tmp_path, "tiny")
    folder = write_char_dataset(tmp_path, name="big")
    meta = json.loads((folder / "meta.json").read_text())
    meta["vocab_size"] = 70_000
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="vocab_size 70000 does not fit dtype uint16"):
        data.load_meta(tmp_path, "big")
    folder = write_char_dataset(tmp_path, name="short", text="abc" * 50)
    with pytest.raises(UserError, match="val.bin has 15 tokens, fewer than one window"):
        data.load_meta(tmp_path, "short", block_size=32)
    (folder / "meta.json").unlink()
    with pytest.raises(UserError, match="has no meta.json"):
        data.load_meta(tmp_path, "short")


def test_ensure_dataset_prepares_only_known_names(tmp_path, shakespeare_path, monkeypatch):
    assert data.ensure_dataset(tmp_path, "mine") is False
    monkeypatch.setenv("TINYSHAKESPEARE", str(shakespeare_path))
    assert data.ensure_dataset(tmp_path, "shakespeare_char") is True
    meta = data.load_meta(tmp_path, "shakespeare_char", block_size=256)
    assert meta["vocab_size"] == 65 and meta["tokenizer"]["type"] == "char"
    assert data.ensure_dataset(tmp_path, "shakespeare_char") is False  # already there
