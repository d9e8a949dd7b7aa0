"""bench.py's command line: its own flags go before or after the suite's name."""

import bench


def no_record(argv):
    return getattr(bench.build_parser().parse_args(argv), "no_record", False)


def test_no_record_before_or_after_the_suite_in_both_spellings():
    assert no_record(["--no-record", "train"]) and no_record(["--no_record", "sample"])
    assert no_record(["train", "--no_record"]) and no_record(["all", "--no-record"])
    assert not no_record(["train"]) and not no_record(["all"])
