"""The model's shapes, found by what its parts are: its blocks, its vocabulary matrices, the
number of blocks a checkpoint holds, and a model built with shapes only (no memory).

Code outside model.py (Muon, LoRA, FSDP, loading a checkpoint, the MFU meter, lab.py's
parameter report) finds the model's parts here, not by their names, so a learner who
renames `lm_head` or `transformer.h` in model.py still trains, loads and samples. This
module imports model.py and nothing else of the project's (but UserError, from the
standard-library-only gptkit/ops/errors.py), so sampling, serving and loading sit low
in the import graph.
"""

import torch
import torch.nn as nn

from gptkit.ops.errors import UserError
from model import GPT


class ShapesOnly(torch.overrides.TorchFunctionMode):
    """Around building a model whose shapes alone are wanted: torch.empty, which every
    nn.Linear and nn.Embedding makes its weight with, gives meta tensors (shapes, no
    memory), and in-place initialisers (nn.init's normal_, zero_, ...) leave meta tensors
    alone; the rest (a norm's ones, a table of RoPE angles) is computed as usual. Not
    `with torch.device("meta")`: under it every operation runs PyTorch's reference
    implementations, whose first use imports torch.compile's machinery, about a second of
    start-up for each command that checks a checkpoint's shapes (measured)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.empty:
            kwargs = {**kwargs, "device": "meta"}
        name = getattr(func, "__name__", "")
        target = args[0] if args else kwargs.get("tensor")  # nn.init's functions pass tensor=
        if name.endswith("_") and not name.startswith("__") and getattr(target, "is_meta", False):
            return target
        return func(*args, **kwargs)


def meta_model(config):
    """GPT(config) with its matrices on the meta device: shapes only, no memory for them."""
    with ShapesOnly():
        return GPT(config)


def blocks(model):
    """(name, nn.ModuleList) of the model's Transformer blocks: model.py's transformer.h,
    found by what it is (the first module list of config.n_layer modules that holds
    matrices), not by its name, so code that treats the blocks apart (Muon, LoRA, FSDP)
    still runs after a learner renames them in model.py."""
    for name, module in model.named_modules():
        if (isinstance(module, nn.ModuleList) and len(module) == model.config.n_layer
                and any(p.ndim == 2 for p in module.parameters())):
            return name, module
    raise UserError(f"model.py's GPT has no list of its {model.config.n_layer} blocks (an nn.ModuleList of "
                    "n_layer modules with matrices, transformer.h as written)")


def vocabulary_matrices(model):
    """Names of the token embedding's and the output layer's matrices (both, tied or not:
    model.py's transformer.wte.weight and lm_head.weight), found by what they are, outside
    the blocks: the first nn.Embedding with a row per token of the padded vocabulary (a
    position table of as many rows comes after it), then every nn.Linear with an output
    per token."""
    inside, vocab = blocks(model)[0] + ".", model.config.padded_vocab_size
    outside = [(name, m) for name, m in model.named_modules(remove_duplicate=False) if not name.startswith(inside)]
    tables = [name for name, m in outside if isinstance(m, nn.Embedding) and m.num_embeddings == vocab]
    heads = [name for name, m in outside if isinstance(m, nn.Linear) and m.out_features == vocab]
    return [f"{name}.weight" for name in tables[:1] + heads]


def blocks_held(state):
    """How many blocks a state dict holds, whatever model.py names them: the most numbered
    children of any one module in its names ('transformer.h.0.attn...' ... 'h.5...': 6)."""
    numbered = {}
    for key in state:
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            if part.isdigit():
                numbered.setdefault(tuple(parts[:i]), set()).add(part)
    return max(map(len, numbered.values()), default=0)
