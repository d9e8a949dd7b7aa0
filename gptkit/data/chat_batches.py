"""Chat training data: whole conversations packed into windows, the batches train.py reads.

Packing: best-fit (as nanochat's): each conversation, in turn, goes into the open
window with the least room that still holds it, else into a new window; a window is
padded with mask-0 tokens. A conversation never straddles two windows, so every
target sees its whole conversation from the start; an earlier conversation in the
same window is only context (its markers close it), and no window is without targets.
Why not cut the stream anywhere, as for text: a window starting mid-conversation
would teach replies to questions it cannot see.

Re-packed every epoch: the training conversations are shuffled (a pure function of
the seed and the epoch) before each packing, so a conversation meets other
neighbours at other positions every epoch. Packed once, each would always sit at the
same position after the same neighbours, which a model with learned positions
memorises: measured, 300 of 300 held-out replies exact alone but 3 of 7 later turns
wrong in one multi-turn session (docs/chat.md). Evaluation reads the first packing
of each split, the same windows at every evaluation.

What the step needs is the batch's, as for text: (x, y) with y = -1 wherever the next
token is not a target, and `targets(step)`, the step's target count over the whole
global batch, by which train.py's train_step weights each micro-batch's mean loss.

    python prepare.py talks --input talks.jsonl --format chat
    python train.py configs/chat_arithmetic.py --dataset=talks
"""

import bisect
from pathlib import Path

import numpy as np
import torch

from gptkit.evals import scoring
from gptkit.ops.errors import UserError

PACK_STREAM = 0x9AC4  # the epochs' shuffles, apart from the batches' random stream


def pack_best_fit(conversations, window, pad_id, order=None):
    """conversations: list of (ids, mask) lists; window: tokens per window (block_size + 1);
    order: the order they are placed in (default: longest first, the tightest packing).
    Returns (ids, mask) lists of whole windows, each of length `window`."""
    if order is None:
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
    targets, eval_plan, get, close), over packed windows instead of random offsets.

    Each split's conversations are read once (in memory: chat sets are small). Iteration
    `step` takes batch_size * accumulation windows, drawn by a generator seeded with
    (seed, step) from the packing of the step's epoch, a pure function as for text, so
    resuming repeats the data exactly, and so does any number of ranks. An epoch is as
    many steps as the first packing's windows fill."""

    def __init__(self, data_dir, name, meta, block_size, device, batch_size=None, accumulation=None,
                 seed=0):
        folder = Path(data_dir) / name
        self.pad = meta["chat"]["turn_ids"]["<|end|>"]  # never a target, only context
        self.block_size, self.vocab_size = block_size, meta["vocab_size"]
        self.device = torch.device(device)
        self.batch_size, self.accumulation, self.seed = batch_size, accumulation, seed
        self.conversations, self.packed = {}, {}
        for split in ("train", "val"):
            ids = np.fromfile(folder / f"{split}.bin", dtype=meta["dtype"])
            mask = np.fromfile(folder / f"{split}_mask.bin", dtype=np.uint8)
            self.conversations[split] = conversations_of(ids, mask)
            try:
                self.packed[split] = (0, self.pack(split, order=None))  # (epoch, windows)
            except UserError as e:
                raise UserError(f"{folder / (split + '.bin')}: {e} (block_size + 1): train with a "
                                f"larger block_size, or prepare again with --block_size {block_size} "
                                "--errors skip to leave such conversations out")
        self.first = {split: windows for split, (_, windows) in self.packed.items()}
        self.steps_per_epoch = None
        if batch_size and accumulation:
            self.steps_per_epoch = max(1, len(self.first["train"][0]) // (batch_size * accumulation))

    def pack(self, split, order):
        """The split's conversations packed in `order`: (windows, targets), (N, T + 1) each."""
        ids, mask = pack_best_fit(self.conversations[split], self.block_size + 1, self.pad, order)
        windows = torch.tensor(ids, dtype=torch.int64).view(-1, self.block_size + 1)
        return windows, torch.tensor(mask, dtype=torch.bool).view(-1, self.block_size + 1)

    def epoch_windows(self, step):
        """The training windows of `step`'s epoch: epoch 0 packed longest first, each later
        epoch in an order shuffled by (seed, epoch). The last packing is kept."""
        epoch = step // self.steps_per_epoch
        if self.packed["train"][0] != epoch:
            order = None  # epoch 0: longest first
            if epoch > 0:
                rng = np.random.default_rng([self.seed, PACK_STREAM, epoch])
                order = rng.permutation(len(self.conversations["train"])).tolist()
            self.packed["train"] = (epoch, self.pack("train", order))
        return self.packed["train"][1]

    def rows(self, step):
        """The windows of `step`'s global batch: indices into epoch_windows(step)."""
        windows, _ = self.epoch_windows(step)
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, len(windows), size=self.batch_size * self.accumulation)

    def micro_batches(self, step, rank=0, world_size=1):
        rows, (windows, targets) = self.rows(step), self.epoch_windows(step)
        local = self.per_rank(world_size)
        for chunk in range(rank * local, (rank + 1) * local):
            picked = rows[chunk * self.batch_size : (chunk + 1) * self.batch_size]
            yield self.batch(windows, targets, picked)

    def targets(self, step):
        """The target tokens in `step`'s whole global batch (every rank's micro-batches)."""
        _, targets = self.epoch_windows(step)
        return int(targets[self.rows(step), 1:].sum())

    def tokens_per_step(self):
        """Tokens a step reads (every window's block_size inputs), for the log's tok/s."""
        return self.batch_size * self.accumulation * self.block_size

    def per_rank(self, world_size):
        return self.accumulation // world_size

    def n_windows(self, split):
        return len(self.first[split][0])

    def get(self, split, rows):
        """(x, y) of the first packing's windows `rows` (evaluation, eval.py)."""
        return self.batch(*self.first[split], rows)

    def batch(self, windows, targets, rows):
        """(x, y) of the windows `rows`: (B, T) inputs and targets, -1 where nothing is learned."""
        rows = torch.as_tensor(rows, dtype=torch.int64)
        windows, targets = windows[rows], targets[rows]
        x = windows[:, :-1].contiguous()  # (B, T)
        y = torch.where(targets[:, 1:], windows[:, 1:], -1)  # (B, T)
        return x.to(self.device), y.to(self.device)

    def eval_plan(self, eval_iters, seed, byte_lengths, autocast, dist):
        """Every val window with eval_iters=0 (the figure to compare), else the same
        eval_iters * batch_size random windows of each split at every evaluation."""
        rows = {}
        for stream, split in enumerate(("train", "val")):
            n = (eval_iters or scoring.FULL_EVAL_TRAIN_BATCHES) * self.batch_size
            rng = np.random.default_rng([seed, scoring.EVAL_STREAM, stream])
            rows[split] = rng.integers(0, self.n_windows(split), size=n)
        if eval_iters == 0:
            rows["val"] = np.arange(self.n_windows("val"))
        return scoring.EvalPlan(self.get, rows, self.batch_size, self.block_size,
                        chat_byte_lengths(byte_lengths, self.vocab_size), autocast, dist, self.device)

    def close(self):
        pass


def chat_byte_lengths(lengths, vocab_size):
    """The tokenizer's bytes per id, and 0 for each special token up to vocab_size (turn and
    tool tokens decode to no text)."""
    return None if lengths is None else torch.cat([lengths, lengths.new_zeros(vocab_size - len(lengths))])
