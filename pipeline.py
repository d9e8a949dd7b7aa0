"""From a corpus to a chat model you can talk to, in one command, with a report.

    python pipeline.py                                  # laptop size, Tiny Shakespeare (offline: $TINYSHAKESPEARE)
    python pipeline.py --size tiny --out_dir run-tiny   # every stage in about a minute (the tests' size)
    python pipeline.py --corpus books/ --tasks none     # your own text, no report card
    python pipeline.py --size gpu --corpus fineweb_edu --shards 40 --nproc_per_node 8   # GPT-2 124M's shape

Each stage is one of our own commands, run as a child process (gptkit/pipeline/stages.py):
prepare.py (the corpus, and our BPE sized to the model), train.py (pretraining),
eval.py (bits per byte and the report card), prepare.py (arithmetic conversations in
that BPE), train.py (chat SFT), rl.py (GRPO on sums it can check), eval.py again,
convert.py (Hugging Face and GGUF), eval.py plot; then RUN/report.md, and the
serve.py command that serves the result. A finished stage leaves a done-marker in
RUN/stages and is never run again; Ctrl-C stops the running stage as its command
stops (train.py and rl.py save a checkpoint) and the same command resumes it
(docs/pipeline.md).
"""

from gptkit.ops.errors import quiet_start

quiet_start()  # a Ctrl-C or a missing package while the imports below load: one line, no traceback
import json
import os
import sys
from pathlib import Path

from gptkit.ops.errors import EXIT_INTERRUPTED, ArgumentParser, UserError, run_main
from gptkit.ops.lock import FolderLock
from gptkit.pipeline.report import write_report
from gptkit.pipeline.runner import Interrupted, Progress, run_stages
from gptkit.pipeline.sizes import SIZES
from gptkit.pipeline.stages import STAGES, WEB_CORPORA, Run, serve_command

REPO = Path(__file__).resolve().parent


def parse_args(argv):
    parser = ArgumentParser(prog="pipeline.py", description=__doc__.split("\n")[0],
                            epilog="stages, sizes, resuming and the report: docs/pipeline.md")
    parser.add_argument("--size", choices=list(SIZES), default="laptop",
                        help="tiny (a minute: the tests'), laptop (26 minutes on 2 CPU cores), gpu (GPT-2 124M's "
                             "shape, for a node of GPUs) (default laptop)")
    parser.add_argument("--corpus", default="shakespeare",
                        help="shakespeare (a local copy in $TINYSHAKESPEARE, else downloaded), fineweb_edu or "
                             "openwebtext (downloaded: online), or a text file or folder of yours (default shakespeare)")
    parser.add_argument("--shards", type=int, help="fineweb_edu, openwebtext: only the first N Parquet files")
    parser.add_argument("--out_dir", help="the run's folder (default run-SIZE)")
    parser.add_argument("--tasks", default="core",
                        help="the report card's tasks, as eval.py --tasks takes them, or none (default core; "
                             "offline the card is n/a, with why, unless --task_file gives the files)")
    parser.add_argument("--task_file", action="append", default=[], metavar="NAME=PATH",
                        help="a task's file, as eval.py --task_file (repeatable)")
    parser.add_argument("--device", default="auto", help="train.py's, rl.py's and eval.py's --device (default auto)")
    parser.add_argument("--nproc_per_node", type=int, default=1,
                        help="train.py and rl.py on this many processes (torchrun --standalone; default 1)")
    return parser.parse_args(argv)


def check(args):
    """The user's choices, checked before any stage runs."""
    if args.corpus not in ("shakespeare", *WEB_CORPORA) and not Path(args.corpus).exists():
        raise UserError(f"--corpus {args.corpus} is neither shakespeare, {', '.join(WEB_CORPORA)} nor a file or "
                        "folder that exists")
    if args.shards is not None and (args.corpus not in WEB_CORPORA or args.shards < 1):
        raise UserError(f"--shards goes with a downloaded corpus ({', '.join(WEB_CORPORA)}) and is at least 1")
    for spec in args.task_file:
        name, _, path = spec.partition("=")
        if not name or not path or not Path(path).is_file():
            raise UserError(f"--task_file {spec}: expected NAME=PATH to a file that exists")
    if args.nproc_per_node < 1:
        raise UserError(f"--nproc_per_node must be at least 1, got {args.nproc_per_node}")


def settings_of(args):
    """What decides a run's results: a run folder holds one set of them."""
    corpus = args.corpus if args.corpus in ("shakespeare", *WEB_CORPORA) else str(Path(args.corpus).resolve())
    task_files = [f"{n}={Path(p).resolve()}" for n, _, p in (s.partition("=") for s in args.task_file)]
    return {"size": args.size, "corpus": corpus, "shards": args.shards, "tasks": args.tasks, "task_files": task_files}


def claim_settings(folder, settings):
    """Record the run's settings in RUN/pipeline.json, or check them against a run there."""
    path = folder / "pipeline.json"
    if path.is_file():
        before = json.loads(path.read_text())
        changed = [f"{k} {before.get(k)!r} -> {v!r}" for k, v in settings.items() if before.get(k) != v]
        if changed:
            raise UserError(f"{folder} holds a pipeline run with other settings ({'; '.join(changed)}): "
                            "give another --out_dir, or remove the folder to start again")
        return
    path.write_text(json.dumps(settings, indent=2) + "\n")


def script(repo_file):
    """A script's path as the commands will show it: relative where it is below this folder."""
    relative = os.path.relpath(repo_file)
    return repo_file if relative.startswith("..") else relative


def main(argv=None):
    args = parse_args(argv)
    check(args)
    settings = settings_of(args)
    folder = Path(args.out_dir or f"run-{args.size}")
    size = SIZES[args.size]
    run = Run(folder, size, corpus=settings["corpus"], tasks=args.tasks, task_files=settings["task_files"],
              shards=args.shards, device=args.device, nproc_per_node=args.nproc_per_node,
              scripts={name: script(REPO / name) for name in ("prepare.py", "train.py", "eval.py", "rl.py",
                                                              "convert.py", "serve.py")})
    with FolderLock(folder, "pipeline run", "give another --out_dir"):
        claim_settings(folder, settings)
        print(f"pipeline: size {args.size}, corpus {settings['corpus']}, into {folder}", flush=True)
        try:
            markers = run_stages(run, STAGES, Progress(size["expected_s"]))
        except Interrupted:
            return EXIT_INTERRUPTED
        report = write_report(run, STAGES, markers, settings, serve_command(run))
    print(f"report: {report}\nserve it: {serve_command(run)}   (then open http://127.0.0.1:8000/)")
    return 0


if __name__ == "__main__":
    run_main(main)
