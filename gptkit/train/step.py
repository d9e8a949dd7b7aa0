"""What every optimizer step does besides the forward and backward passes: clip the
gradient norm, set the learning rate. train.py's train_step and rl.py's updates call
these same two, so that the two commands clip and schedule alike; like the step, they
use torch alone (tests/test_layout.py holds them to the step's rule).

    grad_norm = clip_gradients(model, max_norm)   # the norm before clipping
    set_lr(optimizers, lr_scale)                  # every group at its peak rate x lr_scale
"""

import torch


def clip_gradients(model, max_norm):
    """The global gradient norm (all ranks' shards under FSDP), after clipping it to
    max_norm when max_norm > 0 (the norm returned is the one before clipping)."""
    params = [p for p in model.parameters() if p.grad is not None]
    if max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP: a DTensor's total


def set_lr(optimizers, scale):
    """Set every group's rate to its peak rate ("base_lr", from optim.make_optimizers)
    times `scale`, the schedule's factor (optim.lr_scale): Muon follows AdamW's schedule."""
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * scale
