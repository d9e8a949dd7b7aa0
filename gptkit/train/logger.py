"""Training logs: the console line, a tqdm bar, out_dir/metrics.jsonl and wandb.

Rank 0 alone logs. Every record also goes to `metrics.jsonl`, one JSON object a
line, so any tool (eval.py plot, a notebook, jq) can read a run without a service:

    {"kind": "train", "iter": 100, "loss": 1.2345, "lr": 0.001, "grad_norm": 0.85,
     "ms_per_iter": 35.2, "tokens_per_s": 12345.0, "mfu": 0.312, "train_time_s": 3.5,
     "mem_peak_gb": 12.31, "mem_reserved_gb": 14.02}
    {"kind": "eval", "iter": 250, "train_loss": 1.3, "val_loss": 1.4, "val_bpb": 2.02,
     "train_bpb": 1.88, "lr": 0.001, "train_time_s": 9.1}
    {"kind": "note", "iter": 0, "note": "compile failed: BackendCompilerFailed: ..."}

mem_peak_gb and mem_reserved_gb are this rank's (rank 0's) CUDA memory so far:
torch.cuda.max_memory_allocated (tensors) and max_memory_reserved (what the
caching allocator holds, what nvidia-smi shows, less CUDA's own context); None
where CUDA is not in use.
"""

import collections
import json
import math
import netrc
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import torch

from gptkit.ops.checkpoint import write_text_atomic
from gptkit.ops.errors import RunFailed, UserError, first_line


ETA_WINDOW = 100  # steps whose mean duration paces the ETA
PACE_STEPS = 10  # steps after the first that pace the check of a time budget against the warmup


def format_duration(seconds):
    """1h02m, 3m07s, 12s."""
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def cuda_peak_memory_gb():
    """(peak allocated, peak reserved) GB of this process's CUDA memory so far, or
    (None, None) where CUDA is not in use (a CPU run, even on a machine with a GPU)."""
    if not torch.cuda.is_initialized():
        return None, None
    return torch.cuda.max_memory_allocated() / 1e9, torch.cuda.max_memory_reserved() / 1e9


def format_train_line(rec, total_iters=None, eta_s=None):
    """`step 100/5000 | loss 1.2345 | lr 1.0e-03 | norm 0.85 | 35.2 ms | 12,345 tok/s | mfu 31.2% | eta 2m51s`,
    and on CUDA `| mem 12.31 GB (14.02 reserved)` before the eta."""
    mfu = "n/a" if rec["mfu"] is None else f"{100 * rec['mfu']:.1f}%"
    step = f"{rec['iter']}/{total_iters}" if total_iters else f"{rec['iter']}"
    line = (
        f"step {step} | loss {rec['loss']:.4f} | lr {rec['lr']:.1e} | "
        f"norm {rec['grad_norm']:.2f} | {rec['ms_per_iter']:.1f} ms | "
        f"{rec['tokens_per_s']:,.0f} tok/s | mfu {mfu}"
    )
    if rec.get("mem_peak_gb") is not None:
        line += f" | mem {rec['mem_peak_gb']:.2f} GB ({rec['mem_reserved_gb']:.2f} reserved)"
    if eta_s is not None:
        line += f" | eta {format_duration(eta_s)}"
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


def trim_metrics(path, resume_iter, eval_kind="eval"):
    """Drop records past a resume point (written after the checkpoint, before a kill),
    so the file reads as one continuous run. The evaluation at the resume point itself
    (kind `eval_kind`: rl.py's is "rl_eval") came before its checkpoint: it stays.
    Atomic, like a checkpoint."""
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
        if (rec.get("kind") == eval_kind and it <= resume_iter) or it < resume_iter:
            kept.append(line)
    write_text_atomic(path, "".join(line + "\n" for line in kept))


# The CPU clock the run's budget counts (this process's CPU seconds, all threads); a name
# of its own so that a test can stand a clock of its own in for it.
cpu_clock = time.process_time


class Clock:
    """Times each training step (`with clock.step():`) on two clocks, which the loop adds
    to its RunState so that a checkpoint saves them: `last_step_s`, the step's wall
    seconds (train_time_s), and `last_step_cpu_s`, this process's CPU seconds inside it
    (train_cpu_s, the figure bench.py's one-thread comparisons read). Only steps count:
    start-up, evaluations and saves are left out, so a run stopped and resumed spends
    its time budget on the same training as one that ran through."""

    def __init__(self):
        self.last_step_s = self.last_step_cpu_s = 0.0

    @contextmanager
    def step(self):
        t0, cpu0 = time.perf_counter(), cpu_clock()
        yield
        self.last_step_s, self.last_step_cpu_s = time.perf_counter() - t0, cpu_clock() - cpu0


def mfu_meter(model_cfg, world_size, device, is_main, dtype=torch.float32):
    """mfu(tokens_per_s) of one rank's share of the tokens against the device's peak
    (gptkit/train/mfu.py; measured once on a CPU), or None without a known peak. On a
    CPU, training faster than the recorded peak has measured a better one: it is kept."""
    from gptkit.train.mfu import cpu_peak_dtype, cpu_peak_flops, estimate_mfu, measure_peak

    peak_flops = measure_peak(device, dtype) if is_main else None

    def mfu(tokens_per_s):
        nonlocal peak_flops
        if not peak_flops:
            return None
        used = estimate_mfu(model_cfg, tokens_per_s / world_size, peak_flops)
        if used > 1 and device == "cpu":  # the peak was measured on a busy machine
            achieved = used * peak_flops
            peak_flops = cpu_peak_flops(measure=lambda: achieved, dtype=cpu_peak_dtype(dtype))
            used = estimate_mfu(model_cfg, tokens_per_s / world_size, peak_flops)
        return used

    return mfu


def print_done(state, out_dir, start_time, note=None):
    """The run's last line: what it did, where its checkpoints are, how long it took;
    after a `note` (a budget that ended inside the warmup: optim.Schedule.end_note)."""
    if note is not None:
        print(f"note: {note}")
    elapsed = format_duration(time.monotonic() - start_time)
    print(f"done: {state.iter_num} iterations, best val loss {state.best_val_loss:.4f}, "
          f"checkpoints in {out_dir} ({elapsed} in all)")


class Logger:
    """Rank 0's logs; on other ranks every method does nothing (the clock still runs).

    `mfu(tokens_per_s)` gives the model FLOPs utilisation of this rank's share of a
    step's tokens, or None where no peak is known."""

    def __init__(self, cfg, state, run_config, enabled, schedule, default_project, write_files=True,
                 tokens_per_iter=0, mfu=None):
        self.enabled = enabled
        self.run_config, self.write_files = run_config, write_files
        self.config_path = Path(cfg.out_dir) / "config.json"
        self.state, self.clock = state, Clock()
        self.log_interval, self.tokens_per_iter, self.mfu = cfg.log_interval, tokens_per_iter, mfu
        self.bar = None
        self.wandb = None
        self.metrics = None
        self.schedule = schedule  # for the ETA and the number of steps (optim.Schedule, or rl.py's)
        self.total_iters = schedule.total_iters  # None: a time budget's steps are not known
        self.step_seconds = collections.deque(maxlen=ETA_WINDOW)  # the latest steps' durations, for the ETA
        self.steps_timed = 0
        self.pace_from = None  # (steps, budget seconds) after the process's first step
        self.tty = sys.stdout.isatty()
        if not enabled:
            return
        out_dir, start_iter = cfg.out_dir, state.iter_num
        if cfg.wandb_log and write_files:  # first: a wandb failure leaves no files behind
            self.wandb = start_wandb(cfg, run_config, default_project)
        if write_files:
            # A resumed run continues its own log (trimmed to the checkpoint); any
            # other run starts one: metrics.jsonl always holds exactly one run.
            self.metrics = open(Path(out_dir) / "metrics.jsonl", "a" if cfg.init_from == "resume" else "w")
        if cfg.progress_bar and self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total_iters, initial=start_iter, unit="it", dynamic_ncols=True)

    def print(self, text):
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def record(self, rec, line=None):
        """Write one metrics record to metrics.jsonl, the console and wandb; a record of
        another kind than train, eval or note (rl.py's) prints `line`."""
        if not self.enabled:
            return
        if self.metrics is not None:
            try:
                self.metrics.write(json.dumps({k: _json_safe(v) for k, v in rec.items()}) + "\n")
                self.metrics.flush()
            except OSError as e:  # a full disk, most likely
                raise RunFailed(f"could not write {self.metrics.name}: {e}")
        if line is not None:
            self.print(line)
        elif rec["kind"] == "train":
            eta = self.schedule.eta_s(self.state, self.seconds_per_iter)
            self.print(format_train_line(rec, self.total_iters, eta))
        elif rec["kind"] == "eval":
            self.print(format_eval_line(rec))
        else:
            self.print(f"note: {rec['note']}")
            return  # text, not a metric to chart
        if self.wandb is not None:
            prefix = {"train": "train", "eval": "eval"}.get(rec["kind"], rec["kind"])
            data = {f"{prefix}/{k}": v for k, v in rec.items() if k not in ("kind", "iter") and v is not None}
            self.wandb.log(data, step=rec["iter"])

    def compile_failed(self, reason):
        """torch.compile failed and the run goes on eager: say so in metrics.jsonl (a
        note at this iteration), in the run's settings (compile "failed" and the reason:
        config.json, written before the first forward, is written again, atomically;
        later checkpoints carry the same settings) and in wandb's config."""
        if not self.enabled:
            return
        self.run_config.update(compile="failed", compile_error=reason)
        self.record({"kind": "note", "iter": self.state.iter_num, "note": f"compile failed: {reason}; training goes on without compile"})
        if self.write_files:
            write_text_atomic(self.config_path, json.dumps(self.run_config, indent=2) + "\n")
        if self.wandb is not None:
            self.wandb.config.update({"compile": "failed", "compile_error": reason}, allow_val_change=True)

    def train(self, loss, grad_norm, lr):
        """The step just taken (iteration state.iter_num, timed by the clock): a record
        every log_interval iterations, and the progress bar."""
        dt = self.clock.last_step_s
        if self.state.iter_num % self.log_interval == 0:
            tokens_per_s = self.tokens_per_iter / dt
            self.record({"kind": "train", "iter": self.state.iter_num, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                         "ms_per_iter": 1000 * dt, "tokens_per_s": tokens_per_s,
                         "mfu": self.mfu(tokens_per_s) if self.mfu else None, **self._clocks(),
                         **dict(zip(("mem_peak_gb", "mem_reserved_gb"), cuda_peak_memory_gb())),
                         **({"skipped": True} if not math.isfinite(grad_norm) else {})})
        self.advance(dt)

    def eval(self, scores, lr):
        """An evaluation's losses ({split: gptkit.evals.scoring.Score}) at state.iter_num."""
        bpb = {f"{s}_bpb": scores[s].bpb for s in ("val", "train")} if self.has_bpb(scores) else {}
        self.record({"kind": "eval", "iter": self.state.iter_num, "train_loss": scores["train"].loss,
                     "val_loss": scores["val"].loss, **bpb, "lr": lr, **self._clocks()})

    @staticmethod
    def has_bpb(scores):
        return all(score.bytes > 0 for score in scores.values())

    def _clocks(self):
        return {"train_time_s": self.state.train_time_s, "train_cpu_s": self.state.train_cpu_s}

    def advance(self, seconds):
        """One more iteration done, that took `seconds`."""
        self.steps_timed += 1
        if self.steps_timed == 2:
            self.step_seconds.clear()  # the process's first step compiles and warms up: not the pace
        self.step_seconds.append(seconds)
        if self.bar is not None:
            self.bar.update(1)
        self.check_budget_pace()

    def check_budget_pace(self):
        """Once, PACE_STEPS steps after the process's first (which compiles and warms up):
        a note when the time budget will end the run inside its warmup (optim.Schedule)."""
        steps, spent = self.state.iter_num + 1, self.schedule.spent_s(self.state)  # this step counted
        if self.steps_timed == 1:
            self.pace_from = (steps, spent)
        elif self.steps_timed == 1 + PACE_STEPS and steps > self.pace_from[0]:  # the loop moved iter_num
            pace = (spent - self.pace_from[1]) / (steps - self.pace_from[0])
            note = self.schedule.budget_warmup_note(steps, spent, pace)
            if note is not None:
                self.record({"kind": "note", "iter": self.state.iter_num, "note": note})  # as the step's record

    @property
    def seconds_per_iter(self):
        """The ETA's pace: the mean of the last ETA_WINDOW steps (evaluations are not steps),
        so that one slow or fast step on a loaded machine moves it by 1/ETA_WINDOW."""
        return sum(self.step_seconds) / len(self.step_seconds) if self.step_seconds else None

    def eval_progress(self, iter_num):
        """A progress reporter for one evaluation (see EvalProgress)."""
        return EvalProgress(self if self.enabled else None, iter_num)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


class EvalProgress:
    """Shows that an evaluation is running: a transient tqdm bar on a terminal, else
    (nohup, batch jobs) a line every PERIOD seconds once it has taken that long."""

    PERIOD = 30.0

    def __init__(self, logger, iter_num):
        self.logger, self.iter_num = logger, iter_num
        self.start = self.last_line = time.monotonic()
        self.bar = None

    def update(self, split, done, total):
        if self.logger is None:
            return
        if self.logger.tty and self.logger.bar is not None:
            if self.bar is None or self.bar.desc != f"eval {split}":
                self.close()
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=f"eval {split}", unit="batch", leave=False, dynamic_ncols=True)
            self.bar.update(done - self.bar.n)
            return
        now = time.monotonic()
        if now - self.last_line >= self.PERIOD:
            self.last_line = now
            rate = (now - self.start) / max(done, 1)
            self.logger.print(
                f"eval {self.iter_num} | {split} batch {done}/{total} | {format_duration(now - self.start)} so far, "
                f"{split} done in ~{format_duration(rate * (total - done))}"
            )

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def wandb_host():
    return urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"


def check_wandb_ready():
    """Before any work: wandb is installed and can log (offline mode, or a key from
    WANDB_API_KEY or `wandb login`'s ~/.netrc entry). Never reads the key's value into a log."""
    try:
        __import__("wandb")
    except ImportError:
        raise UserError("wandb_log is on but wandb is not installed: pip install wandb (or --wandb_log=false)")
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return
    if os.environ.get("WANDB_API_KEY"):
        return
    try:
        if netrc.netrc(os.environ.get("NETRC")).authenticators(wandb_host()):
            return
    except (OSError, netrc.NetrcParseError):
        pass
    raise UserError(
        "wandb_log is on but wandb has no login on this machine: run `wandb login`, set WANDB_API_KEY, "
        "or log locally with WANDB_MODE=offline (sync later with `wandb sync`); or --wandb_log=false"
    )


def start_wandb(cfg, run_config, default_project):
    """A wandb run; WANDB_MODE=offline writes it under ./wandb without a network.
    The API key stays in the environment (WANDB_API_KEY), never in a setting or a log.
    Project and run names default to default_project (train.py: the dataset's name) and
    the out_dir's name."""
    check_wandb_ready()
    import wandb

    project = cfg.wandb_project or default_project
    name = cfg.wandb_run_name or Path(cfg.out_dir).resolve().name
    try:
        return wandb.init(project=project, name=name, config=run_config)
    except Exception as e:  # network, permissions, a bad key: wandb's own errors vary by version
        raise UserError(f"could not start wandb ({type(e).__name__}: {first_line(e)}): fix it, or --wandb_log=false")
