"""OpenAI's GPT-2 weights in and out, in the Hugging Face format.

A Hugging Face GPT-2 folder holds `config.json` and `model.safetensors` (or the older
`pytorch_model.bin`). Our parameter names are GPT-2's, so loading is a rename plus one
twist: GPT-2 stores its projections as `Conv1D` weights of shape (in, out), the
transpose of `nn.Linear`'s (out, in).

    python -c "from gptkit.interop import hf_gpt2; m = hf_gpt2.load_gpt2('gpt2')"   # downloads once, when online
    python -c "from gptkit.interop import hf_gpt2; m = hf_gpt2.load_gpt2('path/to/folder')"
    python convert.py out-mine hf-mine --to hf      # a checkpoint out (gptkit/interop/export.py)

Nothing is unpickled: safetensors holds only tensors, and .bin files are read with
torch.load(weights_only=True).
"""

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from gptkit.ops.atomic import atomic_write
from gptkit.ops.checkpoint import load_checkpoint
from gptkit.ops.errors import UserError
from gptkit.prepare.download import fetch_whole
from model import GPT, GPTConfig, NORM_EPS

HUB_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # 124M, 350M, 774M, 1558M
HUB_URL = "https://huggingface.co/openai-community/{name}/resolve/main/{file}"
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GPT2_EOT_ID = 50256
# The most a download may bring (no listing gives the size): gpt2-xl's weights are 6.4 GB.
HUB_FILE_BYTES = {"config.json": 1 << 20, "model.safetensors": 8 << 30}


def default_cache_dir():
    return Path(os.environ.get("GPT2_CACHE_DIR", Path.home() / ".cache" / "gpt2_weights"))


def hub_folder(name, cache_dir=None):
    """The local folder holding hub model `name`, downloading its files when missing."""
    folder = Path(cache_dir or default_cache_dir()) / name
    folder.mkdir(parents=True, exist_ok=True)
    for file in ("config.json", "model.safetensors"):
        if (folder / file).is_file():
            continue
        url = HUB_URL.format(name=name, file=file)
        fetch_whole(url, folder / file, HUB_FILE_BYTES[file], name, hint=(
            ". Offline? Pass a local folder in Hugging Face format instead (config.json plus model.safetensors or "
            "pytorch_model.bin), e.g. one written by GPT2LMHeadModel.save_pretrained, or copy the files into "
            f"{folder}"))
    return folder


def config_from_hf(hf, dropout=0.0):
    """A GPTConfig from a Hugging Face GPT-2 config.json dict; UserError for what we can't run."""
    if hf.get("model_type") != "gpt2":
        raise UserError(f"config.json has model_type={hf.get('model_type')!r}; only 'gpt2' models load here")
    unsupported = []
    activation = hf.get("activation_function", "gelu_new")
    if activation not in ("gelu_new", "gelu_pytorch_tanh", "gelu"):
        unsupported.append(f"activation_function={activation!r} (we run gelu_new and gelu)")
    if hf.get("layer_norm_epsilon", NORM_EPS) != NORM_EPS:
        unsupported.append(f"layer_norm_epsilon={hf['layer_norm_epsilon']} (we use {NORM_EPS})")
    if hf.get("scale_attn_by_inverse_layer_idx", False) or not hf.get("scale_attn_weights", True):
        unsupported.append("non-standard attention scaling")
    if unsupported:
        raise UserError("this GPT-2 variant is not supported: " + "; ".join(unsupported))
    try:
        return GPTConfig(
            block_size=hf["n_positions"], vocab_size=hf["vocab_size"], n_layer=hf["n_layer"],
            n_head=hf["n_head"], n_embd=hf["n_embd"], mlp_hidden=hf.get("n_inner"), dropout=dropout,
            tie_embeddings=hf.get("tie_word_embeddings", True),
            mlp="gelu_exact" if activation == "gelu" else "gelu",
        )
    except KeyError as e:
        raise UserError(f"config.json lacks {e}, which every GPT-2 config has")


def read_weights(folder):
    """The state dict stored in a Hugging Face folder (safetensors preferred)."""
    if (folder / "model.safetensors").is_file():
        path = folder / "model.safetensors"
        try:
            return load_file(path)
        except Exception as e:  # safetensors raises its own error types for damaged files
            raise UserError(f"{path} is not a readable safetensors file: {e}")
    path = folder / "pytorch_model.bin"
    if not path.is_file():
        raise UserError(f"{folder} holds neither model.safetensors nor pytorch_model.bin")
    return load_checkpoint(path)  # weights_only=True; a pickled object is refused, never "load it anyway"


def load_gpt2(name_or_path, dropout=0.0, cache_dir=None):
    """A GPT with pretrained GPT-2 weights, from a hub name (see HUB_NAMES) or a local folder."""
    folder = Path(name_or_path)
    if not folder.is_dir():
        if str(name_or_path) not in HUB_NAMES:
            raise UserError(f"{name_or_path} is neither a folder nor one of {', '.join(HUB_NAMES)}")
        folder = hub_folder(str(name_or_path), cache_dir)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise UserError(f"{folder} has no config.json: it is not a Hugging Face model folder")
    try:
        hf_config = json.loads(config_path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{config_path} is not valid JSON: {e}")
    model = GPT(config_from_hf(hf_config, dropout))

    theirs = {}
    for key, tensor in read_weights(folder).items():
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # causal-mask buffers in older checkpoints, not weights
        key = key if key.startswith(("transformer.", "lm_head.")) else "transformer." + key
        theirs[key] = tensor.t() if key.endswith(CONV1D_WEIGHTS) else tensor
    if model.config.tie_embeddings:
        theirs.pop("lm_head.weight", None)  # the same matrix as wte
    ours = model.state_dict()
    if model.config.tie_embeddings:
        ours.pop("lm_head.weight")
    missing, unexpected = sorted(ours.keys() - theirs.keys()), sorted(theirs.keys() - ours.keys())
    if missing or unexpected:
        raise UserError(f"weights in {folder} do not match a GPT-2: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for key, target in ours.items():
            if theirs[key].shape != target.shape:
                raise UserError(f"{key} in {folder} has shape {tuple(theirs[key].shape)}, expected {tuple(target.shape)}")
            target.copy_(theirs[key])
    return model


ACTIVATIONS = {"gelu": "gelu_new", "gelu_exact": "gelu"}  # our mlp -> transformers' activation_function


def gpt2_mismatches(c):
    """What in GPTConfig `c` a GPT2LMHeadModel cannot hold, as 'setting=value (GPT-2 needs ...)'."""
    differences = {
        "pos_encoding": (c.pos_encoding, "learned"), "norm": (c.norm, "layernorm"),
        "norm_placement": (c.norm_placement, "pre"), "bias": (c.bias, True),
        "tie_embeddings": (c.tie_embeddings, True), "qk_norm": (c.qk_norm, False),
        "n_kv_head": (c.kv_heads, c.n_head), "logit_softcap": (c.logit_softcap, None),
    }
    wrong = [f"{name}={have!r} (GPT-2 needs {need!r})" for name, (have, need) in differences.items() if have != need]
    if c.mlp not in ACTIVATIONS:
        wrong.insert(3, f"mlp={c.mlp!r} (GPT-2 needs {' or '.join(map(repr, ACTIVATIONS))})")
    return wrong


def export_gpt2(model, folder, eos_token_id=GPT2_EOT_ID):
    """Write `model` as a Hugging Face GPT2LMHeadModel folder (config.json + model.safetensors);
    `eos_token_id` is its tokenizer's end of text (None for a character vocabulary)."""
    c = model.config
    wrong = gpt2_mismatches(c)
    if wrong:
        raise UserError("only GPT-2-shaped models export to the GPT-2 format: " + ", ".join(wrong))
    tensors = {}
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight":
            continue  # tied to wte; transformers ties it again on load
        if key == "transformer.wte.weight":
            tensor = tensor[: c.vocab_size]  # drop padding rows
        tensors[key] = (tensor.t() if key.endswith(CONV1D_WEIGHTS) else tensor).detach().float().contiguous().cpu()
    eot = eos_token_id if eos_token_id is not None and eos_token_id < c.vocab_size else None
    hf_config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": ACTIVATIONS[c.mlp],
        "vocab_size": c.vocab_size, "n_positions": c.block_size, "n_embd": c.n_embd, "n_layer": c.n_layer,
        "n_head": c.n_head, "n_inner": None if c.hidden_size == 4 * c.n_embd else c.hidden_size,
        "layer_norm_epsilon": NORM_EPS, "resid_pdrop": c.dropout, "embd_pdrop": c.dropout, "attn_pdrop": c.dropout,
        "tie_word_embeddings": True, "bos_token_id": eot, "eos_token_id": eot,
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
