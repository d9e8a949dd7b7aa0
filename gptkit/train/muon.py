"""Muon: momentum whose update is orthogonalised, for the hidden weight matrices.

Muon (Keller Jordan, 2024, https://kellerjordan.github.io/posts/muon/ and
https://github.com/KellerJordan/Muon) keeps SGD momentum for each 2-D weight
matrix, then replaces the update by its nearest semi-orthogonal matrix U·Vᵀ
(from the SVD U·S·Vᵀ of the momentum) before applying it. Every direction of
the update then moves by the same amount, so rare directions are not drowned
out by the dominant ones. The SVD is too slow, so a few Newton–Schulz
iterations approximate U·Vᵀ with matrix products only.

Muon is meant for the matrices inside the Transformer blocks; embeddings, the
output head, norm gains and biases stay with AdamW (same sources; the
speedrun's recipe). `split_params_for_muon` makes that split; `optim.py` builds
both optimizers from it, e.g. when training with

    python train.py configs/shakespeare.py --optimizer=muon

Under DDP the gradients are already averaged across ranks before `step()`, so
every rank computes the same update from the same numbers: this optimizer
needs no communication of its own. Under FSDP each rank holds a shard of every
matrix: `orthogonalize_whole` gathers the matrix first (one all-gather each).
"""

import torch

from gptkit.ops.device import matmul_dtype
from gptkit.models.shapes import blocks

# Coefficients of the quintic p(x) = a·x + b·x³ + c·x⁵ applied to the singular
# values, from Keller Jordan's Muon (zeropower_via_newtonschulz5). They are
# chosen to make the slope at 0 as large as possible (a = 3.4445), so small
# singular values grow fast, while still keeping every value inside roughly
# [0.7, 1.2] after 5 steps instead of converging exactly to 1; the post
# reports that this inexactness does not hurt training.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)

# Added to the Frobenius norm before dividing, so an all-zero gradient stays
# zero instead of becoming NaN (same value as the reference implementation).
NS_EPS = 1e-7


def orthogonalize(G, steps=5):
    """Approximately replace G (rows, cols) by U·Vᵀ from its SVD G = U·S·Vᵀ.

    Returns a tensor of G's shape and dtype whose singular values lie in about
    [0.68, 1.2] (measured on random matrices; tiny singular values of nearly
    singular G grow less). Runs in bfloat16 on GPUs that compute it natively, as
    the reference does, in float16 on older GPUs (V100, T4), which only emulate
    bfloat16, and in float32 on CPUs, where bfloat16 matrix products are slow
    (gptkit.ops.device.matmul_dtype).
    """
    assert G.ndim == 2, f"orthogonalize expects a matrix, got shape {tuple(G.shape)}"
    a, b, c = NS_COEFFICIENTS
    # The iteration only converges for singular values in (0, √3); dividing by
    # the Frobenius norm (≥ the largest singular value) puts them all in (0, 1].
    # Normalised in G's own dtype first: the norm of a large gradient can exceed
    # float16's range (65504), the normalised entries cannot.
    X = (G / (G.norm() + NS_EPS)).to(matmul_dtype(G.device))
    tall = G.size(0) > G.size(1)
    if tall:
        # Work on the wide orientation so X @ Xᵀ is the smaller Gram matrix.
        X = X.mT  # (cols, rows)
    for _ in range(steps):
        A = X @ X.mT  # (r, r) with r = min(rows, cols)
        B = b * A + c * (A @ A)  # (r, r)
        X = a * X + B @ X  # each singular value s becomes a·s + b·s³ + c·s⁵
    if tall:
        X = X.mT  # (rows, cols)
    return X.to(G.dtype)


def orthogonalize_whole(G, steps=5):
    """orthogonalize(G), also when G is an FSDP shard (a DTensor).

    Newton–Schulz needs the whole matrix: gather it, orthogonalise it on every
    rank (the same numbers everywhere, as under DDP, which also orthogonalises
    every matrix on every rank), and keep this rank's rows of the result. One
    all-gather per matrix and one whole matrix in memory at a time."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(G, DTensor):
        return orthogonalize(G, steps)
    whole = orthogonalize(G.full_tensor(), steps)  # (rows, cols)
    # src_data_rank=None: every rank cuts its own shard from its own copy, no traffic.
    return distribute_tensor(whole, G.device_mesh, G.placements, src_data_rank=None)


class Muon(torch.optim.Optimizer):
    """Orthogonalised momentum for 2-D parameters; see the module docstring.

    params: tensors or (name, tensor) pairs (names appear in error messages).
    lr: step size of the orthogonalised update (0.02, Keller Jordan's Muon).
    momentum: 0.95 (same source); nesterov: look ahead along the momentum.
    weight_decay: decoupled, as in AdamW: p ← p·(1 − lr·weight_decay).
    cautious_wd: decay only the entries this step's update also moves toward zero
        (cautious weight decay, Chen et al. 2025; nanochat's Muon).
    normuon: divide each output neuron's (row's) update by its running RMS, then
        rescale the whole to the orthogonalised update's norm (NorMuon, Li et al. 2025).
    """

    def __init__(self, params, lr=0.02, momentum=0.95, nesterov=True, ns_steps=5, weight_decay=0.0,
                 cautious_wd=False, normuon=False):
        if not lr >= 0.0:
            raise ValueError(f"Muon lr must be >= 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Muon momentum must be in [0, 1), got {momentum}")
        if not (isinstance(ns_steps, int) and ns_steps >= 1):
            raise ValueError(f"Muon ns_steps must be a whole number >= 1, got {ns_steps!r}")
        if not weight_decay >= 0.0:
            raise ValueError(f"Muon weight_decay must be >= 0, got {weight_decay}")
        defaults = dict(
            lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, weight_decay=weight_decay,
            cautious_wd=cautious_wd, normuon=normuon,
        )
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        # Called for every group, by __init__ too: reject anything that is not a
        # matrix here, before a step could fail halfway through.
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        names = group.get("param_names") or [None] * len(group["params"])
        for p, name in zip(group["params"], names):
            if p.ndim != 2:
                self.param_groups.pop()
                what = f"parameter '{name}'" if name else "a parameter"
                raise ValueError(
                    f"Muon only handles 2-D weight matrices, but {what} has shape "
                    f"{tuple(p.shape)}: give it to AdamW instead (see split_params_for_muon)"
                )

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, beta = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                # Momentum as an exponential average (the reference's current
                # form). Up to a constant factor, which the normalisation in
                # orthogonalize removes, this is SGD's buf = beta·buf + g.
                buf.lerp_(g, 1 - beta)
                # Nesterov: step along (1 - beta)·g + beta·buf, a look-ahead.
                direction = g.lerp(buf, beta) if group["nesterov"] else buf
                update = orthogonalize_whole(direction, steps=group["ns_steps"])
                if group.get("normuon"):  # .get: state saved before the setting existed
                    update = normalize_neurons(update, state)
                # Scale by sqrt(max(1, rows/cols)) so tall matrices (e.g. the
                # MLP's c_fc, 4C x C) get an update whose per-element size
                # matches a square one's (Keller Jordan's Muon, muon_update).
                rows, cols = p.shape
                scale = max(1.0, rows / cols) ** 0.5
                if group["weight_decay"] > 0 and group.get("cautious_wd"):
                    # Only where update and weight share a sign: there the step
                    # itself pulls the weight toward zero, and the decay agrees.
                    p.sub_(p * (update * p > 0), alpha=lr * group["weight_decay"])
                elif group["weight_decay"] > 0:
                    p.mul_(1 - lr * group["weight_decay"])
                p.add_(update, alpha=-lr * scale)
        return loss


# NorMuon's running average of each neuron's squared update (its beta2, the paper's).
NORMUON_BETA = 0.95


def normalize_neurons(update, state):
    """NorMuon's step on an orthogonalised update (rows = output neurons).

    Orthogonalising makes every direction move alike, but some rows (neurons) can
    still get much larger updates than others; dividing each row by its running
    RMS evens them out, as Adam does per entry. The result is rescaled to the
    orthogonalised update's Frobenius norm, so muon_lr keeps its meaning."""
    row_mean_sq = update.square().mean(dim=1, keepdim=True)  # (rows, 1)
    if "neuron_second_moment" not in state:
        state["neuron_second_moment"] = torch.zeros_like(row_mean_sq)
    v = state["neuron_second_moment"]
    v.lerp_(row_mean_sq, 1 - NORMUON_BETA)
    normed = update / (v.sqrt() + NS_EPS)
    return normed * (update.norm() / (normed.norm() + NS_EPS))


def split_params_for_muon(model):
    """([(name, p)] for Muon, [(name, p)] for AdamW) covering every trainable parameter.

    Muon gets each 2-D parameter inside the Transformer blocks (model.py's
    transformer.h, found by what it is: gptkit/models/params.py's blocks): attention and MLP
    matrices. AdamW gets the rest: token/position embeddings, the output head, norm
    gains and biases; the Muon post explains that embeddings and the head are not
    hidden-layer matrices and do better with AdamW. `named_parameters()` lists a tied
    lm_head/wte weight once, so it lands in exactly one list.
    """
    if not hasattr(model, "config"):
        raise ValueError(f"{type(model).__name__} is not model.py's GPT: pass the raw GPT, not a DDP- or "
                         "torch.compile-wrapped one")
    prefix = blocks(model)[0] + "."
    muon, adamw = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name.startswith(prefix) and p.ndim == 2:
            muon.append((name, p))
        else:
            adamw.append((name, p))
    return muon, adamw
