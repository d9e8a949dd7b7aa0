"""A LoRA run under torchrun with 2 gloo ranks: DDP keeps a whole copy of the
adapters on each rank, FSDP shards them with the frozen base, and both save the
adapters only, in one ckpt.pt, that resumes exactly."""

import pytest
import torch

import train
from gptkit.ops.checkpoint import load_checkpoint
from train_helpers import losses_by_iter, run_torchrun, tiny_args, write_base_checkpoint, write_char_dataset

LORA = dict(lora_rank=4, lora_targets="attn.c_attn,mlp.c_proj", max_iters=8, eval_interval=4, lr_decay_iters=8)


def ok(result):
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def max_diff(a, b):
    assert sorted(a) == sorted(b), (a, b)
    return max(abs(a[i] - b[i]) for i in a)


@pytest.fixture
def setting(tmp_path):
    data = write_char_dataset(tmp_path / "data").parent
    return data, write_base_checkpoint(tmp_path / "base.pt", data)


@pytest.mark.slow
def test_ddp_lora_equals_one_process(setting, tmp_path):
    data, base = setting
    args = dict(LORA, init_from=base, dropout=0.0)  # no dropout: 1 and 2 processes draw different masks
    assert train.main(tiny_args(data, tmp_path / "one", **args)) == 0
    ok(run_torchrun(tiny_args(data, tmp_path / "ddp", **args), cwd=tmp_path))
    assert max_diff(losses_by_iter(tmp_path / "one"), losses_by_iter(tmp_path / "ddp")) < 1e-5
    one, ddp = (load_checkpoint(tmp_path / name / "ckpt.pt") for name in ("one", "ddp"))
    assert set(ddp["model"]) == set(one["model"]) and all("lora_" in k for k in ddp["model"])
    for name, tensor in one["model"].items():
        torch.testing.assert_close(ddp["model"][name], tensor, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_fsdp_lora_saves_one_small_file_and_resumes_exactly_after_sigterm(setting, tmp_path):
    data, base = setting
    args = dict(LORA, init_from=base, dropout=0.1, lora_dropout=0.1, parallel="fsdp")  # the RNG states matter
    ok(run_torchrun(tiny_args(data, tmp_path / "ref", **args), cwd=tmp_path))
    stopped = ok(run_torchrun(tiny_args(data, tmp_path / "cut", **args), cwd=tmp_path, GPT_FAULTS="sigterm_at=5"))
    assert "stopped by SIGTERM at iteration 6" in stopped.stdout
    assert not (tmp_path / "cut" / "ckpt").exists()  # no sharded folder: the adapters are gathered into ckpt.pt
    ckpt = load_checkpoint(tmp_path / "cut" / "ckpt.pt")
    assert ckpt["iter_num"] == 6 and all("lora_" in k for k in ckpt["model"])
    assert len(ckpt["optimizer"][0]["state"]) == len(ckpt["model"]) == 8
    ok(run_torchrun(tiny_args(data, tmp_path / "cut", **dict(args, init_from="resume")), cwd=tmp_path))
    assert max_diff(losses_by_iter(tmp_path / "ref"), losses_by_iter(tmp_path / "cut")) <= 1e-6
    # The same file resumes in one process (the FSDP run's adapters and AdamW moments, whole).
    assert train.main(tiny_args(data, tmp_path / "cut", **dict(args, init_from="resume", parallel="ddp", max_iters=10))) == 0
