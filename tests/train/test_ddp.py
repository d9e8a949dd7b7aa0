"""Two gloo ranks under torchrun train exactly as one process at the same global batch."""

import subprocess
import sys

import pytest
import torch

import train
from train_helpers import REPO, losses_by_iter, read_metrics, subprocess_env, tiny_args, write_char_dataset


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process(tmp_path):
    write_char_dataset(tmp_path / "data")
    # dropout 0: each rank draws its own dropout masks, so only without dropout can
    # two ranks and one process compute the very same numbers.
    args = dict(max_iters=8, eval_interval=4, gradient_accumulation_steps=4, dropout=0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert train.main(tiny_args(tmp_path / "data", tmp_path / "one", **args)) == 0
    finally:
        torch.set_num_threads(threads)
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    result = subprocess.run(
        [*torchrun, "--standalone", "--nproc_per_node=2", str(REPO / "train.py"),
         *tiny_args(tmp_path / "data", tmp_path / "two", **args)],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "world size 2" in result.stdout
    a, b = losses_by_iter(tmp_path / "one"), losses_by_iter(tmp_path / "two")
    assert sorted(a) == sorted(b) == list(range(8))  # rank 0 alone wrote: one line per step
    assert max(abs(a[i] - b[i]) for i in a) < 1e-5, (a, b)
    va = [e["val_loss"] for e in read_metrics(tmp_path / "one", "eval")]
    vb = [e["val_loss"] for e in read_metrics(tmp_path / "two", "eval")]
    assert va == pytest.approx(vb, abs=1e-5)
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == [".lock", "best.pt", "ckpt.pt", "config.json", "metrics.jsonl"]
    assert not any(p.name.endswith(".pt") for p in tmp_path.iterdir())  # no stray files from rank 1


@pytest.mark.slow
def test_sigterm_to_torchrun_stops_both_ranks_at_one_step_with_a_checkpoint(tmp_path):
    import signal
    import time

    from gptkit.ops.checkpoint import load_checkpoint

    write_char_dataset(tmp_path / "data")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py"),
         *tiny_args(tmp_path / "data", out, max_iters=100000, eval_interval=100000)],
        cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            path = out / "metrics.jsonl"
            if path.is_file() and len(read_metrics(out, "train")) >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # torchrun forwards it to both workers
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert "stopped by SIGTERM" in stdout, stdout[-2000:] + stderr[-2000:]
    ckpt = load_checkpoint(out / "ckpt.pt")
    last_logged = read_metrics(out, "train")[-1]["iter"]
    assert ckpt["iter_num"] == last_logged + 1  # saved at the step boundary after the last step
    assert len(ckpt["rng"]["per_rank"]) == 2  # each rank's RNG state, for an exact resume


@pytest.mark.slow
def test_a_time_budget_under_two_ranks_stops_both_at_one_step_and_resumes(tmp_path):
    """Each rank's own clock would end the run at its own step (the other then waits in
    an all-reduce forever) and decay its rate apart: the slowest rank's clock rules both,
    and the run ends once, at one step, with its budget spent, then resumes to a larger one."""
    from gptkit.ops.checkpoint import load_checkpoint

    write_char_dataset(tmp_path / "data")
    out = tmp_path / "out"
    budget = dict(max_iters=100000, eval_interval=100000, time_budget=1.5, warmup_iters=2)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py"),
         *tiny_args(tmp_path / "data", out, **budget)],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ckpt = load_checkpoint(out / "ckpt.pt")
    steps = ckpt["iter_num"]
    assert steps > 5 and f"done: {steps} iterations" in result.stdout
    assert ckpt["train_cpu_s"] >= 1.5  # the budget was spent: the run did not end early
    rates = [r["lr"] for r in read_metrics(out, "train")]
    assert rates[-1] < 0.2 * max(rates)  # the decay followed the budget to its end
    # Resumed to a larger budget, both ranks go on from the saved clock and stop together again.
    more = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py"),
         *tiny_args(tmp_path / "data", out, **dict(budget, time_budget=2.5)), "--init_from=resume"],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    resumed = load_checkpoint(out / "ckpt.pt")
    assert resumed["iter_num"] > steps and resumed["train_cpu_s"] >= 2.5
