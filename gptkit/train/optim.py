"""Optimizers and the learning-rate schedule, built from the training settings.

    optimizers = make_optimizers(model, cfg, device_type="cuda")  # [AdamW] or [AdamW, Muon]
    scale = lr_scale(step, cfg)  # pure: the schedule can be tested and plotted without a model

train.py's set_lr sets every group's rate to its "base_lr" times that scale at each step.

AdamW decays only the matrices (weights of linear layers and embeddings), not
biases or norm gains: decaying a bias or a gain towards zero only pulls the
network towards a less expressive one (nanoGPT does the same split by ndim).
"""

import math

import torch

from gptkit.ops.errors import UserError


def lr_scale(step, cfg, progress=None):
    """The schedule's factor at iteration `step` (0-based): every parameter group
    trains at its peak rate (AdamW's learning_rate, Muon's muon_lr) times this.
    `progress` (a time budget's share spent, 0 to 1) stands for step / lr_decay_iters
    after the warmup: the decay then follows the clock instead of the step count.

    decay_lr=False: 1 at every step (nanoGPT's meaning). Otherwise a linear warmup
    over `warmup_iters`, then by `lr_schedule`:
      cosine   - cosine decay to min_lr / learning_rate at `lr_decay_iters`, that after;
      constant - 1 after the warmup;
      wsd      - warmup, stable at 1, then a cooldown to min_lr / learning_rate over
                 the last `cooldown_frac` of `lr_decay_iters`, shaped by `cooldown_shape`:
                 linear, or 1-sqrt (sqrt(f) of the way down at a share f of the
                 cooldown, 1 - sqrt(f) with min_lr 0: it falls fast at first, then
                 lingers near the floor; Hägele et al. 2024, "Scaling Laws and
                 Compute-Optimal Training Beyond Fixed Training Durations", found it
                 better than linear).
    """
    if not cfg.decay_lr:
        return 1.0
    if step < cfg.warmup_iters:
        return (step + 1) / (cfg.warmup_iters + 1)
    if cfg.lr_schedule == "constant":
        return 1.0
    if progress is not None:
        step = max(progress * cfg.lr_decay_iters, cfg.warmup_iters)  # the decay starts after the warmup
    floor = cfg.min_lr / cfg.learning_rate if cfg.learning_rate > 0 else 0.0
    if step >= cfg.lr_decay_iters:
        return floor
    if cfg.lr_schedule == "wsd":
        cooldown_start = cfg.lr_decay_iters * (1 - cfg.cooldown_frac)
        if step < cooldown_start:
            return 1.0
        frac = (step - cooldown_start) / max(cfg.lr_decay_iters - cooldown_start, 1e-9)
        if cfg.cooldown_shape == "1-sqrt":
            frac = math.sqrt(frac)
        return 1.0 + frac * (floor - 1.0)
    assert cfg.lr_schedule == "cosine", cfg.lr_schedule
    frac = (step - cfg.warmup_iters) / max(cfg.lr_decay_iters - cfg.warmup_iters, 1)
    coeff = 0.5 * (1.0 + math.cos(math.pi * frac))  # 1 -> 0
    return floor + coeff * (1.0 - floor)


def lr_at(step, cfg):
    """AdamW's learning rate at iteration `step` of a run without a time budget."""
    return cfg.learning_rate * lr_scale(step, cfg)


class Schedule:
    """Where the run stands on its schedule: it ends after max_iters steps or, with a
    time_budget, once that many seconds of training steps are spent (evaluations,
    saves and start-up left out) if that comes first, the learning rate's decay then
    following whichever share is further along. The clock is the run's own, saved in
    every checkpoint (RunState): on a CPU its CPU seconds (train_cpu_s: a fixed CPU
    budget, unmoved by other processes), on a GPU the wall seconds inside steps
    (train_time_s)."""

    def __init__(self, cfg, device_type):
        self.cfg, self.cpu = cfg, device_type == "cpu"
        self.total_iters = None if cfg.time_budget else cfg.max_iters  # a budget's steps are not known

    def spent_s(self, state):
        return state.train_cpu_s if self.cpu else state.train_time_s

    def progress(self, state):
        """The share of the run done (0 to 1), or None without a time budget: the share of
        the budget spent or of max_iters taken, whichever is further along (a fast machine
        stops at max_iters with its decay done; a slow one when the budget is spent)."""
        budget = self.cfg.time_budget
        if not budget:
            return None
        return min(1.0, max(self.spent_s(state) / budget, state.iter_num / max(self.cfg.max_iters, 1)))

    def finished(self, state):
        """max_iters steps taken, or the time budget spent. A budget that the run's first
        step alone spends cannot train what it describes: refused (exit 2) before the
        loop saves anything."""
        if state.iter_num == 1 and self.cfg.time_budget and self.spent_s(state) >= self.cfg.time_budget:
            step_s, what = self.spent_s(state), "CPU seconds" if self.cpu else "seconds"
            raise UserError(f"time_budget={self.cfg.time_budget:g} is spent by the first training step alone "
                            f"({step_s:.3g} {what}): nothing saved; give room for many steps, e.g. "
                            f"--time_budget={max(1, math.ceil(100 * step_s)):g}")
        return state.iter_num >= self.cfg.max_iters or self.progress(state) == 1.0

    def lr_scale(self, state):
        return lr_scale(state.iter_num, self.cfg, self.progress(state))

    def inside_warmup(self, steps):
        """Whether a time budget spent after `steps` steps ends the run inside its warmup,
        so that the learning rate never decays: the warmup counts steps, and only after it
        does the decay follow the clock. (A warmup as long as max_iters is
        schedule_warnings' case.)"""
        cfg = self.cfg
        return bool(cfg.time_budget and cfg.decay_lr and cfg.lr_schedule != "constant"
                    and steps < cfg.warmup_iters < cfg.max_iters)

    def budget_warmup_note(self, steps, spent_s, budget_s_per_step):
        """Early, once the pace is known (`budget_s_per_step`: seconds of the budget's clock
        a step, after `steps` steps and `spent_s` seconds): one line when the steps the budget
        allows are fewer than warmup_iters; None otherwise."""
        if not self.inside_warmup(steps) or budget_s_per_step <= 0:
            return None
        allowed = steps + int(max(0.0, self.cfg.time_budget - spent_s) / budget_s_per_step)
        if allowed >= self.cfg.warmup_iters:
            return None
        return (f"time_budget={self.cfg.time_budget:g} allows about {allowed:,} steps at this pace, fewer than "
                f"warmup_iters={self.cfg.warmup_iters}: the run will end inside its warmup, its learning rate never "
                f"decayed; give --warmup_iters={max(1, allowed // 10)} or a longer budget")

    def end_note(self, state):
        """At the end: one line when the budget ended the run inside its warmup; None otherwise."""
        if not (self.inside_warmup(state.iter_num) and self.progress(state) == 1.0):
            return None
        return (f"the time budget ended the run at step {state.iter_num:,}, inside warmup_iters="
                f"{self.cfg.warmup_iters}: the learning rate never decayed (it reached "
                f"{lr_scale(state.iter_num - 1, self.cfg):.0%} of learning_rate); give --warmup_iters="
                f"{max(1, state.iter_num // 10)} or a longer budget")

    def eta_s(self, state, seconds_per_iter):
        """Wall seconds left after step state.iter_num: seconds_per_iter for each step left,
        or the budget's clock if that ends first. A CPU budget counts CPU seconds of all
        threads: they become wall seconds at the run's own rate so far (two threads: ~0.5)."""
        steps_left = max(0, self.cfg.max_iters - state.iter_num - 1)
        steps = None if seconds_per_iter is None else seconds_per_iter * steps_left
        if not self.cfg.time_budget:
            return steps
        clock = max(0.0, self.cfg.time_budget - self.spent_s(state))
        if self.cpu and state.train_cpu_s > 0:
            clock *= state.train_time_s / state.train_cpu_s
        return clock if steps is None else min(clock, steps)


def schedule_warnings(cfg):
    """Settings that are legal but probably not what was meant (impossible ones are
    refused by TrainConfig itself)."""
    out = []
    if not cfg.decay_lr or cfg.max_iters == 0:
        return out
    if cfg.warmup_iters >= cfg.max_iters:
        out.append(f"warmup_iters={cfg.warmup_iters} >= max_iters={cfg.max_iters}: the run ends before the "
                   f"learning rate reaches learning_rate={cfg.learning_rate}")
    elif cfg.lr_schedule == "cosine" and cfg.warmup_iters >= cfg.lr_decay_iters:
        out.append(f"warmup_iters={cfg.warmup_iters} >= lr_decay_iters={cfg.lr_decay_iters}: the cosine decay "
                   f"never happens (min_lr from step {cfg.warmup_iters} on)")
    if cfg.lr_decay_iters < cfg.max_iters and cfg.lr_schedule != "constant" and cfg.min_lr > 0:
        out.append(f"lr_decay_iters={cfg.lr_decay_iters} < max_iters={cfg.max_iters}: the last "
                   f"{cfg.max_iters - cfg.lr_decay_iters} steps train at min_lr={cfg.min_lr}")
    return out


def adamw_groups(named_params, weight_decay):
    """Two AdamW parameter groups: matrices (decayed) and everything else (not)."""
    decay = [p for _, p in named_params if p.requires_grad and p.dim() >= 2]
    no_decay = [p for _, p in named_params if p.requires_grad and p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizers(model, cfg, device_type):
    """[AdamW] or, with optimizer="muon", [AdamW, Muon] for the raw model.

    Every param group remembers its own peak rate in "base_lr", and train.py's
    `set_lr(optimizers, lr_scale(step, cfg))` scales them all by the schedule,
    so Muon follows the same warmup and decay as AdamW."""
    fused = device_type == "cuda"  # one kernel for all parameters; CUDA only
    if cfg.optimizer == "adamw":
        adamw_named = list(model.named_parameters())
        muon_named = []
    else:
        from gptkit.train.muon import Muon, split_params_for_muon

        muon_named, adamw_named = split_params_for_muon(model)
    adamw = torch.optim.AdamW(
        adamw_groups(adamw_named, cfg.weight_decay),
        lr=cfg.learning_rate,
        betas=(cfg.beta1, cfg.beta2),
        fused=fused,
    )
    optimizers = [adamw]
    if muon_named:
        optimizers.append(
            Muon(
                [p for _, p in muon_named],
                lr=cfg.muon_lr,
                momentum=cfg.muon_momentum,
                nesterov=cfg.muon_nesterov,
                ns_steps=getattr(cfg, "muon_ns_steps", 5),  # older saved settings: Muon's defaults
                weight_decay=getattr(cfg, "muon_weight_decay", 0.0),
                cautious_wd=getattr(cfg, "muon_cautious_wd", False),
                normuon=getattr(cfg, "muon_normuon", False),
            )
        )
    for opt in optimizers:
        for group in opt.param_groups:
            group["base_lr"] = group["lr"]
    return optimizers


def make_scaler(dtype, device_type):
    """A GradScaler, enabled for float16 only (its small range needs loss scaling).
    Disabled, it is the identity: scale() returns the loss, step() just steps."""
    return torch.amp.GradScaler(device_type, enabled=dtype == torch.float16)

