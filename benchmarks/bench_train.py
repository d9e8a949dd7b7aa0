"""Training speed: ms per iteration, tokens/s and MFU of train.py's own loop.

    python bench.py train                                   # CPU: quick start and nanoGPT's CPU shape
    python bench.py train --model gpt2 --block_size 1024    # GPU: GPT-2 124M (scripts/gpu_check.sh)

Each row runs `train.main` in this process on a generated dataset (random token
ids: speed does not depend on the text) for --iters steps and reports medians
over the steps after --warmup. MFU is against the measured fp32 matmul peak on a
CPU and the datasheet bf16 peak on CUDA. The runs use learning_rate 0, so the val
loss never improves and no checkpoint is written (the optimizer still does all of
its arithmetic): the table measures training, not the disk.
"""

import contextlib
import io
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

SHAPES = {
    # configs/shakespeare.py's model and batch (read from the file below)
    "quickstart": None,
    # nanoGPT README's "I only have a CPU" run: 4 layers, 4 heads, 128 wide, context 64, batch 12
    "nanogpt_cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, bias=False, vocab_size=65),
    # GPT-2 small as configs/gpt2.py trains it, one micro-batch per step on one device
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, batch_size=12, bias=True,
                 vocab_size=50257, pad_vocab_multiple=64),
}


def add_arguments(parser):
    parser.add_argument("--model", default="quickstart,nanogpt_cpu", help="comma-separated: " + ", ".join(SHAPES))
    parser.add_argument("--iters", type=int, default=30, help="training steps per row (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of the medians (default 5)")
    parser.add_argument("--block_size", type=int, default=None, help="override the shape's context length")
    parser.add_argument("--batch_size", type=int, default=None, help="override the shape's micro-batch")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda (default auto)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument("--compile", default="auto", help="auto (on for CUDA), true, false")


# Settings of a config file that describe the run, not the model or the step.
NOT_MEASURED = ("out_dir", "dataset", "data_dir", "eval_interval", "eval_iters", "log_interval", "max_iters",
                "lr_decay_iters", "warmup_iters", "init_from", "wandb_log", "wandb_project", "wandb_run_name")


def quickstart_shape():
    """configs/shakespeare.py's model, batch and optimizer, exactly as it trains."""
    from gptkit.config import read_config_file

    cfg = read_config_file(REPO / "configs" / "shakespeare.py")
    shape = {k: v for k, v in cfg.items() if k not in NOT_MEASURED}
    shape["vocab_size"] = 65  # Tiny Shakespeare's characters
    return shape


def write_random_dataset(folder, vocab_size, n_train=2_000_000, n_val=200_000, seed=0):
    dtype = "uint16" if vocab_size <= 65536 else "uint32"
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    rng.integers(0, vocab_size, n_train).astype(dtype).tofile(folder / "train.bin")
    rng.integers(0, vocab_size, n_val).astype(dtype).tofile(folder / "val.bin")
    # A character vocabulary of the same size even for GPT-2's 50,257 ids: speed does not
    # depend on the tokenizer, and GPT-2's BPE files would need a network (or a local copy).
    tokenizer = {"type": "char", "chars": [chr(32 + i) for i in range(vocab_size)]}
    meta = {"format_version": 1, "tokenizer": tokenizer, "vocab_size": vocab_size, "dtype": dtype,
            "eot_id": None, "num_tokens": {"train": n_train, "val": n_val}, "sources": [],
            "split": {"rule": "random ids for benchmarking", "val_fraction": 0.1}, "fingerprint": "random"}
    (folder / "meta.json").write_text(json.dumps(meta))


def measure(name, shape, args, tmp):
    """(config.json, median ms/iter, median tokens/s, last train record) of one train.py run."""
    import torch

    import train

    data_dir, out_dir = Path(tmp) / "data", Path(tmp) / f"out-{name}"
    write_random_dataset(data_dir / name, shape["vocab_size"])
    settings = {k: v for k, v in shape.items() if k != "vocab_size"}
    settings.update(
        dataset=name, data_dir=data_dir, out_dir=out_dir, max_iters=args.iters, eval_interval=10**9,
        eval_iters=1, log_interval=1, learning_rate=0.0, always_save_checkpoint="false", dropout=0.0,
        gradient_accumulation_steps=1, warmup_iters=0, device=args.device, dtype=args.dtype,
        compile=args.compile, progress_bar="false",
    )
    if torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()  # each row's own peak, not the process's so far
    with contextlib.redirect_stdout(io.StringIO()):
        code = train.main([f"--{k}={v}" for k, v in settings.items()])
    assert code == 0, f"train.py exited with {code}"
    config = json.loads((out_dir / "config.json").read_text())
    steps = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["kind"] == "train"][args.warmup :]
    assert steps, f"--iters {args.iters} leaves no steps after --warmup {args.warmup}"
    ms = statistics.median(r["ms_per_iter"] for r in steps)
    tokens_per_s = statistics.median(r["tokens_per_s"] for r in steps)
    return config, ms, tokens_per_s, steps[-1]


def compile_cell(config):
    """What really ran: "true", "false", or "failed (the error's type)" when train.py fell back to eager."""
    if config["compile"] != "failed":
        return config["compile"]
    return f"failed ({config.get('compile_error', '').split(':')[0]})"


def memory_cell(record):
    """Peak CUDA memory of the run, allocated / reserved, in GB; n/a on a CPU."""
    if record.get("mem_peak_gb") is None:
        return "n/a"
    return f"{record['mem_peak_gb']:.2f} / {record['mem_reserved_gb']:.2f}"


def run(args):
    from benchmarks.report import Table
    from gptkit.train.mfu import estimate_mfu, measure_matmul_flops, peak_flops_for_device
    from gptkit.models.shapes import meta_model
    from model import GPTConfig

    names = [n.strip() for n in args.model.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown --model {unknown}: choose from {', '.join(SHAPES)}")
    table = Table(
        "train: train.py's loop, one device",
        ["shape", "params (M)", "block", "batch", "device", "dtype", "compile", "ms/iter", "tokens/s", "MFU",
         "peak mem GB (alloc / reserved)"],
        note=f"Medians over steps {args.warmup}..{args.iters - 1}; random token ids; learning_rate 0 (no checkpoint "
        "writes). MFU: 6N + 12LTd FLOPs per token against the measured fp32 matmul peak on CPU, the datasheet "
        "bf16 peak on CUDA. compile: what ran (failed: train.py fell back to eager). Peak memory: "
        "torch.cuda.max_memory_allocated / max_memory_reserved over the run.",
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            shape = dict(quickstart_shape() if name == "quickstart" else SHAPES[name])
            if args.block_size:
                shape["block_size"] = args.block_size
            if args.batch_size:
                shape["batch_size"] = args.batch_size
            config, ms, tokens_per_s, last = measure(name, shape, args, tmp)
            model_cfg = GPTConfig(**{f: config[f] for f in GPTConfig.__dataclass_fields__})
            device = config["device"]
            if device.startswith("cuda"):
                peak = peak_flops_for_device(device)
            else:
                peak = getattr(args, "cpu_peak_flops", None) or measure_matmul_flops("cpu")
            mfu = f"{100 * estimate_mfu(model_cfg, tokens_per_s, peak):.1f}%" if peak else "n/a"
            params = meta_model(model_cfg).num_params() / 1e6  # no memory allocated
            table.add_row(name, params, shape["block_size"], shape["batch_size"], device, config["dtype"],
                          compile_cell(config), ms, tokens_per_s, mfu, memory_cell(last))
    return [table]
