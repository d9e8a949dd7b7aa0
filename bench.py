"""Benchmarks: measure, print a table, and append it to benchmarks/LOG.md.

    python bench.py prepare     # tokenizer throughput and peak memory vs the simple way
    python bench.py tokenizer   # BPE training and encoding: tokenizers vs rustbpe + tiktoken
    python bench.py train       # ms/iter, tokens/s, MFU for the quick-start shape
    python bench.py sample      # generation tokens/s with and without the KV cache
    python bench.py speedrun    # the modern recipe vs nanoGPT's CPU settings (slow)
    python bench.py memory      # memory per rank, DDP vs FSDP, with/without activation checkpointing
    python bench.py vocab       # char vs trained BPEs vs GPT-2 BPE on Tiny Shakespeare (slow)
    python bench.py lora        # full fine-tuning vs LoRA: peak memory and ms/step, GPT-2 124M and 355M (slow)
    python bench.py budget      # configs/shakespeare_1200cpus.py vs nanoGPT at 300/600/1200 CPU s (~70 min)
    python bench.py gpt2_cpu    # GPT-2 124M batch-1 sampling: ours vs transformers vs llama.cpp
    python bench.py chat_step   # chat training's step: the output layer on target positions only (GPT-2's shape)
    python bench.py tasks       # eval.py --tasks' multiple-choice scoring vs lm-evaluation-harness: items per CPU s
    python bench.py serve       # serve.py: time to first token, tokens/s for 1, 4, 16 streams (vs llama-cpp-python)
    python bench.py all         # prepare, train and sample in one go

Every run first measures this machine's own fp32 matmul rate: on a CPU the best
such rate measured here (cached, as train.py does) is the peak MFU is reported
against (there is no datasheet number to use).
Comparisons are made as ratios inside one run, because shared machines are
noisy: two numbers measured minutes apart are not comparable, a ratio is.
Add --no_record (before or after the suite) to print without touching the log.
BENCHMARKS.md summarises the latest figures and says how to read each suite.
"""

import argparse
import datetime
import importlib
import shlex
import sys
from pathlib import Path

from gptkit.ops.errors import ArgumentParser, run_main

SUITES = {
    "prepare": "benchmarks.bench_prepare",
    "tokenizer": "benchmarks.bench_tokenizer",
    "train": "benchmarks.bench_train",
    "sample": "benchmarks.bench_sample",
    "speedrun": "benchmarks.bench_speedrun",
    "memory": "benchmarks.bench_memory",
    "vocab": "benchmarks.bench_vocab",
    "lora": "benchmarks.bench_lora",
    "budget": "benchmarks.bench_budget",
    "gpt2_cpu": "benchmarks.bench_gpt2_cpu",
    "serve": "benchmarks.bench_serve",
    "chat_step": "benchmarks.bench_chat_step",
    "tasks": "benchmarks.bench_tasks",
}
ALL = ["prepare", "train", "sample"]  # speedrun takes ~15 minutes on its own
RESULTS = Path(__file__).resolve().parent / "benchmarks" / "LOG.md"


def build_parser():
    parser = ArgumentParser(
        prog="bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_arguments(parser, argparse.SUPPRESS)  # before the suite: bench.py --no_record train
    sub = parser.add_subparsers(dest="suite", required=True)
    for name, module_name in SUITES.items():
        sub_parser = sub.add_parser(name, help=f"run the {name} benchmark")
        add_common_arguments(sub_parser, argparse.SUPPRESS)  # or after it: bench.py train --no_record
        importlib.import_module(module_name).add_arguments(sub_parser)
    add_common_arguments(sub.add_parser("all", help="run " + ", ".join(ALL) + " with their defaults"), argparse.SUPPRESS)
    return parser


def add_common_arguments(parser, default):
    # SUPPRESS: a flag not given on one side never overwrites the other's (argparse
    # would reset it to False); main reads it with getattr. --no-record is the older spelling.
    parser.add_argument("--no_record", "--no-record", action="store_true", default=default,
                        help="do not append to benchmarks/LOG.md")


def header_lines(command, peak_flops):
    from benchmarks.report import machine_info

    info = machine_info()
    machine = ", ".join(f"{k}: {v}" for k, v in info.items())
    return [
        f"### {datetime.datetime.now():%Y-%m-%d %H:%M} — `{command}`",
        "",
        f"Machine: {machine}. fp32 matmul peak (best measured on this machine): {peak_flops / 1e9:,.1f} GFLOP/s.",
        "",
    ]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    from gptkit.train.mfu import cpu_peak_flops

    peak = cpu_peak_flops()  # the peak train.py's MFU uses: the best measured on this machine
    command = "python bench.py " + " ".join(shlex.quote(a) for a in argv)
    lines = header_lines(command, peak)
    print("\n".join(lines))
    suites = ALL if args.suite == "all" else [args.suite]
    tables_seen = []
    for name in suites:
        module = importlib.import_module(SUITES[name])
        suite_args = args
        if args.suite == "all":  # each suite's own defaults
            suite_parser = ArgumentParser()
            module.add_arguments(suite_parser)
            suite_args = suite_parser.parse_args([])
        suite_args.cpu_peak_flops = peak
        suite_args.log_header, suite_args.log_path = lines, RESULTS  # for suites that log row by row
        for table in module.run(suite_args):
            tables_seen.append(table)
            text = table.to_markdown()
            print(text + "\n", flush=True)
            if not getattr(table, "recorded", False):  # else already in the log, row by row
                lines += [text, ""]
    if not getattr(args, "no_record", False) and not all(getattr(t, "recorded", False) for t in tables_seen):
        with open(RESULTS, "a") as f:
            f.write("\n".join(lines) + "\n")
        print(f"appended to {RESULTS.relative_to(RESULTS.parent.parent)}")
    return 0


if __name__ == "__main__":
    run_main(main)
