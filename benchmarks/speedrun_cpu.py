"""`bench.py speedrun --one_thread`: CPU seconds to nanoGPT's quality, one thread per run.

Three kinds of run, interleaved seed by seed (N A B N A B ...), each a subprocess
at OMP_NUM_THREADS=1 whose CPU seconds (user + system, getrusage) are counted:

    N  nanoGPT's own train.py, its README CPU command (with --nanogpt or NANOGPT_DIR)
    A  our train.py at exactly those settings (configs/shakespeare_char.py + overrides)
    B  the recipe, configs/shakespeare.py (plus --recipe_args)

The target is N's final loss on the whole validation split (its checkpoint,
evaluated here in the consecutive windows train.py's --eval_iters=0 uses), or
A's when no nanoGPT checkout is given, or --target. For A and B, "CPU s to
target" is train.py's train_cpu_s (the process's CPU seconds inside training
steps: start-up, evaluations and saves left out) interpolated at the crossing; the headline ratio
divides it by N's whole-process CPU seconds (its 20-batch evaluations included,
which favours nanoGPT's side by ~5%), and the second ratio by A's.

    python bench.py speedrun --one_thread --nanogpt ../nanoGPT --seeds 1
"""

import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks import one_thread

REPO = Path(__file__).resolve().parent.parent


def first_reach_cpu(records, target):
    """train_cpu_s at which the eval val loss first reaches target (linear between evals), or None."""
    points = [(r["iter"], r["train_cpu_s"], r["val_loss"]) for r in records if r.get("kind") == "eval" and "train_cpu_s" in r]
    previous = None
    for it, cpu, loss in sorted(points):
        if loss <= target:
            if previous is None or previous[2] == loss:
                return cpu, it
            it0, cpu0, loss0 = previous
            frac = (loss0 - target) / (loss0 - loss)
            return cpu0 + frac * (cpu - cpu0), it0 + frac * (it - it0)
        previous = (it, cpu, loss)
    return None


def run(args, configs, Table, read_metrics):
    """configs: [(label, train.py argv)] with A first, then B and any candidates."""
    nano = one_thread.nanogpt_dir(args.nanogpt)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    work = Path(args.keep_dir).resolve() if args.keep_dir else Path(tempfile.mkdtemp(prefix="speedrun-cpu-"))
    results = []  # dicts: label, seed, cpu_s, wall_s, final, iters, records (ours)
    for seed in seeds:
        if nano is not None and seed == seeds[0]:  # nanoGPT has no seed setting: it always uses 1337
            print("[speedrun] nanoGPT's own train.py ...", file=sys.stderr, flush=True)
            out = work / "nanogpt"
            r = one_thread.nanogpt_train(nano, out, work / "nanogpt.log")
            final, iters = one_thread.full_split_val_loss(r["ckpt"], one_thread.nanogpt_char_data(nano) / "meta.pkl")
            results.append(dict(label="N: nanoGPT's own train.py", seed=1337, final=final, iters=iters, records=None, **r))
        for label, argv in configs:
            print(f"[speedrun] seed {seed}: {label} ...", file=sys.stderr, flush=True)
            out = work / f"seed{seed}-{len(results)}"
            command = [sys.executable, args.train_script, *argv, f"--seed={seed}", f"--out_dir={out}",
                       "--progress_bar=false", "--overwrite=true"]
            r = one_thread.run_one_thread(command, REPO, out.with_suffix(".log"))
            records = read_metrics(out / "metrics.jsonl")
            evals = [x for x in records if x.get("kind") == "eval"]
            results.append(dict(label=label, seed=seed, final=evals[-1]["val_loss"], iters=evals[-1]["iter"], records=records, **r))
    return tables(results, nano, args.target, Table)


def tables(results, nano, target, Table):
    by = {}
    for r in results:
        by.setdefault(r["label"], []).append(r)
    labels = list(by)
    n_label = labels[0] if nano is not None else None
    a_label = labels[1] if nano is not None else labels[0]
    if target is None:
        target = statistics.fmean(r["final"] for r in by[n_label or a_label])
    n_cpu = statistics.fmean(r["cpu_s"] for r in by[n_label]) if n_label else None
    a_cpu = statistics.fmean(r["cpu_s"] for r in by[a_label])
    table = Table(
        f"speedrun at one thread: CPU seconds to val loss {target:.4f} (the whole validation split)",
        ["run", "seed", "iters", "final val loss", "process CPU s", "wall s", "CPU s to target",
         "vs nanoGPT's CPU s" if n_label else "vs nanoGPT's CPU s (no checkout)", "vs A's CPU s"],
        note="Every run a subprocess with OMP_NUM_THREADS=1; process CPU s = user + system of the whole process "
        "(start-up and evaluations included). CPU s to target: train.py's train_cpu_s (training steps alone, "
        "start-up and evaluations left out) at the first full-split evaluation at or below the target, interpolated between "
        "evaluations; for nanoGPT, its whole run. Ratios: CPU s to target over nanoGPT's (or A's) whole-process CPU s.",
    )
    for label in labels:
        for r in by[label]:
            if r["records"] is None:
                reach = (r["cpu_s"], r["iters"]) if r["final"] <= target else None
            else:
                reach = first_reach_cpu(r["records"], target)
            to = reach[0] if reach else None
            table.add_row(
                label, r["seed"], r["iters"], f"{r['final']:.4f}", f"{r['cpu_s']:.1f}", f"{r['wall_s']:.0f}",
                "not reached" if to is None else f"{to:.1f}",
                "—" if to is None or n_cpu is None else f"{to / n_cpu:.2f}",
                "—" if to is None else f"{to / a_cpu:.2f}",
            )
    return [table]
