"""Loss curves: train loss, val loss and learning rate against iteration, one colour per run.

Reads the `metrics.jsonl` that train.py writes into each out_dir (one JSON object
per line, `"kind": "train"` or `"kind": "eval"`). A run that is still writing is
fine: a cut-off last line is skipped.

    python eval.py plot out-shakespeare-char
    python eval.py plot out-baseline out-rope --out compare.png
    python eval.py plot out-char out-bpe2048 --metric bpb    # runs with different tokenizers

--metric loss plots nats per token, which compares runs only when they share a
tokenizer; --metric bpb plots bits per byte (the eval rows' train_bpb and
val_bpb), which compares any runs on the same text. The default, auto, is bpb
when every run has logged it, else loss.
"""

import json
from pathlib import Path

from gptkit.ops.errors import UserError

METRICS_FILE = "metrics.jsonl"
# metric -> (axis label, (kind, key) of the faint train curve, (kind, key) of the val dots)
METRICS = {
    "loss": ("loss (nats/token)", ("train", "loss"), ("eval", "val_loss")),
    "bpb": ("bits per byte", ("eval", "train_bpb"), ("eval", "val_bpb")),
}


def read_metrics(out_dir):
    """{'train': [rows], 'eval': [rows]} from OUT_DIR/metrics.jsonl.

    Unknown keys and kinds are ignored (newer trainers may log more); a last
    line without its newline is a run caught mid-write and is skipped; any other
    unreadable line is a UserError naming the file and the line.
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise UserError(f"run folder {out_dir} does not exist")
    path = out_dir / METRICS_FILE
    if not path.is_file():
        raise UserError(
            f"{path} does not exist: is {out_dir} a training out_dir? (train.py writes it)"
        )
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    rows = {"train": [], "eval": []}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):  # no newline after it: still being written
                continue
            raise UserError(f"{path}, line {number} is not valid JSON ({e.msg})")
        if not isinstance(row, dict):
            raise UserError(f"{path}, line {number} is not a JSON object")
        if row.get("kind") in rows and isinstance(row.get("iter"), (int, float)):
            rows[row["kind"]].append(row)
    if not rows["train"] and not rows["eval"]:
        raise UserError(f"{path} holds no metrics yet: wait for the first logged iteration")
    return rows


def _series(rows, key):
    """(iters, values) for the rows that have a number under `key`."""
    pairs = [
        (r["iter"], r[key])
        for r in rows
        if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def run_labels(out_dirs):
    """Legend names: each folder's name, or the path as given when two names clash."""
    names = [Path(d).name or str(d) for d in out_dirs]
    return [str(d) if names.count(n) > 1 else n for d, n in zip(out_dirs, names)]


def has_bpb(rows):
    return bool(_series(rows["eval"], "val_bpb")[0])


def choose_metric(runs, metric="auto"):
    """'loss' or 'bpb' for `runs` = [(label, rows)]; bpb needs every run to have logged it."""
    if metric not in ("auto", *METRICS):
        raise UserError(f"--metric must be auto, loss or bpb, not {metric!r}")
    missing = [label for label, rows in runs if not has_bpb(rows)]
    if metric == "bpb" and missing:
        raise UserError(
            f"--metric bpb: {', '.join(missing)} logged no val_bpb (trained before train.py reported "
            "bits per byte?); use --metric loss, which compares runs only when they share a tokenizer"
        )
    if metric == "auto":
        return "loss" if missing else "bpb"
    return metric


def loss_figure(runs, metric="loss"):
    """A Figure of loss or bits per byte (top) and learning rate (bottom) for `runs` = [(label, rows)]."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError("plotting needs matplotlib: pip install matplotlib")
    fig = Figure(figsize=(9, 7), layout="constrained")
    ax_loss, ax_lr = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    colours = matplotlib.colormaps["tab10"]
    for i, (label, rows) in enumerate(runs):
        colour = colours(i % 10)
        axis_label, (train_kind, train_key), (val_kind, val_key) = METRICS[metric]
        x, y = _series(rows[train_kind], train_key)
        if x:
            ax_loss.plot(x, y, color=colour, alpha=0.35, linewidth=0.8, label=f"{label} train")
        x, y = _series(rows[val_kind], val_key)
        if x:
            ax_loss.plot(x, y, color=colour, marker="o", markersize=3, label=f"{label} val")
        x, y = _series(rows["train"] or rows["eval"], "lr")
        if x:
            ax_lr.plot(x, y, color=colour, label=label)
    ax_loss.set_ylabel(METRICS[metric][0])
    every = "every logged iteration" if metric == "loss" else "every eval"
    ax_loss.set_title(f"train {METRICS[metric][0]} (faint, {every}) and val (dots)")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("iteration")
    ax_lr.grid(alpha=0.3)
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    return fig


def plot_runs(out_dirs, out=None, metric="auto"):
    """Read every run's metrics and write the PNG (by default loss.png in the first
    run's folder, beside its metrics.jsonl); return its Path."""
    import io

    from gptkit.ops.checkpoint import write_text_atomic
    from gptkit.ops.paths import claim_output

    if not out_dirs:
        raise UserError("give at least one run folder, e.g. python eval.py plot out-shakespeare-char")
    runs = [(label, read_metrics(d)) for label, d in zip(run_labels(out_dirs), out_dirs)]
    out = claim_output(out or Path(out_dirs[0]) / "loss.png", "file", overwrite=True, what="--out")
    fig = loss_figure(runs, choose_metric(runs, metric))
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    write_text_atomic(out, png.getvalue())  # a full disk leaves the previous plot, not half a PNG
    return Path(out)
