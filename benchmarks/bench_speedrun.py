"""Speedrun: time for the modern recipe to reach nanoGPT's CPU quality.

    python bench.py speedrun                 # A B A B A B: baseline vs recipe, 3 seeds
    python bench.py speedrun --quick         # a smoke test: short runs, 1 seed
    python bench.py speedrun --ablation      # also the recipe with one idea off at a time
    python bench.py speedrun --recipe_args="--n_layer=6 --max_iters=900"   # try a candidate

A is nanoGPT's README CPU run, done by our train.py: configs/shakespeare_char.py
with the overrides in BASELINE_ARGS (GPT-2 architecture, AdamW, cosine
schedule, 2000 iterations). B is the recipe, configs/shakespeare.py. Each run
is a subprocess `python train.py CONFIG ... --seed=S --out_dir=DIR` that
evaluates the whole validation split (`--eval_iters=0`) every eval_interval
iterations and writes DIR/metrics.jsonl. The runs alternate (A B A B ...) so
that a change in the machine's load hits both alike.

The target is the mean over seeds of A's final val loss (or --target). For
each run we report the training wall time (train_time_s: evaluation excluded)
and the iteration at which val loss first reaches the target, linearly
interpolated between the two evaluations around the crossing. The headline
ratio, per seed, is B's time to target over A's whole training time; the
target is at most 0.5 (the recipe reaches A's quality in half A's wall time).
"""

import difflib
import json
import math
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gptkit.ops.errors import RunFailed, UserError

REPO = Path(__file__).resolve().parent.parent

BASELINE_CONFIG = "configs/shakespeare_char.py"
# nanoGPT README's CPU command (minus its 20-batch eval estimate and logging
# flags): https://github.com/karpathy/nanoGPT#quick-start
BASELINE_ARGS = [
    "--device=cpu",
    "--compile=false",
    "--block_size=64",
    "--batch_size=12",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--max_iters=2000",
    "--lr_decay_iters=2000",
    "--dropout=0.0",
]
RECIPE_CONFIG = "configs/shakespeare.py"
RECIPE_ARGS = ["--device=cpu"]
# Both: evaluate the whole validation split, never a sample of batches.
COMMON_ARGS = ["--eval_iters=0"]

# The recipe with one idea switched off at a time, for the ablation table in
# BENCHMARKS.md. Setting names follow model.py/train.py; the harness checks
# them against `train.py --help` before starting any run.
ABLATIONS = {
    "adamw instead of muon": ["--optimizer=adamw"],
    "learned positions instead of rope": ["--pos_encoding=learned"],
    "no qk-norm": ["--qk_norm=false"],
    "gelu instead of relu²": ["--mlp=gelu"],
    "no zero-init projections": ["--zero_init_proj=false"],
    "no logit soft-cap": ["--logit_softcap=none"],
    "tied head": ["--tie_embeddings=true"],
    "cosine instead of warmup-stable-decay": ["--lr_schedule=cosine"],
}

# --quick: this many iterations for A (B is scaled by the same factor), 1 seed.
QUICK_BASELINE_ITERS = 200
QUICK_EVALS = 4


def add_arguments(parser):
    parser.add_argument("--seeds", type=int, default=3, help="runs of each configuration (default 3)")
    parser.add_argument("--first_seed", type=int, default=1, help="seeds are first_seed, first_seed+1, ...")
    parser.add_argument("--eval_interval", type=int, default=250, help="A's eval interval in iterations")
    parser.add_argument(
        "--recipe_eval_interval", type=int, default=None,
        help="B's eval interval (default: the recipe config's own)",
    )
    parser.add_argument("--target", type=float, default=None, help="val loss target (default: A's mean final)")
    parser.add_argument("--baseline_args", default="", help="extra train.py arguments for A, one string")
    parser.add_argument("--recipe_args", default="", help="extra train.py arguments for B, one string")
    parser.add_argument("--ablation", action="store_true", help="also run the recipe with each idea off")
    parser.add_argument("--quick", action="store_true", help="smoke test: short runs, 1 seed")
    parser.add_argument("--keep_dir", default=None, help="keep every run's out_dir under this folder")
    parser.add_argument("--train_script", default="train.py", help="the training script (default train.py)")
    parser.add_argument("--one_thread", action="store_true",
                        help="CPU seconds per run at one thread, against nanoGPT's own train.py with --nanogpt (benchmarks/speedrun_cpu.py)")
    parser.add_argument("--nanogpt", default=None, help="a nanoGPT checkout to compare with (default: $NANOGPT_DIR)")


# ---------------------------------------------------------------- pure parts


def read_metrics(path):
    """The records of a metrics.jsonl file, in order; RunFailed naming a bad line."""
    path = Path(path)
    if not path.is_file():
        raise RunFailed(f"{path} was not written: did train.py run to the end?")
    records = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise RunFailed(f"{path}, line {lineno}: not JSON ({e.msg})")
            if isinstance(record, dict):
                records.append(record)
    return records


def eval_points(records):
    """[(iter, train_time_s, val_loss)] of the eval records, sorted by iteration."""
    points = [
        (int(r["iter"]), float(r["train_time_s"]), float(r["val_loss"]))
        for r in records
        if r.get("kind") == "eval"
    ]
    return sorted(points)


def first_reach(points, target):
    """(train_time_s, iter) at which val loss first reaches `target`, or None.

    Between the last evaluation above the target and the first at or below it,
    the loss is taken to fall linearly in time and iterations (interpolation).
    """
    previous = None
    for it, t, loss in points:
        if loss <= target:
            if previous is None or previous[2] == loss:
                return t, float(it)
            it0, t0, loss0 = previous
            frac = (loss0 - target) / (loss0 - loss)  # in [0, 1): loss0 > target >= loss
            return t0 + frac * (t - t0), it0 + frac * (it - it0)
        previous = (it, t, loss)
    return None


def ms_per_iter(points):
    """Mean training ms per iteration between the first and last evaluation."""
    (i0, t0, _), (i1, t1, _) = points[0], points[-1]
    return 1000.0 * (t1 - t0) / (i1 - i0) if i1 > i0 else float("nan")


def summarize_run(points, target):
    """What the tables need from one run's eval points."""
    if not points:
        raise RunFailed("the run wrote no eval records to metrics.jsonl")
    reached = first_reach(points, target)
    return {
        "final_iter": points[-1][0],
        "final_val_loss": points[-1][2],
        "train_time_s": points[-1][1],
        "time_to_target_s": reached[0] if reached else None,
        "iter_to_target": reached[1] if reached else None,
        "ms_per_iter": ms_per_iter(points),
    }


def spread(values, fmt="{:.3f}"):
    """'mean (min–max)' of the values that are not None; '—' when there are none."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "—"
    mean = fmt.format(statistics.fmean(values))
    if len(values) == 1:
        return mean
    return f"{mean} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def ratios(recipe_runs, baseline_runs):
    """Per seed: B's time to target / A's whole training time (None if B never got there)."""
    out = []
    for seed, b in recipe_runs.items():
        a = baseline_runs[seed]
        t = b["time_to_target_s"]
        out.append(None if t is None else t / a["train_time_s"])
    return out


# ------------------------------------------------------------ running train.py


def known_settings(train_script):
    """Setting names listed by `train.py --help` (config.format_help's format)."""
    result = subprocess.run(
        [sys.executable, train_script, "--help"], cwd=REPO, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise UserError(f"`python {train_script} --help` failed: {result.stderr.strip()[-500:]}")
    names = set()
    for line in result.stdout.splitlines():
        stripped = line.strip()
        if stripped.startswith("--") and " (" in stripped:
            names.add(stripped[2:].split(" ", 1)[0])
    return names


def check_settings(label, argv, known):
    """UserError naming the first `--key` in argv that train.py does not know."""
    for arg in argv:
        if arg.startswith("--"):
            key = arg[2:].split("=", 1)[0].replace("-", "_")
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=1)
                hint = f" (did you mean '--{close[0]}'?)" if close else ""
                raise UserError(f"{label}: train.py has no setting '--{key}'{hint}")


def quick_overrides(config_values, factor, evals):
    """Scale a config's step counts by `factor` for --quick: max_iters, and the
    schedule lengths the config sets (lr_decay_iters, warmup_iters)."""
    max_iters = max(evals, int(config_values.get("max_iters", 2000) * factor))
    interval = max(1, max_iters // evals)
    max_iters = interval * evals  # the last evaluation lands on the last step
    out = [f"--max_iters={max_iters}", f"--eval_interval={interval}"]
    for key in ("lr_decay_iters", "warmup_iters"):
        if key in config_values:
            out.append(f"--{key}={max(0, int(config_values[key] * factor))}")
    return out


def plan(args):
    """[(label, argv for train.py without seed/out_dir)] in the order each seed runs them."""
    from gptkit.config import read_config_file

    baseline_values = {"max_iters": 2000, "lr_decay_iters": 2000}  # BASELINE_ARGS' numbers
    recipe_path = REPO / RECIPE_CONFIG
    if not recipe_path.is_file():
        raise UserError(f"{RECIPE_CONFIG} does not exist: the recipe is what this benchmark measures")
    recipe_values = read_config_file(recipe_path)
    baseline = [BASELINE_CONFIG, *BASELINE_ARGS, *COMMON_ARGS, f"--eval_interval={args.eval_interval}"]
    recipe = [RECIPE_CONFIG, *RECIPE_ARGS, *COMMON_ARGS]
    if args.recipe_eval_interval:
        recipe.append(f"--eval_interval={args.recipe_eval_interval}")
    if args.quick:
        factor = QUICK_BASELINE_ITERS / baseline_values["max_iters"]
        baseline += quick_overrides(baseline_values, factor, QUICK_EVALS)
        recipe += quick_overrides(recipe_values, factor, QUICK_EVALS)
    baseline += shlex.split(args.baseline_args)
    recipe += shlex.split(args.recipe_args)
    configs = [("A: nanoGPT-equivalent", baseline), ("B: recipe", recipe)]
    if args.ablation:
        # Last on the command line, so an ablation's override wins over --recipe_args.
        configs += [(f"B, {name}", recipe + over) for name, over in ABLATIONS.items()]
    return configs


def run_training(train_script, argv, seed, out_dir):
    """Run train.py once; return its eval points. Its output goes to out_dir/train.log."""
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, train_script, *argv, f"--seed={seed}", f"--out_dir={out_dir}"]
    log_path = out_dir / "train.log"
    with open(log_path, "w") as log:
        log.write(" ".join(shlex.quote(c) for c in command) + "\n")
        log.flush()
        code = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = log_path.read_text().strip().splitlines()[-5:]
        message = f"train.py exited with {code} (log: {log_path}):\n  " + "\n  ".join(tail)
        raise UserError(message) if code == 2 else RunFailed(message)
    return eval_points(read_metrics(out_dir / "metrics.jsonl"))


def run(args):
    from benchmarks.report import Table

    if args.seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {args.seeds}")
    seeds = [args.first_seed] if args.quick else list(range(args.first_seed, args.first_seed + args.seeds))
    configs = plan(args)
    known = known_settings(args.train_script)
    if known:  # an empty --help listing means a format we cannot read: let train.py judge
        for label, argv in configs:
            check_settings(label, argv, known)
    if args.one_thread:
        from benchmarks import speedrun_cpu

        return speedrun_cpu.run(args, configs, Table, read_metrics)

    work = Path(args.keep_dir).resolve() if args.keep_dir else Path(tempfile.mkdtemp(prefix="speedrun-"))
    out_dirs = {(seed, i): work / f"seed{seed}-{i}" for seed in seeds for i in range(len(configs))}
    if args.keep_dir:  # an old run's metrics.jsonl must never be read as a new one's
        taken = [str(d) for d in out_dirs.values() if d.exists()]
        if taken:
            raise UserError(f"{taken[0]} already exists: give --keep_dir an empty or new folder")
    points = {label: {} for label, _ in configs}
    try:
        for seed in seeds:
            for index, (label, argv) in enumerate(configs):
                out_dir = out_dirs[(seed, index)]
                print(f"[speedrun] seed {seed}: {label} ...", file=sys.stderr, flush=True)
                started = time.perf_counter()
                points[label][seed] = run_training(args.train_script, argv, seed, out_dir)
                final = points[label][seed][-1] if points[label][seed] else None
                print(
                    f"[speedrun]   done in {time.perf_counter() - started:.0f} s"
                    + (f", final val loss {final[2]:.4f} at iter {final[0]}" if final else ""),
                    file=sys.stderr, flush=True,
                )
    finally:
        if not args.keep_dir:
            shutil.rmtree(work, ignore_errors=True)
    return build_tables(configs, points, args.target, Table)


def build_tables(configs, points, target, Table):
    """The per-run table and the summary table from every run's eval points."""
    labels = [label for label, _ in configs]
    baseline_label = labels[0]
    if target is None:
        target = statistics.fmean(p[-1][2] for p in points[baseline_label].values() if p)
    summaries = {
        label: {seed: summarize_run(p, target) for seed, p in points[label].items()} for label in labels
    }

    runs = Table(
        f"speedrun: every run (target val loss {target:.4f}, full validation split)",
        ["config", "seed", "iters", "final val loss", "train time (s)",
         "time to target (s)", "iter at target", "ms/iter"],
        note="Time and iteration at target are linearly interpolated between the two evaluations "
        "around the crossing; train time excludes evaluation.",
    )
    for label in labels:
        for seed, s in summaries[label].items():
            runs.add_row(
                label, seed, s["final_iter"], f"{s['final_val_loss']:.4f}", f"{s['train_time_s']:.1f}",
                "not reached" if s["time_to_target_s"] is None else f"{s['time_to_target_s']:.1f}",
                "—" if s["iter_to_target"] is None else f"{s['iter_to_target']:.0f}",
                f"{s['ms_per_iter']:.1f}",
            )

    summary = Table(
        "speedrun: summary, mean (min–max) over seeds",
        ["config", "reached target", "time to target (s)", "ratio to A's train time",
         "final val loss", "ms/iter"],
        note="Ratio: per seed, the config's time to target over A's whole training time "
        "(the target for B: at most 0.5). A's ms/iter is our plain speed at "
        "nanoGPT-equivalent settings.",
    )
    baseline = summaries[baseline_label]
    for label in labels:
        runs_of = summaries[label]
        summary.add_row(
            label,
            f"{sum(s['time_to_target_s'] is not None for s in runs_of.values())}/{len(runs_of)}",
            spread([s["time_to_target_s"] for s in runs_of.values()], "{:.1f}"),
            spread(ratios(runs_of, baseline), "{:.2f}"),
            spread([s["final_val_loss"] for s in runs_of.values()], "{:.4f}"),
            spread([s["ms_per_iter"] for s in runs_of.values()], "{:.1f}"),
        )
    return [summary, runs]
