"""Score checkpoints on any text, a prepared split or the standard tasks, and compare them in one table.

    python eval.py out-shakespeare-char --input held_out.txt       # a text, a folder, a .jsonl, a .parquet
    python eval.py out-a out-b/best.pt --dataset shakespeare_char --split val
    python eval.py --init_from gpt2 --input held_out.txt --stride 512
    python eval.py out-shakespeare --init_from gpt2 --tasks hellaswag --json results.json
    python eval.py out-chat-arithmetic --dataset arithmetic_chat --exact_match   # a chat split: replies' loss, exact match
    python eval.py out-a out-b --tasks core                        # the report card: ARC, PIQA, Winogrande, ...
    python eval.py out-chat --tasks chat --json card.json          # a chat model: letters and GSM8K as a conversation
    python eval.py plot out-a out-b --out runs.png                  # loss curves from metrics.jsonl
    zcat web.txt.gz | python eval.py out-a --input - --max_tokens 100000   # a stream, read only that far

Every token of the text but each document's first is scored exactly once, by
sliding windows of the model's block_size moved `--stride` tokens at a time (the
default, block_size, is train.py's eval_iters=0 evaluation, so its val loss
comes out the same; a smaller stride gives each token more context and costs
block_size/stride times the work). Each model reads the text with its own
tokenizer. Reported: loss (nats per token), perplexity, bits per byte (total
nats / (ln 2 x the UTF-8 bytes of the scored tokens), comparable across
tokenizers) and the token and byte counts. With --tasks the standard tasks
(ARC, PIQA, Winogrande, HellaSwag, MMLU, LAMBADA, GSM8K; gptkit/evals/tasks.py) are scored
as lm-evaluation-harness scores them and printed as one report card with its
centered-accuracy summary and standard errors (gptkit/evals/report_card.py). Errors exit with code 2.

`eval.py plot OUT_DIR ...` draws the training curves instead: train and val loss
and the learning rate of each run, from its metrics.jsonl (gptkit/evals/plot.py; needs
matplotlib). A checkpoint folder named `plot` is written ./plot.
"""

import argparse
import sys

from gptkit.ops.errors import quiet_start

quiet_start()  # a Ctrl-C or a missing package while the imports below load: one line, no traceback
import torch

from gptkit.evals import evaluation
from gptkit.evals import tasks
from gptkit.ops.device import DTYPES, resolve_device, training_dtype
from gptkit.ops.errors import ArgumentParser, UserError, run_main
from gptkit.ops.paths import claim_output


def parse_args(argv):
    parser = ArgumentParser(
        prog="eval.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="*", metavar="CKPT_OR_OUT_DIR",
                        help="checkpoint files or training out_dirs (best.pt there, else ckpt.pt)")
    parser.add_argument("--init_from", action="append", default=[], metavar="NAME_OR_FOLDER",
                        help="also score OpenAI's GPT-2: gpt2, gpt2-medium, gpt2-large, gpt2-xl or a Hugging Face folder (repeatable)")
    text = parser.add_mutually_exclusive_group()
    text.add_argument("--input", nargs="+", metavar="PATH",
                      help="text file, folder of .txt and .parquet files, .jsonl (a \"text\" per line), .parquet (its text column), a pipe, or - (standard input)")
    text.add_argument("--dataset", help="a dataset prepared by prepare.py (under --data_dir): score a whole split")
    parser.add_argument("--split", choices=("val", "train"), default="val", help="with --dataset (default: %(default)s)")
    parser.add_argument("--data_dir", default="data", help="folder holding the dataset folders (default: %(default)s)")
    parser.add_argument("--hellaswag", help=argparse.SUPPRESS)  # gone: HellaSwag is one of --tasks
    parser.add_argument("--tasks", metavar="NAMES",
                        help=f"standard tasks, comma-separated: {', '.join(tasks.TASKS)}, or a set: "
                        + "; ".join(f"{k} ({', '.join(v)})" for k, v in tasks.SETS.items() if k != "all") + "; all")
    parser.add_argument("--task_file", action="append", default=[], metavar="NAME=PATH",
                        help="read a task from its publisher's file (.parquet or .jsonl) instead of fetching it "
                        "by name (repeatable)")
    parser.add_argument("--limit", type=int, help="with --tasks: score only each task's first N items")
    parser.add_argument("--hub_url", help="with --tasks: the Hugging Face Hub's base address, for a mirror "
                        f"(default: $HF_ENDPOINT or {tasks.HUB_URL})")
    parser.add_argument("--exact_match", action="store_true",
                        help="with a chat --dataset: also the share of its assistant replies written exactly (greedy, "
                        "given the conversation before each)")
    parser.add_argument("--answers", choices=("calculator", "none"),
                        help="with a chat --dataset: the share of its questions whose reply (greedy, as sample.py "
                        "--chat writes it, tool calls run by the calculator or not: none) ends with the reference's "
                        "final answer; --limit N asks the first N")
    parser.add_argument("--stride", type=int, help="tokens the window moves each step (default: each model's block_size)")
    parser.add_argument("--batch_size", type=int,
                        help="sequences per forward pass (default: 8 windows of text, 32 task answers)")
    parser.add_argument("--max_tokens", type=int,
                        help="score only the first N tokens of the text or split (the text is read only that far)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps (default: %(default)s)")
    parser.add_argument("--dtype", default="auto", choices=("auto", *DTYPES),
                        help="auto: bfloat16 on GPUs that compute it natively, float16 on older ones, float32 on CPUs (default: %(default)s)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON (- for stdout, instead of the table)")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    problems = []
    if not args.models and not args.init_from:
        problems.append("give at least one checkpoint or out_dir, or --init_from gpt2")
    if args.hellaswag is not None:
        problems.append("--hellaswag is gone: use --tasks hellaswag (and --task_file hellaswag=FILE for a local "
                        "copy); its acc_norm is lm-evaluation-harness's, per character (docs/evaluation.md)")
    elif not (args.input or args.dataset or args.tasks):
        problems.append("say what to score: --input PATH, --dataset NAME or --tasks NAMES")
    for name, low in (("stride", 1), ("batch_size", 1), ("max_tokens", 2), ("limit", 1)):
        value = getattr(args, name)
        if value is not None and value < low:
            problems.append(f"--{name} must be at least {low}, not {value}")
    if args.exact_match and not args.dataset:
        problems.append("--exact_match scores a chat dataset's replies: give --dataset NAME")
    if args.answers and not args.dataset:
        problems.append("--answers asks a chat dataset's questions: give --dataset NAME")
    if (args.task_file or args.hub_url) and not args.tasks or (args.limit and not (args.tasks or args.answers)):
        problems.append("--task_file, --limit and --hub_url go with --tasks NAMES (--limit with --answers too)")
    if problems:
        parser.error("; ".join(problems))
    return args


def read_tasks(args):
    """[(Task, items)] of --tasks, each read (fetched by name when no --task_file names it) before any model loads."""
    files = tasks.parse_files(args.task_file)
    names = tasks.parse_names(args.tasks)
    unused = sorted(set(files) - set(names))
    if unused:
        raise UserError(f"--task_file names {', '.join(unused)}, which --tasks does not score")
    out = []
    for name in names:
        task = tasks.TASKS[name]
        out.append((task, tasks.read_task(task, tasks.resolve_file(task, files.get(name), args.hub_url), args.limit)))
    return out


def plot_main(argv):
    """`eval.py plot OUT_DIR ... [--out FILE]`: the loss curves of training runs."""
    from gptkit.evals import plot

    parser = ArgumentParser(
        prog="eval.py plot", description="Plot train/val loss and learning rate of training runs (needs matplotlib)."
    )
    parser.add_argument("out_dirs", nargs="+", metavar="OUT_DIR", help="run folders to compare")
    parser.add_argument("--out", default=None,
                        help="PNG to write (default: loss.png in the first OUT_DIR), replaced if it exists; "
                        "a folder, a device or a folder you cannot write to is refused before plotting")
    parser.add_argument(
        "--metric", default="auto", choices=("auto", "loss", "bpb"),
        help="loss (nats/token), bpb (bits per byte: compares tokenizers) or auto (bpb when every run has it)",
    )
    args = parser.parse_args(argv)
    path = plot.plot_runs(args.out_dirs, args.out, args.metric)
    print(f"wrote {path}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["plot"]:
        return plot_main(argv[1:])
    args = parse_args(argv)
    device = resolve_device(args.device)
    settings = evaluation.Settings(device, training_dtype(args.dtype, device), args.batch_size or 8, args.stride,
                                   args.max_tokens, progress=not args.no_progress)
    if args.json and args.json != "-":  # before any work: a destination that cannot be written fails now
        args.json = claim_output(args.json, "file", overwrite=True, what="--json")
    # Check the inputs before loading any model: a bad file fails fast.
    texts = evaluation.InputText(args.input) if args.input else None
    split = (args.data_dir, args.dataset, args.split) if args.dataset else None
    task_items = read_tasks(args) if args.tasks else None
    source = " ".join(args.input) if args.input else f"{args.dataset}/{args.split}" if args.dataset else None

    results = []
    for spec, init_from in [(m, False) for m in args.models] + [(m, True) for m in args.init_from]:
        candidate = evaluation.load_candidate(spec, init_from)
        result = evaluation.evaluate_candidate(candidate, settings, texts, split, args.exact_match, task_items,
                                               args.batch_size or 32)
        if args.answers:
            from gptkit.evals.answers import answer_exact

            exact, asked = answer_exact(candidate.model, candidate.tokenizer, args.data_dir, args.dataset, args.split,
                                        args.answers, device, args.limit)
            result.answers = {"tools": args.answers, "exact": exact, "questions": asked, "rate": exact / asked}
        print(candidate.summary, file=sys.stderr)  # after the checks: a mistake's error is the only line
        if result.score is not None:
            s = result.score
            print(f"{result.name}: {s.tokens:,} tokens in {result.seconds:.1f} s "
                  f"({s.tokens / result.seconds:,.0f} tokens/s) on {device}", file=sys.stderr)
        for note in result.notes:
            print(f"{result.name}: {note}", file=sys.stderr)
        results.append(result)
        del candidate
        if device.type == "cuda":
            torch.cuda.empty_cache()

    if args.json:
        evaluation.write_json(results, args.json, settings, source)
    if args.json != "-":
        if source:
            print(f"scored: {source}" + (f" (first {args.max_tokens:,} tokens)" if args.max_tokens else ""))
        print(evaluation.markdown_table(results))
        for result in results:
            if result.exact_match is not None:
                print(evaluation.exact_match_lines(result))
            if result.answers is not None:
                a = result.answers
                print(f"final answers, {result.name}: {a['exact']:,} of {a['questions']:,} exact ({a['rate']:.1%}), "
                      f"tool calls run by: {a['tools']}")
        if task_items:
            from gptkit.evals.report_card import card_table

            print(card_table(results))
            print("centered = (acc - random) / (1 - random); summary: their mean over the tasks; ± one standard "
                  "error, sqrt(p(1 - p) / (n - 1)) as lm-evaluation-harness's acc_stderr (docs/evaluation.md)")
    return 0


if __name__ == "__main__":
    run_main(main)
