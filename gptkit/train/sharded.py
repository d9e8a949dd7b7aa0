"""Saving sharded checkpoints (DCP) of FSDP runs, and loading them into a training run.

    torchrun --standalone --nproc_per_node=2 train.py configs/shakespeare.py --parallel=fsdp
    # writes out_dir/ckpt/ (every rank its own shard) and out_dir/best.pt (weights, one file)

The format, its atomic layout and the checks every load makes are gptkit/ops/sharded.py's
(the reader that sampling and evaluation share); this file is training's side:
`save` (every rank writes its shard, rank 0 run.json last, then the renames),
`load_into` (weights and optimizer states, resharded to this run), the conversions
between a one-file checkpoint's optimizer states and sharded ones, and
`sharded_to_single` (convert.py --to pt: a resumable ckpt.pt).
"""

import dataclasses
import json
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    get_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from gptkit.ops import faults
from gptkit.ops.atomic import fsync_dir, publish
from gptkit.ops.checkpoint import non_finite_tensors, save_checkpoint
from gptkit.ops.errors import PeerFailed, RunFailed, UserError
from gptkit.run_state import RunState, rng_state, rng_to_json
from gptkit.ops.sharded import (  # noqa: F401  (find, is_complete, open_checkpoint: training's readers too)
    FOLDER, FORMAT_VERSION, METADATA_FILE, OLD, RUN_FILE, TEMP, _causes, _describe, file_record, find,
    is_complete, load_state, open_checkpoint, read_run,
)
from gptkit.train import distributed


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
        faults.maybe_exit_during_save((info or {}).get("iter_num"))
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


def load_into(checkpoint, model, optimizers):
    """Fill `model` (sharded or not) and `optimizers` from a sharded checkpoint (a
    Snapshot from open_checkpoint, or a path to open).

    Collective when a process group exists (every rank reads the pieces it
    needs); a single process reads everything (no_dist)."""
    model_sd, optim_sd = get_state_dict(model, optimizers)
    state = {"model": model_sd, "optim": optim_sd}
    load_state(checkpoint, state)
    set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"])


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
