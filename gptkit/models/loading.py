"""Find a checkpoint and build the GPT it holds: ours, nanoGPT's, or OpenAI's GPT-2.

Checkpoints load with weights_only=True (gptkit.ops.checkpoint): a file holding
pickled code is refused before anything in it runs. A LoRA run's checkpoint holds
only its adapters: its base is loaded from where the run recorded it, checked
against the run's fingerprint of it, and the adapters merged in (gptkit/models/lora.py),
so sample.py, eval.py and every convert.py export get one plain GPT.
"""

import dataclasses
from pathlib import Path

import torch

from gptkit.models import lora
from gptkit.ops.checkpoint import FORMAT_VERSION, checked_model_config, load_checkpoint, non_finite_tensors
from gptkit.config import read_config_file
from gptkit.ops.errors import UserError
from gptkit.interop.hf_gpt2 import HUB_NAMES
from gptkit.models.shapes import blocks_held, meta_model, vocabulary_matrices
from gptkit.ops.paths import shown
from gptkit.interop.nanogpt import (
    is_nanogpt_checkpoint,
    nanogpt_model_config,
    nanogpt_state_dict,
    nanogpt_tokenizer_dict,
    strip_wrapper_prefixes,
)
from gptkit.data.tokenizer import tokenizer_from_dict

CHECKPOINT_NAMES = ("best.pt", "ckpt.pt")  # best.pt first: the weights with the lowest val loss
CONFIGS = Path(__file__).resolve().parents[2] / "configs"  # the shipped configs, beside gptkit/


def find_checkpoint(out_dir, ckpt=None):
    """What to load: `ckpt` when given, else best.pt or ckpt.pt in `out_dir`, else the
    sharded checkpoint of an FSDP run there (a folder, out_dir/ckpt/)."""
    if ckpt:
        return Path(ckpt)
    folder = Path(out_dir)
    try:
        folder.stat()
    except (FileNotFoundError, NotADirectoryError):
        pass  # said below, with how to train one
    except OSError as e:  # a name too long for the system, a loop of symlinks
        raise UserError(f"cannot read out_dir {shown(folder)}: {e.strerror}")
    for name in CHECKPOINT_NAMES:
        if (folder / name).is_file():
            return folder / name
    if any((folder / name).is_dir() for name in ("ckpt", ".ckpt.old")) or (folder / ".metadata").is_file():
        from gptkit.ops import sharded  # torch.distributed: imported for FSDP runs only

        found = folder if sharded.is_complete(folder) else sharded.find(folder)
        if found is not None:
            return found
    how = f"train one first with {training_command(folder)}, or pass --out_dir DIR or --ckpt FILE"
    if not folder.is_dir():
        raise UserError(f"no checkpoint: the folder {folder} does not exist; {how}")
    raise UserError(f"no checkpoint in {folder} (looked for {' and '.join(CHECKPOINT_NAMES)} and an FSDP run's ckpt/); {how}")


def read_checkpoint(path):
    """The checkpoint dict at `path`: a one-file checkpoint, or an FSDP run's sharded
    folder's weights, checked as resume checks it (gptkit/ops/sharded.py)."""
    path = Path(path)
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        pass  # load_checkpoint says so, with how to train one
    except OSError as e:
        raise UserError(f"cannot read checkpoint {shown(path)}: {e.strerror}")
    if path.is_dir():
        from gptkit.ops import sharded

        if not sharded.is_complete(path):
            raise UserError(f"{path} is a folder, not a checkpoint: give a .pt file, a run's out_dir or its ckpt/ folder")
        return sharded.read_weights(path)
    return load_checkpoint(path, map_location="cpu")  # UserError for a missing, damaged or unsafe file


def training_command(out_dir, configs=CONFIGS):
    """The train.py command that writes `out_dir`: the shipped config whose out_dir it is,
    else the quick start's config pointed at that folder."""
    for path in sorted(Path(configs).glob("*.py")):
        try:
            if read_config_file(path).get("out_dir") == Path(out_dir).as_posix():
                return f"python train.py configs/{path.name}"
        except UserError:
            continue  # a broken config is not ours to report here
    return f"python train.py configs/shakespeare.py --out_dir={out_dir}"




def load_weights(model, state_dict, source, check_only=False):
    """Copy weights into `model`, explaining any mismatch instead of a traceback.
    Buffers the file lacks (e.g. a mask the model builds itself) keep the model's values.
    check_only: only compare names and shapes (e.g. against a model on the meta device)."""
    target = model.state_dict()
    buffers = {name for name, _ in model.named_buffers()}
    missing = [k for k in target if k not in state_dict and k not in buffers]
    unexpected = [k for k in state_dict if k not in target]
    wrong_shape = [
        f"{k} {tuple(v.shape)} vs {tuple(target[k].shape)}"
        for k, v in state_dict.items()
        if k in target and (not torch.is_tensor(v) or v.shape != target[k].shape)
    ]
    if missing or unexpected or wrong_shape:
        parts = [
            f"{label} {', '.join(items[:4])}{' ...' if len(items) > 4 else ''}"
            for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong_shape))
            if items
        ]
        raise UserError(f"the weights in {source} do not fit the model its config describes: {'; '.join(parts)}")
    if not check_only:
        model.load_state_dict(state_dict, strict=False)


def model_from_checkpoint(ckpt, source, data_dir="data", meta=None):
    """(GPT in eval mode, tokenizer, one-line summary) from a loaded checkpoint dict:
    ours (format_version, model_config, tokenizer) or nanoGPT's (model_args)."""
    from model import GPT  # imported here so `sample.py --help` stays quick

    if not isinstance(ckpt, dict):
        raise UserError(f"{source} is not a checkpoint: it holds a {type(ckpt).__name__}, not a dict")
    if is_nanogpt_checkpoint(ckpt):
        tokenizer_dict, tokenizer_source = nanogpt_tokenizer_dict(ckpt, data_dir, meta)
        tokenizer = tokenizer_from_dict(tokenizer_dict)
        model_kwargs = nanogpt_model_config(ckpt, tokenizer.vocab_size)
        state = nanogpt_state_dict(ckpt)
        described = f"nanoGPT checkpoint, vocabulary from {tokenizer_source}"
        val_loss = ckpt.get("best_val_loss")
    elif all(k in ckpt for k in ("model", "model_config", "tokenizer")):
        version = ckpt.get("format_version", FORMAT_VERSION)
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise UserError(
                f"{source} has format_version {version!r}; this sample.py reads up to {FORMAT_VERSION}: update the code"
            )
        tokenizer = tokenizer_from_dict(ckpt["tokenizer"])
        model_kwargs = dict(ckpt["model_config"]) if isinstance(ckpt["model_config"], dict) else ckpt["model_config"]
        state = strip_wrapper_prefixes(ckpt["model"])
        described = f"{ckpt['tokenizer'].get('type')} tokenizer"
        if ckpt.get("lora") is not None:  # adapters only: base + adapters, merged
            saved = checked_model_config(model_kwargs, source)
            state = lora.merge(adapted_model(ckpt["lora"], state, source, saved.block_size)).state_dict()
            described += f", LoRA rank {ckpt['lora']['rank']} on {ckpt['lora']['base']['init_from']}, merged"
        val_loss = ckpt.get("val_loss", ckpt.get("best_val_loss"))
    else:
        keys = ", ".join(sorted(map(str, ckpt))[:8]) or "none"
        raise UserError(f"{source} is not a checkpoint of this project or of nanoGPT (its keys: {keys})")

    config = checked_model_config(model_kwargs, source, dropout=0.0)  # sampling never drops out
    if tokenizer.vocab_size > config.vocab_size:
        raise UserError(
            f"{source}: its tokenizer has {tokenizer.vocab_size} tokens but the model only {config.vocab_size}"
        )
    if not isinstance(state, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()):
        raise UserError(f"{source}: its weights are not a dict of named tensors")
    bad = non_finite_tensors(state, "weights")
    if bad:
        raise UserError(f"{source}: {bad[0]} holds NaN or inf; these weights cannot generate text")
    # Build the model's shapes on the meta device first (no memory): the config's sizes
    # must match the tensors the file really holds before anything is allocated. Before
    # even that, two sizes whose shapes would cost time or memory to build are checked
    # against the file, by what its tensors are rather than by model.py's names (a
    # learner's renamed module loads): its blocks and its width.
    held = blocks_held(state)
    if config.n_layer > held:
        raise UserError(f"{source}: its model_config says n_layer={config.n_layer} but the weights hold {held} blocks")
    if not any(config.n_embd in v.shape for v in state.values()):
        raise UserError(f"the weights in {source} do not fit the model its config describes: "
                        f"n_embd={config.n_embd} is the size of none of its tensors")
    try:
        load_weights(meta_model(config), state, source, check_only=True)
    except RuntimeError as e:  # sizes too large to even describe
        raise UserError(f"{source}: its model_config describes an impossible model ({str(e).splitlines()[0]})")
    model = GPT(config)
    load_weights(model, state, source)
    model.eval()

    details = [described]
    if isinstance(ckpt.get("iter_num"), int):
        details.append(f"iteration {ckpt['iter_num']}")
    if val_loss is not None:
        details.append(f"val loss {float(val_loss):.4f}")
    return model, tokenizer, f"loaded {source} ({', '.join(details)})"


def checkpoint_of(init_from):
    """The checkpoint of ours that `init_from` names, or None (a hub name, a Hugging Face
    folder): a checkpoint file; a run folder (best.pt, else ckpt.pt, else its FSDP
    ckpt/, as sample.py picks); an FSDP run's sharded ckpt/ folder itself."""
    path = Path(init_from)
    if path.is_file():
        return path
    if path.is_dir() and (any((path / name).is_file() for name in CHECKPOINT_NAMES)
                          or (path / "ckpt").is_dir() or (path / ".metadata").is_file()):
        return find_checkpoint(path)  # UserError for an incomplete sharded one
    return None


def load_base(init_from, dropout=0.0):
    """(GPT, tokenizer description) to fine-tune or to put adapters on: GPT-2 by hub
    name, a Hugging Face folder, or a checkpoint of ours (checkpoint_of: a file, a run
    folder or a sharded folder; a LoRA run's comes merged)."""
    from model import GPT  # imported here so `sample.py --help` stays quick

    path = checkpoint_of(init_from)
    if path is not None:
        model, tokenizer, _ = model_from_checkpoint(read_checkpoint(path), path)
        if dropout:  # the loaded model never drops out; training may
            trained = GPT(dataclasses.replace(model.config, dropout=dropout))
            trained.load_state_dict(model.state_dict())
            model = trained
        return model.train(), tokenizer.to_dict()
    from gptkit.interop.hf_gpt2 import load_gpt2

    return load_gpt2(init_from, dropout=dropout), {"type": "gpt2"}


def check_lora_record(record, source):
    """A checkpoint's `lora` entry, checked before anything is loaded for it."""
    ok = (isinstance(record, dict) and isinstance(record.get("rank"), int) and record["rank"] > 0
          and isinstance(record.get("alpha"), (int, float)) and isinstance(record.get("targets"), list)
          and isinstance(record.get("base"), dict) and isinstance(record["base"].get("init_from"), str)
          and isinstance(record["base"].get("fingerprint"), str))
    if not ok:
        raise UserError(f"{source}: its LoRA settings are incomplete (rank, alpha, targets, base): it is damaged or not ours")
    try:
        return lora.parse_targets(",".join(record["targets"]))
    except ValueError as e:
        raise UserError(f"{source}: {e}")


def lora_base(record, source, dropout=0.0):
    """The base model a LoRA run's adapters belong to, loaded from where the run
    recorded it; a missing base, or one whose weights changed since, is a UserError
    naming the expected and found fingerprints."""
    where, expected = record["base"]["init_from"], record["base"]["fingerprint"]
    try:
        model, _ = load_base(where, dropout)
    except UserError as e:
        raise UserError(f"{source} holds LoRA adapters for the base {where}, which cannot be loaded (expected "
                        f"fingerprint {short(expected)}, found none): {e}")
    found = lora.fingerprint(model)
    if found != expected:
        raise UserError(f"{source} holds LoRA adapters for the base {where}, whose weights have changed since "
                        f"(expected fingerprint {short(expected)}, found {short(found)}): put the original base back there")
    return model


def short(fingerprint):
    return fingerprint[: len("sha256:") + 16]


def adapted_model(record, adapters, source, block_size, dropout=0.0, lora_dropout=0.0):
    """The base with the run's adapters applied and loaded (not merged): what a LoRA
    run resumes from, and, merged, what sample.py and convert.py read."""
    targets = check_lora_record(record, source)
    model = lora_base(record, source, dropout)
    trained = record.get("trained")
    if trained is not None:  # a chat run on a base without turn tokens: grown, its embedding trained
        vocab_size = record.get("vocab_size")
        if trained != vocabulary_matrices(model) or not isinstance(vocab_size, int) or vocab_size < model.config.vocab_size:
            raise UserError(f"{source}: its LoRA settings name weights trained beside the adapters that this code does not know")
        model.grow_vocab(record["vocab_size"])
    if block_size < model.config.block_size:
        model.crop_block_size(block_size)  # before apply: cropping makes a new (trainable) wpe
    lora.apply(model, record["rank"], float(record["alpha"]), lora_dropout, targets)
    model.lora_spec["base"] = dict(record["base"])
    if trained is not None:
        lora.train_token_embedding(model)
    lora.load_adapters(model, adapters, source)
    return model


def load_model(init_from="resume", out_dir="out-shakespeare", ckpt=None, data_dir="data", meta=None):
    """(GPT on the CPU in eval mode, tokenizer, summary): OpenAI's GPT-2 (init_from a
    name or a Hugging Face folder), or the checkpoint `ckpt`, else best.pt or ckpt.pt in
    out_dir. data_dir and meta locate a nanoGPT checkpoint's vocabulary."""
    if init_from != "resume":
        if init_from not in HUB_NAMES and not Path(init_from).is_dir():
            raise UserError(
                f"init_from={init_from!r} must be resume, one of {', '.join(HUB_NAMES)}, "
                "or a folder in Hugging Face format (config.json and model.safetensors)"
            )
        from gptkit.interop.hf_gpt2 import load_gpt2

        model = load_gpt2(init_from)
        model.eval()
        return model, tokenizer_from_dict({"type": "gpt2"}), f"loaded pretrained {init_from} (GPT-2 BPE)"
    path = find_checkpoint(out_dir, ckpt)
    return model_from_checkpoint(read_checkpoint(path), path, data_dir, meta)
