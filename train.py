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
"""

import dataclasses
import json
import math
import random
import textwrap
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from gptkit import dataset
from gptkit import faults
from gptkit import fused
from gptkit import scoring
from gptkit.checkpoint import save_checkpoint, write_text_atomic
from gptkit.config import parse_settings, setting, settings_dict
from gptkit.device import DTYPES, resolve_device, training_dtype
from gptkit.errors import PeerFailed, RunFailed, UserError, run_main, same_on_every_rank
from gptkit.tokenizer import tokenizer_from_dict
from gptkit.train import distributed
from gptkit.train import fsdp
from gptkit.train import logger
from gptkit.train import optim
from gptkit.train import sharded
from gptkit.train.mfu import estimate_mfu, measure_peak
from gptkit.train.run_state import provenance, rng_state, set_rng_state
from gptkit.train.setup import (
    Forward, OutDir, check_batch_sizes, check_resumable, check_world_size, embedding_heavy_note, init_model,
)
from model import GPTConfig

FULL_EVAL_TRAIN_BATCHES = 20  # eval_iters=0: the train loss is estimated on this many batches
EVAL_STOP_CHECK = 4  # evaluation rounds between agreeing on a stop signal
MAX_SEED = 2**32 - 1 - 4096  # numpy seeds stop at 2**32 - 1, and each rank adds its rank
CHOICES = {
    "lr_schedule": ("cosine", "constant", "wsd"),
    "optimizer": ("adamw", "muon"),
    "dtype": ("auto", *DTYPES),
    "backend": ("auto", "nccl", "gloo"),
    "parallel": ("ddp", "fsdp"),
}


@dataclasses.dataclass
class TrainConfig:
    """Training: data, optimization, evaluation, checkpoints, logging and devices"""

    out_dir: str = setting("out", "folder for ckpt.pt, best.pt, config.json and metrics.jsonl (one run at a time)")
    overwrite: bool = setting(False, "init_from=scratch into an out_dir that holds a run: replace it (else refused)")
    eval_interval: int = setting(2000, "evaluate, and save ckpt.pt, every this many iterations")
    log_interval: int = setting(1, "log the training loss every this many iterations")
    eval_iters: int = setting(200, "batches per split for each loss estimate; 0 = the whole val split (train: 20 random batches)")
    eval_only: bool = setting(False, "evaluate once, print the losses and exit (writes nothing)")
    always_save_checkpoint: bool = setting(True, "save ckpt.pt at every eval; false: only when the val loss improves")
    init_from: str = setting("scratch", "scratch | resume (out_dir/ckpt.pt) | gpt2 | gpt2-medium | gpt2-large | gpt2-xl | a local Hugging Face folder")
    wandb_log: bool = setting(False, "also log to Weights & Biases (WANDB_MODE=offline works without a network)")
    wandb_project: str | None = setting(None, "wandb project name (none: the dataset name)")
    wandb_run_name: str | None = setting(None, "wandb run name (none: the out_dir's name)")
    progress_bar: bool = setting(True, "show a tqdm progress bar when the output is a terminal")
    dataset: str = setting("openwebtext", "dataset folder name under data_dir, as written by prepare.py")
    data_dir: str = setting("data", "folder holding the dataset folders")
    gradient_accumulation_steps: int = setting(40, "micro-batches per iteration over ALL ranks (divided by the number of ranks)")
    batch_size: int = setting(12, "windows per micro-batch on each rank")
    optimizer: str = setting("adamw", "adamw | muon (Muon for the block matrices, AdamW for the rest)")
    learning_rate: float = setting(6e-4, "peak AdamW learning rate")
    max_iters: int = setting(600000, "total optimizer steps")
    weight_decay: float = setting(0.1, "AdamW weight decay, on matrices only")
    beta1: float = setting(0.9, "AdamW beta1")
    beta2: float = setting(0.95, "AdamW beta2")
    grad_clip: float = setting(1.0, "clip the global gradient norm to this; 0 = no clipping")
    muon_lr: float = setting(0.02, "peak Muon learning rate (optimizer=muon)")
    muon_momentum: float = setting(0.95, "Muon momentum")
    muon_nesterov: bool = setting(True, "Nesterov momentum in Muon")
    muon_ns_steps: int = setting(5, "Newton-Schulz iterations per Muon update (fewer are cheaper and rougher)")
    decay_lr: bool = setting(True, "follow lr_schedule; false = learning_rate at every step, no warmup")
    lr_schedule: str = setting("cosine", "cosine | constant | wsd (warmup, stable, decay)")
    warmup_iters: int = setting(2000, "linear warmup steps")
    lr_decay_iters: int | None = setting(None, "step at which the rate reaches min_lr (none: max_iters, so it follows --max_iters)")
    min_lr: float = setting(6e-5, "final learning rate (usually learning_rate / 10)")
    cooldown_frac: float = setting(0.2, "wsd: share of lr_decay_iters spent decaying to min_lr")
    backend: str = setting("auto", "DDP backend: auto (nccl on CUDA, gloo on CPU) | nccl | gloo")
    parallel: str = setting("ddp", "under torchrun: ddp (a full copy per rank) | fsdp (weights, gradients, optimizer sharded; out_dir/ckpt/)")
    activation_checkpointing: bool = setting(False, "recompute each block's activations in backward: less memory, ~1/3 more compute")
    device: str = setting("auto", "auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps")
    dtype: str = setting("auto", "auto (bfloat16 where supported, else float16 on CUDA; float32 on CPU) | float32 | bfloat16 | float16")
    compile: bool | str = setting("auto", "torch.compile the model: auto (on for CUDA) | true | false")
    seed: int = setting(1337, f"random seed (weights, dropout, data order), 0 to {MAX_SEED}")

    def __post_init__(self):
        problems = []
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                problems.append(f"{name}={getattr(self, name)!r} must be one of {', '.join(allowed)}")
        compile_ = str(self.compile).lower()
        if compile_ not in ("auto", "true", "false", "1", "0"):
            problems.append(f"compile={self.compile!r} must be auto, true or false")
        else:
            self.compile = {"1": "true", "0": "false"}.get(compile_, compile_)
        for name in ("eval_interval", "log_interval", "gradient_accumulation_steps", "batch_size", "muon_ns_steps"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be at least 1")
        if self.lr_decay_iters is None:
            self.lr_decay_iters = self.max_iters  # the schedule follows max_iters
        for name in ("eval_iters", "max_iters", "warmup_iters", "lr_decay_iters"):
            if getattr(self, name) < 0:
                problems.append(f"{name}={getattr(self, name)} must not be negative")
        for name in ("learning_rate", "min_lr", "weight_decay", "grad_clip", "muon_lr"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                problems.append(f"{name}={value} must be a finite number, not negative")
        for name in ("beta1", "beta2", "muon_momentum"):
            if not 0 <= getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be in [0, 1)")
        if not 0 <= self.seed <= MAX_SEED:
            problems.append(f"seed={self.seed} must be between 0 and {MAX_SEED}")
        if self.decay_lr and self.min_lr == 0 and self.lr_schedule != "constant" and self.lr_decay_iters < self.max_iters:
            problems.append(
                f"lr_decay_iters={self.lr_decay_iters} < max_iters={self.max_iters} with min_lr=0: steps "
                f"{self.lr_decay_iters} to {self.max_iters - 1} would train at learning rate 0; leave lr_decay_iters "
                "unset (it follows max_iters), or set min_lr > 0"
            )
        if not 0 <= self.cooldown_frac <= 1:
            problems.append(f"cooldown_frac={self.cooldown_frac} must be in [0, 1]")
        if not self.init_from:
            problems.append("init_from must not be empty")
        if problems:
            raise ValueError("invalid training settings: " + "; ".join(problems))


@torch.no_grad()
def evaluate(forward, module, batches, eval_sets, batch_size, autocast, d, device, byte_lengths, stop, progress):
    """Loss and bits per byte (gptkit.scoring.Score) of each split over its eval windows,
    batch_size windows per forward pass; each rank takes every W-th batch.

    Returns None if a stop signal arrives on any rank first: the ranks agree on
    it every few batches, so Ctrl-C during a long evaluation acts within seconds."""
    module.eval()
    out = {}
    try:
        for split, windows in eval_sets.items():
            def read(_, start, n, split=split):
                return batches.splits[split].read_windows([start], n, batches.vocab_size)[0]

            def between_batches(done, total, split=split):
                progress.update(split, done, total)
                due = done % EVAL_STOP_CHECK == 0 or done == total
                return due and distributed.any_rank(stop.raised, d, device)  # True: stop here

            total = scoring.score_windows(forward, read, windows, batches.block_size, batch_size, byte_lengths,
                                          device, autocast, d.rank, d.world_size, between_batches)
            if total is None:
                return None
            distributed.all_reduce_sum(total, d)
            out[split] = scoring.Score.from_tensor(total)
    finally:
        progress.close()
        module.train()
    return out


def eval_byte_lengths(meta, device):
    """Bytes per token id on the device for bits per byte; None (with a warning) when
    the tokenizer cannot be loaded here (e.g. GPT-2's BPE files offline)."""
    try:
        return scoring.byte_lengths_tensor(tokenizer_from_dict(meta["tokenizer"]), device)
    except UserError as e:
        print(f"warning: evaluations will show no bits per byte: {e}")
        return None


def main(argv=None):
    try:  # mistakes every rank makes alike: under torchrun only rank 0 prints them
        model_cfg, cfg = parse_settings(argv, [GPTConfig, TrainConfig], prog="train.py", description=__doc__)
        check_world_size(cfg, distributed.world_size_from_env())
        check_batch_sizes(model_cfg, cfg)
        if cfg.wandb_log and not cfg.eval_only:
            logger.check_wandb_ready()
    except UserError as e:
        raise same_on_every_rank(e)
    return train(model_cfg, cfg)


def train(model_cfg, cfg):
    """Run one training job on this rank: take the out_dir (rank 0), train, clean up.
    On an error, leave at once without waiting for the other ranks (see distributed.py)."""
    start = time.monotonic()
    device_type = resolve_device(cfg.device).type
    d = distributed.init(cfg.backend, device_type)
    out_dir, ok = None, False
    try:
        out_dir = distributed.agreed(d, lambda: OutDir(cfg) if d.is_main and not cfg.eval_only else None)
        code = run(model_cfg, cfg, d, start)
        ok = True
        return code
    except Exception as e:
        if d.enabled and distributed.is_peer_failure(e):
            raise PeerFailed() from e  # another rank failed and says why
        raise
    finally:
        if out_dir is not None:
            out_dir.release(ok)
        distributed.cleanup(d, ok)


def run(model_cfg, cfg, d, start):
    device = str(resolve_device(cfg.device, d.local_rank if d.enabled else None))
    device_type = device.split(":")[0]
    local_accum = cfg.gradient_accumulation_steps // d.world_size
    ptdtype = training_dtype(cfg.dtype, device_type)
    distributed.agreed(d, lambda: fsdp.check_settings(cfg.parallel, d.enabled, ptdtype))
    use_compile = cfg.compile == "true" or (cfg.compile == "auto" and device_type == "cuda")
    if device_type == "cuda":  # TF32 for float32 matmuls and convolutions
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    out_dir = Path(cfg.out_dir)

    # Data: prepare a missing named dataset once (rank 0), then check it on every rank.
    distributed.agreed(d, lambda: dataset.ensure_dataset(cfg.data_dir, cfg.dataset) if d.is_main else None)
    meta = distributed.agreed(d, lambda: dataset.load_meta(cfg.data_dir, cfg.dataset))

    torch.manual_seed(cfg.seed + d.rank)  # different dropout on each rank
    random.seed(cfg.seed + d.rank)
    np.random.seed(cfg.seed + d.rank)
    raw_model, model_cfg, ckpt = distributed.agreed(d, lambda: init_model(model_cfg, cfg, meta, out_dir))
    distributed.agreed(d, lambda: dataset.check_block_size(meta, model_cfg.block_size, Path(cfg.data_dir) / cfg.dataset))
    if d.is_main:
        for warning in optim.schedule_warnings(cfg):
            print(f"warning: {warning}")
    raw_model.to(device)
    if device_type == "cpu" and ptdtype == torch.float32:  # hand-written backward for RMSNorm, ReLU² (gptkit/fused.py)
        fused.apply(raw_model)
    if cfg.activation_checkpointing:
        fsdp.checkpoint_blocks(raw_model)
    if cfg.parallel == "fsdp":  # shard in place before the optimizers see the parameters
        if ckpt is None:  # the same initial weights on every rank (as DDP broadcasts them)
            distributed.broadcast_params(raw_model, d)
        elif "sharded" not in ckpt:  # a one-file checkpoint: its optimizer states by parameter name
            ckpt["optimizer"] = sharded.optimizer_state_by_name(raw_model, cfg, device_type, ckpt["optimizer"], out_dir)
        fsdp.shard(raw_model, ptdtype)
    optimizers = optim.make_optimizers(raw_model, cfg, device_type)
    scaler = optim.make_scaler(ptdtype, device_type)

    iter_num, best_val_loss, val_loss, last_eval_iter, train_time = 0, math.inf, math.nan, -1, 0.0
    cpu_offset = 0.0  # train_cpu_s: this process's CPU seconds (all threads), evaluations left out
    if ckpt is not None:
        distributed.agreed(d, lambda: check_resumable(ckpt, optimizers, out_dir, cfg))
        # Today's settings win (learning rates, weight decay, betas, momentum): keep
        # each fresh group's hyperparameters over the ones saved with its state.
        fresh = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in optimizers]
        if "sharded" in ckpt:  # out_dir/ckpt/: weights and optimizer states, resharded to this run
            sharded.load_into(ckpt["sharded"], raw_model, optimizers)
        elif cfg.parallel == "fsdp":
            sharded.load_full_optimizer_state(raw_model, optimizers, ckpt["optimizer"])
        else:
            for opt, state in zip(optimizers, ckpt["optimizer"]):
                opt.load_state_dict(state)
        for opt, groups in zip(optimizers, fresh):
            for g, hyper in zip(opt.param_groups, groups):
                g.update(hyper)
        if scaler is not None and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
        val_loss, last_eval_iter = ckpt["val_loss"], ckpt.get("last_eval_iter", -1)
        train_time = ckpt.get("train_time_s", 0.0)
        cpu_offset = -ckpt.get("train_cpu_s", 0.0)
        rng = ckpt["rng"]
        per_rank = rng.get("per_rank")
        if per_rank and len(per_rank) == d.world_size:
            rng = {**rng, **per_rank[d.rank]}
        elif d.world_size > 1:
            print(f"warning: rank {d.rank}: the checkpoint's RNG states were saved by another number of ranks; dropout will not repeat exactly")
        set_rng_state(rng, device)
        ckpt = None  # free the memory
        if d.is_main:
            print(f"resumed from {out_dir / 'ckpt.pt'} at iteration {iter_num} (best val loss {best_val_loss:.4f})")

    # Wrap: DDP (gradients averaged across ranks), then compile.
    module = raw_model
    if d.enabled and cfg.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        # Buffers (masks, RoPE tables) are built identically on every rank: no need to
        # broadcast them, and not doing so keeps forward passes free of collectives.
        module = DDP(raw_model, device_ids=[d.local_rank] if device_type == "cuda" else None, broadcast_buffers=False)
    forward = Forward(module, use_compile)
    autocast = nullcontext() if ptdtype == torch.float32 else torch.autocast(device_type, dtype=ptdtype)

    resolved = dataclasses.replace(
        cfg, device=device, dtype=str(ptdtype).removeprefix("torch."), compile="true" if use_compile else "false"
    )
    settings = settings_dict(model_cfg, resolved)
    write = d.is_main and not cfg.eval_only
    if d.is_main:
        print("settings: " + textwrap.fill("  ".join(f"{k}={v}" for k, v in settings.items()), 100, subsequent_indent="  "))
        print(f"{raw_model.num_params() / 1e6:.2f}M parameters | world size {d.world_size} | {device} {settings['dtype']} | compile {use_compile}")
        if note := embedding_heavy_note(raw_model, cfg.init_from):
            print(note)
    if write and cfg.init_from == "resume":
        logger.trim_metrics(out_dir / "metrics.jsonl", iter_num)
    log = logger.Logger(cfg, out_dir, d.is_main, cfg.max_iters, iter_num, settings, write_files=write)
    if write:
        write_text_atomic(out_dir / "config.json", json.dumps(settings, indent=2) + "\n")
    prov = provenance(device) if d.is_main else None
    peak_flops = measure_peak(device) if d.is_main else None

    B, T, G = cfg.batch_size, model_cfg.block_size, cfg.gradient_accumulation_steps
    batches = dataset.Batches(cfg.data_dir, cfg.dataset, meta, T, device)
    # Eval windows (gptkit.scoring rows): the same random sample at every evaluation; with
    # eval_iters=0 every token of the val split once (the figure compared; a train sample suffices).
    eval_sets = {}
    for split in ("train", "val"):
        starts = dataset.eval_offsets(cfg.seed, split, batches.n_tokens(split), T, B, cfg.eval_iters or FULL_EVAL_TRAIN_BATCHES)
        eval_sets[split] = scoring.sample_windows(np.concatenate(starts), T)
    if cfg.eval_iters == 0:
        eval_sets["val"] = scoring.plan_windows([batches.n_tokens("val")], T, T)
    byte_lengths = eval_byte_lengths(meta, device)
    tokens_per_iter = B * T * G
    ckpt_path = out_dir / ("ckpt" if cfg.parallel == "fsdp" else "ckpt.pt")
    last_ckpt = (iter_num, ckpt_path) if cfg.init_from == "resume" else None

    def save(kind):
        """ckpt.pt (everything to resume) or best.pt (weights); rank 0 writes.
        FSDP: out_dir/ckpt/, every rank its shard (gptkit/train/sharded.py)."""
        if cfg.parallel == "fsdp":
            return sharded.save(kind, out_dir, raw_model, optimizers, run_info(), device, d)
        states = distributed.gather_objects({"torch": torch.get_rng_state(), "cuda": rng_state(device)["cuda"]}, d)
        if not d.is_main:
            return
        obj = {"format_version": 1, "model": raw_model.state_dict(), **run_info()}
        if kind == "ckpt":
            obj["optimizer"] = [opt.state_dict() for opt in optimizers]
            obj["scaler"] = scaler.state_dict() if scaler is not None else None
            obj["rng"] = {**rng_state(device), "per_rank": states if d.world_size > 1 else None}
        save_checkpoint(obj, out_dir / f"{kind}.pt")

    def run_info():
        """What a checkpoint holds besides weights, optimizer and RNG: plain values."""
        return {
            "model_config": dataclasses.asdict(model_cfg),
            "tokenizer": meta["tokenizer"],
            "config": settings,
            "iter_num": iter_num,
            "best_val_loss": best_val_loss,
            "val_loss": val_loss,
            "last_eval_iter": last_eval_iter,
            "train_time_s": train_time,
            "train_cpu_s": time.process_time() - cpu_offset,
            "data_fingerprint": meta.get("fingerprint"),
            "dataset": cfg.dataset,
            "provenance": prov,
        }

    def fail(what):
        """Stop the run (every rank gets here alike: rank 0 reports, the others stop quietly)."""
        where = f"{last_ckpt[1]} (iteration {last_ckpt[0]})" if last_ckpt else "none saved yet in this run"
        if not d.is_main:
            raise PeerFailed()
        raise RunFailed(f"{what}. Last good checkpoint: {where}. Try a lower learning_rate or muon_lr, "
                        "grad_clip, or dtype=bfloat16/float32")

    def stopped(when, save_now):
        """A clean stop on SIGINT/SIGTERM: save (unless nothing was trained yet) and say how to go on."""
        by = stop.signal_name or "a signal on another rank"
        elapsed = logger.format_duration(time.monotonic() - start)
        if save_now and iter_num > 0:
            save("ckpt")
            log.print(f"stopped by {by} {when}: saved {ckpt_path} (iteration {iter_num}); "
                      f"continue with --init_from=resume ({elapsed} in all)")
        else:
            log.print(f"stopped by {by} {when}: nothing trained yet, nothing saved ({elapsed} in all)")
        return 0

    stop = distributed.StopFlag().install()
    try:
        while True:
            # Evaluate (and save) at every eval_interval and at the end; a resumed run
            # does not repeat the evaluation its checkpoint was saved after.
            due = (iter_num % cfg.eval_interval == 0 or iter_num >= cfg.max_iters) and iter_num != last_eval_iter
            if due or cfg.eval_only:
                cpu0 = time.process_time()
                scores = evaluate(forward, module, batches, eval_sets, B, autocast, d, device, byte_lengths,
                                  stop, log.eval_progress(iter_num))
                cpu_offset += time.process_time() - cpu0
                if scores is None:  # a stop signal during the evaluation
                    return stopped(f"during the evaluation at iteration {iter_num}", save_now=iter_num > 0)
                if not all(math.isfinite(scores[s].loss) for s in scores):
                    fail(f"the val loss is {scores['val'].loss} (train {scores['train'].loss}) at iteration {iter_num}; nothing saved")
                val_loss, last_eval_iter = scores["val"].loss, iter_num
                lr = optim.lr_at(iter_num, cfg)
                bpb = {f"{s}_bpb": scores[s].bpb for s in ("val", "train")} if byte_lengths is not None else {}
                log.record({"kind": "eval", "iter": iter_num, "train_loss": scores["train"].loss, "val_loss": val_loss, **bpb, "lr": lr, "train_time_s": train_time,
                            "train_cpu_s": time.process_time() - cpu_offset})
                if cfg.eval_only:
                    break
                improved = val_loss < best_val_loss
                best_val_loss = min(best_val_loss, val_loss)
                if iter_num > 0 and (improved or cfg.always_save_checkpoint):
                    save("ckpt")
                    last_ckpt = (iter_num, ckpt_path)
                if iter_num > 0 and improved:
                    save("best")
            if iter_num >= cfg.max_iters or cfg.eval_only:
                break

            # One optimizer step over the global batch; this rank's share of it.
            t0 = time.perf_counter()
            faults.maybe_sigterm(iter_num)
            offsets = dataset.global_batch_offsets(cfg.seed, iter_num, batches.n_tokens("train"), T, B * G)
            loss_sum = torch.zeros((), device=device)
            for micro in range(local_accum):
                chunk = d.rank * local_accum + micro
                x, y = batches.get("train", dataset.micro_batch_offsets(offsets, B, chunk))
                if d.enabled:  # average gradients across ranks only after the last micro-step
                    fsdp.set_gradient_sync(module, micro == local_accum - 1)
                with autocast:
                    _, loss = forward(x, y)
                faults.maybe_fail(iter_num)
                if faults.at_step("nan_loss_at", iter_num):
                    loss = loss * float("nan")
                loss_sum += loss.detach().float()
                loss = loss / local_accum
                (scaler.scale(loss) if scaler is not None else loss).backward()
            if faults.at_step("inf_grad_at", iter_num):
                next(p for p in raw_model.parameters() if p.grad is not None).grad.fill_(math.inf)
            if scaler is not None:
                for opt in optimizers:
                    scaler.unscale_(opt)
            params = [p for p in raw_model.parameters() if p.grad is not None]
            if cfg.grad_clip > 0:
                norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            else:
                norm = torch.nn.utils.get_total_norm([p.grad for p in params])
            # One all-reduce carries the loss sum, the norm (equal on every rank) and
            # the stop flag, so every rank makes the same decision at the same step.
            norm = fsdp.norm_value(norm)  # FSDP: the global norm over all shards
            stats = torch.stack([loss_sum, norm.float().to(device), torch.tensor(float(stop.raised), device=device)])
            loss_total, norm_total, stops = distributed.all_reduce_sum(stats, d).tolist()
            loss_mean, grad_norm = loss_total / G, norm_total / d.world_size
            if not math.isfinite(loss_mean) or (not math.isfinite(grad_norm) and scaler is None):
                what = f"loss is {loss_mean}" if not math.isfinite(loss_mean) else f"gradient norm is {grad_norm}"
                fail(f"the training {what} at iteration {iter_num}; stopped before the optimizer step")
            lr = optim.lr_at(iter_num, cfg)
            optim.set_lr(optimizers, lr / cfg.learning_rate if cfg.learning_rate > 0 else 0.0)
            for opt in optimizers:
                if scaler is not None:
                    scaler.step(opt)  # skips the step when the scaled gradients overflowed
                else:
                    opt.step()
            if scaler is not None:
                scaler.update()
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            train_time += dt
            if iter_num % cfg.log_interval == 0:
                tokens_per_s = tokens_per_iter / dt
                mfu = estimate_mfu(model_cfg, tokens_per_s / d.world_size, peak_flops) if peak_flops else None
                log.record({"kind": "train", "iter": iter_num, "loss": loss_mean, "lr": lr, "grad_norm": grad_norm,
                            "ms_per_iter": 1000 * dt, "tokens_per_s": tokens_per_s, "mfu": mfu, "train_time_s": train_time,
                            "train_cpu_s": time.process_time() - cpu_offset,
                            **({"skipped": True} if not math.isfinite(grad_norm) else {})})
            iter_num += 1
            log.advance(dt)
            if stops > 0:
                return stopped(f"at iteration {iter_num}", save_now=True)
    finally:
        stop.uninstall()
        log.close()
        batches.close()
    if d.is_main and not cfg.eval_only:
        print(f"done: {iter_num} iterations, best val loss {best_val_loss:.4f}, checkpoints in {out_dir} "
              f"({logger.format_duration(time.monotonic() - start)} in all)")
    return 0


if __name__ == "__main__":
    run_main(main)
