"""What a checkpoint records about the run besides the weights: the training loop's
state (RunState), every RNG state (so a resumed run draws the same dropout masks)
and provenance (which code, versions and device made it). All as tensors and plain
values, which `torch.load(weights_only=True)` accepts: numpy's state array becomes a tensor.
"""

import dataclasses
import math
import platform
import random
import subprocess
from pathlib import Path

import numpy as np
import torch


ALWAYS_SAVED = ("iter_num", "best_val_loss", "val_loss")  # in every checkpoint ever written


@dataclasses.dataclass
class RunState:
    """What the training loop carries from one iteration to the next, and what a
    checkpoint saves of it (as top-level keys: `**asdict(state)`)."""

    iter_num: int = 0  # optimizer steps taken
    best_val_loss: float = math.inf
    val_loss: float = math.nan  # at the latest evaluation
    last_eval_iter: int = -1  # a resumed run does not repeat the evaluation its checkpoint was saved after
    train_time_s: float = 0.0  # wall seconds inside training steps
    train_cpu_s: float = 0.0  # this process's CPU seconds (all threads) inside training steps (torchrun: the slowest rank's)

    @classmethod
    def from_checkpoint(cls, ckpt):
        """The state a checkpoint saved. Checkpoints older than last_eval_iter,
        train_time_s or train_cpu_s lack them: those start from their defaults."""
        return cls(**{f.name: ckpt[f.name] for f in dataclasses.fields(cls) if f.name in ckpt})

    def eval_due(self, eval_interval, at_end):
        """Evaluate (and save) every eval_interval iterations and at the end, once per iteration."""
        return (self.iter_num % eval_interval == 0 or at_end) and self.iter_num != self.last_eval_iter


def provenance(device):
    """Which code made a checkpoint: git commit (and local changes), versions, device."""
    here = Path(__file__).resolve().parent

    def git(*args):
        try:
            out = subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    name = torch.cuda.get_device_name(device) if str(device).startswith("cuda") else platform.processor() or "cpu"
    return {
        "git_commit": commit,
        "git_dirty": None if status is None else bool(status),
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "device": f"{device} ({name})",
    }


def rng_state(device):
    """This process's RNG states as tensors and plain values (weights_only loads them)."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state(device)] if str(device).startswith("cuda") else [],
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
    }


def set_rng_state(state, device):
    torch.set_rng_state(state["torch"])
    if state["cuda"] and str(device).startswith("cuda"):
        torch.cuda.set_rng_state(state["cuda"][0], device)
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))


def rng_to_json(state):
    """rng_state(...) with its tensors as lists of ints: JSON, for a sharded checkpoint's run.json."""
    return {
        "torch": state["torch"].tolist(),
        "cuda": [s.tolist() for s in state["cuda"]],
        "python": [state["python"][0], list(state["python"][1]), state["python"][2]],
        "numpy": {**state["numpy"], "keys": state["numpy"]["keys"].tolist()},
    }


def rng_from_json(obj):
    """rng_to_json's inverse (check_rng_state then says whether the result is usable)."""
    return {
        "torch": torch.tensor(obj["torch"], dtype=torch.uint8),
        "cuda": [torch.tensor(s, dtype=torch.uint8) for s in obj["cuda"]],
        "python": (obj["python"][0], tuple(obj["python"][1]), obj["python"][2]),
        "numpy": {**obj["numpy"], "keys": torch.tensor(obj["numpy"]["keys"], dtype=torch.int64)},
    }


def check_loop_state(ckpt, source):
    """The loop's counters and RNG states of a checkpoint (one file, or a sharded
    run.json after rng_from_json), each of the type resuming needs: a UserError naming
    `source` and the field otherwise. Counters from JSON may be ints where floats are kept."""
    for field in dataclasses.fields(RunState):
        key, kind, value = field.name, field.type, ckpt.get(field.name)
        if value is None and key not in ALWAYS_SAVED:
            continue  # a checkpoint older than this field: RunState.from_checkpoint gives its default
        ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
        if not ok or (kind is int and value < -1):
            raise _damaged(source, f"its {key!r} is {type(value).__name__} {str(value)[:40]}, not {kind.__name__}")
    rng = ckpt.get("rng")
    if not isinstance(rng, dict):
        raise _damaged(source, f"its 'rng' is {type(rng).__name__}, not dict")
    check_rng_state(rng, source)
    per_rank = rng.get("per_rank")
    if per_rank is not None:
        if not isinstance(per_rank, list):
            raise _damaged(source, "its per-rank RNG states are not a list")
        for state in per_rank:  # a rank's entry may hold only some generators: resuming merges it over rng
            check_rng_state({**rng, **state} if isinstance(state, dict) else state, source)


def check_rng_state(state, source):
    """rng_state()'s shape: what set_rng_state accepts without a traceback."""
    def tensor_of(t, dtype, n=None):
        return torch.is_tensor(t) and t.dtype == dtype and t.dim() == 1 and (n is None or t.numel() == n)

    n_torch = torch.get_rng_state().numel()
    python, numpy_ = state.get("python") if isinstance(state, dict) else None, state.get("numpy") if isinstance(state, dict) else None
    ok = (
        isinstance(state, dict) and tensor_of(state.get("torch"), torch.uint8, n_torch)
        and isinstance(state.get("cuda"), list) and all(tensor_of(t, torch.uint8) for t in state["cuda"])
        and isinstance(python, (list, tuple)) and len(python) == 3 and isinstance(python[0], int)
        and isinstance(python[1], (list, tuple)) and len(python[1]) == 625
        and all(isinstance(v, int) and 0 <= v < 2**32 for v in python[1][:624]) and isinstance(python[1][624], int)
        and (python[2] is None or isinstance(python[2], float))
        and isinstance(numpy_, dict) and tensor_of(numpy_.get("keys"), torch.int64, 624)
        and isinstance(numpy_.get("pos"), int) and 0 <= numpy_["pos"] <= 624
        and numpy_.get("has_gauss") in (0, 1) and isinstance(numpy_.get("cached_gaussian"), float)
    )
    if not ok:
        raise _damaged(source, "its RNG states are malformed")


def _damaged(source, what):
    from gptkit.ops.errors import UserError

    return UserError(f"{source}: {what}: it is damaged or not ours")
