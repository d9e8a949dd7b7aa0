"""train.py's settings checked: every problem of a TrainConfig at once, in one error,
before any data is read; and the checks that need the model's settings or the
number of ranks too (sizes no machine holds, accumulation that the ranks cannot share).

    TrainConfig(max_iters=-1)   # ValueError: invalid training settings: max_iters=-1 must not be negative
    check_world_size(cfg, 64)   # UserError naming gradient_accumulation_steps and a fix

train.py's TrainConfig calls `check` from its __post_init__, rl.py's RLConfig
`trainer_problems` (the same rules, not a copy); train.py's main runs
`check_world_size` and `check_batch_sizes` before anything else (on every rank alike).
"""

import dataclasses
import math

from gptkit.models import lora
from gptkit.config import choice_problems
from gptkit.ops.device import DTYPES
from gptkit.ops.errors import UserError
from gptkit.train.distributed import same_global_batch

MAX_SEED = 2**32 - 1 - 4096  # numpy seeds stop at 2**32 - 1, and each rank adds its rank
MAX_MICRO_BATCH_TOKENS = 2**31  # beyond int32 indexing, and beyond any machine's memory for activations
MAX_EVAL_WINDOWS = 10_000_000  # their start offsets alone would take 80 MB
CHOICES = {
    "lr_schedule": ("cosine", "constant", "wsd"),
    "cooldown_shape": ("linear", "1-sqrt"),
    "optimizer": ("adamw", "muon"),
    "dtype": ("auto", *DTYPES),
    "backend": ("auto", "nccl", "gloo"),
    "parallel": ("ddp", "fsdp"),
    "cpu_kernels": ("fused", "model"),
}


def check(cfg):
    """Fill in what follows from other settings (lr_decay_iters, lora_alpha, compile's
    spelling), then raise one ValueError listing every problem, if any."""
    problems = choice_problems(cfg, CHOICES)
    compile_ = str(cfg.compile).lower()
    if compile_ not in ("auto", "true", "false", "1", "0"):
        problems.append(f"compile={cfg.compile!r} must be auto, true or false")
    else:
        cfg.compile = {"1": "true", "0": "false"}.get(compile_, compile_)
    for name in ("eval_interval", "log_interval", "gradient_accumulation_steps", "batch_size",
                 "muon_ns_steps"):
        if getattr(cfg, name) < 1:
            problems.append(f"{name}={getattr(cfg, name)} must be at least 1")
    if cfg.lr_decay_iters is None:
        cfg.lr_decay_iters = cfg.max_iters  # the schedule follows max_iters
    for name in ("eval_iters", "max_iters", "warmup_iters", "lr_decay_iters"):
        if getattr(cfg, name) < 0:
            problems.append(f"{name}={getattr(cfg, name)} must not be negative")
    problems += trainer_problems(cfg, numbers=(*OPTIMIZER_NUMBERS, "min_lr", "muon_weight_decay"),
                                 decays=(*OPTIMIZER_DECAYS, ("muon_lr", "muon_weight_decay")))
    if not math.isfinite(cfg.time_budget) or cfg.time_budget < 0:
        problems.append(f"time_budget={cfg.time_budget} must be a finite number of seconds, not negative "
                        "(0 = off)")
    if cfg.muon_weight_decay > 0 and cfg.optimizer != "muon":
        problems.append(f"muon_weight_decay={cfg.muon_weight_decay} decays Muon's matrices, but "
                        f"optimizer={cfg.optimizer}: set weight_decay (AdamW's) instead")
    for name in ("muon_cautious_wd", "muon_normuon"):
        if getattr(cfg, name) and cfg.optimizer != "muon":
            problems.append(f"{name}=true changes Muon's step, but optimizer={cfg.optimizer}")
    if cfg.muon_cautious_wd and cfg.muon_weight_decay == 0:
        problems.append("muon_cautious_wd=true chooses where Muon's weight decay acts, but "
                        "muon_weight_decay=0: set one above 0")
    decays = cfg.decay_lr and cfg.lr_schedule != "constant"
    if decays and cfg.min_lr == 0 and cfg.lr_decay_iters < cfg.max_iters:
        problems.append(
            f"lr_decay_iters={cfg.lr_decay_iters} < max_iters={cfg.max_iters} with min_lr=0: "
            f"steps {cfg.lr_decay_iters} to {cfg.max_iters - 1} would train at learning rate "
            "0; leave lr_decay_iters unset (it follows max_iters), or set min_lr > 0"
        )
    if not 0 <= cfg.cooldown_frac <= 1:
        problems.append(f"cooldown_frac={cfg.cooldown_frac} must be in [0, 1]")
    if not cfg.init_from:
        problems.append("init_from must not be empty")
    if problems:
        raise ValueError("invalid training settings: " + "; ".join(problems))


OPTIMIZER_NUMBERS = ("learning_rate", "weight_decay", "grad_clip", "muon_lr")
OPTIMIZER_DECAYS = (("learning_rate", "weight_decay"),)


def trainer_problems(cfg, numbers=OPTIMIZER_NUMBERS, decays=OPTIMIZER_DECAYS):
    """The settings every command that trains shares, as train.py checks them (TrainConfig;
    rl.py's RLConfig, which holds these same fields): rates, decays and the clip finite and
    not negative, decoupled decay below 1, betas in [0, 1), the seed in range, LoRA's
    settings (lora_problems). `numbers` and `decays` name the fields to check; train.py
    adds its own (min_lr, Muon's weight decay)."""
    problems = []
    for name in numbers:
        value = getattr(cfg, name)
        if not math.isfinite(value) or value < 0:
            problems.append(f"{name}={value} must be a finite number, not negative")
    # Decoupled weight decay multiplies each decayed weight by 1 - lr * decay every step
    # (AdamW's and Muon's alike): at 1 the weights are zeroed, above it their signs flip.
    for lr, decay in decays:
        product = getattr(cfg, lr) * getattr(cfg, decay)
        if math.isfinite(getattr(cfg, lr)) and math.isfinite(getattr(cfg, decay)) and product >= 1:
            problems.append(f"{lr} x {decay} = {product:g} must be below 1: decoupled weight decay "
                            f"multiplies each weight by 1 - {product:g} every step, which zeroes it or "
                            "flips its sign; lower one of them")
    for name in ("beta1", "beta2", "muon_momentum"):
        if not 0 <= getattr(cfg, name) < 1:
            problems.append(f"{name}={getattr(cfg, name)} must be in [0, 1)")
    if not 0 <= cfg.seed <= MAX_SEED:
        problems.append(f"seed={cfg.seed} must be between 0 and {MAX_SEED}")
    return problems + lora_problems(cfg)


def lora_problems(cfg):
    problems = []
    if cfg.lora_rank < 0:
        problems.append(f"lora_rank={cfg.lora_rank} must not be negative (0 = no LoRA)")
    if cfg.lora_alpha is None and cfg.lora_rank > 0:
        cfg.lora_alpha = float(cfg.lora_rank)  # scale 1
    elif cfg.lora_alpha is not None and not 0 < cfg.lora_alpha < math.inf:  # NaN too
        problems.append(f"lora_alpha={cfg.lora_alpha} must be a positive number "
                        "(or none: the rank)")
    if not 0 <= cfg.lora_dropout < 1:
        problems.append(f"lora_dropout={cfg.lora_dropout} must be in [0, 1)")
    try:
        lora.parse_targets(cfg.lora_targets)
    except ValueError as e:
        problems.append(str(e))
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    adapter_settings = ("lora_alpha", "lora_dropout", "lora_targets")
    lone = [f"{name}={getattr(cfg, name)!r}" for name in adapter_settings
            if cfg.lora_rank == 0 and getattr(cfg, name) != defaults[name]]
    if lone and cfg.init_from != "resume":  # resuming keeps the rank; lora_dropout applies
        problems.append(f"{', '.join(lone)} without lora_rank: LoRA is off (lora_rank=0), so "
                        "every weight would train; set --lora_rank=R (e.g. 8) for adapters, or "
                        "leave out the LoRA settings")
    if cfg.lora_rank > 0 and cfg.init_from == "scratch":
        problems.append("lora_rank > 0 adapts a trained model: set --init_from=gpt2 (or a "
                        "Hugging Face folder or a checkpoint file)")
    if cfg.lora_rank > 0 and cfg.optimizer == "muon":
        problems.append("LoRA adapters train with AdamW (as in the LoRA paper and peft): use "
                        "--optimizer=adamw with lora_rank > 0")
    return problems


def check_batch_sizes(model_cfg, cfg):
    """Sizes no machine can hold fail here, not after minutes of allocating."""
    tokens = cfg.batch_size * model_cfg.block_size
    if tokens > MAX_MICRO_BATCH_TOKENS:
        raise UserError(
            f"batch_size * block_size = {tokens:,} tokens in one micro-batch (at most {MAX_MICRO_BATCH_TOKENS:,}): "
            "use a smaller batch_size and more gradient_accumulation_steps"
        )
    if cfg.eval_iters * cfg.batch_size > MAX_EVAL_WINDOWS:
        raise UserError(
            f"eval_iters * batch_size = {cfg.eval_iters * cfg.batch_size:,} windows per evaluation (at most "
            f"{MAX_EVAL_WINDOWS:,}): use fewer eval_iters, or eval_iters=0 for the whole val split"
        )


def check_world_size(cfg, world_size):
    if cfg.gradient_accumulation_steps % world_size:
        G = cfg.gradient_accumulation_steps
        raise UserError(
            f"gradient_accumulation_steps={G} (the global count) must be divisible by the number of "
            f"ranks, {world_size}: use a multiple of {world_size}, e.g. --gradient_accumulation_steps=%d "
            f"--batch_size=%d for about the same global batch" % same_global_batch(G, cfg.batch_size, world_size)
        )
