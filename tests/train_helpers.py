"""Helpers for the train.py tests: a tiny dataset written by hand (the meta.json
schema of prepare.py), tiny-model arguments, and running train.py in-process or
in a subprocess."""

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from repo import REPO, SHAKESPEARE


def sample_text(n_chars=60_000):
    """Tiny Shakespeare's first n_chars when a local copy is found (repo.SHAKESPEARE), else
    a generated stand-in of the same shape: speakers' names, lines of words, every
    character Tiny Shakespeare uses, and enough distinct words for a BPE to learn merges."""
    if SHAKESPEARE.is_file():
        return SHAKESPEARE.read_text()[:n_chars]
    return stand_in_text(n_chars)


def stand_in_text(n_chars, seed=0):
    rng = np.random.default_rng(seed)
    syllables = ["th", "ou", "ar", "st", "en", "in", "wh", "er", "an", "ly", "ght", "ow", "qu", "iz",
                 "ve", "ck", "ju", "ex", "ro", "me", "da", "yo", "ph", "ing", "be", "ful"]
    words = ["".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(400)]
    names = ["ROMEO", "JULIET", "KING HENRY VI", "QUEEN MARGARET", "FIRST CITIZEN", "BAPTISTA", "XAVIER", "ZOUNDS"]
    marks = [",", ".", ";", "!", "?", ":", " -", "'s", "", "", "", ""]
    text = "FIRST CITIZEN:\nBefore we proceed any further, hear me speak: 3 $ & jolly quiz!\n\n"
    while len(text) < n_chars:
        line = " ".join(rng.choice(words) + rng.choice(marks) for _ in range(rng.integers(4, 10)))
        text += f"{rng.choice(names)}:\n{line.capitalize()}\n\n"
    return text[:n_chars]


def write_char_dataset(data_dir, name="tiny", text=None, val_fraction=0.1):
    """data_dir/name/{train.bin,val.bin,meta.json} for a character-level text."""
    text = sample_text() if text is None else text
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], dtype=np.uint16)
    n_val = int(len(ids) * val_fraction)
    folder = Path(data_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    ids[:-n_val].tofile(folder / "train.bin")
    ids[-n_val:].tofile(folder / "val.bin")
    meta = {
        "format_version": 1,
        "tokenizer": {"type": "char", "chars": chars},
        "vocab_size": len(chars),
        "dtype": "uint16",
        "eot_id": None,
        "num_tokens": {"train": int(len(ids) - n_val), "val": int(n_val)},
        "sources": [{"path": "generated", "bytes": len(text), "sha256": hashlib.sha256(text.encode()).hexdigest()}],
        "split": {"rule": "the last val_fraction of the characters", "val_fraction": val_fraction},
        "fingerprint": hashlib.sha256((text + str(chars)).encode()).hexdigest(),
    }
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def tiny_args(data_dir, out_dir, dataset="tiny", **overrides):
    """Command-line settings for a ~30k-parameter model that steps in milliseconds."""
    settings = {
        "dataset": dataset,
        "data_dir": data_dir,
        "out_dir": out_dir,
        "n_layer": 2,
        "n_head": 2,
        "n_embd": 32,
        "block_size": 32,
        "batch_size": 4,
        "gradient_accumulation_steps": 2,
        "dropout": 0.1,
        "learning_rate": 1e-2,
        "max_iters": 20,
        "warmup_iters": 2,
        "lr_decay_iters": 40,
        "min_lr": 1e-3,
        "eval_interval": 10,
        "eval_iters": 2,
        "log_interval": 1,
        "device": "cpu",
        "dtype": "float32",
        "compile": "false",
        "progress_bar": "false",
    }
    settings.update(overrides)
    return [f"--{k}={v}" for k, v in settings.items()]


def read_metrics(out_dir, kind=None):
    path = Path(out_dir) / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in records if kind is None or r["kind"] == kind]


def losses_by_iter(out_dir):
    return {r["iter"]: r["loss"] for r in read_metrics(out_dir, "train")}


def subprocess_env(**extra):
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.pop("GPT_FAULTS", None)
    env.update(extra)
    return env


def run_train_subprocess(args, timeout=180, **env):
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=REPO,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_torchrun(args, nproc=2, timeout=300, cwd=None, **env):
    """train.py under torchrun with `nproc` gloo ranks on this CPU."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
         str(REPO / "train.py"), *args],
        cwd=cwd or REPO, env=subprocess_env(**env), capture_output=True, text=True, timeout=timeout,
    )


def write_base_checkpoint(path, data_dir):
    """A tiny char-level checkpoint of ours, the base of a LoRA run (init_from=FILE)."""
    import torch

    from gptkit.ops.checkpoint import save_checkpoint
    from model import GPT, GPTConfig

    meta = json.loads((data_dir / "tiny" / "meta.json").read_text())
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=meta["vocab_size"])
    save_checkpoint({"format_version": 1, "model": GPT(config).state_dict(), "model_config": dataclasses.asdict(config),
                     "tokenizer": meta["tokenizer"]}, path)
    return path


def perturbed_model(config, seed=0):
    """A GPT whose norm gains and biases are not 1 and 0, so any mix-up shows in the logits."""
    import torch

    from model import GPT

    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def write_run(folder, model, tokenizer_dict):
    """folder/ckpt.pt holding `model` as a run of ours (weights, config, tokenizer)."""
    import dataclasses

    from gptkit.ops.checkpoint import FORMAT_VERSION, save_checkpoint

    save_checkpoint({
        "format_version": FORMAT_VERSION, "model": model.state_dict(),
        "model_config": dataclasses.asdict(model.config), "tokenizer": tokenizer_dict, "iter_num": 7,
    }, Path(folder) / "ckpt.pt")
    return Path(folder)


def one_process_run(root, **overrides):
    """An uninterrupted run in one process at one thread (each torchrun worker's kernels) on
    a tiny char dataset, in root / "one": what the distributed runs are compared against."""
    import torch

    import train

    data = write_char_dataset(root / "data").parent
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert train.main(tiny_args(data, root / "one", **overrides)) == 0
    finally:
        torch.set_num_threads(threads)
    return root
