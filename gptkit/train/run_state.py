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


@dataclasses.dataclass
class RunState:
    """What the training loop carries from one iteration to the next, and what a
    checkpoint saves of it (as top-level keys: `**asdict(state)`)."""

    iter_num: int = 0  # optimizer steps taken
    best_val_loss: float = math.inf
    val_loss: float = math.nan  # at the latest evaluation
    last_eval_iter: int = -1  # a resumed run does not repeat the evaluation its checkpoint was saved after
    train_time_s: float = 0.0  # wall seconds inside training steps
    train_cpu_s: float = 0.0  # this process's CPU seconds (all threads), evaluations left out

    @classmethod
    def from_checkpoint(cls, ckpt):
        """The state a checkpoint saved. Checkpoints older than last_eval_iter,
        train_time_s or train_cpu_s lack them: those start from their defaults."""
        return cls(**{f.name: ckpt[f.name] for f in dataclasses.fields(cls) if f.name in ckpt})

    def eval_due(self, eval_interval, max_iters):
        """Evaluate (and save) every eval_interval iterations and at the end, once per iteration."""
        return (self.iter_num % eval_interval == 0 or self.iter_num >= max_iters) and self.iter_num != self.last_eval_iter


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
