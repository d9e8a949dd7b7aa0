"""train.py end to end on CPU with a tiny model: learning, exact resume, signals,
atomic checkpoints, non-finite losses, fp16 loss scaling, settings and data errors,
eval_only, checkpoint policy and wandb offline."""

import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from gptkit.ops.checkpoint import load_checkpoint
from gptkit.ops.device import runs_on_glibc
from gptkit.ops.errors import UserError, run_main
from gptkit.train.settings import check_world_size
import train
from train_helpers import (
    REPO,
    losses_by_iter,
    read_metrics,
    run_train_subprocess,
    subprocess_env,
    tiny_args,
    write_char_dataset,
)




@pytest.fixture
def data_dir(tmp_path):
    write_char_dataset(tmp_path / "data")
    return tmp_path / "data"


def run_main_code(argv):
    with pytest.raises(SystemExit) as info:
        run_main(train.main, argv)
    return info.value.code


def test_short_run_loss_falls(data_dir, tmp_path):
    out = tmp_path / "out"
    assert train.main(tiny_args(data_dir, out, max_iters=40, eval_interval=20, eval_iters=4)) == 0
    evals = read_metrics(out, "eval")
    assert [e["iter"] for e in evals] == [0, 20, 40]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5, evals
    train_records = read_metrics(out, "train")
    assert [r["iter"] for r in train_records] == list(range(40))
    assert set(train_records[0]) >= {"kind", "iter", "loss", "lr", "grad_norm", "ms_per_iter", "tokens_per_s", "mfu", "train_time_s"}
    assert set(evals[0]) == {"kind", "iter", "train_loss", "val_loss", "val_bpb", "train_bpb", "lr", "train_time_s", "train_cpu_s"}
    cpu = [r["train_cpu_s"] for r in train_records]  # CPU seconds without evaluations: they only grow
    assert cpu[0] > 0 and all(b >= a for a, b in zip(cpu, cpu[1:]))
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["iter_num"] == 40 and ckpt["dataset"] == "tiny"
    assert ckpt["tokenizer"]["type"] == "char"
    assert ckpt["model_config"]["vocab_size"] == len(ckpt["tokenizer"]["chars"])
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])
    assert set(ckpt["provenance"]) == {"git_commit", "git_dirty", "torch", "python", "device"}
    assert ckpt["config"]["n_layer"] == 2 and ckpt["config"]["max_iters"] == 40
    assert (out / "config.json").is_file()


def test_a_checkpoint_saved_before_the_newer_loop_fields_still_resumes_exactly(data_dir, tmp_path):
    """Checkpoints older than last_eval_iter, train_time_s and train_cpu_s (flat keys
    iter_num, best_val_loss, val_loss only) resume, and the RunState's other fields
    start from their defaults: the run goes on as if never stopped."""
    full, old = tmp_path / "full", tmp_path / "old"
    assert train.main(tiny_args(data_dir, full, max_iters=20)) == 0
    assert train.main(tiny_args(data_dir, old, max_iters=10)) == 0
    ckpt = load_checkpoint(old / "ckpt.pt")
    for key in ("last_eval_iter", "train_time_s", "train_cpu_s"):
        del ckpt[key]
    torch.save(ckpt, old / "ckpt.pt")
    assert train.main(tiny_args(data_dir, old, max_iters=20, init_from="resume")) == 0
    a, b = losses_by_iter(full), losses_by_iter(old)
    assert sorted(b) == list(range(20)) and all(abs(a[i] - b[i]) < 1e-6 for i in a)
    resumed = load_checkpoint(old / "ckpt.pt")
    assert resumed["iter_num"] == 20 and resumed["last_eval_iter"] == 20 and resumed["train_time_s"] > 0


def test_resume_from_eval_checkpoint_equals_uninterrupted(data_dir, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert train.main(tiny_args(data_dir, full, max_iters=20)) == 0
    assert train.main(tiny_args(data_dir, part, max_iters=10)) == 0  # same schedule (lr_decay_iters=40)
    assert load_checkpoint(part / "ckpt.pt")["iter_num"] == 10
    assert train.main(tiny_args(data_dir, part, max_iters=20, init_from="resume")) == 0
    a, b = losses_by_iter(full), losses_by_iter(part)
    assert sorted(a) == sorted(b) == list(range(20))
    for i in a:
        assert abs(a[i] - b[i]) <= 1e-6, (i, a[i], b[i])
    assert [e["val_loss"] for e in read_metrics(full, "eval")] == pytest.approx(
        [e["val_loss"] for e in read_metrics(part, "eval")], abs=1e-6
    )
    wa, wb = load_checkpoint(full / "ckpt.pt")["model"], load_checkpoint(part / "ckpt.pt")["model"]
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


def test_a_time_budget_ends_the_run_when_spent_with_the_decay_done_and_resumes_to_a_larger_one(data_dir, tmp_path):
    """The budget counts this process's CPU seconds inside training steps (train_cpu_s):
    the run ends at the step that spends it, its rate decayed to min_lr, and a resume
    with a larger budget goes on from there."""
    out = tmp_path / "out"
    budget = dict(max_iters=100_000, time_budget=1, eval_interval=100_000, lr_decay_iters=100_000)
    assert train.main(tiny_args(data_dir, out, **budget)) == 0
    ckpt = load_checkpoint(out / "ckpt.pt")
    steps = read_metrics(out, "train")
    last_step = steps[-1]["train_cpu_s"] - steps[-2]["train_cpu_s"]
    assert len(steps) == ckpt["iter_num"] > 5 and 1 <= ckpt["train_cpu_s"] < 1 + last_step + 1e-9  # the step past it
    lrs = [r["lr"] for r in steps[2:]]  # after the warmup the rate falls with the share spent, towards min_lr
    assert all(a >= b for a, b in zip(lrs, lrs[1:])) and lrs[0] > 2 * lrs[-1] and lrs[-1] < 0.15e-2
    evals = read_metrics(out, "eval")
    assert [e["iter"] for e in evals] == [0, ckpt["iter_num"]] and evals[-1]["lr"] == pytest.approx(1e-3)
    assert (out / "best.pt").is_file()
    assert train.main(tiny_args(data_dir, out, init_from="resume", **{**budget, "time_budget": 1.5})) == 0
    resumed = load_checkpoint(out / "ckpt.pt")
    assert resumed["iter_num"] > ckpt["iter_num"] and 1.5 <= resumed["train_cpu_s"] < 1.7
    assert [r["iter"] for r in read_metrics(out, "train")] == list(range(resumed["iter_num"]))


def test_a_time_budget_counts_the_same_steps_whether_or_not_the_run_was_stopped(data_dir, tmp_path, monkeypatch):
    """On a clock that gives each step one second and jumps by 1000 between processes (a
    start-up), a 10-second budget trains 10 steps, stopped after 5 and resumed or not,
    to the same weights: start-up, evaluations and saves are not charged to the budget."""
    from gptkit.train import logger

    clock = {"ticks": iter(range(10**6))}
    monkeypatch.setattr(logger, "cpu_clock", lambda: float(next(clock["ticks"])))  # read twice a step
    budget = dict(max_iters=100_000, time_budget=10, eval_interval=3, lr_decay_iters=100_000)
    assert train.main(tiny_args(data_dir, tmp_path / "whole", **budget)) == 0
    monkeypatch.setenv("GPT_FAULTS", "sigterm_at=4")  # the stop comes in iteration 4, which completes
    assert train.main(tiny_args(data_dir, tmp_path / "cut", **budget)) == 0
    assert load_checkpoint(tmp_path / "cut" / "ckpt.pt")["iter_num"] == 5
    monkeypatch.delenv("GPT_FAULTS")
    clock["ticks"] = iter(range(1000, 10**6))  # another process's start-up
    assert train.main(tiny_args(data_dir, tmp_path / "cut", init_from="resume", **budget)) == 0
    whole, cut = load_checkpoint(tmp_path / "whole" / "ckpt.pt"), load_checkpoint(tmp_path / "cut" / "ckpt.pt")
    assert (whole["iter_num"], whole["train_cpu_s"]) == (cut["iter_num"], cut["train_cpu_s"]) == (10, 10)
    assert losses_by_iter(tmp_path / "whole") == losses_by_iter(tmp_path / "cut")
    assert all(torch.equal(whole["model"][k], cut["model"][k]) for k in whole["model"])


def test_a_time_budget_that_ends_inside_the_warmup_says_so_early_and_at_the_end(data_dir, tmp_path, monkeypatch,
                                                                                capsys):
    """A clock of one second a step: a 30-second budget with warmup_iters=100 is said,
    from the pace of the first steps, to end inside the warmup, and said again at its end;
    a warmup the budget outlasts is said nothing about."""
    from gptkit.train import logger

    ticks = iter(range(10**6))
    monkeypatch.setattr(logger, "cpu_clock", lambda: float(next(ticks)))  # read twice a step
    budget = dict(max_iters=100_000, time_budget=30, eval_interval=100_000, lr_decay_iters=100_000, log_interval=100)
    assert train.main(tiny_args(data_dir, tmp_path / "a", warmup_iters=100, **budget)) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if line.startswith("note: ")]
    assert len(notes) == 2, out
    assert notes[0].startswith("note: time_budget=30 allows about 30 steps at this pace, fewer than warmup_iters=100")
    assert notes[1].startswith("note: the time budget ended the run at step 30, inside warmup_iters=100")
    assert [r["iter"] for r in read_metrics(tmp_path / "a", "note")] == [10]  # the 11th step's
    assert train.main(tiny_args(data_dir, tmp_path / "b", warmup_iters=5, **budget)) == 0
    assert "note: " not in capsys.readouterr().out


def test_a_time_budget_too_small_for_one_step_says_so_and_exits_2(data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_main_code(tiny_args(data_dir, out, max_iters=100, time_budget=1e-6)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: time_budget=1e-06 is spent by the first training step "
                                                   "alone ("), captured.err
    assert "nothing saved; give room for many steps, e.g. --time_budget=" in lines[0]
    assert "checkpoints in" not in captured.out and not out.exists()


def wait_for_progress(out_dir, min_iter, proc=None, timeout=120):
    """Block until metrics.jsonl has a train record at or past min_iter."""
    deadline = time.time() + timeout
    path = out_dir / "metrics.jsonl"
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"training ended early: {proc.stderr.read()}")
        if path.is_file():
            its = [r["iter"] for r in read_metrics(out_dir, "train")] if path.stat().st_size else []
            if its and its[-1] >= min_iter:
                return
        time.sleep(0.02)
    raise AssertionError("no training progress")


def test_sigterm_then_resume_equals_uninterrupted(data_dir, tmp_path):
    n = 60
    full, cut = tmp_path / "full", tmp_path / "cut"
    args = dict(max_iters=n, eval_interval=20, lr_decay_iters=n)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *tiny_args(data_dir, cut, **args)],
        cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for_progress(cut, 3, proc)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "stopped by SIGTERM" in stdout
    stopped_at = load_checkpoint(cut / "ckpt.pt")["iter_num"]
    assert 3 < stopped_at < n, "the signal must land mid-run for this test to mean anything"
    assert train.main(tiny_args(data_dir, cut, init_from="resume", **args)) == 0
    assert train.main(tiny_args(data_dir, full, **args)) == 0
    a, b = losses_by_iter(full), losses_by_iter(cut)
    assert sorted(a) == sorted(b) == list(range(n))
    worst = max(abs(a[i] - b[i]) for i in a)
    assert worst <= 1e-6, worst
    assert [e["iter"] for e in read_metrics(cut, "eval")] == [0, 20, 40, 60]


def test_sigint_saves_a_checkpoint_and_exits_0(data_dir, tmp_path, capsys, default_sigint):
    out = tmp_path / "out"

    def interrupt():
        try:
            wait_for_progress(out, 2)
        finally:  # never leave the 100000-step run going
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt)
    thread.start()
    code = train.main(tiny_args(data_dir, out, max_iters=100000, eval_interval=100000))
    thread.join()
    assert code == 0
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert 2 < ckpt["iter_num"] < 100000
    assert set(ckpt) >= {"optimizer", "scaler", "rng", "model", "model_config", "tokenizer", "config"}
    assert f"stopped by SIGINT at iteration {ckpt['iter_num']}" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler given back


def test_kill_during_save_leaves_previous_checkpoint(data_dir, tmp_path):
    out = tmp_path / "out"
    assert train.main(tiny_args(data_dir, out, max_iters=10)) == 0
    before = (out / "ckpt.pt").read_bytes()
    result = run_train_subprocess(tiny_args(data_dir, out, max_iters=20, init_from="resume"), GPT_FAULTS="exit_during_save")
    assert result.returncode == 137, result.stderr
    assert (out / "ckpt.pt").read_bytes() == before
    leftovers = [p.name for p in out.iterdir() if ".tmp-" in p.name]
    assert leftovers, "the fault should have left a half-written temporary file behind"
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 10
    # Resuming takes ckpt.pt, never the half-written temporary file.
    assert train.main(tiny_args(data_dir, out, max_iters=12, init_from="resume")) == 0
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 12


@pytest.mark.parametrize("fault, what", [("nan_loss_at", "loss is nan"), ("inf_grad_at", "gradient norm is inf")])
def test_non_finite_stops_before_the_step(data_dir, tmp_path, monkeypatch, capsys, fault, what):
    out = tmp_path / "out"
    monkeypatch.setenv("GPT_FAULTS", f"{fault}=13")
    assert run_main_code(tiny_args(data_dir, out, max_iters=30)) == 1
    err = capsys.readouterr().err
    assert f"{what} at iteration 13" in err
    assert f"{out / 'ckpt.pt'} (iteration 10)" in err
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["iter_num"] == 10
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert max(r["iter"] for r in read_metrics(out, "train")) == 12


def test_fp16_overflow_skips_the_step_and_training_goes_on(data_dir, tmp_path, monkeypatch):
    ref, hit = tmp_path / "ref", tmp_path / "hit"
    common = dict(dtype="float16", dropout=0.0, eval_interval=100)
    assert train.main(tiny_args(data_dir, ref, max_iters=6, **common)) == 0
    monkeypatch.setenv("GPT_FAULTS", "inf_grad_at=6")
    assert train.main(tiny_args(data_dir, hit, max_iters=7, **common)) == 0
    a, b = load_checkpoint(ref / "ckpt.pt"), load_checkpoint(hit / "ckpt.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])  # step 6 was skipped
    assert b["scaler"]["scale"] == a["scaler"]["scale"] / 2
    assert read_metrics(hit, "train")[-1]["skipped"] is True
    monkeypatch.delenv("GPT_FAULTS")
    assert train.main(tiny_args(data_dir, hit, max_iters=10, init_from="resume", **common)) == 0
    c = load_checkpoint(hit / "ckpt.pt")
    assert c["iter_num"] == 10 and c["scaler"]["scale"] == b["scaler"]["scale"]
    assert not all(torch.equal(a["model"][k], c["model"][k]) for k in a["model"])
    assert all(math.isfinite(r["loss"]) for r in read_metrics(hit, "train"))


def test_unknown_setting_is_rejected_before_data_is_read(tmp_path):
    with pytest.raises(UserError, match=r"unknown setting '--n_layers' \(did you mean 'n_layer'\?\)"):
        train.main(["--n_layers=3", f"--data_dir={tmp_path}", "--dataset=none"])
    config = tmp_path / "typo.py"
    config.write_text("learning_rte = 1e-3\n")
    with pytest.raises(UserError, match=r"unknown setting 'learning_rte' in .*typo.py \(did you mean 'learning_rate'\?\)"):
        train.main([str(config)])
    with pytest.raises(UserError, match="bad value for --eval_only: 'maybe'"):
        train.main(["--eval_only=maybe"])
    with pytest.raises(UserError, match="lr_schedule='cosin' must be one of cosine, constant, wsd"):
        train.main(["--lr_schedule=cosin"])
    with pytest.raises(UserError, match="compile='sometimes' must be auto, true or false"):
        train.main(["--compile=sometimes"])
    assert not (tmp_path / "none").exists()


def test_compile_setting_takes_booleans_and_words(tmp_path):
    config = tmp_path / "c.py"
    config.write_text("compile = False\n")
    from gptkit.config import parse_settings

    _, cfg = parse_settings([str(config)], [train.GPTConfig, train.TrainConfig])
    assert cfg.compile == "false"
    _, cfg = parse_settings(["--compile=true"], [train.GPTConfig, train.TrainConfig])
    assert cfg.compile == "true"


def test_missing_dataset_names_the_command(tmp_path):
    with pytest.raises(UserError, match=r"dataset folder .*mine does not exist: run python prepare.py --input FILE"):
        train.main(tiny_args(tmp_path, tmp_path / "out", dataset="mine"))


def test_split_shorter_than_a_block(tmp_path):
    write_char_dataset(tmp_path / "data", text="abcdefgh" * 30)
    with pytest.raises(UserError, match="fewer than one window of block_size\\+1 = 33"):
        train.main(tiny_args(tmp_path / "data", tmp_path / "out"))


def test_vocabulary_mismatch_on_resume(data_dir, tmp_path):
    out = tmp_path / "out"
    assert train.main(tiny_args(data_dir, out, max_iters=10)) == 0
    write_char_dataset(data_dir, name="other", text="xyz \n" * 5000)
    with pytest.raises(UserError, match="vocabulary mismatch: .*ckpt.pt was trained with a char \\(\\d+ tokens\\)"):
        train.main(tiny_args(data_dir, out, dataset="other", init_from="resume", max_iters=20))


def test_eval_only_evaluates_and_writes_nothing(data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert train.main(tiny_args(data_dir, out, max_iters=10)) == 0
    files = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    metrics = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert train.main(tiny_args(data_dir, out, init_from="resume", eval_only="true")) == 0
    text = capsys.readouterr().out
    val = read_metrics(out, "eval")[-1]["val_loss"]
    assert "eval 10 | train loss" in text and f"val loss {val:.4f}" in text
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == files
    assert (out / "metrics.jsonl").read_text() == metrics


def test_always_save_checkpoint_false_saves_only_improvements(data_dir, tmp_path):
    # learning_rate 0: the val loss never improves after the first evaluation.
    flat_false, flat_true = tmp_path / "a", tmp_path / "b"
    assert train.main(tiny_args(data_dir, flat_false, learning_rate=0.0, always_save_checkpoint="false")) == 0
    assert not (flat_false / "ckpt.pt").exists() and not (flat_false / "best.pt").exists()
    assert train.main(tiny_args(data_dir, flat_true, learning_rate=0.0, always_save_checkpoint="true")) == 0
    assert load_checkpoint(flat_true / "ckpt.pt")["iter_num"] == 20 and not (flat_true / "best.pt").exists()


def test_best_pt_holds_the_best_weights(data_dir, tmp_path):
    out = tmp_path / "out"
    assert train.main(tiny_args(data_dir, out, max_iters=30)) == 0
    evals = [e for e in read_metrics(out, "eval") if e["iter"] > 0]
    best_eval = min(evals, key=lambda e: e["val_loss"])
    best = load_checkpoint(out / "best.pt")
    assert best["iter_num"] == best_eval["iter"]
    assert best["val_loss"] == pytest.approx(best_eval["val_loss"], abs=1e-6)
    assert "optimizer" not in best and "rng" not in best and "scaler" not in best
    assert load_checkpoint(out / "ckpt.pt")["best_val_loss"] == pytest.approx(best_eval["val_loss"], abs=1e-6)


def test_gradient_accumulation_must_divide_across_ranks(tmp_path):
    from gptkit.config import parse_settings
    _, cfg = parse_settings(tiny_args(tmp_path, tmp_path / "out", gradient_accumulation_steps=5), [train.GPTConfig, train.TrainConfig])
    with pytest.raises(UserError, match="gradient_accumulation_steps=5 .* divisible by the number of ranks, 2"):
        check_world_size(cfg, 2)


def test_compile_failure_falls_back_to_eager(monkeypatch, capsys):
    def broken_compile(module):
        def call(*args):
            raise RuntimeError("BackendCompilerFailed: no C compiler")
        return call

    monkeypatch.setattr(torch, "compile", broken_compile)
    forward = train.Forward(lambda x, y: (x, y), use_compile=True)
    assert forward(1, 2) == (1, 2)
    assert "torch.compile failed (RuntimeError: BackendCompilerFailed: no C compiler)" in capsys.readouterr().err
    assert forward.compiled is None


def failing_backend(graph_module, example_inputs):
    raise RuntimeError("no C compiler")


@pytest.mark.parametrize("backend", ["eager", failing_backend])
def test_a_failed_compile_is_recorded_where_users_look(data_dir, tmp_path, monkeypatch, capsys, backend):
    """A backend that raises fails at the first forward pass, after config.json was
    written: training goes on eager, and the log, metrics.jsonl, config.json, the
    checkpoint's settings and the benchmark's cell all say compile failed. With a
    backend that works ("eager": dynamo without code generation, fast) they say true."""
    import json

    from benchmarks.bench_train import compile_cell

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model: real_compile(model, backend=backend))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    out = tmp_path / "out"
    try:
        assert train.main(tiny_args(data_dir, out, compile="true", max_iters=4, eval_interval=4)) == 0
    finally:
        torch._dynamo.reset()
    config = json.loads((out / "config.json").read_text())
    notes = read_metrics(out, "note")
    assert len(read_metrics(out, "train")) == 4
    if backend == "eager":
        assert config["compile"] == "true" and "compile_error" not in config and notes == []
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the model really went through dynamo
        assert compile_cell(config) == "true"
        return
    reason = "BackendCompilerFailed: backend='failing_backend' raised:"
    assert config["compile"] == "failed" and config["compile_error"].startswith(reason)
    assert [n["iter"] for n in notes] == [0] and notes[0]["note"].startswith(f"compile failed: {reason}")
    assert f"note: compile failed: {reason}" in capsys.readouterr().out
    assert load_checkpoint(out / "ckpt.pt")["config"]["compile"] == "failed"
    assert compile_cell(config) == "failed (BackendCompilerFailed)"


def test_wandb_offline_writes_a_run(data_dir, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert train.main(tiny_args(data_dir, tmp_path / "out", max_iters=4, wandb_log="true", wandb_project="t")) == 0
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs and any(p.suffix == ".wandb" for p in runs[0].iterdir())


def test_wandb_missing_says_how_to_install(data_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(UserError, match="pip install wandb"):
        train.main(tiny_args(data_dir, tmp_path / "out", max_iters=2, wandb_log="true"))


def test_wandb_without_a_login_is_an_error_before_any_work(data_dir, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "netrc").write_text("machine example.org login a password b\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    with pytest.raises(UserError, match="wandb has no login on this machine: run `wandb login`.*WANDB_MODE=offline"):
        train.main(tiny_args(data_dir, tmp_path / "out", max_iters=2, wandb_log="true"))
    assert not (tmp_path / "out").exists()  # no config.json, no empty metrics.jsonl


def test_wandb_names_default_to_the_dataset_and_out_dir(data_dir, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    seen = {}

    class Run:
        def log(self, data, step):
            pass

        def finish(self):
            pass

    def init(project, name, config):
        seen.update(project=project, name=name)
        return Run()

    monkeypatch.setattr(wandb, "init", init)
    assert train.main(tiny_args(data_dir, tmp_path / "my-run", max_iters=2, wandb_log="true")) == 0
    assert seen == {"project": "tiny", "name": "my-run"}


def test_missing_named_dataset_is_prepared(tmp_path, shakespeare_path, monkeypatch):
    monkeypatch.setenv("TINYSHAKESPEARE", str(shakespeare_path))
    out = tmp_path / "out"
    assert train.main(tiny_args(tmp_path / "data", out, dataset="shakespeare_char", max_iters=2)) == 0
    assert (tmp_path / "data" / "shakespeare_char" / "meta.json").is_file()
    assert load_checkpoint(out / "ckpt.pt")["model_config"]["vocab_size"] == 65


def test_eval_iters_0_evaluates_every_val_token_once(data_dir, tmp_path):
    import math

    import numpy as np
    import torch.nn.functional as F

    from model import GPT, GPTConfig

    out = tmp_path / "out"
    assert train.main(tiny_args(data_dir, out, max_iters=2, eval_interval=2, eval_iters=0)) == 0
    ckpt = load_checkpoint(out / "ckpt.pt")
    model = GPT(GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    model.eval()
    val = torch.from_numpy(np.fromfile(data_dir / "tiny" / "val.bin", dtype=np.uint16).astype(np.int64))
    T = 32
    losses = []
    with torch.no_grad():
        for s in range(0, len(val) - 1, T):  # consecutive windows, the last one shorter
            x, y = val[s : s + T], val[s + 1 : s + T + 1]
            logits, _ = model(x[None, : len(y)])
            losses.append(F.cross_entropy(logits[0], y, reduction="none"))
    losses = torch.cat(losses)
    assert len(losses) == len(val) - 1  # every token but the first, once
    assert ckpt["val_loss"] == pytest.approx(losses.mean().item(), abs=1e-5)
    last = read_metrics(out, "eval")[-1]
    assert last["val_bpb"] == pytest.approx(last["val_loss"] / math.log(2), rel=1e-6)  # ASCII: a byte a token


def test_muon_run_resumes_exactly(data_dir, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    args = dict(optimizer="muon", max_iters=12, eval_interval=6)
    assert train.main(tiny_args(data_dir, full, **args)) == 0
    assert train.main(tiny_args(data_dir, part, **{**args, "max_iters": 6})) == 0
    assert len(load_checkpoint(part / "ckpt.pt")["optimizer"]) == 2  # AdamW and Muon
    assert train.main(tiny_args(data_dir, part, init_from="resume", **args)) == 0
    a, b = losses_by_iter(full), losses_by_iter(part)
    assert sorted(a) == sorted(b) and max(abs(a[i] - b[i]) for i in a) <= 1e-6
    with pytest.raises(UserError, match="different optimizer setting"):
        train.main(tiny_args(data_dir, part, init_from="resume", max_iters=14))


def test_a_bfloat16_cpu_run_with_matmul_attention_learns_and_resumes_exactly(data_dir, tmp_path, capsys):
    """What configs/shakespeare_1200cpus.py trains with on a CPU with bfloat16 instructions:
    autocast to bfloat16 and attention="matmul" (dropout on the attention weights too). The
    loss falls, the run's dtype is recorded, and a run resumed halfway equals one run
    straight through (autocast keeps no state; the checkpoint holds float32 weights)."""
    full, part = tmp_path / "full", tmp_path / "part"
    args = dict(optimizer="muon", max_iters=12, eval_interval=6, dtype="bfloat16", attention="matmul")
    assert train.main(tiny_args(data_dir, full, **args)) == 0
    if runs_on_glibc():  # the header says what it set
        assert "memory: glibc keeps freed blocks for the next step" in capsys.readouterr().out
    assert train.main(tiny_args(data_dir, part, **{**args, "max_iters": 6})) == 0
    assert train.main(tiny_args(data_dir, part, init_from="resume", **args)) == 0
    a, b = losses_by_iter(full), losses_by_iter(part)
    assert sorted(a) == sorted(b) and max(abs(a[i] - b[i]) for i in a) <= 1e-6
    assert a[11] < a[0] - 0.5, a
    ckpt = load_checkpoint(full / "ckpt.pt")
    assert ckpt["model_config"]["attention"] == "matmul" and ckpt["config"]["dtype"] == "bfloat16"
    assert all(t.dtype == torch.float32 for t in ckpt["model"].values() if t.is_floating_point())


def write_gpt2_ids_dataset(data_dir, name="bpe", n=20_000):
    """Random GPT-2 token ids with a {"type": "gpt2"} tokenizer (train.py never decodes)."""
    import json

    import numpy as np

    folder = data_dir / name
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    counts = {"train": n, "val": n // 10}
    for split, count in counts.items():
        rng.integers(0, 50257, count).astype(np.uint16).tofile(folder / f"{split}.bin")
    meta = {"format_version": 1, "tokenizer": {"type": "gpt2"}, "vocab_size": 50257, "dtype": "uint16",
            "eot_id": 50256, "num_tokens": counts, "sources": [], "split": {"rule": "random", "val_fraction": 0.1},
            "fingerprint": "random"}
    (folder / "meta.json").write_text(json.dumps(meta))


def test_init_from_a_local_hugging_face_folder_crops_block_size(data_dir, tmp_path):
    from gptkit.interop.hf_gpt2 import export_gpt2
    from model import GPT, GPTConfig

    torch.manual_seed(0)
    pretrained = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=50257))
    export_gpt2(pretrained, tmp_path / "hf")
    write_gpt2_ids_dataset(data_dir)
    out = tmp_path / "out"
    args = tiny_args(data_dir, out, dataset="bpe", init_from=tmp_path / "hf", block_size=32, learning_rate=0.0,
                     max_iters=2, eval_interval=2, batch_size=2, gradient_accumulation_steps=1)
    assert train.main(args) == 0
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["model_config"]["block_size"] == 32 and ckpt["model_config"]["n_layer"] == 1
    assert torch.equal(ckpt["model"]["transformer.wpe.weight"], pretrained.transformer.wpe.weight[:32])
    assert torch.equal(ckpt["model"]["transformer.wte.weight"], pretrained.transformer.wte.weight)
    with pytest.raises(UserError, match="vocabulary mismatch: init_from=gpt2 uses GPT-2's BPE vocabulary"):
        train.main(tiny_args(data_dir, tmp_path / "x", init_from="gpt2"))
