"""Sharded checkpoints (torch.distributed.checkpoint, DCP) of FSDP runs: the format, and reading one.

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

Saving, and loading into a training run, are gptkit/train/sharded.py's; this file is
what every reader shares (resume, sample.py, eval.py, convert.py), and `read_weights`
is what sampling reads. Verified on every load (open_checkpoint, the one loader for
every reader; the checks are the last section here): run.json records each
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
import functools
import hashlib
import json
import os
import pickle
import re
import sys
import time
import warnings
import weakref
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed

from gptkit.ops.errors import UserError
from gptkit.run_state import RunState, check_loop_state, rng_from_json
from gptkit.ops.untrusted import open_regular

FORMAT_VERSION = 2  # 2: run.json records each file's size and SHA-256
RUN_FILE, METADATA_FILE = "run.json", ".metadata"
HASH = "sha256"  # as every other pin in this project; ~1 GB/s with SHA-NI, half crc32's speed (docs/trust.md)
MAX_RUN_BYTES = 256 << 20  # run.json: ~20 KB of RNG states per rank
MAX_METADATA_BYTES = 1 << 30  # DCP's index: ~200 bytes per tensor piece
MAX_CHUNKS = 1 << 16  # pieces of one tensor (one per rank that holds a part)
_HEX = re.compile(r"^[0-9a-f]{64}$")
FOLDER, TEMP, OLD = "ckpt", ".ckpt.tmp", ".ckpt.old"
OPEN_ATTEMPTS = 5  # a reader racing a save that swaps the folder retries this often


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


def read_weights(src):
    """A sharded checkpoint (out_dir or out_dir/ckpt/) as the dict a one-file ckpt.pt
    holds, without its optimizer states: what sample.py and eval.py read."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    from model import GPT, GPTConfig

    run = read_run(src)
    model = GPT(GPTConfig(**run["model_config"]))
    state = {"model": get_model_state_dict(model)}
    load_state(run["sharded"], state)
    set_model_state_dict(model, state["model"])
    keep = ("model_config", "tokenizer", "config", "data_fingerprint", "dataset", "provenance", "chat", "lora",
            *(f.name for f in dataclasses.fields(RunState)))
    return {"format_version": 1, "model": model.state_dict(), **{k: run.get(k) for k in keep if k in run}}


def load_state(checkpoint, state):
    """dcp.load into `state` (in place) from the verified checkpoint, through the safe
    reader and planner below; every failure becomes a UserError naming the folder."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    snapshot = checkpoint if isinstance(checkpoint, Snapshot) else open_checkpoint(checkpoint)
    SafeReader, SafeLoadPlanner = safe_loaders()
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


@functools.cache
def safe_loaders():
    """(SafeReader, SafeLoadPlanner): DCP's reader and load planner made safe, built on
    first use (torch.distributed.checkpoint takes ~1 s to import: a DDP or one-device
    run never pays it)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystem

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

    return SafeReader, SafeLoadPlanner


# ---- what a folder must be before anything in it is used ------------------------------
# What a sharded checkpoint folder (out_dir/ckpt/) must be before anything in it is used.
#
#     snapshot = open_snapshot(Path("out-big/ckpt"))   # every check below, or one UserError
#     snapshot.run["iter_num"], snapshot.metadata       # run.json (checked), DCP's index (checked)
#
# A folder someone hands us may be damaged (bit rot, a half-finished copy), crafted,
# or replaced by a running save while we read it. So, in this order:
#
# 1. The folder is opened once and every file in it is opened through that handle,
#    after an lstat: a FIFO, device or symbolic link is refused before it is opened
#    (a FIFO would block forever), and so is any file the save did not write.
#    The files stay open: a save that swaps folders meanwhile cannot mix its files
#    into ours (their data stays readable even after the old folder is removed).
# 2. run.json (size-capped) is parsed and every field type-checked, with the checks
#    the one-file loader uses (model config, tokenizer, loop state, RNG states).
# 3. Each file's size and SHA-256 must equal what the save recorded in run.json
#    (written last, before the rename that publishes the checkpoint). The hash of
#    .metadata there also ties run.json to this very index: it is the save's id.
# 4. .metadata is unpickled with an allow-list (nothing in it can run code), then
#    checked: every tensor's chunks lie inside its shape and cover it exactly once,
#    every chunk has its bytes in a shard file, inside that file.
#
# With several ranks each rank hashes only its share of the shard files (a
# mismatch on any rank stops them all, through distributed.agreed).


class Changed(Exception):
    """The folder was replaced (by a save) while it was being opened: try again."""


def file_record(path):
    """{"bytes": ..., "sha256": ...} of a file just written (run.json's "files")."""
    with open(path, "rb") as f:
        return {"bytes": os.fstat(f.fileno()).st_size, HASH: hashlib.file_digest(f, HASH).hexdigest()}


class Snapshot:
    """One save of a sharded checkpoint, verified, its files held open.

    str(snapshot) is the folder's path; run is run.json (RNG states still as JSON
    lists); metadata is DCP's checked index. The files close with the object."""

    def __init__(self, folder, run, metadata, fds):
        self.folder, self.run, self.metadata, self._fds = Path(folder), run, metadata, fds
        weakref.finalize(self, _close_all, fds)

    def __str__(self):
        return str(self.folder)

    @contextmanager
    def stream(self, name):
        """The held file `name`, as a file object of its own (from offset 0)."""
        with os.fdopen(os.dup(self._fds[name]), "rb") as f:
            f.seek(0)
            yield f


def _close_all(fds):
    for fd in fds.values():
        os.close(fd)
    fds.clear()


def open_snapshot(folder, rank=0, world_size=1, note=print):
    """A verified Snapshot of the checkpoint folder, or a UserError naming the file and
    what differs; Changed when a save replaced the folder meanwhile. This rank hashes
    every world_size-th shard file (and .metadata)."""
    folder = Path(folder)
    try:
        dfd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise Changed()
    except OSError as e:
        raise UserError(f"cannot read the sharded checkpoint {folder}: {e.strerror or e}")
    fds = {}
    try:
        try:
            run, metadata = _verify(folder, dfd, fds, rank, world_size, note)
        except (UserError, OSError) as e:
            if _replaced(folder, dfd):
                raise Changed() from e
            if isinstance(e, OSError):
                raise UserError(f"cannot read the sharded checkpoint {folder}: {e.strerror or e}")
            raise
        return Snapshot(folder, run, metadata, fds)
    except BaseException:
        _close_all(fds)
        raise
    finally:
        os.close(dfd)


def _replaced(folder, dfd):
    try:
        now, held = os.stat(folder), os.fstat(dfd)
    except OSError:
        return True
    return (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)


def _open(dfd, folder, name, fds, max_bytes=None):
    try:
        fds[name] = open_regular(name, max_bytes, dir_fd=dfd, what=folder / name)
    except FileNotFoundError:
        raise UserError(f"{folder / name} is missing: the checkpoint is incomplete (a partial copy?)")
    return fds[name]


def _verify(folder, dfd, fds, rank, world_size, note):
    names = set(os.listdir(dfd))
    with os.fdopen(os.dup(_open(dfd, folder, RUN_FILE, fds, MAX_RUN_BYTES)), "rb") as f:
        run = parse_run(f.read(), folder / RUN_FILE)
    records = run.get("files")
    if records is None:  # format 1: saved before checksums were recorded
        note(f"note: {folder} was saved by an older version that recorded no checksums: only its structure is checked")
        records = {name: None for name in names - {RUN_FILE}}
    extra = sorted(names - set(records) - {RUN_FILE})
    if extra:
        raise UserError(f"{folder / extra[0]} is not part of the checkpoint (run.json does not list it): "
                        "remove it, or copy the checkpoint again")
    if METADATA_FILE not in records:
        raise UserError(f"{folder / RUN_FILE} lists no {METADATA_FILE}: the checkpoint is incomplete")
    sizes = {}
    for name, record in sorted(records.items()):
        cap = MAX_METADATA_BYTES if name == METADATA_FILE else None  # the index is unpickled: capped; shards are mapped
        sizes[name] = os.fstat(_open(dfd, folder, name, fds, cap)).st_size
        if record is not None and sizes[name] != record["bytes"]:
            raise UserError(f"{folder / name} is {sizes[name]:,} bytes but was saved with {record['bytes']:,}: "
                            "it is truncated or damaged; use another checkpoint or copy it again")
    shards = sorted(set(records) - {METADATA_FILE})
    for name in [METADATA_FILE, *shards[rank::world_size]]:
        if records[name] is not None:
            with os.fdopen(os.dup(fds[name]), "rb") as f:
                f.seek(0)
                if hashlib.file_digest(f, HASH).hexdigest() != records[name][HASH]:
                    raise UserError(f"{folder / name} fails its checksum ({HASH} differs from the one saved in run.json): "
                                    "the file is damaged or from another save; use another checkpoint or copy it again")
    with os.fdopen(os.dup(fds[METADATA_FILE]), "rb") as f:
        f.seek(0)
        metadata = read_metadata(f, folder / METADATA_FILE)
    check_metadata(metadata, {name: sizes[name] for name in shards}, folder / METADATA_FILE)
    return run, metadata


# ---- run.json ---------------------------------------------------------------------------


def parse_run(raw, source):
    """run.json's bytes as a dict whose every field has been checked (RNG states stay JSON)."""
    from gptkit.ops.checkpoint import checked_model_config
    from gptkit.data.tokenizer import check_description

    try:
        run = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise UserError(f"{source} is not valid JSON ({type(e).__name__}: {str(e)[:200]}): the checkpoint is damaged")
    if not isinstance(run, dict):
        raise UserError(f"{source} holds a {type(run).__name__}, not the object a save writes: the checkpoint is damaged")
    version = run.get("format_version")
    if version not in (1, 2):
        raise UserError(f"{source} has format_version {str(version)[:40]}; this code reads versions 1 and 2")
    _check_type(run, "world_size", int, source)
    if run["world_size"] < 1:
        raise UserError(f"{source}: its world_size is {run['world_size']}, not a number of ranks")
    checked_model_config(run.get("model_config"), source)
    check_description(run.get("tokenizer"), source)
    check_optimizer_settings(run.get("config"), source)
    for key, kind in (("data_fingerprint", str), ("dataset", str), ("provenance", dict), ("scaler", dict)):
        if run.get(key) is not None and not isinstance(run[key], kind):
            raise UserError(f"{source}: its {key!r} is a {type(run[key]).__name__}, not {kind.__name__} or null")
    rng = run.get("rng")
    if not isinstance(rng, dict) or not isinstance(rng.get("per_rank"), list) or not 1 <= len(rng["per_rank"]) <= run["world_size"]:
        raise UserError(f"{source}: its 'rng' must hold the RNG states of each of its {run['world_size']} ranks")
    try:
        states = {**rng_from_json(rng), "per_rank": [rng_from_json(r) for r in rng["per_rank"]]}
    except (TypeError, ValueError, KeyError, IndexError, OverflowError, RuntimeError, AttributeError) as e:
        raise UserError(f"{source}: its 'rng' is malformed ({type(e).__name__}: {str(e)[:100]})")
    check_loop_state({**run, "rng": states}, source)
    if version >= 2:
        _check_files(run.get("files"), source)
    return run


def _check_type(obj, key, kind, source):
    value = obj.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise UserError(f"{source}: its {key!r} is {type(value).__name__}, not {kind.__name__}: it is damaged or not ours")


def check_optimizer_settings(config, source):
    """The training settings that rebuild the optimizers (the rest are only reported)."""
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise UserError(f"{source}: its 'config' is a {type(config).__name__}, not the run's settings")
    if config.get("optimizer") not in ("adamw", "muon"):
        raise UserError(f"{source}: its optimizer setting is {str(config.get('optimizer'))[:40]!r}, not adamw or muon")
    numbers = ("learning_rate", "weight_decay", "beta1", "beta2") + (("muon_lr", "muon_momentum") if config["optimizer"] == "muon" else ())
    for key in numbers:
        value = config.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise UserError(f"{source}: its setting {key} is {str(value)[:40]!r}, not a number")


def _check_files(files, source):
    ok = isinstance(files, dict) and all(
        isinstance(name, str) and Path(name).name == name and name not in (".", "..", RUN_FILE)
        and isinstance(r, dict) and set(r) == {"bytes", HASH} and isinstance(r["bytes"], int)
        and not isinstance(r["bytes"], bool) and r["bytes"] >= 0 and isinstance(r[HASH], str) and _HEX.match(r[HASH])
        for name, r in files.items()
    )
    if not ok:
        raise UserError(f"{source}: its 'files' must map each file name of the folder to its bytes and {HASH}")


# ---- .metadata ---------------------------------------------------------------------------

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


class _Refused(pickle.UnpicklingError):
    """A global outside the allow-list (not a damaged file: a crafted one)."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        is_dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) not in _METADATA_CLASSES and not is_dtype:
            raise _Refused(f"global '{module}.{name}' is not allowed in a checkpoint's .metadata")
        return super().find_class(module, name)


def read_metadata(f, source):
    """DCP's Metadata from the open file `f`, unpickled with the allow-list above."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = _MetadataUnpickler(f).load()
    except _Refused as e:
        raise UserError(f"refusing to load {source}: {str(e)[:200]} (it could run code)")
    except Exception as e:  # truncated, random bytes, or an allowed class given bad arguments
        raise UserError(f"{source} is damaged (not DCP metadata): {type(e).__name__}: {str(e)[:200]}")
    if type(metadata) is not Metadata:
        raise UserError(f"{source} does not hold DCP metadata (found a {type(metadata).__name__})")
    return metadata


def check_metadata(metadata, shard_sizes, source):
    """Every entry well-formed, every tensor covered exactly once by its chunks, every
    chunk's bytes inside a shard file, and every shard file used."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    def damaged(why):
        return UserError(f"{source} is damaged: {why}; use another checkpoint or copy it again")

    entries, storage = getattr(metadata, "state_dict_metadata", None), getattr(metadata, "storage_data", None)
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        raise damaged("its index of tensors or of storage is not a dict")
    expected = set()
    for fqn, entry in entries.items():
        if not isinstance(fqn, str):
            raise damaged(f"an entry is named {fqn!r}, not by a string")
        if type(entry) is BytesStorageMetadata:
            expected.add(MetadataIndex(fqn))
            continue
        if type(entry) is not TensorStorageMetadata or type(entry.properties) is not TensorProperties \
                or not isinstance(entry.properties.dtype, torch.dtype):
            raise damaged(f"{fqn} is not described as a tensor or a value")
        shape = _ints(entry.size)
        chunks = entry.chunks
        if shape is None or not isinstance(chunks, list) or len(chunks) > MAX_CHUNKS \
                or not all(type(c) is ChunkStorageMetadata for c in chunks):
            raise damaged(f"{fqn} has a malformed shape or list of chunks")
        boxes = [(_ints(c.offsets), _ints(c.sizes)) for c in chunks]
        _check_cover(fqn, shape, boxes, damaged)
        expected.update(MetadataIndex(fqn, offsets) for offsets, _ in boxes)
    keys = set(storage)
    if not all(type(k) is MetadataIndex for k in keys) or keys != expected:
        odd = sorted(map(str, keys ^ expected))
        raise damaged(f"its storage index and its tensors disagree (e.g. {odd[0][:200] if odd else 'a key of the wrong kind'})")
    used = set()
    for key, info in storage.items():
        if type(info) is not _StorageInfo or info.transform_descriptors:
            raise damaged(f"the storage of {key.fqn} is not a plain piece of a file")
        name, offset, length = info.relative_path, info.offset, info.length
        if not isinstance(name, str) or name not in shard_sizes:
            raise damaged(f"{key.fqn} is stored in {str(name)[:100]!r}, which is not a shard file of this folder")
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in (offset, length)) \
                or offset + length > shard_sizes[name]:
            raise damaged(f"{key.fqn} is stored past the end of {name}")
        used.add(name)
    unused = sorted(set(shard_sizes) - used)
    if unused:
        raise damaged(f"no tensor is stored in {unused[0]} (an extra shard?)")


def _ints(size):
    """A torch.Size (or tuple) of non-negative ints as a tuple, else None."""
    if not isinstance(size, (torch.Size, tuple)) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in size):
        return None
    return tuple(size)


def _check_cover(fqn, shape, boxes, damaged):
    """The chunks (offsets, sizes) lie inside `shape`, do not overlap, and their
    volumes add up to the tensor's: together, they cover it exactly once."""
    import math

    for offsets, sizes in boxes:
        if offsets is None or sizes is None or len(offsets) != len(shape) or len(sizes) != len(shape) \
                or any(o + s > n for o, s, n in zip(offsets, sizes, shape)):
            raise damaged(f"a chunk of {fqn} {tuple(shape)} lies outside it")
    covered = sum(math.prod(sizes) for _, sizes in boxes)
    if covered != math.prod(shape):
        raise damaged(f"the chunks of {fqn} {tuple(shape)} hold {covered:,} elements, not {math.prod(shape):,}")

    def overlap(a, b):
        return all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a[0], a[1], b[0], b[1]))

    # A sweep along the first dimension: FSDP cuts there, so few chunks are ever open at once.
    ordered = sorted((box for box in boxes if math.prod(box[1])), key=lambda box: box[0][:1])
    open_ = []
    for box in ordered:
        open_ = [a for a in open_ if not shape or a[0][0] + a[1][0] > box[0][0]]
        if any(overlap(a, box) for a in open_):
            raise damaged(f"two chunks of {fqn} {tuple(shape)} overlap")
        open_.append(box)
