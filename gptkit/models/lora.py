"""LoRA: low-rank adapters trained beside a frozen model (Hu et al. 2021, "LoRA:
Low-Rank Adaptation of Large Language Models").

Each chosen linear layer W (out x in) keeps its weights and gains two small
matrices, A (r x in) and B (out x r), so that it computes

    y = W x + b + (alpha / r) · B (A dropout(x))

Only A and B train. B starts at zero, so at step 0 the model is exactly the base
model; A starts as nn.Linear's own weights do (Kaiming-uniform with a = √5), as in
peft. Merging folds the adapters into the weights, W + (alpha / r) · B A, after
which the model is a plain GPT again, as fast as the base and exportable anywhere.

LoRA is applied to a built model from outside (model.py stays the architecture):

    lora.apply(model, rank=8, alpha=8, dropout=0.05, targets=("attn.c_attn",))
    lora.adapter_state_dict(model)   # what a LoRA checkpoint saves: the A and B matrices
    lora.merge(model)                # plain weights again, e.g. to sample or export

    python train.py configs/finetune_shakespeare_lora.py       # docs/lora.md
"""

import hashlib
import math
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptkit.ops.errors import UserError
from gptkit.models.shapes import blocks, vocabulary_matrices

TARGETS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # the block's matrices, by module name
ADAPTER_MARK = ".lora_"  # adapter parameter names end in .lora_A or .lora_B


class LoRALinear(nn.Linear):
    """An nn.Linear with a low-rank update beside it. The weight and bias are the
    original layer's own Parameters (same names, same tensors), so the base's state
    dict keys and its weight tying are unchanged; lora_A and lora_B are new."""

    def __init__(self, linear, rank, alpha, dropout):
        # Built on the meta device (no memory), then given the original layer's parameters.
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        self.weight = linear.weight
        self.bias = linear.bias
        self.rank, self.alpha = rank, alpha
        self.scaling = alpha / rank
        device, dtype = linear.weight.device, linear.weight.dtype
        self.lora_A = nn.Parameter(torch.empty(rank, linear.in_features, device=device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(linear.out_features, rank, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's init, as peft's lora_A
        self.lora_dropout = nn.Dropout(dropout)

    def forward(self, x):
        update = F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B)  # (..., r) then (..., out)
        return F.linear(x, self.weight, self.bias) + self.scaling * update

    def merged(self):
        """A plain nn.Linear holding W + scaling · B A (and the same bias)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        with torch.no_grad():
            delta = (self.lora_B.float() @ self.lora_A.float()) * self.scaling  # (out, in), in fp32
            linear.weight = nn.Parameter((self.weight.float() + delta).to(self.weight.dtype), requires_grad=False)
        linear.bias = self.bias
        return linear


def parse_targets(text):
    """'attn.c_attn,attn.c_proj' -> ('attn.c_attn', 'attn.c_proj'); 'all' is every target.
    ValueError naming the allowed names for anything else."""
    names = tuple(dict.fromkeys(s.strip() for s in str(text).split(",") if s.strip()))
    if names == ("all",):
        return TARGETS
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:
        raise ValueError(f"lora_targets={text!r}: each must be one of {', '.join(TARGETS)} (comma-separated) or all")
    return names


def check_rank(model, rank, targets):
    """UserError unless `rank` is at most the smaller side of every layer it adapts: the
    update B·A of an (out, in) layer has rank at most min(out, in), so a larger rank only
    adds parameters (and memory: B and A grow with it) that cannot change what it learns."""
    block = blocks(model)[1][0]
    for target in targets:
        try:
            layer = block.get_submodule(target)
        except AttributeError:
            raise UserError(f"lora_targets: model.py's blocks have no {target} (renamed in model.py? "
                            f"its modules: {', '.join(n for n, _ in block.named_modules() if n)})") from None
        if type(layer) is not nn.Linear:
            raise UserError(f"lora_targets: {target} is a {type(layer).__name__} in model.py, not an nn.Linear")
        width = min(layer.in_features, layer.out_features)
        if rank > width:
            raise UserError(
                f"lora_rank={rank} is above what {target} ({layer.in_features} in, {layer.out_features} out) can use: "
                f"its update has rank at most {width}, so the rest would only take memory; use lora_rank <= {width} "
                f"(LoRA's usual ranks are 4 to 64)"
            )


def apply(model, rank, alpha, dropout, targets):
    """Freeze every parameter of `model` and give each target layer of every block a
    LoRALinear; returns the model (changed in place). `targets` are names from TARGETS."""
    for p in model.parameters():
        p.requires_grad_(False)
    for block in blocks(model)[1]:
        for target in targets:
            owner_name, _, layer_name = target.rpartition(".")
            owner = block.get_submodule(owner_name)
            layer = getattr(owner, layer_name)
            assert type(layer) is nn.Linear, f"{target} is a {type(layer).__name__}, not an nn.Linear"
            setattr(owner, layer_name, LoRALinear(layer, rank, alpha, dropout))
    model.lora_spec = {"rank": rank, "alpha": alpha, "dropout": dropout, "targets": list(targets)}
    return model


@contextmanager
def disabled(model):
    """The base alone inside the block (every adapter's scale 0, nothing copied): the
    frozen reference of rl.py's DPO and KL term when it trains adapters."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    scales = [m.scaling for m in layers]
    for m in layers:
        m.scaling = 0.0
    try:
        yield model
    finally:
        for m, scale in zip(layers, scales):
            m.scaling = scale


def is_applied(model):
    return any(isinstance(m, LoRALinear) for m in model.modules())


def merge(model):
    """Fold every adapter into its weights and put plain nn.Linear layers back; the
    model computes the same function (up to rounding) and trains no more adapters."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, name, child.merged())
    model.__dict__.pop("lora_spec", None)
    return model


def train_token_embedding(model):
    """Let the token embedding and output layer train beside the adapters (peft's
    modules_to_save), as a model that gained ids needs: a chat run's new turn tokens
    (gptkit/data/chat.py) start as the mean row and must learn their own. They are saved
    with the adapters, and the model's grown vocab_size with the LoRA settings."""
    params = dict(model.named_parameters(remove_duplicate=False))
    names = vocabulary_matrices(model)  # both names, tied or not
    for name in names:
        params[name].requires_grad_(True)
    model.lora_spec["trained"] = names
    model.lora_spec["vocab_size"] = model.config.vocab_size


def adapter_state_dict(model):
    """{name: tensor} of the adapters, e.g. 'transformer.h.0.attn.c_attn.lora_A', and of the
    weights trained beside them (train_token_embedding)."""
    trained = set(getattr(model, "lora_spec", {}).get("trained", []))
    return {k: v for k, v in model.state_dict().items() if ADAPTER_MARK in k or k in trained}


def load_adapters(model, adapters, source):
    """Copy saved adapters into a model LoRA was applied to with the same settings."""
    expected = adapter_state_dict(model)
    missing = sorted(expected.keys() - adapters.keys())
    unexpected = sorted(adapters.keys() - expected.keys())
    wrong = [f"{k} {tuple(adapters[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items()
             if k in adapters and (not torch.is_tensor(adapters[k]) or adapters[k].shape != v.shape)]
    if missing or unexpected or wrong:
        parts = [f"{label} {', '.join(items[:3])}" for label, items in
                 (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)) if items]
        raise UserError(f"the adapters in {source} do not fit their base with the saved LoRA settings: {'; '.join(parts)}")
    model.load_state_dict(adapters, strict=False)


def fingerprint(model):
    """sha256 of the base model's tensors (adapters left out): each name, dtype, shape
    and bytes in name order. The same weights give the same fingerprint whatever file
    format they came in; any changed value changes it."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if ADAPTER_MARK in name:
            continue
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy())  # the raw bytes, without a copy
    return "sha256:" + digest.hexdigest()


def summary(model):
    """One line for the start of a run: what trains, out of how much."""
    spec = model.lora_spec
    adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    also = " but its token embedding, which trains for the new turn tokens" if spec.get("trained") else ""
    return (f"LoRA rank {spec['rank']} (alpha {spec['alpha']:g}, scale {spec['alpha'] / spec['rank']:g}) on "
            f"{', '.join(spec['targets'])}: {adapters:,} trainable parameters ({adapters / total:.2%} of {total:,}); "
            f"base {spec['base']['init_from']} frozen{also}")
