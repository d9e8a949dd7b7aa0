"""What a checkpoint records about the run besides the weights: every RNG state
(so a resumed run draws the same dropout masks) and provenance (which code,
versions and device made it). All as tensors and plain values, which
`torch.load(weights_only=True)` accepts: numpy's state array becomes a tensor.
"""

import platform
import random
import subprocess
from pathlib import Path

import numpy as np
import torch


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
