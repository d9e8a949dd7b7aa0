"""Distributed data parallel set-up under torchrun, and the agreed stop flag.

    torchrun --standalone --nproc_per_node=8 train.py configs/gpt2.py

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; without them we are one process.
A SIGINT or SIGTERM only raises a flag; the training loop all-reduces that flag
with its per-step numbers, so every rank stops at the same step boundary and
rank 0 saves one checkpoint (torchrun forwards SIGTERM to its workers and kills
them 30 s later: RELIABILITY.md).
"""

import dataclasses
import os
import signal

import torch
import torch.distributed as dist

from gptkit.errors import UserError


@dataclasses.dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    enabled: bool = False

    @property
    def is_main(self):
        return self.rank == 0


def launched_by_torchrun():
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def resolve_backend(backend, device_type):
    if backend == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    return backend


def init(backend, device_type):
    """Join the process group when launched by torchrun; else a one-process Dist."""
    if not launched_by_torchrun():
        return Dist()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    world_size = int(os.environ["WORLD_SIZE"])
    backend = resolve_backend(backend, device_type)
    if backend == "nccl" and device_type != "cuda":
        raise UserError("backend nccl needs CUDA devices: use --backend=gloo (or auto) on CPU")
    if device_type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise UserError(
                f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA device(s): "
                "give torchrun --nproc_per_node at most the number of GPUs"
            )
        torch.cuda.set_device(local_rank)  # one process per device
    dist.init_process_group(backend=backend)
    return Dist(rank=rank, local_rank=local_rank, world_size=world_size, enabled=True)


def cleanup(d):
    if d.enabled and dist.is_initialized():
        # Without this barrier some gloo runs aborted at exit (RELIABILITY.md).
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(tensor, d):
    if d.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier(d):
    if d.enabled:
        dist.barrier()


def broadcast_params(model, d):
    """Rank 0's parameters on every rank (DDP does this itself when it wraps a model)."""
    if d.enabled:
        for p in model.parameters():
            dist.broadcast(p.data, src=0)


def gather_objects(obj, d):
    """Every rank's `obj` as a list on every rank (plain values only)."""
    if not d.enabled:
        return [obj]
    out = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out


class StopFlag:
    """Remembers the first SIGINT/SIGTERM; a second SIGINT interrupts at once."""

    def __init__(self):
        self.signal_name = None
        self._previous = {}

    def install(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the user insists: stop without saving
        self.signal_name = signal.Signals(signum).name

    @property
    def raised(self):
        return self.signal_name is not None

    def uninstall(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
