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
from gptkit.ops.checkpoint import load_checkpoint
from gptkit.train import sharded
from train_helpers import REPO, one_process_run, losses_by_iter, read_metrics, subprocess_env, tiny_args, write_char_dataset

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
    return one_process_run(tmp_path_factory.mktemp("reference"), **ARGS)


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
def test_two_nodes_of_two_ranks_train_as_one_process(tmp_path, reference):
    """DDP, 4 ranks: each reads its own micro-batch by its global rank (by its local
    rank, both nodes would read the same two and the losses would differ); only the
    global rank 0 writes, into the one shared folder."""
    nodes = node_folders(tmp_path, reference)
    out = tmp_path / "shared" / "out"
    results = ok(launch_nodes(nodes, tiny_args("data", out, **ARGS)))
    assert sum(output.count("world size 4") for _, output in results) == 1
    assert sorted(p.name for p in out.iterdir()) == [".lock", "best.pt", "ckpt.pt", "config.json", "metrics.jsonl"]
    assert_same_run(out, reference, load_checkpoint(out / "ckpt.pt")["model"])
    for folder in nodes:  # nothing but its own copy of the dataset in a node's folder
        assert sorted(p.name for p in folder.iterdir()) == ["data"]
        assert sorted(p.name for p in (folder / "data" / "tiny").iterdir()) == ["meta.json", "train.bin", "val.bin"]


@pytest.mark.slow
def test_a_rank_killed_on_one_node_restarts_both_and_fsdp_resumes_to_the_uninterrupted_run(tmp_path, reference):
    """FSDP, 4 ranks, torchrun --max-restarts=1 and init_from=auto: rank 3 (on the second
    node) is SIGKILLed at iteration 6, after the checkpoint of iteration 4; both nodes
    stop, torchrun restarts them, the job resumes from iteration 4 and ends where the
    uninterrupted one-process run ends. Every rank wrote its shard into the shared out_dir."""
    nodes = node_folders(tmp_path, reference)
    out = tmp_path / "shared" / "out"
    results = ok(launch_nodes(
        nodes, tiny_args("data", out, parallel="fsdp", init_from="auto", **ARGS), extra=["--max-restarts=1"],
        GPT_FAULTS=f"kill_at=6,kill_rank=3,kill_once={tmp_path / 'killed'}", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
    ))
    assert (tmp_path / "killed").exists()  # made by rank 3 just before its SIGKILL
    # (Which failure each torchrun saw first, the SIGKILL or a rank that lost its peer, varies.)
    text = "".join(output for _, output in results)
    assert text.count("init_from=auto: no checkpoint in") == 1  # the first attempt, from scratch
    assert text.count(f"resumed from {out / 'ckpt'} at iteration 4") == 1  # the restart
    assert load_checkpoint(reference / "one" / "ckpt.pt")["iter_num"] == 8
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp", "run.json"]
    assert [r["iter"] for r in read_metrics(out, "train")] == STEPS  # one run's metrics, steps 6-7 once
    single = sharded.sharded_to_single(out, tmp_path / "single.pt")
    assert load_checkpoint(single)["iter_num"] == 8
    assert_same_run(out, reference, load_checkpoint(single)["model"])


def test_a_node_that_never_joins_fails_the_rendezvous_in_the_time_set(tmp_path):
    """One launcher of a 2-node job whose other node never comes: c10d rendezvous (the
    commands of docs/distributed.md) gives up after --rdzv_conf join_timeout=N seconds
    (600 by default) with one last line, exit 1, and no worker ever starts."""
    start = time.monotonic()
    result = subprocess.run(
        [*TORCHRUN, "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}",
         "--rdzv_conf=join_timeout=3", str(REPO / "train.py"), "--help"],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=90,
    )
    code, output, seconds = result.returncode, result.stdout + result.stderr, time.monotonic() - start
    assert code == 1 and seconds < 40, (seconds, output[-2000:])
    assert output.splitlines()[-1] == "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"
    assert "usage: train.py" not in output  # no worker ever started


def test_a_rank_that_lost_a_peer_leaves_torchrun_a_line_naming_the_address(tmp_path, monkeypatch, capsys):
    """What the other ranks of a job whose rank was SIGKILLed leave in their torchrun's
    summary (seen there with two launchers; see docs/distributed.md), instead of a bare exit code 1."""
    from gptkit.ops.errors import run_main
    from gptkit.train.distributed import peer_failed

    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                        "[10.0.0.2]:41234. This is typically caused by a remote worker crashing")

    def main(argv):
        raise peer_failed(gloo)

    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    with pytest.raises(SystemExit) as exit_:
        run_main(main)
    assert exit_.value.code == 1
    assert capsys.readouterr().err == ""  # the console keeps the failed rank's own line alone
    import json

    assert json.loads((tmp_path / "error.json").read_text())["message"] == (
        "error on rank 0: another rank left the job (Connection closed by peer [10.0.0.2]:41234): every rank stops; "
        "the torchrun of the node at that address names the rank that failed and why")


def test_the_error_file_for_torchrun_is_never_seen_half_written(tmp_path, monkeypatch):
    """torchrun's agent reads each failed rank's error file with a JSON reader: a file caught
    between open("w")'s truncation and the write (empty) made it raise instead of printing
    its summary. The message is written beside the file and renamed into place, so a write
    cut short leaves the file as it was and no temporary behind."""
    import json

    from gptkit.ops import errors

    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    errors._tell_torchrun("error on rank 1: the first")
    assert json.loads(path.read_text())["message"] == "error on rank 1: the first"
    real_dump = json.dump

    def cut_short(obj, f):  # the disk fills halfway through the write
        f.write('{"message": "err')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", cut_short)
    errors._tell_torchrun("error on rank 1: the second")
    monkeypatch.setattr(json, "dump", real_dump)
    assert json.loads(path.read_text())["message"] == "error on rank 1: the first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["error.json"]


def test_restarts_on_several_nodes_without_a_store_per_attempt_are_refused_before_any_work(tmp_path, monkeypatch):
    """With the rendezvous store shared (torch's default), the first restart of a
    2-launcher job failed here with "Gloo connectFullMesh failed ... Connection refused":
    refused at start instead, in one line that every rank makes alike (printed once)."""
    from gptkit.ops.errors import UserError

    data = write_char_dataset(tmp_path / "data").parent
    for name, value in dict(RANK="2", LOCAL_RANK="0", WORLD_SIZE="4", GROUP_WORLD_SIZE="2", TORCHELASTIC_MAX_RESTARTS="1",
                            TORCHELASTIC_USE_AGENT_STORE="True").items():  # as torchrun sets them on the second node
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=r"^torchrun --max-restarts on several nodes needs --rdzv_backend=c10d and "
                                        r"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's environment") as caught:
        train.main(tiny_args(data, tmp_path / "out", **ARGS))
    assert getattr(caught.value, "same_on_every_rank", False)
    assert not (tmp_path / "out").exists()
