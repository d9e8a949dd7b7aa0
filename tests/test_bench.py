"""bench.py's command line: its own flags go before or after the suite's name."""

import pytest
import torch

import bench


def no_record(argv):
    return getattr(bench.build_parser().parse_args(argv), "no_record", False)


def test_no_record_before_or_after_the_suite_in_both_spellings():
    assert no_record(["--no-record", "train"]) and no_record(["--no_record", "sample"])
    assert no_record(["train", "--no_record"]) and no_record(["all", "--no-record"])
    assert not no_record(["train"]) and not no_record(["all"])


def test_the_serve_suite_runs_at_a_tiny_size():
    import argparse

    from benchmarks import bench_serve

    parser = argparse.ArgumentParser()
    bench_serve.add_arguments(parser)
    (table,) = bench_serve.run(parser.parse_args(["--quick", "--no_llama_cpp"]))
    assert [(row[1].split(",")[0], row[2]) for row in table.rows] == [
        ("generate_stream", "1"), ("generate_stream", "2"), ("serve.py", "1"), ("serve.py", "2")]  # server, streams
    for row in table.rows:
        assert float(row[5].replace(",", "")) > 0 and row[6] == "8"  # the turn tokens' rows zeroed: greedy replies never end early
        assert row[1] != "serve.py" or float(row[3]) > 0


def test_the_chat_step_suite_times_each_share_against_every_position_scored():
    import argparse

    from benchmarks import bench_chat_step

    parser = argparse.ArgumentParser()
    bench_chat_step.add_arguments(parser)
    threads = torch.get_num_threads()
    try:  # in-process, the suite sets torch to one thread: put it back for the tests after
        (table,) = bench_chat_step.run(parser.parse_args(["--shares", "0.25", "--steps", "1", "--block_size", "16"]))
    finally:
        torch.set_num_threads(threads)
    assert [row[0] for row in table.rows] == ["25%", "100%"] and table.rows[1][1] == "16"
    assert 0 < int(table.rows[0][1]) < 16 and table.rows[1][3] == "1.00x"


@pytest.mark.slow
def test_the_tasks_suite_scores_the_same_items_as_lm_eval(monkeypatch, tiktoken_available):
    import argparse

    pytest.importorskip("lm_eval")
    from benchmarks import bench_tasks

    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")  # the suite sets them: monkeypatch puts them back after
    parser = argparse.ArgumentParser()
    bench_tasks.add_arguments(parser)
    threads = torch.get_num_threads()
    try:
        (table,) = bench_tasks.run(parser.parse_args(["--items", "6", "--n_layer", "1", "--n_embd", "32",
                                                      "--block_size", "64", "--repeats", "1"]))
    finally:
        torch.set_num_threads(threads)
    assert [row[0] for row in table.rows] == ["eval.py --tasks", "lm-evaluation-harness"]
    assert all(row[4] == "6/6 items" for row in table.rows) and table.rows[1][3] == "1.00x"
    assert all(float(row[2].replace(",", "")) > 0 for row in table.rows)


@pytest.mark.slow
def test_the_prepare_suites_parquet_table_shows_the_same_tokens_at_a_tiny_size(shakespeare_path, monkeypatch):
    import argparse

    monkeypatch.setenv("TINYSHAKESPEARE", str(shakespeare_path))
    from benchmarks import bench_prepare

    parser = argparse.ArgumentParser()
    bench_prepare.add_arguments(parser)
    (table,) = bench_prepare.run(parser.parse_args(["--tokenizers", "", "--parquet_mb", "1", "--workers", "1"]))
    assert [(row[0], row[1]) for row in table.rows] == [
        (".parquet", "1"), (".txt folder", "1"), ("fineweb_edu, local copy", "1"),
        (".parquet", "2"), (".txt folder", "2"), ("fineweb_edu, local copy", "2")]
    for first in (0, 3):  # the same documents in every form: the same token count
        assert len({table.rows[first + i][2] for i in range(3)}) == 1 and int(table.rows[first][2].replace(",", "")) > 0
