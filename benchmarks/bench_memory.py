"""Memory per rank: DDP against FSDP2, with and without activation checkpointing.

    python bench.py memory            # 2 gloo ranks on this CPU, ~29M-parameter GPT

Each row launches benchmarks/memory_worker.py under torchrun (2 CPU ranks) and
reports rank 0's figures: the bytes of parameters, gradients and AdamW state it
keeps (counted from the tensors, local shards under FSDP; gradients as they are
at the optimizer step), and its peak resident memory during three training steps
above the memory it held just before them (activations, DDP's gradient buckets,
FSDP's gathered blocks). glibc is told to return every freed block of 64 kB or
more to the system (MALLOC_MMAP_THRESHOLD_), so the peak follows the tensors.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.report import Table

REPO = Path(__file__).resolve().parent.parent
ROWS = [("ddp", False), ("ddp", True), ("fsdp", False), ("fsdp", True)]


def add_arguments(parser):
    parser.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")


def measure(parallel, ac, nproc, folder):
    out = Path(folder) / f"{parallel}-{int(ac)}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536", PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
         str(REPO / "benchmarks" / "memory_worker.py"), parallel, str(int(ac)), str(out)],
        env=env, capture_output=True, text=True, timeout=1800,
    )
    if result.returncode != 0:
        raise RuntimeError(f"memory worker failed ({parallel}, ac={ac}): {result.stderr[-2000:]}")
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(nproc)]


def run(args):
    from benchmarks.memory_worker import BATCH, SHAPE

    table = Table(
        f"Memory per rank, {args.nproc} gloo ranks: GPT {SHAPE['n_layer']}x{SHAPE['n_embd']} (vocab {SHAPE['vocab_size']}), "
        f"batch {BATCH}x{SHAPE['block_size']} per rank, AdamW, fp32",
        ["parallel", "activation ckpt", "params MB", "grads MB", "AdamW MB", "model state MB", "vs DDP",
         "peak RSS during steps MB", "of which above the start MB"],
    )
    ddp_state = None
    with tempfile.TemporaryDirectory() as folder:
        for parallel, ac in ROWS:
            r = measure(parallel, ac, args.nproc, folder)[0]
            state = r["params_mb"] + r["grads_mb"] + r["optimizer_mb"]
            ddp_state = ddp_state or state
            table.add_row(parallel, "yes" if ac else "no", r["params_mb"], r["grads_mb"], r["optimizer_mb"], state,
                          f"{state / ddp_state:.2f}x", r["peak_rss_mb"], r["peak_rss_mb"] - r["rss_before_mb"])
    table.note = (f"{r['n_params'] / 1e6:.1f}M parameters. Model state = what stays between steps "
                  "(FSDP: 1/W of it); the rise above the start is what the steps add (activations, "
                  "gradients, DDP's buckets, FSDP's gathered blocks).")
    return [table]
