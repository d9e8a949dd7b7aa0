"""Scoring a model on token sequences: every target once, in sliding windows; and bits per byte.

A model with a context of T tokens cannot read a long text at once. We slide a
window of up to T inputs along each sequence, `stride` tokens at a time. The first
window scores all its targets; each later one scores only the targets no earlier
window has, so every token but a sequence's first is scored exactly once, each with
at least T - stride tokens of context (all of it when stride is 1, none wasted when
stride is T):

    tokens   0 1 2 3 4 5 6 7 8 9          T = 4, stride = 2
    window 1 [0 1 2 3] -> scores 1 2 3 4
    window 2     [2 3 4 5] -> scores   5 6  (3 and 4 were scored already)
    window 3         [4 5 6 7] -> scores 7 8
    window 4             [6 7 8] -> scores 9

The same code serves eval.py and train.py's whole-split evaluation (eval_iters=0),
so the two always agree. Bits per byte divides the total loss by the UTF-8 bytes
the scored targets decode to, a figure comparable across tokenizers:

    bpb = total nats / (ln 2 * bytes)
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

LN2 = math.log(2)
EVAL_STREAM = 0xE7A1  # separates the evaluation windows' random stream from training's
FULL_EVAL_TRAIN_BATCHES = 20  # eval_iters=0: the train loss is estimated on this many batches


def bits_per_byte(total_nats, n_bytes):
    """Total loss in nats over the UTF-8 bytes its targets decode to -> bits per byte."""
    return total_nats / (LN2 * n_bytes) if n_bytes > 0 else math.nan


def plan_windows(doc_lengths, block_size, stride):
    """The windows that score every target of every sequence once: int64 (N, 4) rows of
    (sequence, start, length, skip). The window's inputs are tokens start..start+length-1,
    its targets start+1..start+length, of which the first `skip` were scored before.
    Sequences shorter than 2 tokens have no target and get no window."""
    assert 1 <= stride <= block_size, f"stride {stride} must be in 1..block_size ({block_size})"
    rows = []
    for doc, n in enumerate(doc_lengths):
        scored_end = 0  # the last target scored so far (targets are tokens 1..n-1)
        start = 0
        while scored_end < n - 1:
            length = min(block_size, n - 1 - start)
            rows.append((doc, start, length, scored_end - start))
            scored_end = start + length
            start += stride
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def sample_windows(starts, block_size):
    """plan_windows rows for full windows at the given starts (train.py's random sample)."""
    starts = np.asarray(starts, dtype=np.int64)
    rows = np.zeros((len(starts), 4), dtype=np.int64)
    rows[:, 1], rows[:, 2] = starts, block_size
    return rows


def byte_lengths_tensor(tokenizer, device):
    """The tokenizer's UTF-8 bytes per id, int64 (vocab_size,), on the device."""
    return torch.from_numpy(tokenizer.token_byte_lengths()).to(device)


def window_batch(read, windows, block_size):
    """(x, y) int64 tensors (B, T) for rows of plan_windows; `read(seq, start, n)` gives
    n tokens. Targets already scored, and the padding of a short window, are -1."""
    x = torch.zeros(len(windows), block_size, dtype=torch.int64)
    y = torch.full((len(windows), block_size), -1, dtype=torch.int64)
    for row, (doc, start, length, skip) in enumerate(windows.tolist()):
        tokens = torch.from_numpy(np.asarray(read(doc, start, length + 1), dtype=np.int64))
        x[row, :length] = tokens[:length]
        y[row, skip:length] = tokens[1 + skip : length + 1]
    return x, y


def accumulator(device):
    """Zeros for (nats, targets, bytes) on the device; float64 where the device has it."""
    device = torch.device(device)
    return torch.zeros(3, dtype=torch.float32 if device.type == "mps" else torch.float64, device=device)


def score_batch(forward, x, y, byte_lengths):
    """(total nats, targets, bytes) of one batch as a tensor (3,) on y's device.

    forward(x, y) returns the mean loss over the targets that are not -1 (the model's
    own fp32 cross-entropy); byte_lengths (vocab_size,) on the device gives each
    target's UTF-8 bytes, looked up and summed there: no copy to the host."""
    _, loss = forward(x, y)
    scored = y >= 0
    n = scored.sum()
    n_bytes = (byte_lengths[y.clamp(min=0)] * scored).sum() if byte_lengths is not None else torch.zeros_like(n)
    nats = torch.where(n > 0, loss.float() * n, 0.0)  # no target: a mean of nothing (NaN) adds 0
    return torch.stack([nats, n.float(), n_bytes.float()])  # summed in float64 by the caller


@torch.no_grad()
def score_windows(forward, read, windows, *, block_size, batch_size, byte_lengths, device, autocast,
                  rank=0, world_size=1, between_batches=None):
    """Sum (nats, targets, bytes) over `windows`, batch_size windows per forward pass.
    With several ranks each takes every world_size-th batch; the caller all-reduces.

    Every rank runs the same number of forward passes: a rank whose share has run out
    scores an empty batch (every target -1) and adds nothing, because under FSDP each
    forward pass is a collective (the blocks' weights are all-gathered) that all
    ranks must join, or the job hangs.

    `between_batches(done, total)` is called after every round (one batch on each
    rank, the same count on every rank, so it may use collectives): a progress bar,
    or a stop check; when it returns True, scoring ends and this returns None."""
    total = accumulator(device)
    rounds = math.ceil(len(windows) / (world_size * batch_size))
    for r in range(rounds):
        first = (r * world_size + rank) * batch_size
        chunk = windows[first : first + batch_size]
        if len(chunk):
            x, y = window_batch(read, chunk, block_size)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with autocast:
                total += score_batch(forward, x, y, byte_lengths).to(total.dtype)
        elif world_size > 1:  # keep step with the other ranks' forward passes; the loss is discarded
            empty = torch.zeros(1, block_size, dtype=torch.int64, device=device)
            with autocast:
                forward(empty, torch.full_like(empty, -1))
        if between_batches is not None and between_batches(r + 1, rounds):
            return None
    return total


@dataclass
class EvalPlan:
    """What every evaluation in training scores: for each split, the items that
    `read(split, items)` turns into (x, y) on the device (a text's windows, rows of
    plan_windows; a chat split's packed windows), batch_size at a time, each rank
    taking every W-th batch. Made by the batch reader (its eval_plan method)."""

    read: object
    items: dict  # split -> the items, in order
    batch_size: int
    block_size: int
    byte_lengths: torch.Tensor | None  # UTF-8 bytes per token id, for bits per byte
    autocast: object
    dist: object  # .rank, .world_size
    device: object

    def rounds(self, split):
        """Batches per rank: the same on every rank."""
        return math.ceil(len(self.items[split]) / (self.dist.world_size * self.batch_size))

    def batch(self, split, r):
        """This rank's (x, y) of round r; every target -1 once its share has run out: a
        forward pass only to keep step with the other ranks' (under FSDP each forward is
        a collective), scoring nothing."""
        first = (r * self.dist.world_size + self.dist.rank) * self.batch_size
        chunk = self.items[split][first : first + self.batch_size]
        if len(chunk):
            return self.read(split, chunk)
        empty = torch.zeros(1, self.block_size, dtype=torch.int64, device=self.device)
        return empty, torch.full_like(empty, -1)


@dataclass
class Score:
    """Sums over the scored targets, and the figures derived from them."""

    nats: float
    tokens: int
    bytes: int

    @classmethod
    def from_tensor(cls, total):
        nats, tokens, n_bytes = total.tolist()
        return cls(nats, int(round(tokens)), int(round(n_bytes)))

    @property
    def loss(self):
        """Mean loss in nats per token."""
        return self.nats / self.tokens if self.tokens else math.nan

    @property
    def ppl(self):
        return math.exp(self.loss) if self.loss < 700 else math.inf

    @property
    def bpb(self):
        return bits_per_byte(self.nats, self.bytes)
