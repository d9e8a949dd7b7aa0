"""CPU seconds of a whole process at one thread, and nanoGPT's own scripts to compare with.

A shared, loaded machine stretches wall time unpredictably, but the CPU seconds
a single-threaded process spends change much less: `run_one_thread` runs a
command with OMP_NUM_THREADS=1 (torch then uses one thread) and reports the
user + system seconds of the process and its children (getrusage), beside its
wall time.

nanoGPT (Karpathy, https://github.com/karpathy/nanoGPT) is never copied here:
give the benchmarks a checkout of it (`--nanogpt PATH`, or NANOGPT_DIR) and its
own train.py / sample.py run as subprocesses, with the README's commands:

    python bench.py speedrun --one_thread --nanogpt ../nanoGPT
    python bench.py sample --one_thread --nanogpt ../nanoGPT
"""

import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

from gptkit.ops.errors import UserError

NANOGPT_ENV = "NANOGPT_DIR"
NANOGPT_FILES = ("train.py", "model.py", "sample.py", "configurator.py", "config/train_shakespeare_char.py")
# nanoGPT README's CPU run ("I only have a macbook"), with its 20-batch evaluation.
NANOGPT_CPU_TRAIN = [
    "config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
    "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4",
    "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0",
]


def one_thread_env():
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def in_one_thread(suite):
    """Run this bench.py suite at one thread: NumPy's BLAS takes its thread count from
    OMP_NUM_THREADS at import, so a `python bench.py SUITE` without it runs again with it.
    Called in-process (a test), torch alone is set to one thread."""
    import torch

    if os.environ.get("OMP_NUM_THREADS") != "1" and Path(sys.argv[0]).name == "bench.py":
        print(f"[{suite}] running again with OMP_NUM_THREADS=1 (NumPy's BLAS would use every core)",
              file=sys.stderr, flush=True)
        os.execve(sys.executable, [sys.executable, *sys.argv], one_thread_env())
    torch.set_num_threads(1)


def children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_one_thread(command, cwd, log_path):
    """Run `command` (a list) in `cwd` at one thread, output to log_path.
    Returns {"wall_s", "cpu_s"}; UserError (exit 2) or RuntimeError naming the log on failure."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cpu0, t0 = children_cpu_seconds(), time.perf_counter()
    with open(log_path, "w") as log:
        log.write(" ".join(shlex.quote(str(c)) for c in command) + "\n")
        log.flush()
        code = subprocess.run(command, cwd=cwd, env=one_thread_env(), stdout=log, stderr=subprocess.STDOUT).returncode
    wall, cpu = time.perf_counter() - t0, children_cpu_seconds() - cpu0
    if code != 0:
        tail = "\n  ".join(log_path.read_text(errors="replace").strip().splitlines()[-5:])
        raise (UserError if code == 2 else RuntimeError)(f"{command[1]} exited with {code} (log: {log_path}):\n  {tail}")
    return {"wall_s": wall, "cpu_s": cpu}


def nanogpt_dir(path=None):
    """The nanoGPT checkout to compare with (--nanogpt, else $NANOGPT_DIR), or None."""
    path = path or os.environ.get(NANOGPT_ENV)
    if not path:
        return None
    folder = Path(path).expanduser().resolve()
    missing = [name for name in NANOGPT_FILES if not (folder / name).is_file()]
    if missing:
        raise UserError(f"{folder} is not a nanoGPT checkout (missing {', '.join(missing)}): "
                        "git clone https://github.com/karpathy/nanoGPT and pass its folder with --nanogpt")
    return folder


def nanogpt_char_data(folder):
    """nanoGPT's prepared Tiny Shakespeare (its own prepare.py writes it; it downloads)."""
    data = folder / "data" / "shakespeare_char"
    if not all((data / name).is_file() for name in ("train.bin", "val.bin", "meta.pkl")):
        raise UserError(f"{data} has no train.bin, val.bin and meta.pkl: run "
                        f"`python data/shakespeare_char/prepare.py` in {folder} first")
    return data


def nanogpt_train(folder, out_dir, log_path):
    """nanoGPT's README CPU run in its own checkout; {"wall_s", "cpu_s", "ckpt"}."""
    nanogpt_char_data(folder)
    command = [sys.executable, "train.py", *NANOGPT_CPU_TRAIN, f"--out_dir={out_dir}"]
    result = run_one_thread(command, folder, log_path)
    ckpt = Path(out_dir) / "ckpt.pt"
    if not ckpt.is_file():
        raise RuntimeError(f"nanoGPT's train.py wrote no {ckpt} (log: {log_path})")
    return {**result, "ckpt": ckpt}


def full_split_val_loss(ckpt_path, meta_path=None, data_dir="data", dataset="shakespeare_char", batch_size=32):
    """(mean loss over the whole val split in consecutive block_size windows, iter_num):
    the windows train.py's --eval_iters=0 uses, for any checkpoint sample.py can load
    (ours or nanoGPT's)."""
    import torch

    from gptkit.data import dataset as ds
    from gptkit.ops.checkpoint import load_checkpoint
    from gptkit.models.loading import model_from_checkpoint

    ckpt = load_checkpoint(ckpt_path)
    iter_num = ckpt.get("iter_num")
    model, _, _ = model_from_checkpoint(ckpt, str(ckpt_path), meta=meta_path)
    model.eval()
    meta = ds.load_meta(data_dir, dataset)
    T = model.config.block_size
    batches = ds.Batches(data_dir, dataset, meta, T, "cpu")
    total, count = 0.0, 0
    try:
        with torch.inference_mode():
            for offsets in ds.eval_offsets(0, "val", batches.n_tokens("val"), T, batch_size, 0):
                x, y = batches.get("val", offsets)
                total += model(x, y)[1].item() * len(offsets)
                count += len(offsets)
    finally:
        batches.close()
    return total / count, iter_num
