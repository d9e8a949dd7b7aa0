"""The best model a fixed CPU budget trains: configs/shakespeare_1200cpus.py against nanoGPT's own code.

    python bench.py budget --nanogpt ../nanoGPT                 # 300, 600 and 1200 CPU s, nanoGPT and ours (~70 min)
    python bench.py budget --budgets 300 --only ours            # ours alone at one budget
    python bench.py budget --budgets 300 --only ours --candidate "wide::--n_embd=192 --max_iters=900"  # screen one

Every run is a subprocess at one thread (OMP_NUM_THREADS=1) whose whole process is
counted in CPU seconds (user + system, getrusage): start-up, data preparation
(ours prepares Tiny Shakespeare into a fresh data folder each run), every
evaluation and every save. The score is the mean loss over the whole validation
split of the run's best checkpoint, in consecutive block_size windows (for ours
the config's own final evaluation, which is exactly that; for nanoGPT its
ckpt.pt, the best by its own 20-batch estimate, scored here afterwards).

Ours at budget B: eval_interval scaled by B/1200 and the config's time_budget less
1200 - B (the reserve it keeps for its evaluations), its max_iters kept: the run ends
at whichever comes first, its decay following it; a config without a time_budget has
its max_iters scaled by B/1200 instead. nanoGPT at budget B: its config/train_shakespeare_char.py with its
README's CPU overrides (4x4x128, block 64, batch 12, no dropout: the baby GPT itself
takes ~20 CPU s a step here, ~60 steps in 1200 s), max_iters = lr_decay_iters scaled to
fill the budget at the rate --nanogpt_iters_per_1200 says.

Runs are written to benchmarks/LOG.md one row at a time as each ends (unless
--no_record), so an interrupted sweep leaves its table behind.
"""

import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import one_thread
from gptkit.ops.errors import UserError

REPO = Path(__file__).resolve().parent.parent
CONFIG = "configs/shakespeare_1200cpus.py"
FULL_BUDGET = 1200
# nanoGPT's own README CPU command, on its own shakespeare_char config.
NANOGPT_CPU = ["--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=50", "--block_size=64",
               "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--dropout=0.0"]
COLUMNS = ["run", "budget CPU s", "iters", "process CPU s", "wall s", "whole-split val loss", "fits"]


def add_arguments(parser):
    parser.add_argument("--budgets", default="300,600,1200", help="comma-separated CPU-second budgets")
    parser.add_argument("--only", choices=("ours", "nanogpt", "both"), default="both")
    parser.add_argument("--nanogpt", default=None, help="a nanoGPT checkout (default: $NANOGPT_DIR)")
    parser.add_argument("--nanogpt_iters_per_1200", type=int, default=8250,
                        help="nanoGPT iterations that fill 1200 CPU s (README CPU shape; 8250 at 0.14 s an "
                        "iteration, measured 2026-12-02; measure with a short run)")
    parser.add_argument("--nanogpt_eval_interval", type=int, default=250, help="nanoGPT's own (default 250)")
    parser.add_argument("--candidate", action="append", default=[],
                        help="LABEL::train.py overrides on the config, its --max_iters meant for 1200 s (repeatable)")
    parser.add_argument("--config", default=CONFIG, help=f"our config (default {CONFIG})")
    parser.add_argument("--keep_dir", default=None, help="keep every run's folder here")


def config_setting(config, name, default=None):
    from gptkit.config import read_config_file

    values = read_config_file(config)
    if name not in values and default is not None:
        return default
    return type(values[name])(values[name])


def scaled(iters, budget):
    return max(1, round(iters * budget / FULL_BUDGET))


def candidates(args):
    """[(label, overrides)]: the config as it is, or the screened candidates."""
    if not args.candidate:
        return [(args.config, [])]
    out = []
    for spec in args.candidate:
        label, sep, rest = spec.partition("::")
        if not sep:
            raise UserError(f"--candidate {spec!r}: write LABEL::OVERRIDES")
        out.append((label.strip(), shlex.split(rest)))
    return out


def setting_of(overrides, name, default, kind=int):
    for arg in overrides:
        if arg.startswith(f"--{name}="):
            return kind(arg.split("=", 1)[1])
    return default


def scaled_overrides(config, overrides, budget):
    """A candidate's overrides (meant for 1200 s) at `budget`: eval_interval scaled and
    the time_budget less the same reserve, max_iters kept (the most steps worth taking:
    the run ends at whichever comes first); without a time_budget, max_iters scaled."""
    time_budget = setting_of(overrides, "time_budget", config_setting(config, "time_budget", 0), float)
    every = scaled(setting_of(overrides, "eval_interval", config_setting(config, "eval_interval")), budget)
    iters = setting_of(overrides, "max_iters", config_setting(config, "max_iters"))
    scaled_names = ("--max_iters=", "--eval_interval=", "--time_budget=")
    out = [a for a in overrides if not a.startswith(scaled_names)]
    if time_budget:
        return out + [f"--max_iters={iters}", f"--eval_interval={every}",
                      f"--time_budget={time_budget - (FULL_BUDGET - budget):g}"]
    return out + [f"--max_iters={scaled(iters, budget)}", f"--eval_interval={every}"]


def ours(args, label, overrides, budget, work):
    """The config at `budget` (scaled_overrides)."""
    from benchmarks.bench_speedrun import read_metrics

    out = work / f"ours-{budget}-{len(list(work.iterdir()))}"
    data = out.with_name(out.name + "-data")  # prepared inside the budget
    command = [sys.executable, "train.py", args.config, *scaled_overrides(args.config, overrides, budget),
               f"--out_dir={out}", f"--data_dir={data}", "--device=cpu", "--progress_bar=false"]
    r = one_thread.run_one_thread(command, REPO, out.with_suffix(".log"))
    records = read_metrics(out / "metrics.jsonl")
    evals = [x for x in records if x.get("kind") == "eval"]
    best = min(e["val_loss"] for e in evals)  # best.pt's; the config evaluates the whole split
    shutil.rmtree(data, ignore_errors=True)
    return dict(label=f"ours: {label}", iters=max(e["iter"] for e in evals), score=best, **r)


def nanogpt(args, nano, budget, work):
    # nanoGPT evaluates (and saves its best) at multiples of eval_interval only, never after
    # its last step: the run ends on one
    every = args.nanogpt_eval_interval
    iters = max(every, scaled(args.nanogpt_iters_per_1200, budget) // every * every)
    out = work / f"nanogpt-{budget}"
    command = [sys.executable, "train.py", "config/train_shakespeare_char.py", *NANOGPT_CPU,
               f"--eval_interval={every}", f"--max_iters={iters}", f"--lr_decay_iters={iters}", f"--out_dir={out}"]
    r = one_thread.run_one_thread(command, nano, out.with_suffix(".log"))
    score_data = work / "score-data"  # our prepared copy of the same split, to score nanoGPT's checkpoint on
    if not (score_data / "shakespeare_char" / "val.bin").is_file():
        text = one_thread.nanogpt_char_data(nano) / "input.txt"  # the very text nanoGPT's prepare.py split
        done = subprocess.run([sys.executable, "prepare.py", "shakespeare_char", "--data_dir", str(score_data), "--quiet",
                               *(["--input", str(text)] if text.is_file() else [])], cwd=REPO)
        if done.returncode:
            raise UserError(f"could not prepare Tiny Shakespeare to score nanoGPT's checkpoint on (exit {done.returncode})")
    score, _ = one_thread.full_split_val_loss(out / "ckpt.pt", one_thread.nanogpt_char_data(nano) / "meta.pkl",
                                              data_dir=score_data)
    return dict(label="nanoGPT's own train.py", iters=iters, score=score, **r)


class Recorder:
    """The table, printed and appended to the log one row at a time."""

    def __init__(self, args, Table, title):
        self.table = Table(title, COLUMNS, note=NOTE)
        self.log = None if getattr(args, "no_record", False) else getattr(args, "log_path", None)
        head = "\n".join(self.table.to_markdown().splitlines()[:4])  # title, blank, columns, rule
        if self.log:
            with open(self.log, "a") as f:
                f.write("\n".join(args.log_header) + "\n" + head + "\n")

    def add(self, r, budget):
        fits = "yes" if r["cpu_s"] <= budget else f"no (+{r['cpu_s'] - budget:.0f} s)"
        self.table.add_row(r["label"], budget, r["iters"], round(r["cpu_s"], 1), round(r["wall_s"]),
                           f"{r['score']:.4f}", fits)
        row = "| " + " | ".join(self.table.rows[-1]) + " |"
        print(row, file=sys.stderr, flush=True)
        if self.log:
            with open(self.log, "a") as f:
                f.write(row + "\n")

    def close(self):
        if self.log:
            with open(self.log, "a") as f:
                f.write("\n" + NOTE + "\n\n")
        self.table.recorded = bool(self.log)


NOTE = ("Each run a subprocess at OMP_NUM_THREADS=1; process CPU s = user + system of the whole process "
        "(start-up, data preparation, evaluations and saves included); whole-split val loss: the best "
        "checkpoint's mean loss over the whole validation split in consecutive block_size windows. "
        "nanoGPT: its config/train_shakespeare_char.py with its README's CPU overrides "
        "(4x4x128, block 64, batch 12, dropout 0), max_iters = lr_decay_iters scaled to the budget.")


def run(args):
    from benchmarks.report import Table

    budgets = [int(b) for b in str(args.budgets).split(",") if b.strip()]
    if not budgets or min(budgets) < 10:
        raise UserError(f"--budgets {args.budgets!r}: give CPU seconds, e.g. 300,600,1200")
    nano = one_thread.nanogpt_dir(args.nanogpt) if args.only in ("nanogpt", "both") else None
    if args.only == "nanogpt" and nano is None:
        raise UserError("--only nanogpt needs --nanogpt PATH (or NANOGPT_DIR)")
    work = Path(args.keep_dir).resolve() if args.keep_dir else Path(tempfile.mkdtemp(prefix="budget-"))
    work.mkdir(parents=True, exist_ok=True)
    rec = Recorder(args, Table, "Fixed CPU budget, one thread: whole-split val loss on Tiny Shakespeare (char)")
    try:
        for budget in budgets:
            if nano is not None:
                rec.add(nanogpt(args, nano, budget, work), budget)
            if args.only in ("ours", "both"):
                for label, overrides in candidates(args):
                    rec.add(ours(args, label, overrides, budget, work), budget)
    finally:
        rec.close()
    return [rec.table]
