"""Read checkpoints written by nanoGPT's train.py, so nanoGPT users keep their models.

nanoGPT saves `ckpt.pt` as {"model": state_dict, "model_args": {...}, "iter_num",
"best_val_loss", "config", "optimizer"}: plain dicts and tensors, which
`torch.load(weights_only=True)` reads. Its GPT uses GPT-2's parameter names, as
ours does, so the weights map name for name once three differences are handled:

- a model saved after `torch.compile` carries an `_orig_mod.` prefix on every key
  (and a DDP-wrapped one `module.`): stripped;
- older nanoGPT versions saved the causal mask as a buffer `attn.bias`: dropped
  (our model builds its own mask);
- GPT-2 BPE models are often padded to vocab 50304 (nanoGPT's train_gpt2 does it
  for speed): we load them as vocab 50257 padded to a multiple of 64, so the
  padded ids are never sampled.

A character-level nanoGPT model keeps its vocabulary in `data/<dataset>/meta.pkl`,
a pickle of {"vocab_size", "itos", "stoi"}. Unpickling can run code, so we read it
with an unpickler that refuses every global lookup: only the built-in pickle
opcodes for dicts, strings and ints work, which is all a genuine meta.pkl holds.

    python sample.py --ckpt ../nanoGPT/out-shakespeare-char/ckpt.pt --meta ../nanoGPT/data/shakespeare_char/meta.pkl
"""

import io
import math
import pickle
import re
from pathlib import Path

from gptkit.ops.errors import UserError

GPT2_VOCAB = 50257  # GPT-2's BPE vocabulary
GPT2_PADDED_VOCAB = 50304  # 50257 rounded up to a multiple of 64, as nanoGPT's train_gpt2 pads it
WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile and DDP wrappers


def is_nanogpt_checkpoint(ckpt):
    """True for a dict in nanoGPT's layout (its `model_args` key is the tell)."""
    return isinstance(ckpt, dict) and isinstance(ckpt.get("model_args"), dict) and "model" in ckpt


def strip_wrapper_prefixes(state_dict):
    """Remove `_orig_mod.` / `module.` prefixes (possibly nested) from every key."""
    out = {}
    for key, value in state_dict.items():
        stripped = True
        while stripped:
            stripped = False
            for prefix in WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key, stripped = key[len(prefix):], True
        out[key] = value
    return out


def nanogpt_state_dict(ckpt):
    """nanoGPT's weights under our names: wrapper prefixes stripped, mask buffers dropped."""
    state = strip_wrapper_prefixes(ckpt["model"])
    # `.attn.bias` (the old causal-mask buffer) and HF's `.attn.masked_bias` are not
    # weights; `.attn.c_attn.bias` (a real bias) ends differently and is kept.
    return {k: v for k, v in state.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}


def nanogpt_model_config(ckpt, tokenizer_vocab_size):
    """GPTConfig keyword arguments for a nanoGPT checkpoint: GPT-2's architecture
    (learned positions, pre-LayerNorm, GELU MLP, tied embeddings) at its shape."""
    args = ckpt["model_args"]
    missing = [k for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size") if k not in args]
    if missing:
        raise UserError(f"nanoGPT checkpoint has no {', '.join(missing)} in its model_args")
    model_vocab = int(args["vocab_size"])
    if tokenizer_vocab_size > model_vocab:
        raise UserError(
            f"the tokenizer has {tokenizer_vocab_size} tokens but the nanoGPT model only {model_vocab}: "
            "wrong meta.pkl? pass the one from the dataset the model was trained on with --meta"
        )
    # Rows beyond the tokenizer's vocabulary are padding: keep them in the table
    # but never predict them. Pick a multiple that reproduces the table's size.
    if model_vocab == tokenizer_vocab_size:
        pad_multiple = 1
    elif math.ceil(tokenizer_vocab_size / 64) * 64 == model_vocab:
        pad_multiple = 64
    else:
        pad_multiple = model_vocab
    return {
        "n_layer": int(args["n_layer"]),
        "n_head": int(args["n_head"]),
        "n_embd": int(args["n_embd"]),
        "block_size": int(args["block_size"]),
        "bias": bool(args.get("bias", True)),  # nanoGPT's GPTConfig default is bias=True
        "vocab_size": tokenizer_vocab_size,
        "pad_vocab_multiple": pad_multiple,
        "dropout": 0.0,  # sampling: no dropout
        "pos_encoding": "learned",
        "norm": "layernorm",
        "norm_placement": "pre",
        "mlp": "gelu_exact",  # nanoGPT's nn.GELU() is the erf form, not GPT-2's tanh
        "tie_embeddings": True,
    }


def nanogpt_tokenizer_dict(ckpt, data_dir="data", meta_path=None):
    """(tokenizer description, where it came from) for a nanoGPT checkpoint.

    The vocabulary comes from `meta_path` when given, else from
    `data_dir/<config['dataset']>/meta.pkl` when it exists; without one, a model
    with GPT-2's vocabulary size (50257, or 50304 padded) uses GPT-2 BPE."""
    if meta_path is not None:
        return char_tokenizer_from_meta(read_meta_pkl(meta_path)), str(meta_path)
    config = ckpt.get("config") if isinstance(ckpt.get("config"), dict) else {}
    dataset = config.get("dataset")
    if isinstance(dataset, str) and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", dataset):
        dataset = None  # not a plain folder name (e.g. "../../x"): never look outside data_dir
    if isinstance(dataset, str) and dataset:
        candidate = Path(data_dir) / dataset / "meta.pkl"
        if candidate.is_file():
            return char_tokenizer_from_meta(read_meta_pkl(candidate)), str(candidate)
    vocab = int(ckpt["model_args"].get("vocab_size", 0))
    if vocab in (GPT2_VOCAB, GPT2_PADDED_VOCAB):
        return {"type": "gpt2"}, "GPT-2 BPE (no meta.pkl; vocabulary size 50257/50304)"
    where = f"{Path(data_dir) / dataset / 'meta.pkl'}" if dataset else "data/<dataset>/meta.pkl"
    raise UserError(
        f"this nanoGPT checkpoint has a {vocab}-token vocabulary but its meta.pkl was not found "
        f"(looked for {where}): pass it with --meta PATH, or --data_dir to the folder holding <dataset>/meta.pkl"
    )


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle asked for a class or function: it is more than plain data."""


class PlainDataUnpickler(pickle.Unpickler):
    """An unpickler that can build only dicts, lists, strings and numbers.

    Anything that needs a global (a class, a function such as os.system) goes
    through `find_class`, which we refuse, so a crafted file cannot run code."""

    def find_class(self, module, name):
        raise RefusedGlobal(f"it asks for {module}.{name}, and only plain data is allowed")


def read_meta_pkl(path):
    """Read nanoGPT's meta.pkl safely; UserError naming the file if it is missing,
    damaged or holds anything but plain data."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"meta file {path} does not exist")
    except OSError as e:
        raise UserError(f"could not read meta file {path}: {e}")
    try:
        meta = PlainDataUnpickler(io.BytesIO(data)).load()
    except RefusedGlobal as e:
        raise UserError(f"refusing to load {path}: unpickling it could run code ({e})")
    except Exception as e:  # a damaged pickle raises EOFError, ValueError, KeyError, ...
        raise UserError(f"{path} is not a readable meta.pkl ({type(e).__name__}: {e})")
    if not isinstance(meta, dict):
        raise UserError(f"{path} is not a nanoGPT meta.pkl: expected a dict, found {type(meta).__name__}")
    return meta


def char_tokenizer_from_meta(meta):
    """Our {"type": "char", "chars": [...]} from nanoGPT's {"itos": {id: char}, ...}."""
    itos = meta.get("itos")
    if not isinstance(itos, dict) or not itos:
        raise UserError("meta.pkl has no 'itos' table: not a character-level nanoGPT meta.pkl")
    if not all(isinstance(i, int) for i in itos):
        raise UserError("meta.pkl's 'itos' must map integer ids to characters")
    ids = sorted(itos)
    if ids != list(range(len(ids))) or not all(isinstance(itos[i], str) and len(itos[i]) == 1 for i in ids):
        raise UserError("meta.pkl's 'itos' must map ids 0..N-1 to single characters")
    return {"type": "char", "chars": [itos[i] for i in ids]}
