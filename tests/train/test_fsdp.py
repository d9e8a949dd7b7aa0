"""FSDP2 under torchrun with two gloo ranks on a CPU: the same numbers as one
process, resumes that are exact (same ranks) or close (another number of
ranks), sharded saves that survive kill -9, and activation checkpointing."""

import shutil
import subprocess
import sys

import pytest
import torch

import train
from gptkit.ops.errors import UserError
from gptkit.train import sharded
from train_helpers import REPO, losses_by_iter, read_metrics, run_torchrun, subprocess_env, tiny_args, write_char_dataset


def one_process(args):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun worker (OMP_NUM_THREADS=1): the same kernels
    try:
        assert train.main(args) == 0
    finally:
        torch.set_num_threads(threads)


def ok(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def max_diff(a, b, steps):
    return max(abs(a[i] - b[i]) for i in steps)


@pytest.mark.slow
def test_fsdp_equals_one_process_and_ddp_and_converts_to_a_file_sample_reads(tmp_path):
    data = write_char_dataset(tmp_path / "data").parent
    # dropout 0: each rank draws its own masks, so only then can the runs agree exactly.
    args = dict(max_iters=20, eval_interval=10, gradient_accumulation_steps=4, dropout=0.0)
    one_process(tiny_args(data, tmp_path / "one", **args))
    # FSDP with activation checkpointing: recomputing the blocks must not change a number.
    fsdp = ok(run_torchrun(tiny_args(data, tmp_path / "fsdp", parallel="fsdp", activation_checkpointing="true", **args), cwd=tmp_path))
    ok(run_torchrun(tiny_args(data, tmp_path / "ddp", **args), cwd=tmp_path))
    assert "world size 2" in fsdp.stdout
    one, fs, ddp = (losses_by_iter(tmp_path / name) for name in ("one", "fsdp", "ddp"))
    assert sorted(fs) == list(range(20))
    assert max_diff(one, fs, range(20)) < 1e-5, (one, fs)
    assert max_diff(ddp, fs, range(20)) < 1e-5, (ddp, fs)
    norms = [r["grad_norm"] for r in read_metrics(tmp_path / "fsdp", "train")]
    assert norms == pytest.approx([r["grad_norm"] for r in read_metrics(tmp_path / "one", "train")], rel=1e-4)  # the global norm
    assert sorted(p.name for p in (tmp_path / "fsdp").iterdir()) == [".lock", "best.pt", "ckpt", "config.json", "metrics.jsonl"]
    assert sorted(p.name for p in (tmp_path / "fsdp" / "ckpt").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "run.json"]

    single = sharded.sharded_to_single(tmp_path / "fsdp", tmp_path / "converted.pt")
    from gptkit.ops.checkpoint import load_checkpoint

    converted, best = load_checkpoint(single), load_checkpoint(tmp_path / "fsdp" / "best.pt")
    reference = load_checkpoint(tmp_path / "one" / "ckpt.pt")
    assert converted["iter_num"] == best["iter_num"] == reference["iter_num"] == 20  # val loss fell: best.pt is iteration 20
    for name, tensor in best["model"].items():
        assert torch.equal(converted["model"][name], tensor), name  # the shards put back together exactly
        # summation order differs between 1 and 2 ranks; AdamW's division by sqrt(v)
        # magnifies that for tiny gradients (measured: at most 2.2e-4 after 20 steps)
        assert torch.allclose(converted["model"][name], reference["model"][name], atol=1e-3), name
    sample = subprocess.run([sys.executable, str(REPO / "sample.py"), f"--ckpt={single}", "--device=cpu",
                             "--num_samples=1", "--max_new_tokens=30", "--start=ROMEO:"],
                            cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert sample.returncode == 0, sample.stderr[-2000:]
    assert "ROMEO:" in sample.stdout and len(sample.stdout) > 30

    # A one-file checkpoint (here DDP's ckpt.pt) resumes under FSDP: its AdamW state is cut into shards.
    more = dict(args, max_iters=24)
    one_process(tiny_args(data, tmp_path / "one", init_from="resume", **more))
    ok(run_torchrun(tiny_args(data, tmp_path / "ddp", init_from="resume", parallel="fsdp", **more), cwd=tmp_path))
    one, ddp_then_fsdp = losses_by_iter(tmp_path / "one"), losses_by_iter(tmp_path / "ddp")
    assert max_diff(one, ddp_then_fsdp, range(20, 24)) < 1e-5, (one, ddp_then_fsdp)
    assert sharded.read_run(tmp_path / "ddp" / "ckpt")["iter_num"] == 24


@pytest.mark.slow
@pytest.mark.parametrize("nproc, eval_iters", [(2, 3), (3, 0)])
def test_evaluation_batches_that_do_not_divide_among_the_ranks_finish_with_one_process_losses(tmp_path, nproc, eval_iters):
    """Under FSDP every forward pass is a collective: a rank whose share of the evaluation
    batches has run out must still join the others' forward passes, or the job hangs.
    3 batches on 2 ranks; the whole val split and the 20-batch train sample on 3 ranks."""
    data = write_char_dataset(tmp_path / "data").parent
    args = dict(max_iters=2, eval_interval=2, eval_iters=eval_iters, gradient_accumulation_steps=6, dropout=0.0)
    one_process(tiny_args(data, tmp_path / "one", **args))
    ok(run_torchrun(tiny_args(data, tmp_path / "fsdp", parallel="fsdp", **args), nproc=nproc, timeout=240, cwd=tmp_path))
    one, fs = (read_metrics(tmp_path / name, "eval") for name in ("one", "fsdp"))
    assert [e["iter"] for e in fs] == [0, 2]
    for split in ("val_loss", "train_loss"):
        assert [e[split] for e in fs] == pytest.approx([e[split] for e in one], abs=1e-4), split


@pytest.mark.slow
def test_sigterm_kill_during_save_and_resume_equal_the_uninterrupted_run(tmp_path):
    data = write_char_dataset(tmp_path / "data").parent
    args = dict(max_iters=12, eval_interval=4, dropout=0.1, parallel="fsdp")  # dropout on: the RNG states matter
    ok(run_torchrun(tiny_args(data, tmp_path / "ref", **args), cwd=tmp_path))
    stopped = ok(run_torchrun(tiny_args(data, tmp_path / "two", **args), cwd=tmp_path, GPT_FAULTS="sigterm_at=6"))
    assert "stopped by SIGTERM at iteration 7" in stopped.stdout
    assert sharded.read_run(tmp_path / "two" / "ckpt")["iter_num"] == 7
    shutil.copytree(tmp_path / "two", tmp_path / "one")

    # kill -9 (os._exit on both ranks) halfway through the next save, at iteration 8
    before = (tmp_path / "two" / "ckpt" / "__0_0.distcp").read_bytes()
    died = run_torchrun(tiny_args(data, tmp_path / "two", init_from="resume", **args), cwd=tmp_path, GPT_FAULTS="exit_during_save")
    assert died.returncode != 0
    assert (tmp_path / "two" / ".ckpt.tmp").is_dir()  # the half-done save: never loaded
    assert (tmp_path / "two" / "ckpt" / "__0_0.distcp").read_bytes() == before
    assert sharded.read_run(sharded.find(tmp_path / "two"))["iter_num"] == 7

    ok(run_torchrun(tiny_args(data, tmp_path / "two", init_from="resume", **args), cwd=tmp_path))
    assert not (tmp_path / "two" / ".ckpt.tmp").exists()
    assert sharded.read_run(sharded.find(tmp_path / "two"))["iter_num"] == 12
    ref, two = losses_by_iter(tmp_path / "ref"), losses_by_iter(tmp_path / "two")
    assert sorted(two) == list(range(12))
    assert max_diff(ref, two, range(12)) < 1e-6, (ref, two)
    assert [e["val_loss"] for e in read_metrics(tmp_path / "two", "eval")] == pytest.approx(
        [e["val_loss"] for e in read_metrics(tmp_path / "ref", "eval")], abs=1e-6)

    # One process (no torchrun, plain training) resumes the 2-rank checkpoint: DCP
    # reshards the weights and AdamW's moments; the data is the same global batch, but
    # one process draws one dropout stream where two ranks drew two, so losses differ a little.
    args.pop("parallel")
    one_process(tiny_args(data, tmp_path / "one", init_from="resume", **args))
    one = losses_by_iter(tmp_path / "one")
    assert sorted(one) == list(range(12))
    print("one-rank resume vs two-rank continuation:", {i: round(one[i] - ref[i], 5) for i in range(7, 12)})
    assert max_diff(ref, one, range(7, 12)) < 0.05, (ref, one)
    assert one[11] < ref[0] - 0.3  # it goes on learning from the resumed weights


@pytest.mark.slow
def test_muon_on_sharded_matrices_equals_one_process(tmp_path):
    data = write_char_dataset(tmp_path / "data").parent
    args = dict(max_iters=6, eval_interval=6, dropout=0.0, optimizer="muon")
    one_process(tiny_args(data, tmp_path / "one", **args))
    ok(run_torchrun(tiny_args(data, tmp_path / "fsdp", parallel="fsdp", **args), cwd=tmp_path))
    one, fs = losses_by_iter(tmp_path / "one"), losses_by_iter(tmp_path / "fsdp")
    assert max_diff(one, fs, range(6)) < 1e-5, (one, fs)


def test_activation_checkpointing_on_one_device_changes_no_loss(tmp_path):
    data = write_char_dataset(tmp_path / "data").parent
    args = dict(max_iters=6, eval_interval=6, dropout=0.1)  # checkpoint replays the dropout masks
    assert train.main(tiny_args(data, tmp_path / "plain", **args)) == 0
    assert train.main(tiny_args(data, tmp_path / "ac", activation_checkpointing="true", **args)) == 0
    plain, ac = losses_by_iter(tmp_path / "plain"), losses_by_iter(tmp_path / "ac")
    assert max_diff(plain, ac, range(6)) < 1e-6, (plain, ac)


def test_fsdp_needs_torchrun_and_refuses_float16(tmp_path):
    data = write_char_dataset(tmp_path / "data").parent
    with pytest.raises(UserError, match="torchrun --standalone --nproc_per_node"):
        train.main(tiny_args(data, tmp_path / "out", parallel="fsdp"))
    from gptkit.train import fsdp

    with pytest.raises(UserError, match="--dtype=bfloat16"):
        fsdp.check_settings("fsdp", True, torch.float16)
    assert not (tmp_path / "out").exists()
