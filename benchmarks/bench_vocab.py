"""Which tokenizer for Tiny Shakespeare? The quick-start model trained with each, at one budget.

    python bench.py vocab                       # char, BPE 512 / 2,048 / 8,192, GPT-2 BPE; 100 iterations each
    python bench.py vocab --max_iters 20 --vocabs 512 --only char,bpe   # a quick smoke run

Every run is configs/shakespeare.py (the quick start's model, block 64, batch
32, Muon) for the same number of iterations, so every model sees the
same number of training *tokens* (a BPE token holds more text than a
character, which is the point of BPE). Afterwards the final weights are scored
on the whole validation split in non-overlapping windows: the summed loss over
the targets in nats, per token and per UTF-8 byte of the targets (bits per
byte = nats / (ln 2 * bytes)), the only one of the two that compares
tokenizers. ms/iter is the median of train.py's own log (eager, no compile).
"""

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_prepare import REPO, shakespeare


def add_arguments(parser):
    parser.add_argument("--max_iters", type=int, default=100, help="training iterations per run (default 100)")
    parser.add_argument("--vocabs", default="512,2048,8192", help="BPE vocabulary sizes (default 512,2048,8192)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    parser.add_argument("--only", default="char,bpe,gpt2", help="which kinds to run (default char,bpe,gpt2)")


def byte_lengths(tokenizer):
    """UTF-8 bytes each id decodes to. The tokenizers' own token_byte_lengths() when they
    have it; otherwise computed here for char and GPT-2 (its end-of-text id: 0 bytes)."""
    import numpy as np

    if hasattr(tokenizer, "token_byte_lengths"):
        return np.asarray(tokenizer.token_byte_lengths(), dtype=np.int64)
    if hasattr(tokenizer, "chars"):
        return np.array([len(c.encode("utf-8")) for c in tokenizer.chars], dtype=np.int64)
    enc = tokenizer.encoding
    lengths = [0 if i == tokenizer.eot_id else len(enc.decode_single_token_bytes(i)) for i in range(enc.n_vocab)]
    return np.array(lengths, dtype=np.int64)


def score_val(ckpt_path, val_bin, dtype):
    """(summed nats, targets, target bytes, parameters) of the checkpoint's model on the whole val split."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from gptkit.models.loading import load_model

    model, tokenizer, _ = load_model(ckpt=str(ckpt_path))
    lengths = torch.from_numpy(byte_lengths(tokenizer))
    ids = torch.from_numpy(np.fromfile(val_bin, dtype=dtype).astype(np.int64))
    T = model.config.block_size
    n_windows = (len(ids) - 1) // T
    x = ids[: n_windows * T].view(n_windows, T)  # (N, T)
    y = ids[1 : n_windows * T + 1].view(n_windows, T)  # (N, T): every target once
    nats = 0.0
    with torch.no_grad():
        for i in range(0, n_windows, 64):
            logits, _ = model(x[i : i + 64])  # (b, T, V)
            nats += F.cross_entropy(logits.float().flatten(0, 1), y[i : i + 64].flatten(), reduction="sum").item()
    return nats, y.numel(), int(lengths[y].sum()), model.num_params()


def run(args):
    from benchmarks.report import Table
    from gptkit.prepare import build

    vocabs = [int(v) for v in args.vocabs.split(",") if v.strip()]
    runs = [("char", "char", None)] + [(f"BPE {v:,}", "bpe", v) for v in vocabs] + [("GPT-2 BPE", "gpt2", None)]
    runs = [r for r in runs if r[1] in args.only.split(",")]
    table = Table(
        f"tokenizers on Tiny Shakespeare: configs/shakespeare.py for {args.max_iters} iterations each "
        f"(the same {args.max_iters * 32 * 64:,} training tokens)",
        ["tokenizer", "vocab", "train tokens", "val bytes/token", "params", "ms/iter", "val loss (nats/token)", "val bits/byte"],
        note="Final weights, whole validation split (nanoGPT's last 10%), non-overlapping 64-token windows; "
        "bits/byte = summed nats / (ln 2 x UTF-8 bytes of the scored targets). Each run once, one after "
        "another, on a machine shared with other jobs: ms/iter is indicative. The BPEs are trained by "
        "prepare.py on the training split only.",
    )
    # One thread: on a machine shared with other jobs, torch's thread pool spin-waits and runs
    # several times slower than a single thread (measured here: 4.8 s/iter for char with 2 threads).
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory(prefix="bench_vocab_") as tmp:
        data = Path(tmp) / "data"
        for label, kind, vocab in runs:
            name = f"sh_{kind}{vocab or ''}"
            folder = build.prepare_dataset(
                [str(shakespeare())], kind, name, str(data), progress=False, vocab_size=vocab
            )
            meta = json.loads((folder / "meta.json").read_text())
            out = Path(tmp) / f"out-{name}"
            settings = {
                "dataset": name, "data_dir": str(data), "out_dir": str(out), "max_iters": args.max_iters,
                "lr_decay_iters": args.max_iters, "eval_interval": args.max_iters, "eval_iters": 5,
                "log_interval": 10, "compile": "false", "progress_bar": "false", "wandb_log": "false",
            }
            cmd = [sys.executable, str(REPO / "train.py"), str(REPO / "configs" / "shakespeare.py")]
            cmd += [f"--{k}={v}" for k, v in settings.items()]
            done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"train.py failed for {label}:\n{done.stderr[-2000:]}")
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            ms = statistics.median(r["ms_per_iter"] for r in rows if r.get("kind") == "train" and r["iter"] >= 10)
            nats, n_targets, n_bytes, n_params = score_val(out / "ckpt.pt", folder / "val.bin", meta["dtype"])
            table.add_row(
                label,
                meta["vocab_size"],
                meta["num_tokens"]["train"],
                f"{n_bytes / n_targets:.2f}",
                n_params,
                ms,
                f"{nats / n_targets:.4f}",
                f"{nats / (math.log(2) * n_bytes):.4f}",
            )
            print(table.rows[-1], file=sys.stderr, flush=True)
    return [table]
