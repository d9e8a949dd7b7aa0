"""Checkpoint files: written atomically, loaded without running any code.

A checkpoint on disk is always complete: gptkit/ops/atomic.py writes it to a temporary
file in the same folder, fsyncs it and renames it over the old one (a rename within
one file system is atomic), so a crash mid-save leaves the previous checkpoint.
Loading first checks the zip container's CRC-32 of every entry (torch.load does
not, so a flipped byte in tensor data would otherwise load as silently wrong
weights), then uses `torch.load(weights_only=True)`, which refuses pickled objects
that could execute code; everything we store is tensors and plain Python values.
"""

import contextlib
import pickle
import signal
import threading
import zipfile
from pathlib import Path

import torch

from gptkit.ops import faults
from gptkit.ops.atomic import atomic_write
from gptkit.ops.errors import RunFailed, UserError
from gptkit.ops.paths import TEMP_MARK  # noqa: F401  (also named here as checkpoint.TEMP_MARK)

FORMAT_VERSION = 1


def save_checkpoint(obj, path, replace=True):
    """Write `obj` to `path` atomically: the old file or the new one, never half.

    A checkpoint with a non-finite floating-point tensor (weights or optimizer state
    gone NaN or inf) is refused: the previous file stays, and the error names the
    tensor. A Ctrl-C during the write waits until the file is in place. A run's own
    checkpoints replace their previous file; replace=False (convert.py --to pt, a new
    name) never replaces a file that appeared meanwhile (gptkit/ops/atomic.py)."""
    path = Path(path)
    bad = non_finite_tensors(obj)
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise RunFailed(f"not saving {path}: {bad[0]}{more} holds NaN or inf (the previous checkpoint is kept)")
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = "the previous checkpoint is intact"
    try:
        with deferred_interrupts(), atomic_write(path, replace=replace, what="checkpoint ", kept=kept) as tmp:
            with open(tmp, "wb") as f:
                torch.save(obj, f)
                faults.maybe_exit_during_save(obj.get("iter_num") if isinstance(obj, dict) else None)
    except RuntimeError as e:  # torch.save reports a full disk as RuntimeError
        raise RunFailed(f"could not write checkpoint {path}: {e} ({kept})")


def write_text_atomic(path, text):
    """Replace a small file (config.json, a trimmed metrics.jsonl; bytes such as a PNG too)
    atomically; a full disk is one RunFailed line and leaves no temporary file."""
    with deferred_interrupts(), atomic_write(path) as tmp:
        if isinstance(text, bytes):
            tmp.write_bytes(text)
        else:
            tmp.write_text(text)


def non_finite_tensors(obj, name="checkpoint"):
    """Names (like `model['h.0.attn.c_attn.weight']`) of the floating-point tensors in
    `obj` that hold a NaN or an infinity; one device sync for all of them."""
    found = []

    def walk(x, where):
        if torch.is_tensor(x):
            if x.is_floating_point() or x.is_complex():
                found.append((where, x))
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{where}[{k!r}]")
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{where}[{i}]")

    walk(obj, name)
    if not found:
        return []
    by_device = {}
    for i, (_, t) in enumerate(found):
        by_device.setdefault(t.device, []).append(i)
    ok = [True] * len(found)
    for indices in by_device.values():  # one stacked check (and one sync) per device
        flags = torch.stack([torch.isfinite(found[i][1]).all() for i in indices]).tolist()
        for i, flag in zip(indices, flags):
            ok[i] = flag
    return [where for (where, _), good in zip(found, ok) if not good]


@contextlib.contextmanager
def deferred_interrupts():
    """Hold Ctrl-C back while a file is written: torch.save interrupted halfway
    reports a failed write that reads like a disk fault. A SIGINT that arrives
    meanwhile is handed to the previous handler as soon as the block ends.
    (Handlers live in the main thread; elsewhere this does nothing.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            if callable(previous):
                previous(signal.SIGINT, pending[-1])
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


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


def checked_model_config(model_kwargs, source, **overrides):
    """A GPTConfig from a checkpoint's model_config, every field of the right type."""
    from gptkit.config import _field_types, check_value
    from model import GPTConfig

    if not isinstance(model_kwargs, dict):
        raise UserError(f"{source}: its model_config is a {type(model_kwargs).__name__}, not a dict")
    types_ = _field_types(GPTConfig)
    unknown = [k for k in model_kwargs if k not in types_]
    if unknown:
        raise UserError(
            f"{source}: its model_config has fields this model.py does not know ({', '.join(map(str, unknown[:4]))}); "
            "was it written by a newer version?"
        )
    wrong = [f"{k}={v!r}" for k, v in model_kwargs.items() if not check_value(v, types_[k])]
    if wrong:
        raise UserError(f"{source}: its model_config has values of the wrong type: {', '.join(wrong[:4])}")
    try:
        return GPTConfig(**{**model_kwargs, **overrides})
    except ValueError as e:
        raise UserError(f"{source}: {e}")
