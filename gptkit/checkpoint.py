"""Checkpoint files: written atomically, loaded without running any code.

A checkpoint on disk is always complete: we write to a temporary file in the
same folder, flush and fsync it, then `os.replace` it over the old one (a rename
within one file system is atomic), so a crash mid-save leaves the previous
checkpoint. Loading first checks the zip container's CRC-32 of every entry (torch.load
does not, so a flipped byte in tensor data would otherwise load as silently
wrong weights), then uses `torch.load(weights_only=True)`, which refuses pickled
objects that could execute code; everything we store is tensors and plain
Python values.
"""

import os
import pickle
import zipfile
from pathlib import Path

import torch

from gptkit import faults
from gptkit.errors import RunFailed, UserError

FORMAT_VERSION = 1
TEMP_MARK = ".tmp-"  # temporary files look like `.ckpt.pt.tmp-1234` and are never loaded


def temp_path_for(path):
    path = Path(path)
    return path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}")


def save_checkpoint(obj, path):
    """Write `obj` to `path` atomically: the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            faults.maybe_exit_during_save()
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as RuntimeError
        tmp.unlink(missing_ok=True)
        raise RunFailed(f"could not write checkpoint {path}: {e} (the previous checkpoint is intact)")
    _fsync_dir(path.parent)


def _fsync_dir(folder):
    """Make the rename itself durable (POSIX); a no-op where folders can't be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(path, map_location="cpu"):
    """Load a checkpoint safely; a missing, damaged or unsafe file is a UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"checkpoint {path} does not exist: train one first, e.g. python train.py configs/shakespeare.py"
        )
    if path.stat().st_size == 0:
        raise UserError(f"checkpoint {path} is empty: it is damaged; delete it or resume from another")
    check_integrity(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's own message suggests weights_only=False, exactly the wrong advice here:
        # show only the line that names the offending object.
        culprit = next((line for line in str(e).splitlines() if "GLOBAL" in line or "global" in line), "")
        raise UserError(
            f"refusing to load {path}: it holds pickled Python objects that could run code "
            f"(only tensors and plain values are allowed). {culprit.strip()}"
        )
    except (RuntimeError, EOFError, OSError, ValueError, IndexError, KeyError) as e:
        raise _damaged(path, e)


def _damaged(path, e):
    return UserError(
        f"{path} is not a complete checkpoint (truncated, corrupted or not a PyTorch file): "
        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    )


def check_integrity(path):
    """Every zip entry present, a plain file, and matching its CRC-32 (reads the file once)."""
    try:
        if not zipfile.is_zipfile(path):
            raise UserError(f"{path} is not a PyTorch checkpoint (not a zip archive): is it truncated or another kind of file?")
        with zipfile.ZipFile(path) as archive:
            if any(info.is_dir() or info.external_attr & 0x10 for info in archive.infolist()):
                raise zipfile.BadZipFile("an entry is marked as a folder")
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError, NotImplementedError) as e:
        raise _damaged(path, e)
    if bad is not None:
        raise UserError(f"{path} is corrupted: the data of {bad} fails its checksum; resume from another checkpoint")
