"""The run's out_dir, held by one writer from start to end (train.py takes it on rank 0
before anything else and releases it last):

    claim, cfg = claim_out_dir(model_cfg, cfg, dist, writes)   # init_from=auto resolved everywhere
    claim = OutDir(cfg)      # the lock, stale temporaries removed, no silent overwrite
    claim.release(ok=True)   # a failed run that saved nothing takes its files with it

init_from=auto (for jobs that torchrun --max-restarts restarts, docs/distributed.md):
resume when the out_dir holds a checkpoint of this run (the same model, dataset and
data, by its fingerprint, optimizer and LoRA settings), start from scratch when it
holds none, and refuse another run's folder as init_from=scratch does, and a folder
with nothing to resume (best.pt alone: weights, no optimizer). The lock goes with the process that
held it, kill -9 included, so a restarted job takes its own out_dir again, while a
second job beside a live one is still refused.

An operator's concern, which a reader of the training step may skip."""

import copy
import dataclasses
import json
import shutil
import time
from pathlib import Path

import torch

from gptkit.data import dataset
from gptkit.ops.errors import UserError
from gptkit.ops.lock import LOCK_NAME, FolderLock, remove_stale_temps
from gptkit.ops.paths import claim_output
from gptkit.train import distributed
from gptkit.ops import sharded  # the sharded checkpoint's names (not torch's DCP: light)

# What makes a checkpoint "this run's" for init_from=auto: the model's settings (not its
# dropout, nor the vocabulary, which the dataset sets and resume checks, nor the attention
# kernel, the same function computed another way), and these.
RUN_IDENTITY = ("dataset", "optimizer", "lora_rank", "lora_targets")
NOT_IDENTITY = ("dropout", "vocab_size", "attention")
CHECKPOINTS = ("ckpt.pt", "best.pt", sharded.FOLDER, sharded.OLD)  # what a run saves, in the out_dir
DATA_FINGERPRINT = "data fingerprint"  # and the data itself: the dataset's fingerprint (meta.json)


def claim_out_dir(model_cfg, cfg, dist, writes):
    """(the OutDir claim on a writing rank 0, else None; cfg with init_from=auto resolved
    to resume or scratch, the same on every rank). Rank 0 decides, holding the lock."""
    def claim():
        if writes:
            return OutDir(cfg, model_cfg)
        if cfg.init_from == "auto" and dist.is_main:  # eval_only: nothing to lock
            return resolve_auto(cfg.out_dir, model_cfg, cfg)
        return None

    held = distributed.agreed(dist, claim)
    if cfg.init_from != "auto":
        return held, cfg
    chosen = held.init_from if isinstance(held, OutDir) else held
    chosen = distributed.gather_objects(chosen, dist)[0]  # rank 0's choice, on every rank
    resolved = copy.copy(cfg)
    resolved.init_from = chosen  # no __post_init__ again: cfg was checked already
    return (held if isinstance(held, OutDir) else None), resolved


def latest_settings(out_dir):
    """The settings saved with the checkpoint in out_dir that init_from=resume would
    load (the newer of ckpt.pt and the sharded ckpt/), and under DATA_FINGERPRINT the
    fingerprint of the data it trained on; {} when they cannot be read
    (resume then names what is wrong with the file), None when there is no checkpoint."""
    out_dir = Path(out_dir)
    folder, single = sharded.find(out_dir), out_dir / "ckpt.pt"
    try:
        if folder is not None and (not single.is_file() or sharded.mtime(folder) >= single.stat().st_mtime):
            with open(folder / sharded.RUN_FILE, "rb") as f:
                raw = f.read(sharded.MAX_RUN_BYTES + 1)
            saved = json.loads(raw) if len(raw) <= sharded.MAX_RUN_BYTES else None
        elif single.is_file():
            # mmap: the settings without reading the weights (the resume's load checks the file)
            saved = torch.load(single, map_location="cpu", weights_only=True, mmap=True)
        else:
            return None
        settings = saved.get("config")
        if not isinstance(settings, dict):
            return {}
        return {**settings, DATA_FINGERPRINT: saved.get("data_fingerprint")}
    except Exception:
        return {}


def identity_differences(saved, model_cfg, cfg):
    """['n_layer=2 there, 4 here', ...]: how the run saved in out_dir differs from this one."""
    if not saved:
        return []  # unreadable: resuming names the damage
    here = {f.name: getattr(model_cfg, f.name) for f in dataclasses.fields(model_cfg) if f.name not in NOT_IDENTITY}
    here.update({name: getattr(cfg, name) for name in RUN_IDENTITY})
    differences = [f"{k}={saved[k]} there, {v} here" for k, v in here.items() if k in saved and saved[k] != v]
    theirs, ours = saved.get(DATA_FINGERPRINT), dataset.fingerprint(cfg.data_dir, cfg.dataset)
    if theirs and ours and theirs != ours:  # the same name, other data (another --data_dir, prepared again)
        differences.append(f"dataset {cfg.dataset}'s data: fingerprint {theirs[:12]} there (data_dir="
                           f"{saved.get('data_dir')}), {ours[:12]} here (data_dir={cfg.data_dir})")
    return differences


def resolve_auto(out_dir, model_cfg, cfg):
    """init_from=auto as "resume" or "scratch" for out_dir (see the module's docstring)."""
    saved = latest_settings(out_dir)
    kept = held_checkpoints(out_dir) if saved is None else []  # best.pt alone, or an unfinished ckpt/
    if kept and not cfg.overwrite:
        start = (f"start a new run from its best weights with --init_from={Path(out_dir) / 'best.pt'} --out_dir=OTHER"
                 if "best.pt" in kept else "start a new run with --out_dir=OTHER")
        raise UserError(
            f"out_dir {out_dir} holds {' and '.join(kept)} but nothing to resume (ckpt.pt, or a complete sharded "
            f"ckpt/; best.pt keeps the weights only, not the optimizer): {start}, or replace it with --overwrite=true"
        )
    if saved is None:
        if cfg.lora_rank > 0:
            raise UserError(
                f"init_from=auto found no checkpoint in {out_dir} to resume, and lora_rank > 0 adapts a trained "
                "model: start the run with --init_from=gpt2 (or a folder or checkpoint file), then restart it with auto"
            )
        replacing = f" (replacing {' and '.join(kept)}: --overwrite)" if kept else ""
        print(f"init_from=auto: no checkpoint in {out_dir}, starting from scratch{replacing}")
        return "scratch"
    differences = identity_differences(saved, model_cfg, cfg)
    if not differences:
        return "resume"
    if cfg.overwrite:
        print(f"init_from=auto: {out_dir} holds another run ({'; '.join(differences)}): replacing it (--overwrite)")
        return "scratch"
    raise UserError(
        f"out_dir {out_dir} holds another run ({'; '.join(differences)}): init_from=auto resumes only its own "
        "run; continue that one with --init_from=resume, start a new one with --out_dir=OTHER, or replace it "
        "with --overwrite=true"
    )


def held_checkpoints(out_dir):
    """The names of the checkpoint files and folders in out_dir (a run's, complete or not)."""
    return [name for name in CHECKPOINTS if (Path(out_dir) / name).exists()]


class OutDir:
    """The run's out_dir, held by one writer (rank 0) from start to end.

    Taking it: the one-writer lock (a second run on the same out_dir is refused,
    naming the process that holds it), the removal of temporary files left by
    killed runs, and the refusal to start a new run over an old one unless
    overwrite is set. Released at the end; a folder this run created and never
    wrote to is removed again."""

    RUN_FILES = ("ckpt.pt", "best.pt", "metrics.jsonl", "config.json")

    def __init__(self, cfg, model_cfg=None):
        # A folder (not a file), writable, with a name the system takes: else one line now.
        self.path = claim_output(cfg.out_dir, "folder", overwrite=True, what="out_dir")
        self.created = not self.path.exists()
        try:
            self.lock = FolderLock(self.path, "training run", "use another --out_dir").acquire()
        except OSError as e:
            raise UserError(f"cannot use out_dir {self.path}: {e.strerror or e}")
        try:
            removed = remove_stale_temps(self.path)
            if (self.path / sharded.TEMP).is_dir():  # a sharded save that died: we hold the lock, so no one writes it
                shutil.rmtree(self.path / sharded.TEMP)
                removed.append(sharded.TEMP)
            if removed:
                print(f"removed {len(removed)} temporary file(s) left in {self.path} by a run that was killed")
            # init_from=auto: decided here, under the lock, so that no other run writes meanwhile
            self.init_from = resolve_auto(self.path, model_cfg, cfg) if cfg.init_from == "auto" else cfg.init_from
            if self.init_from != "resume":
                self._make_room(cfg.overwrite)
        except BaseException:
            self.release(ok=True)  # refused before anything was written: leave the folder as it was
            raise

    def _make_room(self, overwrite):
        held = held_checkpoints(self.path)
        if held and not overwrite:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime((self.path / held[0]).stat().st_mtime))
            raise UserError(
                f"out_dir {self.path} already holds a run ({' and '.join(held)}, saved {when}): continue it with "
                f"--init_from=resume, start a new one with --out_dir=OTHER, or replace it with --overwrite=true"
            )
        for name in self.RUN_FILES:  # a run that saved no checkpoint leaves only logs: start them afresh
            (self.path / name).unlink(missing_ok=True)
        for name in (sharded.FOLDER, sharded.OLD):  # --overwrite: an FSDP run's shards go too
            shutil.rmtree(self.path / name, ignore_errors=True)

    def release(self, ok=True):
        """Let go of the out_dir. A run that failed before saving any checkpoint takes
        its config.json and metrics.jsonl with it, and the folder if it made it."""
        try:
            if not ok and not held_checkpoints(self.path):
                for name in self.RUN_FILES:
                    (self.path / name).unlink(missing_ok=True)
        finally:
            self.lock.release()
        if self.created and [p.name for p in self.path.iterdir()] == [LOCK_NAME]:
            (self.path / LOCK_NAME).unlink(missing_ok=True)
            self.path.rmdir()
