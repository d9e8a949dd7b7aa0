"""Train a GPT on a prepared dataset, on one device or many (torchrun).

    python train.py configs/shakespeare.py                          # quick start, CPU or GPU
    python train.py configs/shakespeare.py --max_iters=500 --compile=false
    python train.py configs/shakespeare.py --init_from=resume       # continue out_dir/ckpt.pt
    torchrun --standalone --nproc_per_node=8 train.py configs/gpt2.py

Every iteration takes one global batch of batch_size * gradient_accumulation_steps
random windows (shared among the ranks), evaluates every eval_interval, saves
out_dir/ckpt.pt (to resume) and out_dir/best.pt (best val loss) atomically, and
logs to the console and out_dir/metrics.jsonl. SIGINT/SIGTERM stop at a step
boundary with a checkpoint saved (exit 0); a non-finite loss or gradient stops
before the optimizer step (exit 1); a bad setting or missing data exits 2.
The log's mfu is 6N + 12·L·T·d FLOPs per token against the GPU's datasheet bf16
peak, or on a CPU the best fp32 matmul rate measured on this machine (cached in
~/.cache/gptkit/cpu_peak.json; see gptkit/train/mfu.py).
Run `python train.py --help` for every setting.

Reading order: `train_step` is one optimizer step (nanoGPT's loop body), the same for
text and chat data (only the batch reader differs). It and what it calls are in this
file, using only torch, model.py, the batches and the optimizers. `run` sets up in a
few named calls (gptkit/train/setup.py) and holds the loop, which assigns every field
of its RunState (gptkit/run_state.py). Which module to read: docs/layout.md.
"""

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

from gptkit.ops.errors import quiet_start

quiet_start()  # a Ctrl-C or a missing package while the imports below load: one line, no traceback
import torch
import torch.distributed

from gptkit.data import dataset
from gptkit.evals import scoring
from gptkit.ops.checkpoint import write_text_atomic
from gptkit.config import parse_settings, setting
from gptkit.ops.device import resolve_device
from gptkit.ops.errors import UserError, first_line, run_main, same_on_every_rank
from gptkit.train import distributed
from gptkit.train import logger
from gptkit.train import optim
from gptkit.train import settings
from gptkit.train import setup
from gptkit.train.checkpointer import Checkpointer, run_info
from gptkit.train.out_dir import claim_out_dir
from gptkit.train.step import clip_gradients, set_lr
from gptkit.train.settings import MAX_SEED
from model import GPTConfig

EVAL_STOP_CHECK = 4  # evaluation rounds between agreeing on a stop signal


@dataclasses.dataclass
class TrainConfig:
    """Training: data, optimization, evaluation, checkpoints, logging and devices"""

    # (the model's own settings, n_layer, n_embd and the rest, are GPTConfig's in model.py)
    # I/O
    out_dir: str = setting("out", "folder for ckpt.pt, best.pt, config.json and metrics.jsonl (one "
                           "run at a time)")
    overwrite: bool = setting(False, "init_from=scratch into an out_dir that holds a run: replace "
                              "it (else refused)")
    eval_interval: int = setting(2000, "evaluate, and save ckpt.pt, every this many iterations")
    log_interval: int = setting(1, "log the training loss every this many iterations")
    eval_iters: int = setting(200, "batches per split for each loss estimate; 0 = the whole val "
                              "split (train: 20 random batches)")
    eval_only: bool = setting(False, "evaluate once, print the losses and exit (writes nothing)")
    always_save_checkpoint: bool = setting(True, "save ckpt.pt at every eval; false: only when the "
                                           "val loss improves")
    init_from: str = setting("scratch", "scratch | resume (out_dir/ckpt.pt) | auto (resume this "
                             "run's checkpoint in out_dir, else scratch: for restarts) | gpt2 | "
                             "gpt2-medium | gpt2-large | gpt2-xl | a local Hugging Face folder | a "
                             "checkpoint file (fine-tune a run of ours)")
    # logging
    wandb_log: bool = setting(False, "also log to Weights & Biases (WANDB_MODE=offline works "
                              "without a network)")
    wandb_project: str | None = setting(None, "wandb project name (none: the dataset name)")
    wandb_run_name: str | None = setting(None, "wandb run name (none: the out_dir's name)")
    progress_bar: bool = setting(True, "show a tqdm progress bar when the output is a terminal")
    # data
    dataset: str = setting("openwebtext", "dataset folder name under data_dir, as written by "
                           "prepare.py")
    data_dir: str = setting("data", "folder holding the dataset folders")
    gradient_accumulation_steps: int = setting(40, "micro-batches per iteration over ALL ranks "
                                               "(divided by the number of ranks)")
    batch_size: int = setting(12, "windows per micro-batch on each rank")
    # AdamW
    optimizer: str = setting("adamw", "adamw | muon (Muon for the block matrices, AdamW for the "
                             "rest)")
    learning_rate: float = setting(6e-4, "peak AdamW learning rate")
    max_iters: int = setting(600000, "total optimizer steps")
    time_budget: float = setting(0.0, "or end when this many seconds are spent (0 = off): CPU "
                                 "seconds of training steps on a CPU, wall seconds on a GPU; the "
                                 "decay follows the share of max_iters or budget further along")
    weight_decay: float = setting(0.1, "AdamW weight decay, on matrices only")
    beta1: float = setting(0.9, "AdamW beta1")
    beta2: float = setting(0.95, "AdamW beta2")
    grad_clip: float = setting(1.0, "clip the global gradient norm to this; 0 = no clipping")
    # Muon
    muon_lr: float = setting(0.02, "peak Muon learning rate (optimizer=muon)")
    muon_momentum: float = setting(0.95, "Muon momentum")
    muon_nesterov: bool = setting(True, "Nesterov momentum in Muon")
    muon_ns_steps: int = setting(5, "Newton-Schulz iterations per Muon update (fewer are cheaper "
                                 "and rougher)")
    muon_weight_decay: float = setting(0.0, "decoupled weight decay of Muon's matrices, "
                                       "p <- p * (1 - lr * decay)")
    muon_cautious_wd: bool = setting(False, "decay only the entries Muon's update also moves "
                                     "toward zero (cautious weight decay)")
    muon_normuon: bool = setting(False, "NorMuon: each neuron's update divided by its running RMS, "
                                 "rescaled to Muon's norm")
    # LoRA (docs/lora.md): train small adapters beside a frozen base instead of every weight
    lora_rank: int = setting(0, "rank R of the LoRA adapters (init_from gpt2, a Hugging Face "
                             "folder or a checkpoint file); 0 = off, train every weight")
    lora_alpha: float | None = setting(None, "LoRA scale is lora_alpha / lora_rank; none = the "
                                       "rank (scale 1, as peft's defaults r=8, alpha=8)")
    lora_dropout: float = setting(0.0, "dropout on each adapter's input (peft's lora_dropout)")
    lora_targets: str = setting("attn.c_attn", "comma-separated: attn.c_attn (q, k, v) | "
                                "attn.c_proj | mlp.c_fc | mlp.c_proj | all")
    # schedule
    decay_lr: bool = setting(True, "follow lr_schedule; false = learning_rate at every step, no "
                             "warmup")
    lr_schedule: str = setting("cosine", "cosine | constant | wsd (warmup, stable, decay)")
    warmup_iters: int = setting(2000, "linear warmup steps")
    lr_decay_iters: int | None = setting(None, "step at which the rate reaches min_lr (none: "
                                         "max_iters, so it follows --max_iters)")
    min_lr: float = setting(6e-5, "final learning rate (usually learning_rate / 10)")
    cooldown_frac: float = setting(0.2, "wsd: share of lr_decay_iters spent decaying to min_lr")
    cooldown_shape: str = setting("linear", "wsd: the cooldown's shape: linear | 1-sqrt (down "
                                  "by sqrt of the cooldown's share: fast at first, then low "
                                  "for longer)")
    # parallel
    backend: str = setting("auto", "DDP backend: auto (nccl on CUDA, gloo on CPU) | nccl | gloo")
    parallel: str = setting("ddp", "under torchrun: ddp (a full copy per rank) | fsdp (weights, "
                            "gradients, optimizer sharded; out_dir/ckpt/)")
    activation_checkpointing: bool = setting(False, "recompute each block's activations in "
                                             "backward: less memory, ~1/3 more compute")
    # system
    device: str = setting("auto", "auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps")
    dtype: str = setting("auto", "auto (bfloat16 where supported, else float16 on CUDA; float32 on "
                         "CPU) | float32 | bfloat16 | float16")
    compile: bool | str = setting("auto", "torch.compile the model: auto (on for CUDA) | true | "
                                  "false")
    cpu_kernels: str = setting("fused", "RMSNorm and ReLU² on a CPU in float32: fused (their "
                               "backward written by hand, gptkit/fast/fused.py; same values) | "
                               "model (model.py's modules, autograd's backward)")
    seed: int = setting(1337, f"random seed (weights, dropout, data order), 0 to {MAX_SEED}")
    dry_run: bool = setting(False, "check the settings for WORLD_SIZE ranks (torchrun's; e.g. "
                            "WORLD_SIZE=512 RANK=0 to check a cluster's job here) and exit")

    def __post_init__(self):
        settings.check(self)  # every problem at once, in one ValueError (gptkit/train/settings.py)


class NonFinite(Exception):
    """The loss, the gradient norm or the val loss is NaN or inf (the message says which, where)."""


@dataclasses.dataclass
class Step:
    """What every optimizer step works on, set up once by `run`."""

    model: "Forward"  # what the step calls: the raw model (inside DDP) through torch.compile
    raw_model: torch.nn.Module  # its parameters, for the gradient norm
    optimizers: list  # [AdamW] or [AdamW, Muon]
    scaler: torch.amp.GradScaler  # float16 loss scaling; the identity otherwise
    batches: dataset.Batches  # each iteration's global batch, as micro-batches (or ChatBatches)
    autocast: object  # the mixed-precision context (none in float32)
    dist: distributed.Dist  # this rank, and how many there are
    grad_clip: float  # the gradient norm's limit; 0 = no clipping


def train_step(step, it, lr_scale, stop):
    """One optimizer step over iteration `it`'s global batch, of which this rank takes
    its share of micro-batches, at `lr_scale` times each group's peak learning rate.
    Returns the mean loss, the gradient norm (before clipping) and whether any rank
    has been asked to stop (`stop.raised`: SIGINT or SIGTERM)."""
    model, scaler, optimizers = step.model, step.scaler, step.optimizers
    batches, dist = step.batches, step.dist
    local_accum = batches.per_rank(dist.world_size)
    # The step's loss is the mean over every target of the global batch (a chat window's
    # replies, every token of a text): each micro-batch's mean is weighted by its share of
    # them, times the ranks (DDP and FSDP average the ranks' gradients). Text: 1 / local_accum.
    targets_per_rank = batches.targets(it) / dist.world_size
    loss_sum = torch.zeros((), device=batches.device)
    for micro, (x, y) in enumerate(batches.micro_batches(it, dist.rank, dist.world_size)):
        # DDP averages the gradients across ranks in backward: only the last micro-step's needs to
        model.require_backward_grad_sync = micro == local_accum - 1
        with step.autocast:
            # Only the loss: logits bound to a name (`_, loss = ...`) would stay in memory,
            # (B, T, vocab_size) of them, through backward and the next micro-step's forward.
            loss = model(x, y)[1] / (targets_per_rank / (y >= 0).sum())  # y = -1: not a target
        loss_sum += loss.detach().float()
        scaler.scale(loss).backward()  # float16: scaled up so small gradients survive
    for opt in optimizers:
        scaler.unscale_(opt)  # the true gradients, for clipping
    grad_norm = clip_gradients(step.raw_model, step.grad_clip)
    # One all-reduce carries the loss, the norm and the stop flag, so that every rank makes
    # the same decision at the same step. The norm is global already (DDP averaged the
    # gradients, FSDP's spans all shards), the same on every rank: their mean is itself.
    totals = torch.stack([loss_sum, grad_norm.float().to(loss_sum.device),
                          torch.tensor(float(stop.raised), device=loss_sum.device)])
    if dist.enabled:
        torch.distributed.all_reduce(totals, op=torch.distributed.ReduceOp.SUM)
    loss_total, norm_total, stops = totals.tolist()
    loss, grad_norm = loss_total / dist.world_size, norm_total / dist.world_size
    if not math.isfinite(loss) or (not math.isfinite(grad_norm) and not scaler.is_enabled()):
        what = f"loss is {loss}" if not math.isfinite(loss) else f"gradient norm is {grad_norm}"
        raise NonFinite(f"the training {what} at iteration {it}; stopped before the optimizer step")
    set_lr(optimizers, lr_scale)
    for opt in optimizers:
        scaler.step(opt)  # float16: skipped when the scaled gradients overflowed
    scaler.update()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    return loss, grad_norm, stops > 0


class Forward:
    """model(x, y) through torch.compile, falling back to eager (with a warning naming
    the error) when compilation fails: a broken backend fails at the first forward
    pass, not at torch.compile() (measured: docs/reliability.md). That is after
    config.json was written, so the run's records learn of it through
    `report_fallback_to`; `error` keeps the reason."""

    def __init__(self, eager, use_compile):
        self.eager = eager  # the raw model, or DDP around it
        self.compiled = None
        self.error = None
        self.on_fallback = None
        if use_compile:
            try:
                self.compiled = torch.compile(eager)
            except Exception as e:
                self._fall_back(e)

    def _fall_back(self, e):
        self.error = f"{type(e).__name__}: {first_line(e)}"
        print(f"warning: torch.compile failed ({self.error}); continuing without compile",
              file=sys.stderr)
        self.compiled = None
        if self.on_fallback is not None:
            self.on_fallback(self.error)

    def report_fallback_to(self, record):
        """Call record(reason) when compilation fails (at once if it already has)."""
        self.on_fallback = record
        if self.error is not None:
            record(self.error)

    def __call__(self, x, y):
        if self.compiled is not None:
            try:
                return self.compiled(x, y)
            except torch.OutOfMemoryError:
                raise  # not a compile failure: eager would run out of memory too
            except Exception as e:
                self._fall_back(e)
        return self.eager(x, y)

    @property
    def require_backward_grad_sync(self):
        return getattr(self.eager, "require_backward_grad_sync", True)

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, sync):
        """DDP: whether this backward averages the gradients across ranks (nanoGPT's
        name); one process has nothing to sync. FSDP reduce-scatters after every
        micro-step instead: skipping it would keep an unsharded fp32 gradient of the
        whole model until the last one (4 bytes a parameter, 6.2 GB for GPT-2 XL),
        the memory FSDP is used to save. It all-gathers every block on every
        micro-step anyway, so this adds about half again to its traffic."""
        if hasattr(self.eager, "require_backward_grad_sync"):
            self.eager.require_backward_grad_sync = sync

    def train(self, mode=True):
        self.eager.train(mode)

    def eval(self):
        self.eager.eval()


@torch.no_grad()
def evaluate(model, plan, stop, progress):
    """Loss and bits per byte (gptkit.evals.scoring.Score) of each split over the plan's batches
    (a text's windows or a chat split's replies: the reader's eval_plan made it).

    Returns None if a stop signal arrives on any rank first: the ranks agree on it
    every few batches, so Ctrl-C during a long evaluation acts within seconds."""
    model.eval()
    out = {}
    try:
        for split in plan.items:
            total = scoring.accumulator(plan.device)
            rounds = plan.rounds(split)
            for r in range(rounds):
                x, y = plan.batch(split, r)  # this rank's share; y = -1 where nothing is scored
                with plan.autocast:
                    total += scoring.score_batch(model, x, y, plan.byte_lengths).to(total.dtype)
                progress.update(split, r + 1, rounds)
                due = (r + 1) % EVAL_STOP_CHECK == 0 or r + 1 == rounds
                if due and distributed.any_rank(stop.raised, plan.dist, plan.device):
                    return None
            out[split] = scoring.Score.from_tensor(distributed.all_reduce_sum(total, plan.dist))
    finally:
        progress.close()
        model.train()
    return out


def main(argv=None):
    try:  # mistakes every rank makes alike: under torchrun only rank 0 prints them
        model_cfg, cfg = parse_settings(argv, [GPTConfig, TrainConfig], prog="train.py",
                                        description=__doc__)
        settings.check_world_size(cfg, distributed.world_size_from_env())
        settings.check_batch_sizes(model_cfg, cfg)
        if cfg.wandb_log and not cfg.eval_only:
            logger.check_wandb_ready()
    except UserError as e:
        raise same_on_every_rank(e)
    if cfg.dry_run:
        return distributed.dry_run(model_cfg, cfg, distributed.world_size_from_env())
    return train(model_cfg, cfg)


def train(model_cfg, cfg):
    """Run one training job on this rank: take the out_dir (rank 0), run, clean up.
    On an error, leave at once without waiting for the other ranks (see distributed.py)."""
    start_time = time.monotonic()
    dist = distributed.init(cfg.backend, resolve_device(cfg.device).type)
    claim, ok = None, False
    try:
        writes = dist.is_main and not cfg.eval_only
        # init_from=auto becomes resume or scratch here
        claim, cfg = claim_out_dir(model_cfg, cfg, dist, writes)
        code = run(model_cfg, cfg, dist, start_time)
        ok = True
        return code
    except Exception as e:
        if dist.enabled and distributed.is_peer_failure(e):
            raise distributed.peer_failed(e) from e  # another rank failed: it or its node says why
        raise
    finally:
        if claim is not None:
            claim.release(ok)
        distributed.cleanup(dist, ok)


def run(model_cfg, cfg, dist, start_time):
    """Set up on this rank, then train: evaluate (and save) every eval_interval
    iterations and at the end, and take one train_step per iteration."""
    out_dir = Path(cfg.out_dir)
    # A missing dataset that prepare.py builds by name (shakespeare_char, ...): rank 0 makes it.
    distributed.agreed(dist, lambda: dist.is_main
                       and dataset.ensure_dataset(cfg.data_dir, cfg.dataset))
    dev = setup.Device.choose(cfg, dist)
    # Data and model: every rank builds the same model from the same seed; DDP and FSDP
    # then start all ranks from rank 0's weights.
    meta, raw_model, model_cfg, ckpt = setup.start(model_cfg, cfg, dist, dev)
    # FSDP: split every parameter across the ranks, in place, before the optimizers see
    # them: each rank keeps 1/W of the weights, gradients and optimizer state.
    setup.shard(raw_model, ckpt, cfg, dist, dev)
    optimizers = optim.make_optimizers(raw_model, cfg, dev.type)
    scaler = optim.make_scaler(dev.dtype, dev.type)
    # Resume: optimizer moments, GradScaler, RNG states and the loop's state come back (an
    # FSDP checkpoint is resharded to this number of ranks; each rank takes its own RNG).
    state = setup.resume(ckpt, raw_model, optimizers, scaler, cfg, dist, dev)  # None: RunState()
    ckpt = None  # free the memory
    # DDP: wrap the model so that backward averages the gradients across ranks (FSDP's
    # sharded model does it itself); then torch.compile, falling back to eager.
    module = setup.wrap(raw_model, cfg, dist, dev, iteration=lambda: state.iter_num)
    model = Forward(module, dev.compile)
    # The batches: random windows of a text, or whole conversations whose replies alone are
    # targets (gptkit/data/chat_batches.py); and the windows every evaluation scores.
    batches = dataset.open_batches(cfg.data_dir, cfg.dataset, meta, model_cfg.block_size, dev.name,
                                   cfg.batch_size, cfg.gradient_accumulation_steps, cfg.seed)
    byte_lengths = setup.eval_byte_lengths(meta, dev.name)
    plan = batches.eval_plan(cfg.eval_iters, cfg.seed, byte_lengths, dev.autocast(), dist)
    step = Step(model, raw_model, optimizers, scaler, batches, dev.autocast(), dist, cfg.grad_clip)
    recorded = setup.settings_as_run(model_cfg, cfg, dev, raw_model)
    write = dist.is_main and not cfg.eval_only
    if dist.is_main:
        print("\n".join(setup.header(recorded, raw_model, dist, dev, cfg)))
    if write and cfg.init_from == "resume":
        logger.trim_metrics(out_dir / "metrics.jsonl", state.iter_num)
    schedule = optim.Schedule(cfg, dev.type)  # to max_iters, or the time_budget if spent first
    mfu = logger.mfu_meter(model_cfg, dist.world_size, dev.name, dist.is_main, dev.dtype)
    log = logger.Logger(cfg, state, recorded, dist.is_main, schedule, cfg.dataset,
                        write_files=write, tokens_per_iter=batches.tokens_per_step(), mfu=mfu)
    model.report_fallback_to(log.compile_failed)  # compile fails at the first forward: logged
    if write:
        write_text_atomic(out_dir / "config.json", json.dumps(recorded, indent=2) + "\n")
    info = run_info(model_cfg, meta, recorded, cfg.dataset, dev.name, dist.is_main)
    saver = Checkpointer(out_dir, raw_model, optimizers, scaler, info, dist, dev.name, cfg.parallel,
                         resumed_at=state.iter_num if cfg.init_from == "resume" else None)

    stop = distributed.StopFlag().install()
    try:
        while True:
            if state.eval_due(cfg.eval_interval, schedule.finished(state)) or cfg.eval_only:
                if schedule.finished(state) and not cfg.eval_only:
                    saver.save_finished(state, cfg.always_save_checkpoint)  # the last eval may fail
                scores = evaluate(model, plan, stop, log.eval_progress(state.iter_num))
                if scores is None:  # a stop signal during the evaluation
                    return stopped(saver, state, log, stop, start_time, during_eval=True)
                log.eval(scores, cfg.learning_rate * schedule.lr_scale(state))
                if cfg.eval_only:
                    break
                val_loss, train_loss = scores["val"].loss, scores["train"].loss
                if not (math.isfinite(val_loss) and math.isfinite(train_loss)):
                    raise NonFinite(f"the val loss is {val_loss} (train {train_loss}) at iteration "
                                    f"{state.iter_num}; nothing saved")
                improved = val_loss < state.best_val_loss
                state.val_loss, state.last_eval_iter = val_loss, state.iter_num
                state.best_val_loss = min(state.best_val_loss, val_loss)
                saver.after_eval(state, improved, cfg.always_save_checkpoint)  # ckpt.pt, best.pt
            if schedule.finished(state):
                break
            lr_scale = schedule.lr_scale(state)  # once per step: set, then logged
            with log.clock.step():
                loss, grad_norm, stop_now = train_step(step, state.iter_num, lr_scale, stop)
            state.train_time_s += log.clock.last_step_s  # the clocks count steps alone
            state.train_cpu_s += log.clock.last_step_cpu_s
            if cfg.time_budget:  # under torchrun: the slowest rank's clock, so all stop at one step
                state.train_time_s, state.train_cpu_s = distributed.slowest_clock(state, dist)
            log.train(loss, grad_norm, cfg.learning_rate * lr_scale)  # AdamW's rate
            state.iter_num += 1
            if stop_now:
                return stopped(saver, state, log, stop, start_time)
    except NonFinite as e:
        raise saver.failed(str(e)) from None
    finally:
        stop.uninstall()
        log.close()
        batches.close()
    if dist.is_main and not cfg.eval_only:
        logger.print_done(state, out_dir, start_time, schedule.end_note(state))
    return 0


def stopped(saver, state, log, stop, start_time, during_eval=False):
    """A clean stop on SIGINT/SIGTERM: save (unless nothing was trained yet), say how to go on."""
    by = stop.signal_name or "a signal on another rank"
    when = f"{'during the evaluation ' if during_eval else ''}at iteration {state.iter_num}"
    elapsed = logger.format_duration(time.monotonic() - start_time)
    if state.iter_num > 0:
        saver.save("ckpt", state)
        log.print(f"stopped by {by} {when}: saved {saver.path} (iteration {state.iter_num}); "
                  f"continue with --init_from=resume ({elapsed} in all)")
    else:
        log.print(f"stopped by {by} {when}: nothing trained yet, nothing saved ({elapsed} in all)")
    return 0


if __name__ == "__main__":
    run_main(main)
