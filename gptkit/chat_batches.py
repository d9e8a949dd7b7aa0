"""Chat training: packing whole conversations into windows, the batches train.py reads,
the exact target-only loss and its evaluation (the turn tokens' rows: gptkit/chat.py).

Packing: best-fit (as nanochat's): conversations longest first, each into the open
window with the least room that still holds it, else a new window; a window is
padded with mask-0 tokens. A conversation never straddles two windows, so every
target sees its whole conversation from the start; an earlier conversation in the
same window is only context (its markers close it), and no window is without targets.
Why not cut the stream anywhere, as for text: a window starting mid-conversation
would teach replies to questions it cannot see.

Loss: the sum of the target tokens' cross-entropy over every micro-batch and rank,
divided by the global target count (TargetOnlyLoss), not a mean of per-batch means.

    python prepare.py talks --input talks.jsonl --format chat
    python train.py configs/chat_arithmetic.py --dataset=talks
"""

import bisect
import dataclasses
import math
from pathlib import Path

import numpy as np
import torch

from gptkit import scoring
from gptkit.chat import TURN_TOKENS
from gptkit.dataset import EVAL_STREAM
from gptkit.errors import UserError

EVAL_STOP_CHECK = 4  # evaluation batches between agreeing on a stop signal, as train.py


def pack_best_fit(conversations, window, pad_id):
    """conversations: list of (ids, mask) lists; window: tokens per window (block_size + 1).
    Returns (ids, mask) lists of whole windows, each of length `window`."""
    order = sorted(range(len(conversations)), key=lambda i: -len(conversations[i][0]))
    bins = []  # [ids, mask] of each window
    rooms = []  # sorted (room left, window index): the best fit is the first that holds a conversation
    for i in order:
        ids, mask = conversations[i]
        if len(ids) > window:
            raise UserError(f"conversation {i} has {len(ids)} tokens, more than a window of {window}")
        at = bisect.bisect_left(rooms, (len(ids), -1))
        if at == len(rooms):  # none holds it: a new window
            room, b = window, len(bins)
            bins.append([[], []])
        else:
            room, b = rooms.pop(at)
        bins[b][0] += ids
        bins[b][1] += mask
        bisect.insort(rooms, (room - len(ids), b))
    out_ids, out_mask = [], []
    for ids, mask in bins:
        out_ids += ids + [pad_id] * (window - len(ids))
        out_mask += mask + [0] * (window - len(ids))
    return out_ids, out_mask


def conversations_of(ids, mask):
    """Split a chat bin back into its conversations: (ids, targets) lists, cut where
    the mask says 2 (a conversation's first token; gptkit/prepare/chat.py)."""
    starts = [*np.flatnonzero(mask == 2).tolist(), len(ids)]
    ids, targets = ids.tolist(), (mask == 1).astype(np.int64).tolist()
    return [(ids[a:b], targets[a:b]) for a, b in zip(starts, starts[1:])]


class ChatBatches:
    """dataset.Batches for a chat dataset: the same interface (micro_batches, per_rank,
    get, close), over packed windows instead of random offsets.

    At start-up each split's conversations are packed into windows of block_size + 1
    tokens (in memory: chat sets are small). Iteration `step` takes batch_size *
    accumulation windows drawn by a generator seeded with (seed, step), a pure
    function as for text, so resuming repeats the data exactly. y is -1 wherever the
    next token is not a target, which the model's cross-entropy ignores.
    `step_targets` is the current step's target count over the whole global batch:
    every rank computes it from the same windows, so no collective is needed."""

    def __init__(self, data_dir, name, meta, block_size, device, batch_size=None, accumulation=None, seed=0):
        folder = Path(data_dir) / name
        pad = meta["chat"]["turn_ids"]["<|end|>"]  # never a target, only context for more padding
        self.windows, self.targets = {}, {}
        for split in ("train", "val"):
            ids = np.fromfile(folder / f"{split}.bin", dtype=meta["dtype"])
            mask = np.fromfile(folder / f"{split}_mask.bin", dtype=np.uint8)
            try:
                packed_ids, packed_mask = pack_best_fit(conversations_of(ids, mask), block_size + 1, pad)
            except UserError as e:
                raise UserError(f"{folder / (split + '.bin')}: {e} (block_size + 1): train with a larger block_size, or "
                                f"prepare again with --block_size {block_size} --errors skip to leave such conversations out")
            self.windows[split] = torch.tensor(packed_ids, dtype=torch.int64).view(-1, block_size + 1)
            self.targets[split] = torch.tensor(packed_mask, dtype=torch.bool).view(-1, block_size + 1)
        self.block_size, self.vocab_size = block_size, meta["vocab_size"]
        self.device = torch.device(device)
        self.batch_size, self.accumulation, self.seed = batch_size, accumulation, seed
        self.step_targets = None

    def micro_batches(self, step, rank=0, world_size=1):
        rng = np.random.default_rng([self.seed, step])
        rows = rng.integers(0, self.n_windows("train"), size=self.batch_size * self.accumulation)
        self.step_targets = int(self.targets["train"][rows, 1:].sum())
        local = self.per_rank(world_size)
        for chunk in range(rank * local, (rank + 1) * local):
            yield self.get("train", rows[chunk * self.batch_size : (chunk + 1) * self.batch_size])

    def per_rank(self, world_size):
        return self.accumulation // world_size

    def n_windows(self, split):
        return len(self.windows[split])

    def get(self, split, rows):
        """(x, y) of the windows `rows`: (B, T) inputs and targets, -1 where nothing is learned."""
        rows = torch.as_tensor(rows, dtype=torch.int64)
        windows, targets = self.windows[split][rows], self.targets[split][rows]
        x = windows[:, :-1].contiguous()  # (B, T)
        y = torch.where(targets[:, 1:], windows[:, 1:], -1)  # (B, T)
        return x.to(self.device), y.to(self.device)

    def close(self):
        pass


class TargetOnlyLoss:
    """The training step's model(x, y) on chat data: the exact mean over the global batch.

    The model returns the mean over this micro-batch's n targets. train.py's step divides
    each micro-batch's loss by the micro-batches per rank (DDP then averages the ranks),
    so a mean of means; here each loss is rescaled to n * G / N (G micro-batches in all,
    N targets in all), and the step's sum of them over every micro-batch and rank, / G,
    is the sum of every target's loss / N, with the gradient of exactly that."""

    def __init__(self, model, batches):
        self.model, self.batches = model, batches

    def __call__(self, x, y):
        logits, loss = self.model(x, y)
        n = (y >= 0).sum()
        return logits, loss * (n * self.batches.accumulation / self.batches.step_targets)

    @property
    def require_backward_grad_sync(self):
        return self.model.require_backward_grad_sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, sync):
        self.model.require_backward_grad_sync = sync


@dataclasses.dataclass
class ChatEvalPlan:
    """What a chat evaluation scores: rows (window indices) of each split."""

    batches: ChatBatches
    rows: dict  # split -> int64 window indices
    batch_size: int
    byte_lengths: torch.Tensor | None
    autocast: object
    dist: object
    device: str


def eval_plan(cfg, meta, batches, dev, dist):
    """Every val window with eval_iters=0 (the figure to compare), else the same
    eval_iters * batch_size random windows of each split at every evaluation."""
    from gptkit.train.setup import FULL_EVAL_TRAIN_BATCHES, eval_byte_lengths

    rows = {}
    for stream, split in enumerate(("train", "val")):
        n = (cfg.eval_iters or FULL_EVAL_TRAIN_BATCHES) * cfg.batch_size
        rows[split] = np.random.default_rng([cfg.seed, EVAL_STREAM, stream]).integers(0, batches.n_windows(split), size=n)
    if cfg.eval_iters == 0:
        rows["val"] = np.arange(batches.n_windows("val"))
    return ChatEvalPlan(batches, rows, cfg.batch_size, chat_byte_lengths(eval_byte_lengths(meta, dev.name)),
                        dev.autocast(), dist, dev.name)


def chat_byte_lengths(lengths):
    """The tokenizer's bytes per id, and 0 for each turn token (they decode to no text)."""
    return None if lengths is None else torch.cat([lengths, lengths.new_zeros(len(TURN_TOKENS))])


@torch.no_grad()
def evaluate(model, plan, stop, progress):
    """train.py's evaluate for chat: {split: Score} of the targets only, or None on a stop signal."""
    from gptkit.train import distributed

    model.eval()
    out = {}
    W, rank, B = plan.dist.world_size, plan.dist.rank, plan.batch_size
    try:
        for split, rows in plan.rows.items():
            total = scoring.accumulator(plan.device)
            rounds = math.ceil(len(rows) / (W * B))
            for r in range(rounds):
                chunk = rows[(r * W + rank) * B : (r * W + rank + 1) * B]
                x, y = plan.batches.get(split, chunk if len(chunk) else rows[:1])
                with plan.autocast:
                    score = scoring.score_batch(model, x, y, plan.byte_lengths)
                if len(chunk):  # else a pass only to keep step with the other ranks' (FSDP), discarded
                    total += score.to(total.dtype)
                progress.update(split, r + 1, rounds)
                due = (r + 1) % EVAL_STOP_CHECK == 0 or r + 1 == rounds
                if due and distributed.any_rank(stop.raised, plan.dist, plan.device):
                    return None
            out[split] = scoring.Score.from_tensor(distributed.all_reduce_sum(total, plan.dist))
    finally:
        progress.close()
        model.train()
    return out
