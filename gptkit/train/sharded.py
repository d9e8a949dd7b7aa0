"""Sharded checkpoints (torch.distributed.checkpoint, DCP) for FSDP runs.

    torchrun --standalone --nproc_per_node=2 train.py configs/shakespeare.py --parallel=fsdp
    # writes out_dir/ckpt/ (every rank its own shard) and out_dir/best.pt (weights, one file)

out_dir/ckpt/ holds
  __0_0.distcp, __1_0.distcp, ...  each rank's shard of the weights and optimizer
                                   state (DCP's files: tensors saved with torch.save)
  .metadata                        DCP's index: which piece of which tensor is where
  run.json                         everything else, as JSON: iteration, losses, settings,
                                   model config, tokenizer, provenance, every rank's RNG

Atomic: all ranks write into out_dir/.ckpt.tmp/, rank 0 adds run.json last, then
renames ckpt/ to .ckpt.old/, .ckpt.tmp/ to ckpt/, and removes .ckpt.old/. A crash
at any point leaves a whole checkpoint: ckpt/, or (between the two renames)
.ckpt.old/, which `find` falls back to. A folder without run.json is never loaded.

Resharding: DCP records each tensor's global shape and each shard's offsets, so
a checkpoint saved by W ranks loads on any number of ranks (also one process
without torchrun, or DDP). The dropout streams are then new ones (each rank
draws its own), so such a resume is close to, not equal to, the original run.

Verified on every load (open_checkpoint, the one loader for every reader: resume,
convert.py; the checks are in shard_checks.py): run.json records each
file's size and SHA-256, and a load refuses, in one line, any folder whose files
differ, whose .metadata does not cover every tensor exactly once, that holds a
FIFO, link or extra file, or whose run.json has a field of the wrong type. A
reader gets one whole save even while a run is saving: the folder's files are
opened once and held.

Loading runs no code. DCP (torch 2.13) reads `.metadata` with `pickle.load` and
any non-tensor value with `torch.load(weights_only=False)`: either would run
whatever a crafted file asks for. We read `.metadata` with an unpickler that
allows only DCP's own metadata classes and torch's sizes and dtypes, and
non-tensor values with `torch.load(weights_only=True)`; tensors DCP already reads
with weights_only=True. run.json is plain JSON.
"""

import dataclasses
import json
import os
import pickle
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    get_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from gptkit import faults
from gptkit.atomic import fsync_dir, publish
from gptkit.checkpoint import non_finite_tensors, save_checkpoint
from gptkit.errors import PeerFailed, RunFailed, UserError
from gptkit.train import distributed
from gptkit.train.run_state import RunState, rng_from_json, rng_state, rng_to_json
from gptkit.train.shard_checks import METADATA_FILE, RUN_FILE, Changed, Snapshot, file_record, open_snapshot

FORMAT_VERSION = 2  # 2: run.json records each file's size and SHA-256
FOLDER, TEMP, OLD = "ckpt", ".ckpt.tmp", ".ckpt.old"
OPEN_ATTEMPTS = 5  # a reader racing a save that swaps the folder retries this often


# ---- saving -------------------------------------------------------------------------


def save(kind, out_dir, model, optimizers, info, device, dist):
    """kind "ckpt": the sharded checkpoint out_dir/ckpt/; "best": weights to best.pt.

    Every rank must call this (both kinds gather or write collectively); `info`
    holds the plain values (iteration, losses, settings, ...), used on rank 0."""
    out_dir = Path(out_dir)
    bad = non_finite_tensors(local_tensors(model, optimizers), "shard")  # this rank's part only
    if distributed.any_rank(bool(bad), dist, device):  # ...so the ranks agree on the answer
        if not dist.is_main:
            raise PeerFailed()
        where = bad[0] if bad else "a tensor of another rank's shard"
        raise RunFailed(f"not saving {out_dir / (FOLDER if kind == 'ckpt' else 'best.pt')}: {where} holds NaN or inf "
                        "(the previous checkpoint is kept)")
    if kind == "best":
        from gptkit.train.fsdp import full_weights

        weights = full_weights(model)  # collective; the whole tensors on rank 0
        if dist.is_main:
            save_checkpoint({"format_version": 1, "model": weights, **info}, out_dir / "best.pt")
        distributed.barrier(dist)
        return
    rngs = distributed.gather_objects(rng_to_json(rng_state(device)), dist)
    tmp, folder, old = out_dir / TEMP, out_dir / FOLDER, out_dir / OLD
    try:
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # left by a crashed save: never loaded
            tmp.mkdir(parents=True)
        distributed.barrier(dist)
        model_sd, optim_sd = get_state_dict(model, optimizers)
        # Every rank writes its own shard file and fsyncs it; rank 0 then writes .metadata.
        with warnings.catch_warnings():  # one process without a process group: what we asked for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=FileSystemWriter(tmp, sync_files=True))
        faults.maybe_exit_during_save()
        files = _file_records(tmp, dist)
        if dist.is_main:
            # No GradScaler under FSDP: it trains in bf16 or fp32 (fsdp.check_settings).
            run = {"format_version": FORMAT_VERSION, "world_size": dist.world_size, **info,
                   "scaler": None, "rng": {**rngs[0], "per_rank": rngs}, "files": files}
            _write_json(tmp / RUN_FILE, run)  # last: its presence marks a whole checkpoint
            fsync_dir(tmp)
            if not folder.exists() and is_complete(old):  # a save died between its renames
                publish(old, folder)
            shutil.rmtree(old, ignore_errors=True)
            if folder.exists():
                publish(folder, old)
            publish(tmp, folder)
            fsync_dir(out_dir)
            shutil.rmtree(old, ignore_errors=True)
    except (OSError, CheckpointException) as e:  # DCP wraps a rank's OSError in CheckpointException
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise RunFailed(f"could not write the sharded checkpoint {folder}: {_describe(_causes(e)[0])} (the previous checkpoint is intact)")
    distributed.barrier(dist)  # no rank goes on (or resumes) before the rename


def _file_records(tmp, dist):
    """Size and SHA-256 of every file DCP wrote, for run.json: each rank hashes every
    world_size-th shard (read back from the page cache), rank 0 also .metadata."""
    shards = sorted(name for name in os.listdir(tmp) if name != METADATA_FILE)
    mine = {name: file_record(tmp / name) for name in shards[dist.rank::dist.world_size]}
    if dist.is_main:
        mine[METADATA_FILE] = file_record(tmp / METADATA_FILE)
    return {name: record for part in distributed.gather_objects(mine, dist) for name, record in part.items()}


def local_tensors(model, optimizers):
    """This rank's shards of the weights and optimizer states, by name (for the finite check)."""
    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    out = {f"model[{name!r}]": local(p) for name, p in model.named_parameters()}
    for i, opt in enumerate(optimizers):
        for j, state in enumerate(opt.state.values()):
            for key, value in state.items():
                if torch.is_tensor(value):
                    out[f"optimizer[{i}] state {j} {key}"] = local(value)
    return out


def _write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())


# ---- finding and loading ------------------------------------------------------------


def is_complete(folder):
    """Both files a save writes last are there (of whatever kind: open_checkpoint checks)."""
    return os.path.lexists(Path(folder) / RUN_FILE) and os.path.lexists(Path(folder) / METADATA_FILE)


def find(out_dir):
    """out_dir/ckpt/, or .ckpt.old/ when a save died between its two renames; else None."""
    for name in (FOLDER, OLD):
        if is_complete(Path(out_dir) / name):
            return Path(out_dir) / name
    return None


def mtime(folder):
    return (Path(folder) / RUN_FILE).stat().st_mtime


def open_checkpoint(path):
    """The verified sharded checkpoint at `path` (a checkpoint folder, or an out_dir
    holding ckpt/): a Snapshot whose files are held open and checked, or one UserError
    naming the file and what is wrong with it. Every loader goes through here.

    A save that replaces the folder while we open it is waited out (a few tries);
    under torchrun each rank hashes its share of the shard files."""
    path = Path(path)
    joined = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank, world_size = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if joined else (0, 1)
    for attempt in range(OPEN_ATTEMPTS):
        folder = path if is_complete(path) else find(path)
        if folder is None:
            raise UserError(f"{path} holds no complete sharded checkpoint (a folder with {METADATA_FILE} and {RUN_FILE})")
        try:
            return open_snapshot(folder, rank, world_size, note=lambda line: print(line, file=sys.stderr))
        except Changed:
            time.sleep(0.05 * (attempt + 1))
    raise UserError(f"{path} kept changing while it was read (a run is saving into it): try again, or stop that run")


def read_run(folder):
    """run.json of the verified checkpoint at `folder`, as the dict train.py resumes
    from (RNG states as tensors again); run["sharded"] is the Snapshot to load from."""
    snapshot = open_checkpoint(folder)
    run = dict(snapshot.run)
    rng = run["rng"]
    run["rng"] = {**rng_from_json(rng), "per_rank": [rng_from_json(r) for r in rng["per_rank"]]}
    run["sharded"] = snapshot
    return run


def load_into(checkpoint, model, optimizers):
    """Fill `model` (sharded or not) and `optimizers` from a sharded checkpoint (a
    Snapshot from open_checkpoint, or a path to open).

    Collective when a process group exists (every rank reads the pieces it
    needs); a single process reads everything (no_dist)."""
    model_sd, optim_sd = get_state_dict(model, optimizers)
    state = {"model": model_sd, "optim": optim_sd}
    load_state(checkpoint, state)
    set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"])


def load_state(checkpoint, state):
    """dcp.load into `state` (in place) from the verified checkpoint, through the safe
    reader and planner below; every failure becomes a UserError naming the folder."""
    snapshot = checkpoint if isinstance(checkpoint, Snapshot) else open_checkpoint(checkpoint)
    try:
        with warnings.catch_warnings():  # loading in one process is what we asked for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=SafeReader(snapshot), planner=SafeLoadPlanner(),
                     no_dist=not (torch.distributed.is_available() and torch.distributed.is_initialized()))
    except UserError:
        raise
    except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
        causes = _causes(e)
        for error in causes:
            if isinstance(error, UserError):
                raise error
        raise UserError(f"could not load the sharded checkpoint {snapshot}: {_describe(causes[0])} "
                        "(was it saved with other model or optimizer settings, or is it damaged?)")


def _causes(e):
    """The errors inside DCP's CheckpointException (failures: rank -> (error, trace)), or [e]."""
    inner = [f[0] if isinstance(f, tuple) else f for f in getattr(e, "failures", {}).values()]
    return inner or [e]


def _describe(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"


def optimizer_state_by_name(model, cfg, device_type, states, out_dir):
    """A one-file checkpoint's optimizer states (a list, by parameter index) as one
    dict by parameter name, for an FSDP run to cut into its shards: they are loaded
    into optimizers of the model before it is sharded, then read back by name."""
    from gptkit.train import optim

    optimizers = optim.make_optimizers(model, cfg, device_type)
    if len(states) != len(optimizers):
        raise UserError(f"{out_dir}/ckpt.pt was trained with a different optimizer setting: resume with --optimizer as before")
    for opt, state in zip(optimizers, states):
        opt.load_state_dict(state)
    return get_optimizer_state_dict(model, optimizers)


def optimizer_states_by_index(model, optimizers):
    """The inverse of optimizer_state_by_name: each optimizer's whole state in torch's
    own layout (parameters by index), as a one-file checkpoint holds it. A collective;
    rank 0 gets the states (on the CPU), the other ranks None."""
    states = []
    for opt in optimizers:
        full = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not full:
            return None
        index = {}
        groups = [{**g, "params": [index.setdefault(name, len(index)) for name in g["params"]]} for g in full["param_groups"]]
        states.append({"state": {index[name]: s for name, s in full["state"].items()}, "param_groups": groups})
    return states


def load_full_optimizer_state(model, optimizers, by_name):
    """Every rank holds the whole `by_name` state; each keeps its shards of it."""
    set_optimizer_state_dict(model, optimizers, by_name, options=StateDictOptions(full_state_dict=True))


class _HeldFiles(FileSystem):
    """DCP's file system, reading a Snapshot's open files instead of opening paths."""

    def __init__(self, snapshot):
        self.snapshot = snapshot

    def create_stream(self, path, mode):
        return self.snapshot.stream(Path(path).name)


class SafeReader(FileSystemReader):
    """FileSystemReader over a verified Snapshot: its checked .metadata and its held files."""

    def __init__(self, snapshot):
        super().__init__(snapshot.folder)
        self.snapshot = snapshot
        self.fs = _HeldFiles(snapshot)

    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import StorageMeta

        metadata = self.snapshot.metadata
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor values (param-group settings, step counts) read with weights_only=True."""

    def load_bytes(self, read_item, value):
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            # torch's message suggests weights_only=False: show only the line naming the object.
            culprit = next((line.strip() for line in str(e).splitlines() if "GLOBAL" in line or "global" in line), "")
            raise UserError(f"refusing to load {read_item.dest_index.fqn} from a sharded checkpoint: it holds "
                            f"pickled Python objects that could run code. {culprit[:200]}")
        # What DefaultLoadPlanner.load_bytes does after its own (unsafe) torch.load.
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


# ---- one file -----------------------------------------------------------------------


def sharded_to_single(src, dest):
    """Convert a sharded checkpoint (out_dir or out_dir/ckpt/) into one ckpt.pt file.

    The result is what a DDP or one-device run saves: it resumes with
    --init_from=resume and samples with sample.py. Runs in one process."""
    save_checkpoint(read_as_single(src), dest, replace=False)  # a new name: never replaces a file that appeared
    return Path(dest)


def read_as_single(src):
    """A sharded checkpoint (out_dir or out_dir/ckpt/) as the dict a one-file ckpt.pt
    holds, read as resume reads it (read_run, load_into); for sample.py and eval.py too."""
    from types import SimpleNamespace

    from gptkit.train import optim
    from model import GPT, GPTConfig

    run = read_run(src)
    model = GPT(GPTConfig(**run["model_config"]))
    optimizers = optim.make_optimizers(model, SimpleNamespace(**run["config"]), "cpu")
    load_into(run["sharded"], model, optimizers)
    keep = ("model_config", "tokenizer", "config", "data_fingerprint", "dataset", "provenance", "scaler",
            *(f.name for f in dataclasses.fields(RunState)))
    rng = run["rng"]
    obj = {
        "format_version": 1,
        "model": model.state_dict(),
        **{k: run.get(k) for k in keep},
        "optimizer": [opt.state_dict() for opt in optimizers],
        "rng": {**{k: v for k, v in rng.items() if k != "per_rank"},
                "per_rank": rng["per_rank"] if len(rng["per_rank"]) > 1 else None},
    }
    return obj
