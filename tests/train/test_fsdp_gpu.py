"""FSDP2 on one CUDA device under torchrun (world size 1), bf16: trains, writes a
sharded checkpoint, resumes from it, converts to one file; and compiles.
Skipped without a GPU; run by scripts/gpu_check.sh."""

import pytest
import torch

from gptkit.checkpoint import load_checkpoint
from gptkit.train import sharded
from train_helpers import read_metrics, run_torchrun, tiny_args, write_char_dataset

pytestmark = pytest.mark.gpu


def ok(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_fsdp_bf16_on_one_gpu_trains_resumes_and_converts(tmp_path):
    data = write_char_dataset(tmp_path / "data").parent
    out = tmp_path / "out"
    args = dict(device="cuda", dtype="bfloat16", parallel="fsdp", activation_checkpointing="true",
                n_embd=64, eval_iters=4, eval_interval=30, compile="false")
    first = ok(run_torchrun(tiny_args(data, out, max_iters=60, **args), nproc=1, cwd=tmp_path))
    assert "world size 1" in first.stdout and "bfloat16" in first.stdout
    evals = read_metrics(out, "eval")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5
    assert sharded.read_run(out / "ckpt")["iter_num"] == 60
    ok(run_torchrun(tiny_args(data, out, max_iters=70, init_from="resume", **args), nproc=1, cwd=tmp_path))
    assert [r["iter"] for r in read_metrics(out, "train")][-1] == 69
    single = load_checkpoint(sharded.sharded_to_single(out, tmp_path / "ckpt.pt"))
    # the master weights stay float32: only the gathered copies for compute are bf16
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in single["model"].values())


def test_fsdp_compiles_on_one_gpu(tmp_path):
    data = write_char_dataset(tmp_path / "data").parent
    result = ok(run_torchrun(tiny_args(data, tmp_path / "out", device="cuda", dtype="bfloat16", parallel="fsdp",
                                       compile="true", max_iters=20, eval_interval=20, eval_iters=2), nproc=1, cwd=tmp_path))
    assert "torch.compile failed" not in result.stderr, result.stderr[-3000:]
