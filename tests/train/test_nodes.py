"""Several nodes, simulated on one machine: two torchrun launchers on localhost
(--nnodes 2, c10d rendezvous on a local port), each "node" in its own working folder
with its own copy of the dataset and only the out_dir shared, train as one process
does (DDP and FSDP); a worker SIGKILLed under --max-restarts resumes by itself to the
uninterrupted run's checkpoint; a node that never joins fails the rendezvous in
bounded time. What this proves and what only a cluster shows: docs/distributed.md."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

import train
from gptkit.checkpoint import load_checkpoint
from gptkit.train import sharded
from train_helpers import REPO, losses_by_iter, read_metrics, subprocess_env, tiny_args, write_char_dataset

# A tiny model and a global batch of 4 micro-batches: one per rank on 4 ranks. dropout 0:
# each rank draws its own dropout masks, so only without dropout can ranks equal one process.
ARGS = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, gradient_accumulation_steps=4,
            dropout=0.0, max_iters=8, eval_interval=4, eval_iters=2, lr_decay_iters=8)
STEPS = list(range(8))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The one-process run every distributed run here is compared against (one thread,
    as each torchrun worker: the same kernels)."""
    root = tmp_path_factory.mktemp("reference")
    data = write_char_dataset(root / "data").parent
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert train.main(tiny_args(data, root / "one", **ARGS)) == 0
    finally:
        torch.set_num_threads(threads)
    return root


def node_folders(tmp_path, reference):
    """Two "nodes": a working folder each, each with its own copy of the dataset."""
    nodes = []
    for name in ("node0", "node1"):
        shutil.copytree(reference / "data", tmp_path / name / "data")
        nodes.append(tmp_path / name)
    return nodes


def launch_nodes(nodes, args, timeout=240, nproc=2, extra=(), **env):
    """One torchrun launcher per node folder, started together; (returncode, output) of each."""
    port = free_port()
    procs = []
    try:
        for node_rank, folder in enumerate(nodes):
            procs.append(subprocess.Popen(
                [*TORCHRUN, f"--nnodes={len(nodes)}", f"--node_rank={node_rank}", f"--nproc_per_node={nproc}",
                 "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_conf=join_timeout=60",
                 "--local_addr=127.0.0.1", *extra, str(REPO / "train.py"), *args],
                cwd=folder, env=subprocess_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,
            ))
        return [(p.returncode, p.communicate(timeout=timeout)[0]) for p in procs for _ in [p.wait(timeout=timeout)]]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def ok(results):
    for code, output in results:
        assert code == 0, output[-4000:]
    return results


def max_diff(a, b):
    return max(abs(a[i] - b[i]) for i in STEPS)


def assert_same_run(out, reference, weights):
    one = reference / "one"
    assert sorted(losses_by_iter(out)) == STEPS  # global rank 0 alone wrote: one line per step
    assert max_diff(losses_by_iter(out), losses_by_iter(one)) < 1e-5, (losses_by_iter(out), losses_by_iter(one))
    assert [e["val_loss"] for e in read_metrics(out, "eval")] == pytest.approx(
        [e["val_loss"] for e in read_metrics(one, "eval")], abs=1e-5)
    expected = load_checkpoint(one / "ckpt.pt")["model"]
    assert weights.keys() == expected.keys()
    assert max((weights[k] - expected[k]).abs().max().item() for k in expected) < 1e-5


@pytest.mark.slow
def test_two_nodes_of_two_ranks_train_as_one_process_ddp_and_fsdp(tmp_path, reference):
    nodes = node_folders(tmp_path, reference)
    # DDP: 4 ranks, each reading its own micro-batch by its global rank (by the local
    # rank, both nodes would read the same two and the losses would differ).
    ddp = tmp_path / "shared" / "ddp"
    results = ok(launch_nodes(nodes, tiny_args("data", ddp, **ARGS)))
    assert "world size 4" in results[0][1] + results[1][1]
    assert sorted(p.name for p in ddp.iterdir()) == [".lock", "best.pt", "ckpt.pt", "config.json", "metrics.jsonl"]
    assert_same_run(ddp, reference, load_checkpoint(ddp / "ckpt.pt")["model"])
    # FSDP: every rank writes its own shard of the sharded checkpoint into the shared out_dir.
    fsdp = tmp_path / "shared" / "fsdp"
    ok(launch_nodes(nodes, tiny_args("data", fsdp, parallel="fsdp", **ARGS)))
    assert sorted(p.name for p in (fsdp / "ckpt").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp", "run.json"]
    single = sharded.sharded_to_single(fsdp, tmp_path / "fsdp.pt")
    assert_same_run(fsdp, reference, load_checkpoint(single)["model"])
    # Nothing but the dataset in a node's own folder: the out_dir is the one shared place.
    for folder in nodes:
        assert sorted(p.name for p in folder.iterdir()) == ["data"]
        assert sorted(p.name for p in (folder / "data" / "tiny").iterdir()) == ["meta.json", "train.bin", "val.bin"]
