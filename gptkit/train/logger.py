"""Training logs: the console line, a tqdm bar, out_dir/metrics.jsonl and wandb.

Rank 0 alone logs. Every record also goes to `metrics.jsonl`, one JSON object a
line, so any tool (eval.py plot, a notebook, jq) can read a run without a service:

    {"kind": "train", "iter": 100, "loss": 1.2345, "lr": 0.001, "grad_norm": 0.85,
     "ms_per_iter": 35.2, "tokens_per_s": 12345.0, "mfu": 0.312, "train_time_s": 3.5}
    {"kind": "eval", "iter": 250, "train_loss": 1.3, "val_loss": 1.4, "val_bpb": 2.02,
     "train_bpb": 1.88, "lr": 0.001, "train_time_s": 9.1}
"""

import json
import math
import os
import sys
from pathlib import Path

from gptkit.errors import UserError


def format_train_line(rec):
    """`step 100 | loss 1.2345 | lr 1.0e-03 | norm 0.85 | 35.2 ms | 12,345 tok/s | mfu 31.2%`"""
    mfu = "n/a" if rec["mfu"] is None else f"{100 * rec['mfu']:.1f}%"
    line = (
        f"step {rec['iter']} | loss {rec['loss']:.4f} | lr {rec['lr']:.1e} | "
        f"norm {rec['grad_norm']:.2f} | {rec['ms_per_iter']:.1f} ms | "
        f"{rec['tokens_per_s']:,.0f} tok/s | mfu {mfu}"
    )
    if rec.get("skipped"):
        line += " | step skipped (fp16 overflow, loss scale lowered)"
    return line


def format_eval_line(rec):
    line = f"eval {rec['iter']} | train loss {rec['train_loss']:.4f} | val loss {rec['val_loss']:.4f}"
    if rec.get("val_bpb") is not None:
        line += f" | val bpb {rec['val_bpb']:.4f}"
    return line


def _json_safe(value):
    """JSON has no NaN or Infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def trim_metrics(path, resume_iter):
    """Drop records past a resume point (written after the checkpoint, before a kill),
    so the file reads as one continuous run. Atomic, like a checkpoint."""
    path = Path(path)
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        it = rec.get("iter", -1)
        if (rec.get("kind") == "eval" and it <= resume_iter) or it < resume_iter:
            kept.append(line)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


class Logger:
    """Rank 0's logs; on other ranks every method does nothing."""

    def __init__(self, cfg, out_dir, enabled, total_iters, start_iter, run_config, write_files=True):
        self.enabled = enabled
        self.bar = None
        self.wandb = None
        self.metrics = None
        if not enabled:
            return
        if write_files:
            self.metrics = open(Path(out_dir) / "metrics.jsonl", "a")
        if cfg.progress_bar and sys.stdout.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_iters, initial=start_iter, unit="it", dynamic_ncols=True)
        if cfg.wandb_log and write_files:
            self.wandb = start_wandb(cfg, run_config)

    def print(self, text):
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def record(self, rec):
        """Write one metrics record to metrics.jsonl, the console and wandb."""
        if not self.enabled:
            return
        if self.metrics is not None:
            self.metrics.write(json.dumps({k: _json_safe(v) for k, v in rec.items()}) + "\n")
            self.metrics.flush()
        self.print(format_train_line(rec) if rec["kind"] == "train" else format_eval_line(rec))
        if self.wandb is not None:
            prefix = "train" if rec["kind"] == "train" else "eval"
            data = {f"{prefix}/{k}": v for k, v in rec.items() if k not in ("kind", "iter") and v is not None}
            self.wandb.log(data, step=rec["iter"])

    def advance(self, n=1):
        if self.bar is not None:
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def start_wandb(cfg, run_config):
    """A wandb run; WANDB_MODE=offline writes it under ./wandb without a network.
    The API key stays in the environment (WANDB_API_KEY), never in a setting or a log."""
    try:
        import wandb
    except ImportError:
        raise UserError("wandb_log is on but wandb is not installed: pip install wandb (or --wandb_log=false)")
    return wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name, config=run_config)
