"""Setting a training run up, in the order train.py calls it:

    dev = Device.choose(cfg, dist)                          # device, dtype, autocast, compile
    meta, raw_model, model_cfg, ckpt = start(model_cfg, cfg, dist, dev)   # data and model
    shard(raw_model, ckpt, cfg, dist, dev)                  # FSDP only
    state = resume(ckpt, raw_model, optimizers, scaler, cfg, dist, dev)   # or RunState()
    module = wrap(raw_model, cfg, dist, dev)                # DDP (train.py's Forward then compiles)
    settings = settings_as_run(model_cfg, cfg, dev, raw_model)          # config.json's
    print("\n".join(header(settings, raw_model, dist, dev, cfg)))      # rank 0

Also here: the check of a checkpoint to resume (the settings' own checks are
gptkit/train/settings.py's). The out_dir's one-writer claim is gptkit/train/out_dir.py."""

import dataclasses
import random
import textwrap
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from gptkit.data import dataset
from gptkit.ops import faults
from gptkit.fast import fused
from gptkit.models import lora
from gptkit.evals import scoring
from gptkit.ops.checkpoint import load_checkpoint, non_finite_tensors
from gptkit.config import settings_dict
from gptkit.ops.device import cuda_build_on_a_cpu_note, enable_tf32, keep_freed_memory, resolve_device, training_dtype
from gptkit.ops.errors import UserError
from gptkit.interop.hf_gpt2 import HUB_NAMES
from gptkit.models.loading import adapted_model, checkpoint_of, load_base
from gptkit.data.tokenizer import tokenizer_from_dict
from gptkit.train import distributed
from gptkit.train import fsdp
from gptkit.train import optim
from gptkit.ops import sharded  # finding and reading; loading into a run: gptkit/train/sharded.py
from gptkit.run_state import RunState, check_loop_state, set_rng_state
from model import GPT, GPTConfig



@dataclasses.dataclass
class Device:
    """Where and in what number format this rank trains."""

    name: str  # "cpu", "cuda:3", "mps"
    dtype: torch.dtype  # the autocast dtype (float32: no autocast)
    compile: bool
    memory: str | None = None  # how the C library's malloc was set for training (CPU), for the header

    @property
    def type(self):
        return self.name.split(":")[0]

    @classmethod
    def choose(cls, cfg, dist):
        device = str(resolve_device(cfg.device, dist.local_rank if dist.enabled else None))
        dtype = training_dtype(cfg.dtype, device)
        distributed.agreed(dist, lambda: fsdp.check_settings(cfg.parallel, dist.enabled, dtype))
        if device.startswith("cuda"):
            enable_tf32()
        use_compile = cfg.compile == "true" or (cfg.compile == "auto" and device.startswith("cuda"))
        memory = keep_freed_memory() if device == "cpu" else None  # each step's tensors reused, not faulted in again
        return cls(device, dtype, use_compile, memory)

    def autocast(self):
        return nullcontext() if self.dtype == torch.float32 else torch.autocast(self.type, dtype=self.dtype)


def start(model_cfg, cfg, dist, dev):
    """(meta, raw model on the device, its config, checkpoint or None): every rank checks
    the dataset and builds the same model."""
    meta = distributed.agreed(dist, lambda: dataset.load_meta(cfg.data_dir, cfg.dataset))
    torch.manual_seed(cfg.seed + dist.rank)  # different dropout on each rank
    random.seed(cfg.seed + dist.rank)
    np.random.seed(cfg.seed + dist.rank)
    raw_model, model_cfg, ckpt = distributed.agreed(dist, lambda: init_model(model_cfg, cfg, meta, Path(cfg.out_dir)))
    folder = Path(cfg.data_dir) / cfg.dataset
    distributed.agreed(dist, lambda: dataset.check_block_size(meta, model_cfg.block_size, folder))
    if dist.is_main:
        for warning in optim.schedule_warnings(cfg):
            print(f"warning: {warning}")
    raw_model.to(dev.name)
    if cfg.cpu_kernels == "fused" and dev.type == "cpu" and dev.dtype == torch.float32:
        # RMSNorm and ReLU² with their backward written by hand, each kind checked against model.py's
        fused.apply(raw_model, note=print if dist.is_main else None)
    if cfg.activation_checkpointing:
        fsdp.checkpoint_blocks(raw_model)
    return meta, raw_model, model_cfg, ckpt


def shard(raw_model, ckpt, cfg, dist, dev):
    """parallel=fsdp: split every parameter across the ranks, in place, from the same
    initial weights on every rank (as DDP broadcasts them). Nothing under DDP."""
    if cfg.parallel != "fsdp":
        return
    if ckpt is None:
        distributed.broadcast_params(raw_model, dist)
    elif "sharded" not in ckpt:  # a one-file checkpoint: its optimizer states by parameter name
        ckpt["optimizer"] = train_sharded().optimizer_state_by_name(raw_model, cfg, dev.type, ckpt["optimizer"], Path(cfg.out_dir))
    fsdp.shard(raw_model, dev.dtype)


def resume(ckpt, raw_model, optimizers, scaler, cfg, dist, dev):
    """Load a checkpoint's optimizer, GradScaler and RNG states into this run (its
    weights are in already); returns the loop's RunState (a fresh one without a
    checkpoint). Today's hyperparameters win (learning rates, weight decay, betas,
    momentum) over the ones saved with the state."""
    if not ckpt:
        return RunState()
    out_dir = Path(cfg.out_dir)
    distributed.agreed(dist, lambda: check_resumable(ckpt, optimizers, out_dir, cfg))
    fresh = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in optimizers]
    if "sharded" in ckpt:  # out_dir/ckpt/: weights and optimizer states, resharded to this run
        train_sharded().load_into(ckpt["sharded"], raw_model, optimizers)
    elif cfg.parallel == "fsdp":
        train_sharded().load_full_optimizer_state(raw_model, optimizers, ckpt["optimizer"])
    else:
        for opt, saved in zip(optimizers, ckpt["optimizer"]):
            opt.load_state_dict(saved)
    for opt, groups in zip(optimizers, fresh):
        for g, hyper in zip(opt.param_groups, groups):
            g.update(hyper)
    if scaler.is_enabled() and ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    rng = ckpt["rng"]
    per_rank = rng.get("per_rank")
    if per_rank and len(per_rank) == dist.world_size:
        rng = {**rng, **per_rank[dist.rank]}
    elif dist.world_size > 1:
        print(f"warning: rank {dist.rank}: the checkpoint's RNG states were saved by another number of ranks; dropout will not repeat exactly")
    set_rng_state(rng, dev.name)
    state = RunState.from_checkpoint(ckpt)
    if dist.is_main:
        print(f"resumed from {checkpoint_source(ckpt, out_dir)} at iteration {state.iter_num} (best val loss {state.best_val_loss:.4f})")
    return state


def wrap(raw_model, cfg, dist, dev, iteration):
    """The module the training step's forward runs (train.py's Forward compiles it):
    DDP around the raw model when there are several ranks, else the raw model (FSDP
    has sharded it in place already). `iteration()` is the loop's iteration, for the
    test-only faults (gptkit/ops/faults.py)."""
    faults.install(raw_model, iteration)
    module = raw_model
    if dist.enabled and cfg.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        # Buffers (masks, RoPE tables) are built identically on every rank: no need to
        # broadcast them, and not doing so keeps forward passes free of collectives.
        module = DDP(raw_model, device_ids=[dist.local_rank] if dev.type == "cuda" else None, broadcast_buffers=False)
    return module


def settings_as_run(model_cfg, cfg, dev, raw_model):
    """Every setting as this run resolved it (device, dtype, compile and the kernels that
    run, not "auto"): what the header prints, config.json and every checkpoint record."""
    dtype = str(dev.dtype).removeprefix("torch.")
    kernels = "fused" if fused.swapped_count(raw_model) else "model"
    resolved = dataclasses.replace(cfg, device=dev.name, dtype=dtype, compile=str(dev.compile).lower(),
                                   cpu_kernels=kernels)
    return settings_dict(model_cfg, resolved)


def header(settings, raw_model, dist, dev, cfg):
    """The run's first lines (rank 0 prints them): the settings, then what runs where."""
    listed = "  ".join(f"{k}={v}" for k, v in settings.items())
    lines = ["settings: " + textwrap.fill(listed, 100, subsequent_indent="  "),
             f"{raw_model.num_params() / 1e6:.2f}M parameters | world size {dist.world_size} | "
             f"{dev.name} {settings['dtype']} | compile {dev.compile} | kernels {fused.describe(raw_model)}"]
    if note := embedding_heavy_note(raw_model, cfg.init_from):
        lines.append(note)
    if note := cuda_build_on_a_cpu_note(torch.device(dev.name)):
        lines.append(note)
    if dev.memory:
        lines.append(dev.memory)
    if lora.is_applied(raw_model):
        lines.append(lora.summary(raw_model))
    return lines


def eval_byte_lengths(meta, device):
    """Bytes per token id on the device for bits per byte; None (with a warning) when
    the tokenizer cannot be loaded here (e.g. GPT-2's BPE files offline)."""
    try:
        return scoring.byte_lengths_tensor(tokenizer_from_dict(meta["tokenizer"]), device)
    except UserError as e:
        print(f"warning: evaluations will show no bits per byte: {e}")
        return None


def init_model(model_cfg, cfg, meta, out_dir):
    """(raw model, model config, checkpoint or None) for init_from; checks the vocabulary."""
    if cfg.init_from == "scratch":
        model_cfg = dataclasses.replace(model_cfg, vocab_size=meta["vocab_size"])
        return GPT(model_cfg), model_cfg, None
    if cfg.init_from == "resume":
        ckpt = _resume_checkpoint(Path(out_dir))
        saved = GPTConfig(**ckpt["model_config"])
        if ckpt.get("tokenizer") != meta["tokenizer"] or saved.vocab_size != meta["vocab_size"]:
            raise UserError(
                f"vocabulary mismatch: {checkpoint_source(ckpt, out_dir)} was trained with a {describe_vocab(ckpt.get('tokenizer'), saved.vocab_size)} "
                f"vocabulary, but dataset {cfg.dataset} has a {describe_vocab(meta['tokenizer'], meta['vocab_size'])} one: "
                "resume on the checkpoint's dataset (--dataset) or start a new out_dir"
            )
        if ckpt.get("data_fingerprint") != meta.get("fingerprint"):
            print(f"warning: dataset {cfg.dataset} differs from the one {checkpoint_source(ckpt, out_dir)} was trained on (fingerprint changed)")
        differing = [f.name for f in dataclasses.fields(GPTConfig) if f.name not in ("vocab_size", "dropout") and getattr(saved, f.name) != getattr(model_cfg, f.name)]
        if differing:
            print(f"note: resuming keeps the checkpoint's model settings; ignoring {', '.join(differing)}")
        model_cfg = dataclasses.replace(saved, dropout=model_cfg.dropout)
        bad = non_finite_tensors(ckpt, str(checkpoint_source(ckpt, out_dir)))
        if bad:
            raise UserError(f"{bad[0]} holds NaN or inf: this checkpoint cannot be resumed; start again or use another")
        if ckpt.get("lora") is not None:  # adapters only: the base comes from where the run recorded it
            model = adapted_model(ckpt["lora"], ckpt["model"], checkpoint_source(ckpt, out_dir), saved.block_size,
                                  dropout=model_cfg.dropout, lora_dropout=cfg.lora_dropout)
            spec = model.lora_spec
            if (cfg.lora_rank, cfg.lora_alpha, lora.parse_targets(cfg.lora_targets)) != (spec["rank"], spec["alpha"], tuple(spec["targets"])):
                print("note: resuming keeps the checkpoint's LoRA rank, alpha and targets")
            return model, model.config, ckpt
        model = GPT(model_cfg)
        if "model" in ckpt:  # a sharded checkpoint's weights load after sharding (train.py)
            model.load_state_dict(ckpt["model"])
        return model, model_cfg, ckpt
    if cfg.init_from in HUB_NAMES or Path(cfg.init_from).exists():
        ours = checkpoint_of(cfg.init_from)  # a file, or a run or sharded folder of ours: the checkpoint in it
        init_from = cfg.init_from if ours is None else str(ours)
        if ours is None and meta["tokenizer"].get("type") != "gpt2":
            raise UserError(
                f"vocabulary mismatch: init_from={cfg.init_from} uses GPT-2's BPE vocabulary, but dataset "
                f"{cfg.dataset} has a {describe_vocab(meta['tokenizer'], meta['vocab_size'])} one: prepare it with --tokenizer gpt2"
            )
        model, tokenizer = load_base(init_from, dropout=model_cfg.dropout)
        base = {"init_from": base_location(init_from), "fingerprint": lora.fingerprint(model)} if cfg.lora_rank else None
        # room for the turn tokens (and tool tokens), or for the tool tokens of a chat model without them
        chat = meta.get("chat", {})
        grown = "tool_ids" in chat and model.config.vocab_size == chat["tool_ids"]["<|call|>"]
        grown = grown or ("chat" in meta and model.config.vocab_size == chat["turn_ids"]["<|system|>"])
        if grown:
            model.grow_vocab(meta["vocab_size"])
        if ours is not None and (tokenizer != tokenizer_from_dict(meta["tokenizer"]).to_dict() or model.config.vocab_size != meta["vocab_size"]):
            raise UserError(
                f"vocabulary mismatch: {init_from} was trained with a {describe_vocab(tokenizer, model.config.vocab_size)} "
                f"vocabulary, but dataset {cfg.dataset} has a {describe_vocab(meta['tokenizer'], meta['vocab_size'])} one"
            )
        if model_cfg.block_size < model.config.block_size:
            model.crop_block_size(model_cfg.block_size)  # before LoRA: cropping makes a new (trainable) wpe
        if cfg.lora_rank:
            targets = lora.parse_targets(cfg.lora_targets)
            lora.check_rank(model, cfg.lora_rank, targets)  # before the adapters take any memory
            lora.apply(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, targets)
            model.lora_spec["base"] = base
            if grown:  # the turn tokens' new rows must learn: the embedding trains too
                lora.train_token_embedding(model)
        return model, model.config, None
    raise UserError(
        f"init_from={cfg.init_from!r} is not scratch, resume, {', '.join(HUB_NAMES)}, an existing folder or a checkpoint file"
    )


def base_location(init_from):
    """Where a LoRA run finds its base again: a hub name as given, a folder or file as
    an absolute path (sample.py may run from another working directory)."""
    return init_from if init_from in HUB_NAMES and not Path(init_from).exists() else str(Path(init_from).resolve())


def checkpoint_source(ckpt, out_dir):
    """The file or folder a resumed checkpoint was read from, for messages."""
    return ckpt["sharded"] if "sharded" in ckpt else Path(out_dir) / "ckpt.pt"


def _resume_checkpoint(out_dir):
    """out_dir/ckpt.pt, or the sharded out_dir/ckpt/ of an FSDP run: the newer one when both exist."""
    folder, single = sharded.find(out_dir), out_dir / "ckpt.pt"
    if folder is not None and (not single.is_file() or sharded.mtime(folder) >= single.stat().st_mtime):
        if single.is_file():
            print(f"note: resuming from {folder}, which is newer than {single}")
        return sharded.read_run(folder)
    return load_checkpoint(single)


def describe_vocab(tokenizer, vocab_size):
    kind = tokenizer.get("type") if isinstance(tokenizer, dict) else tokenizer
    return f"{kind} ({vocab_size} tokens)"


def embedding_heavy_note(model, init_from, share_limit=0.5):
    """A note for a model from scratch whose parameters are mostly token embedding and
    output layer (a large vocabulary on a small model, e.g. GPT-2 BPE on the quick
    start: 94% of 13.65M), else None. The output layer's V x d matrix product then
    dominates every step too, so such a run is many times slower per step."""
    if init_from != "scratch":
        return None  # GPT-2's own shape, or a run already chosen
    total = model.num_params()
    blocks = model.num_params(non_embedding=True)
    embedding = total - blocks
    if embedding <= share_limit * total:
        return None
    c = model.config
    return (
        f"note: {embedding / 1e6:.2f}M of the {total / 1e6:.2f}M parameters ({embedding / total:.0%}) are the token "
        f"embedding and output layer (vocabulary {c.vocab_size:,} x width {c.n_embd}), {blocks / 1e6:.2f}M the blocks; "
        "the output layer's matrix product dominates each step. For a model this small, prepare the data with "
        "a smaller vocabulary (python prepare.py --input ... --tokenizer char), or fine-tune GPT-2, whose "
        "embedding is already trained (configs/finetune_shakespeare.py)"
    )


def check_resumable(ckpt, optimizers, out_dir, cfg):
    if "sharded" in ckpt:
        if ckpt["config"].get("optimizer") != cfg.optimizer:
            raise UserError(f"{ckpt['sharded']} was trained with optimizer={ckpt['config'].get('optimizer')}: resume with --optimizer as before")
    elif cfg.parallel == "ddp" and (not isinstance(ckpt.get("optimizer"), list) or len(ckpt["optimizer"]) != len(optimizers)):
        raise UserError(f"{checkpoint_source(ckpt, out_dir)} was trained with a different optimizer setting: resume with --optimizer as before")
    check_loop_state(ckpt, checkpoint_source(ckpt, out_dir))


def train_sharded():
    """gptkit/train/sharded.py, imported when an FSDP run or a sharded resume needs it
    (torch.distributed.checkpoint takes ~1 s to import)."""
    from gptkit.train import sharded as loader

    return loader
