"""torchrun on one CUDA device (world size 1): DDP under NCCL with gradient accumulation
and resume; FSDP2 in bf16 (train, sharded checkpoint, resume, conversion to one file);
FSDP with activation checkpointing and torch.compile; Muon on FSDP shards.
Skipped without a GPU; run by scripts/gpu_check.sh."""

import json

import pytest
import torch

import train
from gptkit.ops.checkpoint import load_checkpoint
from gptkit.train import sharded
from train_helpers import losses_by_iter, read_metrics, run_torchrun, tiny_args, write_char_dataset

pytestmark = pytest.mark.gpu


def ok(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def max_diff(a, b, iters):
    return max(abs(a[i] - b[i]) for i in iters)


def test_ddp_under_nccl_with_accumulation_resumes_like_one_uninterrupted_process(tmp_path):
    """float32 and no dropout; the cuDNN/SDPA backward kernels are not bit-deterministic,
    so the losses agree closely, not exactly."""
    data = write_char_dataset(tmp_path / "data").parent
    args = dict(device="cuda", dtype="float32", compile="false", dropout=0.0, gradient_accumulation_steps=4,
                eval_interval=10, eval_iters=2, n_embd=64)
    assert train.main(tiny_args(data, tmp_path / "one", max_iters=20, **args)) == 0
    first = ok(run_torchrun(tiny_args(data, tmp_path / "ddp", max_iters=10, backend="nccl", **args), nproc=1, cwd=tmp_path))
    assert "world size 1" in first.stdout
    ok(run_torchrun(tiny_args(data, tmp_path / "ddp", max_iters=20, backend="nccl", init_from="resume", **args),
                    nproc=1, cwd=tmp_path))
    one, ddp = losses_by_iter(tmp_path / "one"), losses_by_iter(tmp_path / "ddp")
    assert sorted(ddp) == list(range(20))
    assert max_diff(one, ddp, range(20)) < 2e-3, (one, ddp)


def test_fsdp_bf16_on_one_gpu_trains_resumes_and_converts(tmp_path):
    data = write_char_dataset(tmp_path / "data").parent
    out = tmp_path / "out"
    args = dict(device="cuda", dtype="bfloat16", parallel="fsdp", n_embd=64, eval_iters=4, eval_interval=30, compile="false")
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


def test_fsdp_with_activation_checkpointing_compiles_and_learns(tmp_path):
    data = write_char_dataset(tmp_path / "data").parent
    out = tmp_path / "out"
    result = ok(run_torchrun(tiny_args(data, out, device="cuda", dtype="bfloat16", parallel="fsdp",
                                       activation_checkpointing="true", compile="true", n_embd=64, max_iters=40,
                                       eval_interval=20, eval_iters=4), nproc=1, cwd=tmp_path))
    assert "torch.compile failed" not in result.stderr, result.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["compile"] == "true" and config["activation_checkpointing"] is True
    assert read_metrics(out, "note") == []
    evals = read_metrics(out, "eval")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.3


def test_muon_on_fsdp_shards_equals_one_process_on_cuda(tmp_path):
    """Muon's Newton-Schulz runs in bf16 on CUDA on both sides; the FSDP side gathers each
    matrix, orthogonalises it and cuts its shard back out."""
    data = write_char_dataset(tmp_path / "data").parent
    args = dict(device="cuda", dtype="float32", compile="false", dropout=0.0, optimizer="muon", max_iters=10,
                eval_interval=10, eval_iters=2, n_embd=64)
    assert train.main(tiny_args(data, tmp_path / "one", **args)) == 0
    ok(run_torchrun(tiny_args(data, tmp_path / "fsdp", parallel="fsdp", **args), nproc=1, cwd=tmp_path))
    one, fs = losses_by_iter(tmp_path / "one"), losses_by_iter(tmp_path / "fsdp")
    assert max_diff(one, fs, range(10)) < 2e-3, (one, fs)
    assert fs[9] < fs[0] - 0.3
