"""Promises of docs/reliability.md that the first version did not keep: one writer
per out_dir, no hang when one rank fails, no non-finite state in a checkpoint,
token ids checked against the vocabulary, no piles of temporary files, no silent
overwrite of a run, and clear errors for impossible settings."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import train
from gptkit.ops.checkpoint import deferred_interrupts, load_checkpoint, non_finite_tensors
from gptkit.ops.errors import RunFailed, UserError
from repo import reset_sigint
from train_helpers import REPO, read_metrics, run_train_subprocess, subprocess_env, tiny_args, write_char_dataset


@pytest.fixture
def data_dir(tmp_path):
    write_char_dataset(tmp_path / "data")
    return tmp_path / "data"


def start_train(args, **env):
    return subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args], cwd=REPO, env=subprocess_env(**env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=reset_sigint,
    )


def wait_for_line(proc, text, timeout=60):
    """Read proc's stdout until a line contains `text`; return what was read."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"{text!r} never appeared: {''.join(seen)[-2000:]} {proc.stderr.read()[-2000:]}")


def all_finite(path):
    return non_finite_tensors(load_checkpoint(path)) == []


# ---- one writer per out_dir ---------------------------------------------------------


def test_second_run_on_a_live_out_dir_is_refused_and_a_killed_one_does_not_block(data_dir, tmp_path):
    out = tmp_path / "out"
    first = start_train(tiny_args(data_dir, out, max_iters=100000, eval_interval=5, lr_decay_iters=100000))
    try:
        wait_for_line(first, "step 6/")  # a checkpoint exists (eval at 5)
        with pytest.raises(UserError, match=rf"{out} is in use by another training run \(pid {first.pid} on "):
            train.main(tiny_args(data_dir, out, init_from="resume", max_iters=100000, lr_decay_iters=100000))
        with pytest.raises(UserError, match="is in use by another training run"):
            train.main(tiny_args(data_dir, out, overwrite="true"))
    finally:
        first.kill()  # as kill -9 or a power cut: no clean-up runs
        first.communicate()
    stale = out / f".ckpt.pt.tmp-{first.pid}"
    stale.write_bytes(b"half a checkpoint")
    assert train.main(tiny_args(data_dir, out, init_from="resume", max_iters=12, lr_decay_iters=12)) == 0
    assert not stale.exists()  # its writer is gone: removed at the next start
    assert all_finite(out / "ckpt.pt")


def test_a_live_processes_temporary_file_is_kept(data_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = out / f".ckpt.pt.tmp-{other.pid}"
        live.write_bytes(b"being written")
        dead = out / ".best.pt.tmp-999999999"
        dead.write_bytes(b"left behind")
        assert train.main(tiny_args(data_dir, out, max_iters=2)) == 0
        assert live.exists() and not dead.exists()
    finally:
        other.kill()
        other.wait()


# ---- a new run never destroys an old one ---------------------------------------------


def test_scratch_run_into_an_existing_run_is_refused_unless_overwrite(data_dir, tmp_path):
    out = tmp_path / "out"
    assert train.main(tiny_args(data_dir, out, max_iters=10)) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.suffix == ".pt"}
    with pytest.raises(UserError) as e:
        train.main(tiny_args(data_dir, out, max_iters=12))
    assert str(out) in str(e.value) and "--init_from=resume" in str(e.value) and "--overwrite=true" in str(e.value)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.suffix == ".pt"} == before
    assert train.main(tiny_args(data_dir, out, max_iters=4, overwrite="true")) == 0
    iters = [r["iter"] for r in read_metrics(out, "train")]
    assert iters == sorted(iters) and iters[0] == 0 and iters[-1] == 3  # metrics.jsonl holds one run


def test_out_dir_that_is_a_file_is_refused_and_nothing_written(data_dir, tmp_path):
    target = tmp_path / "taken"
    target.write_text("not a folder")
    with pytest.raises(UserError, match="exists and is not a folder"):
        train.main(tiny_args(data_dir, target))
    assert target.read_text() == "not a folder"


def test_a_run_refused_at_start_leaves_no_out_dir(tmp_path):
    write_char_dataset(tmp_path / "data", text="abcdefgh" * 4)  # too short for block 32
    with pytest.raises(UserError, match="fewer than one window"):
        train.main(tiny_args(tmp_path / "data", tmp_path / "out"))
    assert not (tmp_path / "out").exists()


# ---- settings that cannot work ----------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ({"learning_rate": "inf"}, "learning_rate=inf must be a finite number"),
        ({"muon_lr": "nan"}, "muon_lr=nan must be a finite number"),
        ({"muon_weight_decay": "-0.1"}, "muon_weight_decay=-0.1 must be a finite number"),
        ({"optimizer": "adamw", "muon_weight_decay": "0.05"}, "muon_weight_decay=0.05 decays Muon's matrices, but optimizer=adamw"),
        ({"optimizer": "adamw", "muon_normuon": "true"}, "muon_normuon=true changes Muon's step, but optimizer=adamw"),
        ({"optimizer": "muon", "muon_cautious_wd": "true"}, "muon_cautious_wd=true chooses where Muon's weight decay acts, but muon_weight_decay=0"),
        ({"weight_decay": "-1"}, "weight_decay=-1.0 must be a finite number, not negative"),
        ({"optimizer": "muon", "muon_lr": "20", "muon_weight_decay": "0.1"},
         r"muon_lr x muon_weight_decay = 2 must be below 1: decoupled weight decay multiplies each weight by "
         r"1 - 2 every step, which zeroes it or flips its sign; lower one of them"),
        ({"optimizer": "muon", "muon_lr": "0.5", "muon_weight_decay": "2"}, "muon_lr x muon_weight_decay = 1 must be"),
        ({"learning_rate": "10", "weight_decay": "0.5"}, "learning_rate x weight_decay = 5 must be below 1"),
        ({"optimizer": "muon", "muon_lr": "1e308", "muon_weight_decay": "1e308"},
         "muon_lr x muon_weight_decay = inf must be below 1"),
        ({"beta1": "1.5"}, r"beta1=1.5 must be in \[0, 1\)"),
        ({"beta2": "1"}, r"beta2=1.0 must be in \[0, 1\)"),
        ({"seed": str(2**70)}, "seed=.* must be between 0 and"),
        ({"seed": "-1"}, "seed=-1 must be between 0 and"),
        ({"time_budget": "-5"}, "time_budget=-5.0 must be a finite number of seconds"),
        ({"time_budget": "inf"}, "time_budget=inf must be a finite number of seconds"),
        ({"max_iters": "500", "lr_decay_iters": "400", "min_lr": "0"}, "steps 400 to 499 would train at learning rate 0"),
    ],
)
def test_impossible_settings_are_refused_before_any_work(tmp_path, override, message):
    with pytest.raises(UserError, match=message):
        train.main(tiny_args(tmp_path / "nodata", tmp_path / "out", **override))
    assert not (tmp_path / "out").exists()


def test_an_impossible_setting_exits_2_without_a_traceback(tmp_path):
    result = run_train_subprocess(tiny_args(tmp_path / "nodata", tmp_path / "out", beta1=2))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: invalid training settings: beta1=2.0")


def test_schedule_follows_max_iters_unless_lr_decay_iters_is_set(data_dir, tmp_path):
    from gptkit.config import parse_settings
    from gptkit.train.optim import lr_at

    args = [a for a in tiny_args(data_dir, tmp_path / "o") if not a.startswith("--lr_decay_iters")]
    _, cfg = parse_settings(args + ["--max_iters=500", "--min_lr=0"], [train.GPTConfig, train.TrainConfig])
    assert cfg.lr_decay_iters == 500 and lr_at(499, cfg) > 0
    _, cfg = parse_settings(args + ["--max_iters=500", "--lr_decay_iters=300", "--min_lr=1e-4"], [train.GPTConfig, train.TrainConfig])
    assert cfg.lr_decay_iters == 300 and lr_at(499, cfg) == pytest.approx(1e-4)


def test_warmup_longer_than_the_run_is_warned(data_dir, tmp_path, capsys):
    assert train.main(tiny_args(data_dir, tmp_path / "out", max_iters=3, warmup_iters=10, lr_decay_iters=3)) == 0
    assert "warmup_iters=10 >= max_iters=3" in capsys.readouterr().out


# ---- non-finite state never reaches a checkpoint ---------------------------------------


def test_exploding_weights_are_never_saved_and_last_good_checkpoint_is_finite(data_dir, tmp_path):
    """A learning rate of 1e30 blows up every weight at the first step: the run must
    stop, and every checkpoint left on disk (the one it names too) must be finite. (A
    weight decay that large is refused before any work: test_impossible_settings...)"""
    out = tmp_path / "out"
    assert train.main(tiny_args(data_dir, out, max_iters=4, eval_interval=2)) == 0
    result = run_train_subprocess(tiny_args(data_dir, out, init_from="resume", max_iters=40, eval_interval=1,
                                            lr_decay_iters=40, learning_rate=1e30, min_lr=0,
                                            weight_decay=0))
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert f"Last good checkpoint: {out / 'ckpt.pt'} (iteration 4)" in result.stderr, result.stderr
    for name in ("ckpt.pt", "best.pt"):
        assert all_finite(out / name)
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 4


def test_save_refuses_non_finite_tensors_and_keeps_the_previous_file(tmp_path):
    from gptkit.ops.checkpoint import save_checkpoint

    path = tmp_path / "ckpt.pt"
    save_checkpoint({"model": {"w": torch.ones(3)}}, path)
    bad = {"model": {"w": torch.ones(3)}, "optimizer": [{"state": {0: {"exp_avg": torch.tensor([1.0, float("inf")])}}}]}
    with pytest.raises(RunFailed, match=r"\['optimizer'\]\[0\]\['state'\]\[0\]\['exp_avg'\] holds NaN or inf"):
        save_checkpoint(bad, path)
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_resuming_a_non_finite_checkpoint_is_refused(data_dir, tmp_path):
    out = tmp_path / "out"
    assert train.main(tiny_args(data_dir, out, max_iters=2)) == 0
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    next(iter(ckpt["model"].values())).fill_(float("nan"))
    torch.save(ckpt, out / "ckpt.pt")  # written by something other than us
    with pytest.raises(UserError, match="holds NaN or inf: this checkpoint cannot be resumed"):
        train.main(tiny_args(data_dir, out, init_from="resume", max_iters=4))


# ---- token ids and the vocabulary ----------------------------------------------------


def test_token_id_beyond_the_vocabulary_is_named_before_training(data_dir, tmp_path):
    ids = np.fromfile(data_dir / "tiny" / "train.bin", dtype=np.uint16)
    ids[1234] = 999
    ids.tofile(data_dir / "tiny" / "train.bin")
    with pytest.raises(UserError, match=r"train.bin holds token id 999 \(first bad id at token 1,234\)"):
        train.main(tiny_args(data_dir, tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_token_id_beyond_the_vocabulary_in_a_large_bin_is_caught_at_its_batch(data_dir, tmp_path, monkeypatch):
    from gptkit.data import dataset

    monkeypatch.setattr(dataset, "FULL_SCAN_BYTES", 0)  # as for a bin too large to scan at start-up
    ids = np.fromfile(data_dir / "tiny" / "train.bin", dtype=np.uint16)
    ids[:] = 70  # every window is bad, so the first batch finds it
    ids.tofile(data_dir / "tiny" / "train.bin")
    with pytest.raises(UserError, match="holds token id 70 .* the vocabulary has"):
        train.main(tiny_args(data_dir, tmp_path / "out"))


def test_meta_vocab_size_that_disagrees_with_the_tokenizer_is_refused(data_dir, tmp_path):
    meta_path = data_dir / "tiny" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["vocab_size"] -= 5
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(UserError, match="disagrees with its char tokenizer"):
        train.main(tiny_args(data_dir, tmp_path / "out"))


# ---- interrupts ------------------------------------------------------------------------


def test_ctrl_c_during_a_save_waits_for_the_file(tmp_path, default_sigint):
    path = tmp_path / "x.txt"
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the signal is held: nothing is raised in here
            path.write_text("complete")
    assert path.read_text() == "complete"


def test_ctrl_c_during_a_long_evaluation_stops_within_seconds(data_dir, tmp_path):
    out = tmp_path / "out"
    proc = start_train(tiny_args(data_dir, out, eval_iters=100000, max_iters=10))  # a very long first evaluation
    try:
        wait_for_line(proc, "parameters")
        time.sleep(2)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 10
    assert proc.returncode == 0, stderr
    assert "stopping at the end of this step" in stderr  # the first Ctrl-C says what it does
    assert "stopped by SIGINT during the evaluation at iteration 0: nothing trained yet" in stdout


def test_evaluation_progress_is_logged_when_output_is_not_a_terminal(data_dir, tmp_path, monkeypatch, capsys):
    from gptkit.train import logger

    monkeypatch.setattr(logger.EvalProgress, "PERIOD", 0.0)
    assert train.main(tiny_args(data_dir, tmp_path / "out", max_iters=1, eval_iters=3)) == 0
    out = capsys.readouterr().out
    assert "eval 0 | train batch 1/3" in out and "eval 0 | val batch 3/3" in out
    assert "in all)" in out.splitlines()[-1]  # the last line says the elapsed time


# ---- distributed failures --------------------------------------------------------------


def torchrun(tmp_path, args, timeout=120, **env):
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py"), *args],
        cwd=tmp_path, env=subprocess_env(**env), capture_output=True, text=True, timeout=timeout,
    )
    return result, time.monotonic() - start


def error_lines(result):
    """Lines a rank printed as an error (torchrun's own summary indents its copy)."""
    return [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error")]


@pytest.mark.slow
def test_an_error_on_one_rank_ends_the_job_at_once_and_is_printed_once(data_dir, tmp_path):
    args = tiny_args(data_dir, tmp_path / "out", max_iters=100000, eval_interval=100000, lr_decay_iters=100000)
    result, seconds = torchrun(tmp_path, args, GPT_FAULTS="fail_at=3,fail_rank=1,fail_kind=user")
    assert result.returncode != 0
    assert seconds < 60, seconds  # not the process group's 30-minute timeout
    assert error_lines(result) == ["error on rank 1: injected user error at iteration 3 (GPT_FAULTS)"], result.stderr[-3000:]
    assert "Root Cause" in result.stderr and "traceback : error on rank 1: injected user error" in result.stderr


@pytest.mark.slow
def test_a_mistake_every_rank_makes_is_printed_once_by_rank_0(data_dir, tmp_path):
    result, _ = torchrun(tmp_path, tiny_args(data_dir, tmp_path / "out", gradient_accumulation_steps=3))
    assert result.returncode != 0
    assert error_lines(result) == [
        "error: gradient_accumulation_steps=3 (the global count) must be divisible by the number of ranks, 2: "
        "use a multiple of 2, e.g. --gradient_accumulation_steps=6 --batch_size=2 for about the same global batch"
    ]
    # After the process group exists: every rank finds no checkpoint to resume; one message.
    result, _ = torchrun(tmp_path, tiny_args(data_dir, tmp_path / "none", init_from="resume"))
    assert result.returncode != 0
    lines = error_lines(result)
    assert len(lines) == 1 and "ckpt.pt does not exist" in lines[0], result.stderr[-3000:]


def test_a_full_disk_at_the_first_write_is_a_clear_error_and_leaves_nothing(data_dir, tmp_path):
    out = tmp_path / "out"
    code = f"""
import resource, signal, sys
sys.path.insert(0, {str(REPO)!r})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG from write(), as a full disk gives ENOSPC
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # the lock fits, config.json does not
import train
from gptkit.ops.errors import run_main
run_main(train.main, {tiny_args(data_dir, out)!r})
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=subprocess_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert f"error: could not write {out / 'config.json'}" in result.stderr
    assert not out.exists()


def test_batches_no_machine_can_hold_are_refused_before_any_work(tmp_path):
    with pytest.raises(UserError, match="tokens in one micro-batch"):
        train.main(tiny_args(tmp_path / "nodata", tmp_path / "out", batch_size=10**8, block_size=64))
    with pytest.raises(UserError, match="windows per evaluation"):
        train.main(tiny_args(tmp_path / "nodata", tmp_path / "out", batch_size=10**5, eval_iters=1000))
    assert not (tmp_path / "out").exists()


def test_running_out_of_memory_is_a_message_not_a_traceback(capsys):
    from gptkit.ops.errors import run_main

    def main(argv):
        torch.empty(2**62, dtype=torch.uint8)  # no machine has 4 EiB

    with pytest.raises(SystemExit) as e:
        run_main(main)
    assert e.value.code == 1
    assert capsys.readouterr().err.startswith("error: out of memory (")


def test_a_final_evaluation_that_fails_loses_no_trained_step(data_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real_evaluate, calls = train.evaluate, []

    def out_of_memory_at_the_end(model, plan, stop, progress):
        calls.append(progress.iter_num)
        if progress.iter_num == 20:
            raise torch.OutOfMemoryError("CPU out of memory (injected in the final evaluation)")
        return real_evaluate(model, plan, stop, progress)

    monkeypatch.setattr(train, "evaluate", out_of_memory_at_the_end)
    with pytest.raises(torch.OutOfMemoryError):
        train.main(tiny_args(data_dir, out, max_iters=20, eval_interval=15))
    assert calls == [0, 15, 20]
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["iter_num"] == 20 and ckpt["last_eval_iter"] == 15  # the trained steps, saved before the evaluation
    assert load_checkpoint(out / "best.pt")["iter_num"] == 15  # best follows the evaluations only
    monkeypatch.setattr(train, "evaluate", real_evaluate)
    assert train.main(tiny_args(data_dir, out, max_iters=20, eval_interval=15, init_from="resume")) == 0
    assert [r["iter"] for r in read_metrics(out, "eval")] == [0, 15, 20]  # the missing evaluation, done on resume
    assert load_checkpoint(out / "ckpt.pt")["last_eval_iter"] == 20


def test_the_eta_follows_the_mean_of_recent_steps_not_the_last_one():
    from types import SimpleNamespace

    from gptkit.train import logger, optim
    from gptkit.run_state import RunState

    cfg = SimpleNamespace(out_dir="unused", log_interval=1, max_iters=1000, wandb_log=False, init_from="scratch",
                          progress_bar=False, time_budget=0.0)
    log = logger.Logger(cfg, RunState(), {}, enabled=False, schedule=optim.Schedule(cfg, "cpu"),
                        default_project="unused")
    log.advance(30.0)  # the first step compiles: not the pace
    assert log.seconds_per_iter == 30.0
    for _ in range(logger.ETA_WINDOW):
        log.advance(0.1)
    assert log.seconds_per_iter == pytest.approx(0.1)
    log.advance(10.0)  # one step 100x slower on a loaded machine moves the pace by a 100th of it
    assert log.seconds_per_iter == pytest.approx(0.1 + 9.9 / logger.ETA_WINDOW)
