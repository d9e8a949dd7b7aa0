"""The model a run starts from (scratch, its own checkpoint, or GPT-2), and the
forward pass through torch.compile with an eager fallback."""

import dataclasses
import sys
from pathlib import Path

import torch

from gptkit.checkpoint import load_checkpoint
from gptkit.errors import UserError
from model import GPT, GPTConfig

PRETRAINED = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def init_model(model_cfg, cfg, meta, out_dir):
    """(raw model, model config, checkpoint or None) for init_from; checks the vocabulary."""
    if cfg.init_from == "scratch":
        model_cfg = dataclasses.replace(model_cfg, vocab_size=meta["vocab_size"])
        return GPT(model_cfg), model_cfg, None
    if cfg.init_from == "resume":
        ckpt = load_checkpoint(Path(out_dir) / "ckpt.pt")
        saved = GPTConfig(**ckpt["model_config"])
        if ckpt.get("tokenizer") != meta["tokenizer"] or saved.vocab_size != meta["vocab_size"]:
            raise UserError(
                f"vocabulary mismatch: {out_dir}/ckpt.pt was trained with a {describe_vocab(ckpt.get('tokenizer'), saved.vocab_size)} "
                f"vocabulary, but dataset {cfg.dataset} has a {describe_vocab(meta['tokenizer'], meta['vocab_size'])} one: "
                "resume on the checkpoint's dataset (--dataset) or start a new out_dir"
            )
        if ckpt.get("data_fingerprint") != meta.get("fingerprint"):
            print(f"warning: dataset {cfg.dataset} differs from the one {out_dir}/ckpt.pt was trained on (fingerprint changed)")
        differing = [f.name for f in dataclasses.fields(GPTConfig) if f.name not in ("vocab_size", "dropout") and getattr(saved, f.name) != getattr(model_cfg, f.name)]
        if differing:
            print(f"note: resuming keeps the checkpoint's model settings; ignoring {', '.join(differing)}")
        model_cfg = dataclasses.replace(saved, dropout=model_cfg.dropout)
        model = GPT(model_cfg)
        model.load_state_dict(ckpt["model"])
        return model, model_cfg, ckpt
    if cfg.init_from in PRETRAINED or Path(cfg.init_from).is_dir():
        from gptkit.interop.hf_gpt2 import load_gpt2

        if meta["tokenizer"].get("type") != "gpt2":
            raise UserError(
                f"vocabulary mismatch: init_from={cfg.init_from} uses GPT-2's BPE vocabulary, but dataset "
                f"{cfg.dataset} has a {describe_vocab(meta['tokenizer'], meta['vocab_size'])} one: prepare it with --tokenizer gpt2"
            )
        model = load_gpt2(cfg.init_from, dropout=model_cfg.dropout)
        if model_cfg.block_size < model.config.block_size:
            model.crop_block_size(model_cfg.block_size)
        return model, model.config, None
    raise UserError(
        f"init_from={cfg.init_from!r} is not scratch, resume, {', '.join(PRETRAINED)} or an existing folder"
    )


def describe_vocab(tokenizer, vocab_size):
    kind = tokenizer.get("type") if isinstance(tokenizer, dict) else tokenizer
    return f"{kind} ({vocab_size} tokens)"


class Forward:
    """model(x, y) through torch.compile, falling back to eager (with a warning naming
    the error) when compilation fails: a broken backend fails at the first forward
    pass, not at torch.compile() (RELIABILITY.md)."""

    def __init__(self, eager, use_compile):
        self.eager = eager
        self.compiled = None
        if use_compile:
            try:
                self.compiled = torch.compile(eager)
            except Exception as e:
                self._fall_back(e)

    def _fall_back(self, e):
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"warning: torch.compile failed ({type(e).__name__}: {first[:300]}); continuing without compile", file=sys.stderr)
        self.compiled = None

    def __call__(self, x, y):
        if self.compiled is not None:
            try:
                return self.compiled(x, y)
            except torch.OutOfMemoryError:
                raise  # not a compile failure: eager would run out of memory too
            except Exception as e:
                self._fall_back(e)
        return self.eager(x, y)


def embedding_heavy_note(model, init_from, share_limit=0.5):
    """A note for a model from scratch whose parameters are mostly token embedding and
    output layer (a large vocabulary on a small model, e.g. GPT-2 BPE on the quick
    start: 94% of 13.65M), else None. The output layer's V x d matrix product then
    dominates every step too, so such a run is many times slower per step."""
    if init_from != "scratch":
        return None  # GPT-2's own shape, or a run already chosen
    total = model.num_params()
    blocks = model.num_params(non_embedding=True)
    embedding = total - blocks
    if embedding <= share_limit * total:
        return None
    c = model.config
    return (
        f"note: {embedding / 1e6:.2f}M of the {total / 1e6:.2f}M parameters ({embedding / total:.0%}) are the token "
        f"embedding and output layer (vocabulary {c.vocab_size:,} x width {c.n_embd}), {blocks / 1e6:.2f}M the blocks; "
        "the output layer's matrix product dominates each step. For a model this small, prepare the data with "
        "a smaller vocabulary (python prepare.py --input ... --tokenizer char), or fine-tune GPT-2, whose "
        "embedding is already trained (configs/finetune_shakespeare.py)"
    )
