"""Distributed data parallel set-up under torchrun, and the agreed stop flag.

    torchrun --standalone --nproc_per_node=8 train.py configs/gpt2.py

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; without them we are one process.
A SIGINT or SIGTERM only raises a flag; the training loop all-reduces that flag
with its per-step numbers, so every rank stops at the same step boundary and
rank 0 saves one checkpoint (torchrun forwards SIGTERM to its workers and kills
them 30 s later: docs/reliability.md).

A failure on one rank must end the whole job, not wait for the process group's
timeout. So a failing rank never waits in a collective on its way out (no barrier
in `cleanup` after an error). Under gloo the other ranks' next collective then
fails at once ("Connection closed by peer"), which they turn into a quiet
`PeerFailed`: the job ends within seconds. Under NCCL a collective does not notice
a peer that left: the others wait until torchrun, seeing a worker fail, sends them
SIGTERM and, since a rank blocked in a collective cannot act on it, SIGKILL 30 s later. Checks that
can fail before training starts run through `agreed`, so a mistake every rank
makes is reported once, by rank 0.
"""

import dataclasses
import os
import re
import signal

import torch
import torch.distributed

from gptkit.ops import faults
from gptkit.ops.errors import PeerFailed, UserError, first_line, same_on_every_rank


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


def world_size_from_env():
    """The number of ranks torchrun started (1 without torchrun), known before any process group."""
    return int(os.environ["WORLD_SIZE"]) if launched_by_torchrun() else 1


def same_global_batch(accumulation, batch_size, world_size):
    """(gradient_accumulation_steps, batch_size) for world_size ranks that keep about
    accumulation x batch_size windows a step, batch_size no larger than now (memory):
    what a user is told when the accumulation does not divide among the ranks."""
    if batch_size % world_size == 0:
        return accumulation * world_size, batch_size // world_size  # exactly the same batch
    per_rank = max(1, round(accumulation * batch_size / world_size))  # windows per rank and step
    micro = -(-per_rank // batch_size)  # micro-batches per rank
    return world_size * micro, max(1, round(per_rank / micro))


def dry_run(model_cfg, cfg, world_size):
    """--dry_run: the settings passed every check a launch with world_size ranks makes
    before its process group (WORLD_SIZE=512 RANK=0 python train.py ... --dry_run=true
    checks a cluster's job on a laptop); say what each step would take, and exit 0."""
    G, B, T = cfg.gradient_accumulation_steps, cfg.batch_size, model_cfg.block_size
    if os.environ.get("RANK", "0") == "0":
        print(f"dry run: the settings hold for {world_size} rank{'s' if world_size > 1 else ''}: each iteration "
              f"takes {G * B:,} windows of {T} tokens ({G * B * T:,} tokens), each rank {G // world_size} "
              f"micro-batch{'es' if G // world_size > 1 else ''} of {B}; nothing was read or written")
    return 0


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
    check_launch()
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
    faults.maybe_delay_join()  # test-only: a rank that starts late (GPT_FAULTS=join_delay=S)
    torch.distributed.init_process_group(backend=backend, **attempt_store(world_size))
    return Dist(rank=rank, local_rank=local_rank, world_size=world_size, enabled=True)


def peer_failed(error):
    """The quiet PeerFailed of a rank whose collective failed because a peer left. The
    peer may have died without a word (SIGKILL, the OOM killer, a lost node), so this
    rank's line in its torchrun's summary says what happened and names the address
    gloo lost, the peer's node, instead of a bare exit code 1; the torchrun of that
    node names the rank, its host and its exit code or signal."""
    # gloo: "[.../pair.cc:553] Connection closed by peer [10.0.0.2]:41234. This is typically caused by ..."
    said = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", first_line(error, 400)).split(". This is typically")[0]
    return PeerFailed(f"another rank left the job ({said[:160]}): every rank stops; the torchrun of the node "
                      "at that address names the rank that failed and why")


def attempt_store(world_size):
    """init_process_group's store for this torchrun attempt: {} (torch's own) unless the
    workers share torchrun's rendezvous store (its default, TORCHELASTIC_USE_AGENT_STORE).
    Then torch reuses that one store on every attempt without a per-attempt prefix (its
    comment says each retry gets a new store; shared, it does not), so a restarted
    worker could read the killed attempt's gloo addresses before its peer wrote new ones:
    "Gloo connectFullMesh failed ... Connection refused", or a hang (seen on one machine
    in 10 of 11 restarts; tests/train/test_restarts.py makes it happen on cue). Each
    attempt's keys go under a prefix of its own here."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    shared = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                                        is_master=False, timeout=torch.distributed.default_pg_timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dict(store=torch.distributed.PrefixStore(f"gptkit/attempt_{attempt}/", shared),
                rank=int(os.environ["RANK"]), world_size=world_size)


def check_launch():
    """Several nodes under torchrun --max-restarts with the rendezvous store shared with
    the workers (torch's default): the first restart reconnects to the last attempt's
    addresses and fails ("Connection refused"), since each node counts its own restarts
    (pytorch/pytorch#135712, #108158; measured here with two launchers on one machine).
    The static rendezvous (--master_addr) always shares its store: not measured under
    restarts, so it is pointed to the c10d form that was."""
    several_nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0
    if several_nodes and restarts and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        raise same_on_every_rank(UserError(
            "torchrun --max-restarts on several nodes needs --rdzv_backend=c10d and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
            "in torchrun's environment on every node (else a restart fails to connect: docs/distributed.md)"
        ))


def cleanup(dist, ok=True):
    """Leave the process group. After an error, leave without waiting for the others:
    they may be blocked in a collective this rank will never join."""
    if dist.enabled and torch.distributed.is_initialized():
        if ok:
            # Without this barrier 4 of 15 two-process gloo runs aborted at exit (docs/reliability.md).
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


PEER_FAILURE_SIGNS = ("closed by peer", "connection reset", "broken pipe", "remote worker", "aborted", "timed out")


def is_peer_failure(error):
    """True for the error a collective raises when another rank has gone."""
    text = str(error).lower()
    return isinstance(error, (RuntimeError, OSError)) and any(sign in text for sign in PEER_FAILURE_SIGNS)


def agreed(dist, fn):
    """Run fn() on this rank, then let every rank know whether any rank failed with a
    UserError: then all stop, rank 0 reporting each distinct message once (naming the
    ranks when not all had it) and the others quietly. fn must not use collectives."""
    try:
        value, message = fn(), None
    except UserError as e:
        if not dist.enabled:
            raise
        value, message = None, str(e)
    if not dist.enabled:
        return value
    messages = gather_objects(message, dist)
    failed = {}
    for rank, m in enumerate(messages):
        if m is not None:
            failed.setdefault(m, []).append(rank)
    if not failed:
        return value
    if not dist.is_main:
        raise PeerFailed()
    everyone = len(failed) == 1 and len(next(iter(failed.values()))) == dist.world_size
    if everyone:
        raise UserError(next(iter(failed)))
    raise UserError("; ".join(f"on rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {m}" for m, r in failed.items()))


def all_reduce_sum(tensor, dist):
    if dist.enabled:
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensor


def sum_gradients(params, dist):
    """Sum every rank's gradients of `params` in one flattened all-reduce (rl.py's updates,
    whose losses are divided by the global count already); a parameter without a gradient
    counts as zeros, so that every rank sends the same layout."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not dist.enabled:
        return
    flat = all_reduce_sum(torch.cat([p.grad.flatten() for p in params]), dist)
    for p, summed in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(summed.view_as(p.grad))


def any_rank(flag, dist, device):
    """True on every rank when `flag` is true on at least one."""
    if not dist.enabled:
        return bool(flag)
    t = torch.tensor(float(flag), device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
    return t.item() > 0


def slowest_clock(state, dist):
    """A time budget under torchrun: (train_time_s, train_cpu_s), RunState's clocks, of the
    slowest rank, for every rank to take, so that all ranks decay their learning rate alike
    and stop at the same step (each rank's own clock would end the run at its own)."""
    if not dist.enabled:
        return state.train_time_s, state.train_cpu_s
    device = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"  # nccl: this rank's GPU (set_device)
    clocks = torch.tensor([state.train_time_s, state.train_cpu_s], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(clocks, op=torch.distributed.ReduceOp.MAX)
    return tuple(clocks.tolist())


def barrier(dist):
    if dist.enabled:
        torch.distributed.barrier()


def broadcast_params(model, dist):
    """Rank 0's parameters on every rank (DDP does this itself when it wraps a model)."""
    if dist.enabled:
        for p in model.parameters():
            torch.distributed.broadcast(p.data, src=0)


def gather_objects(obj, dist):
    """Every rank's `obj` as a list on every rank (plain values only)."""
    if not dist.enabled:
        return [obj]
    out = [None] * dist.world_size
    torch.distributed.all_gather_object(out, obj)
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
        if os.environ.get("RANK", "0") == "0":
            # os.write, not print: a signal handler may interrupt a print in progress.
            note = f"\n{self.signal_name}: stopping at the end of this step and saving a checkpoint"
            if signum == signal.SIGINT:
                note += " (Ctrl-C again to quit at once without saving)"
            try:
                os.write(2, (note + "\n").encode())
            except OSError:
                pass

    @property
    def raised(self):
        return self.signal_name is not None

    def uninstall(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
