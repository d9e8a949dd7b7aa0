"""Chat training's two pure parts: packing whole conversations into windows, and the
exact target-only loss over a step's micro-batches.

Packing: best-fit (as nanochat's): conversations longest first, each into the open
window with the least room that still holds it, else a new window; a window is
padded with mask-0 tokens. A conversation never straddles two windows, so every
target sees its whole conversation from the start; an earlier conversation in the
same window is only context (its markers close it), and no window is without targets.

Loss: the sum of the target tokens' cross-entropy over every micro-batch and rank,
divided by the global target count (one all-reduce of the count), not a mean of
per-batch means.
"""

import torch
import torch.nn.functional as F

from gptkit.errors import UserError


def pack_best_fit(conversations, window, pad_id):
    """conversations: list of (ids, mask) lists; window: tokens per window (block_size + 1).
    Returns (ids, mask) lists of whole windows, each of length `window`."""
    order = sorted(range(len(conversations)), key=lambda i: -len(conversations[i][0]))
    bins = []  # [room, ids, mask]
    for i in order:
        ids, mask = conversations[i]
        if len(ids) > window:
            raise UserError(f"conversation {i} has {len(ids)} tokens, more than a window of {window}")
        fits = [b for b in bins if b[0] >= len(ids)]
        b = min(fits, key=lambda b: b[0]) if fits else None
        if b is None:
            b = [window, [], []]
            bins.append(b)
        b[1] += ids
        b[2] += mask
        b[0] -= len(ids)
    out_ids, out_mask = [], []
    for room, ids, mask in bins:
        out_ids += ids + [pad_id] * room
        out_mask += mask + [0] * room
    return out_ids, out_mask


def target_loss_sum(logits, targets, mask):
    """Summed cross-entropy of the masked targets and their count.
    logits (B, T, V), targets (B, T) int64, mask (B, T) bool."""
    losses = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")  # (B*T,)
    m = mask.flatten()
    return (losses * m).sum(), m.sum()


def global_target_count(masks, group=None):
    """Targets in one optimizer step: every micro-batch's mask on this rank, summed over ranks."""
    count = torch.stack([m.sum() for m in masks]).sum().to(torch.float64)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(count, group=group)
    return count
