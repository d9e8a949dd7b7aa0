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

Loading runs no code. DCP (torch 2.13) reads `.metadata` with `pickle.load` and
any non-tensor value with `torch.load(weights_only=False)`: either would run
whatever a crafted file asks for. We read `.metadata` with an unpickler that
allows only DCP's own metadata classes and torch's sizes and dtypes, and
non-tensor values with `torch.load(weights_only=True)`; tensors DCP already reads
with weights_only=True. run.json is plain JSON.
"""

import json
import os
import pickle
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    get_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from gptkit import faults
from gptkit.checkpoint import non_finite_tensors, save_checkpoint
from gptkit.lock import fsync_dir
from gptkit.errors import PeerFailed, RunFailed, UserError
from gptkit.train import distributed
from gptkit.train.run_state import rng_state

FORMAT_VERSION = 1
FOLDER, TEMP, OLD = "ckpt", ".ckpt.tmp", ".ckpt.old"
RUN_FILE = "run.json"


# ---- saving -------------------------------------------------------------------------


def save(kind, out_dir, model, optimizers, info, device, d):
    """kind "ckpt": the sharded checkpoint out_dir/ckpt/; "best": weights to best.pt.

    Every rank must call this (both kinds gather or write collectively); `info`
    holds the plain values (iteration, losses, settings, ...), used on rank 0."""
    out_dir = Path(out_dir)
    bad = non_finite_tensors(local_tensors(model, optimizers), "shard")  # this rank's part only
    if distributed.any_rank(bool(bad), d, device):  # ...so the ranks agree on the answer
        if not d.is_main:
            raise PeerFailed()
        where = bad[0] if bad else "a tensor of another rank's shard"
        raise RunFailed(f"not saving {out_dir / (FOLDER if kind == 'ckpt' else 'best.pt')}: {where} holds NaN or inf "
                        "(the previous checkpoint is kept)")
    if kind == "best":
        from gptkit.train.fsdp import full_weights

        weights = full_weights(model)  # collective; the whole tensors on rank 0
        if d.is_main:
            save_checkpoint({"format_version": 1, "model": weights, **info}, out_dir / "best.pt")
        distributed.barrier(d)
        return
    rngs = distributed.gather_objects(rng_to_json(rng_state(device)), d)
    tmp, folder, old = out_dir / TEMP, out_dir / FOLDER, out_dir / OLD
    try:
        if d.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # left by a crashed save: never loaded
            tmp.mkdir(parents=True)
        distributed.barrier(d)
        model_sd, optim_sd = get_state_dict(model, optimizers)
        # Every rank writes its own shard file and fsyncs it; rank 0 then writes .metadata.
        with warnings.catch_warnings():  # one process without a process group: what we asked for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=FileSystemWriter(tmp, sync_files=True))
        faults.maybe_exit_during_save()
        if d.is_main:
            # No GradScaler under FSDP: it trains in bf16 or fp32 (fsdp.check_settings).
            run = {"format_version": FORMAT_VERSION, "world_size": d.world_size, **info,
                   "scaler": None, "rng": {**rngs[0], "per_rank": rngs}}
            _write_json(tmp / RUN_FILE, run)  # last: its presence marks a whole checkpoint
            fsync_dir(tmp)
            if not folder.exists() and is_complete(old):  # a save died between its renames
                os.replace(old, folder)
            shutil.rmtree(old, ignore_errors=True)
            if folder.exists():
                os.replace(folder, old)
            os.replace(tmp, folder)
            fsync_dir(out_dir)
            shutil.rmtree(old, ignore_errors=True)
    except (OSError, CheckpointException) as e:  # DCP wraps a rank's OSError in CheckpointException
        if d.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise RunFailed(f"could not write the sharded checkpoint {folder}: {_describe(_causes(e)[0])} (the previous checkpoint is intact)")
    distributed.barrier(d)  # no rank goes on (or resumes) before the rename


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


def rng_to_json(state):
    """run_state.rng_state(...) with its tensors as lists of ints (JSON)."""
    return {
        "torch": state["torch"].tolist(),
        "cuda": [s.tolist() for s in state["cuda"]],
        "python": [state["python"][0], list(state["python"][1]), state["python"][2]],
        "numpy": {**state["numpy"], "keys": state["numpy"]["keys"].tolist()},
    }


def rng_from_json(obj):
    return {
        "torch": torch.tensor(obj["torch"], dtype=torch.uint8),
        "cuda": [torch.tensor(s, dtype=torch.uint8) for s in obj["cuda"]],
        "python": (obj["python"][0], tuple(obj["python"][1]), obj["python"][2]),
        "numpy": {**obj["numpy"], "keys": torch.tensor(obj["numpy"]["keys"], dtype=torch.int64)},
    }


# ---- finding and loading ------------------------------------------------------------


def is_complete(folder):
    return (Path(folder) / RUN_FILE).is_file() and (Path(folder) / ".metadata").is_file()


def find(out_dir):
    """out_dir/ckpt/, or .ckpt.old/ when a save died between its two renames; else None."""
    for name in (FOLDER, OLD):
        if is_complete(Path(out_dir) / name):
            return Path(out_dir) / name
    return None


def mtime(folder):
    return (Path(folder) / RUN_FILE).stat().st_mtime


def read_run(folder):
    """run.json as the dict train.py resumes from (RNG states as tensors again)."""
    path = Path(folder) / RUN_FILE
    try:
        run = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path} is not a complete sharded checkpoint: {type(e).__name__}: {e}")
    if not isinstance(run, dict) or run.get("format_version") != FORMAT_VERSION:
        raise UserError(f"{path} has format_version {run.get('format_version') if isinstance(run, dict) else '?'}; "
                        f"this code reads version {FORMAT_VERSION}")
    run["rng"] = {**rng_from_json(run["rng"]), "per_rank": [rng_from_json(r) for r in run["rng"]["per_rank"]]}
    run["sharded"] = str(folder)
    return run


def load_into(folder, model, optimizers):
    """Fill `model` (sharded or not) and `optimizers` from a sharded checkpoint.

    Collective when a process group exists (every rank reads the pieces it
    needs); a single process reads everything (no_dist)."""
    model_sd, optim_sd = get_state_dict(model, optimizers)
    state = {"model": model_sd, "optim": optim_sd}
    load_state(folder, state)
    set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"])


def load_state(folder, state):
    """dcp.load into `state` (in place) through the safe reader and planner below;
    every failure becomes a UserError naming the folder."""
    try:
        with warnings.catch_warnings():  # loading in one process is what we asked for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=SafeReader(folder), planner=SafeLoadPlanner(),
                     no_dist=not (dist.is_available() and dist.is_initialized()))
    except UserError:
        raise
    except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
        causes = _causes(e)
        for error in causes:
            if isinstance(error, UserError):
                raise error
        raise UserError(f"could not load the sharded checkpoint {folder}: {_describe(causes[0])} "
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


# Everything DCP's .metadata (torch 2.13) names: its own dataclasses, torch's sizes,
# dtypes, layouts and memory formats, and the path it was saved to. Each is a plain
# value or a constructor that only stores its arguments; nothing here (no getattr,
# no eval, no os) can reach a function with side effects.
_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
                 "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),  # looks a layout up by name in a table
    ("torch", "Size"), ("torch", "device"), ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        is_dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) not in _METADATA_CLASSES and not is_dtype:
            raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in a checkpoint's .metadata")
        return super().find_class(module, name)


class SafeReader(FileSystemReader):
    """FileSystemReader whose .metadata is unpickled with the allow-list above."""

    def read_metadata(self, *args, **kwargs):
        rank = kwargs.get("rank")
        path = Path(self.path) / (".metadata" if rank is None else f"__{rank}.metadata")
        try:
            with open(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except pickle.UnpicklingError as e:
            raise UserError(f"refusing to load {path}: {e} (it could run code)")
        except (OSError, EOFError, ValueError, AttributeError, ImportError, TypeError) as e:
            raise UserError(f"{path} is not a complete sharded checkpoint: {type(e).__name__}: {e}")
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

        if not isinstance(metadata, Metadata):
            raise UserError(f"{path} does not hold DCP metadata (found {type(metadata).__name__})")
        for info in (metadata.storage_data or {}).values():
            name = getattr(info, "relative_path", "")
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise UserError(f"refusing to load {path}: it points outside its folder ({name!r})")
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
    from types import SimpleNamespace

    from gptkit.train import optim
    from model import GPT, GPTConfig

    src = Path(src)
    folder = src if is_complete(src) else find(src)
    if folder is None:
        raise UserError(f"{src} holds no complete sharded checkpoint (a folder with .metadata and {RUN_FILE})")
    run = read_run(folder)
    model = GPT(GPTConfig(**run["model_config"]))
    optimizers = optim.make_optimizers(model, SimpleNamespace(**run["config"]), "cpu")
    load_into(folder, model, optimizers)
    keep = ("model_config", "tokenizer", "config", "iter_num", "best_val_loss", "val_loss", "last_eval_iter",
            "train_time_s", "data_fingerprint", "dataset", "provenance", "scaler")
    rng = run["rng"]
    obj = {
        "format_version": 1,
        "model": model.state_dict(),
        **{k: run.get(k) for k in keep},
        "optimizer": [opt.state_dict() for opt in optimizers],
        "rng": {**{k: v for k, v in rng.items() if k != "per_rank"},
                "per_rank": rng["per_rank"] if len(rng["per_rank"]) > 1 else None},
    }
    save_checkpoint(obj, dest)
    return Path(dest)
