"""Full fine-tuning against LoRA: peak memory and time per step.

    python bench.py lora                        # GPT-2 124M and 355M shapes, random weights, CPU
    python bench.py lora --shapes 124M --steps 3
    python bench.py lora --device cuda --shapes 124M,355M,1.5B --block_size 1024 --batch_size 8

Each case runs in a fresh process (benchmarks/lora_worker.py), so that its peak
memory is its own: on a CPU the resident set's high-water mark (ru_maxrss, which
includes Python, torch and the model's construction), on a GPU the CUDA
allocator's peak. LoRA is rank 8 on attn.c_attn (scale 1), the base frozen in
fp32. The ratios are the result: absolute times on a shared CPU are noisy.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.report import Table

REPO = Path(__file__).resolve().parent.parent
MODES = ("full", "lora8")


def add_arguments(parser):
    parser.add_argument("--shapes", default="124M,355M", help="comma-separated GPT-2 shapes: 124M, 355M, 1.5B")
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--block_size", type=int, default=256, help="tokens per window (default 256)")
    parser.add_argument("--batch_size", type=int, default=1, help="windows per step (default 1)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per case; the first is not timed")


def measure(shape, mode, args, folder):
    out = Path(folder) / f"{shape}-{mode}.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "lora_worker.py"), shape, mode, args.device,
         str(args.block_size), str(args.batch_size), str(args.steps), str(out)],
        env=env, capture_output=True, text=True, timeout=3600,
    )
    if result.returncode != 0:
        raise RuntimeError(f"LoRA worker failed ({shape}, {mode}): {result.stderr[-2000:]}")
    return json.loads(out.read_text())


def run(args):
    peak = "peak RSS MB" if args.device == "cpu" else "peak CUDA MB"
    table = Table(
        f"Full fine-tuning vs LoRA rank 8 (attn.c_attn), {args.device}, fp32, batch {args.batch_size}x{args.block_size}, AdamW",
        ["shape", "mode", "trainable params", "params MB", "grads MB", "AdamW MB", peak, "ms/step", "memory vs full", "time vs full"],
    )
    with tempfile.TemporaryDirectory() as folder:
        for shape in args.shapes.split(","):
            full = None
            for mode in MODES:
                r = measure(shape, mode, args, folder)
                full = full or r
                table.add_row(shape, mode, r["trainable"], r["params_mb"], r["grads_mb"], r["adamw_mb"], r["peak_mb"],
                              r["ms_per_step"], f"{r['peak_mb'] / full['peak_mb']:.2f}x", f"{r['ms_per_step'] / full['ms_per_step']:.2f}x")
    table.note = ("Random weights, one process per case. LoRA keeps the whole base (here in fp32) and still "
                  "back-propagates through every layer; it saves the base's gradients, their AdamW moments, the "
                  "inputs autograd keeps only for weight gradients, and the time to compute and apply them.")
    return [table]
