"""bench.py budget's own logic, without its runs: candidates, scaling to a budget, nanoGPT's
iterations ending on an evaluation, and the log written one row at a time."""

import argparse
import types

import pytest

from benchmarks import bench_budget
from benchmarks.report import Table
from gptkit.ops.errors import UserError


def test_candidates_are_label_and_overrides_and_a_bad_one_is_named():
    args = types.SimpleNamespace(candidate=["wide::--n_embd=192 --max_iters=900"], config=bench_budget.CONFIG)
    assert bench_budget.candidates(args) == [("wide", ["--n_embd=192", "--max_iters=900"])]
    args.candidate = ["no separator"]
    with pytest.raises(UserError, match="LABEL::OVERRIDES"):
        bench_budget.candidates(args)


def test_iterations_scale_with_the_budget_and_overrides_win():
    assert bench_budget.scaled(2150, 1200) == 2150 and bench_budget.scaled(2150, 300) == 538
    assert bench_budget.setting_of(["--max_iters=900"], "max_iters", 5) == 900
    assert bench_budget.setting_of([], "max_iters", 5) == 5
    assert bench_budget.config_setting(bench_budget.CONFIG, "max_iters") > 0


def test_a_budget_candidates_own_steps_and_clock_are_scaled_not_replaced_by_the_configs():
    config = bench_budget.CONFIG
    iters, every, clock = (bench_budget.config_setting(config, n) for n in ("max_iters", "eval_interval", "time_budget"))
    assert bench_budget.scaled_overrides(config, [], 1200) == [
        f"--max_iters={iters}", f"--eval_interval={every}", f"--time_budget={clock:g}"]
    candidate = ["--dropout=0.1", "--max_iters=4600", "--time_budget=1100"]  # max_iters: a cap, kept
    assert bench_budget.scaled_overrides(config, candidate, 300) == [
        "--dropout=0.1", "--max_iters=4600", f"--eval_interval={bench_budget.scaled(every, 300)}", "--time_budget=200"]
    steps = ["--time_budget=0", "--max_iters=1000"]  # no clock: the steps scale
    assert bench_budget.scaled_overrides(config, steps, 300) == ["--max_iters=250", f"--eval_interval={bench_budget.scaled(every, 300)}"]


def test_every_run_is_a_row_in_the_log_as_it_ends(tmp_path):
    log = tmp_path / "LOG.md"
    args = argparse.Namespace(log_path=log, log_header=["### now — `python bench.py budget`", ""])
    rec = bench_budget.Recorder(args, Table, "title")
    rec.add(dict(label="ours: x", iters=10, cpu_s=290.0, wall_s=291.0, score=1.6), 300)
    text = log.read_text()
    assert text.splitlines()[-1] == "| ours: x | 300 | 10 | 290 | 291 | 1.6000 | yes |"  # before the next run
    rec.add(dict(label="nanoGPT", iters=20, cpu_s=320.0, wall_s=330.0, score=2.0), 300)
    assert log.read_text().splitlines()[-1].endswith("| no (+20 s) |")
    rec.close()
    assert rec.table.recorded and "#### title" in log.read_text() and bench_budget.NOTE in log.read_text()
