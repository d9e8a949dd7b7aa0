"""Chat training's step with the output layer on target positions only: GPT-2's shape, one thread.

    python bench.py chat_step                      # 12%, 50% and 81% of the positions targets, and all of them
    python bench.py chat_step --shares 0.1,1 --steps 2

model.py's forward runs the output layer (50,257 wide: ~31% of GPT-2 124M's matrix
FLOPs) and the loss only where targets >= 0, as a chat batch marks its replies;
before, it ran on every position and the loss ignored the others, which costs what
a batch whose every position is a target costs now. So one run compares, on the same
model and windows: each share of targets (at random places of the window) against all
positions scored (share 1: the cost of every chat step before the change). A training
step as train.py takes it: forward, loss, backward, zeroed gradients; float32, eager,
batch 1 x block_size, alternating the shares, best of --steps after a warm-up step, CPU
seconds (process_time) at OMP_NUM_THREADS=1 (the bench re-runs itself at one thread).
"""

import time

import torch

from gptkit.ops.errors import UserError


def add_arguments(parser):
    parser.add_argument("--shares", default="0.12,0.5,0.81,1", help="target shares to time (1 = every position)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per share, best kept (default 3)")
    parser.add_argument("--block_size", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=1337)


def step_seconds(model, idx, targets):
    t0 = time.process_time()
    _, loss = model(idx, targets)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.process_time() - t0


def run(args):
    from benchmarks.one_thread import in_one_thread
    from benchmarks.report import Table
    from model import GPT, GPTConfig

    try:
        shares = sorted({float(s) for s in args.shares.split(",") if s.strip()})
    except ValueError:
        raise UserError(f"--shares {args.shares!r}: give fractions, e.g. 0.12,0.5,1")
    if not shares or not all(0 < s <= 1 for s in shares) or args.steps < 1:
        raise UserError("--shares must be fractions in (0, 1] and --steps at least 1")
    if 1.0 not in shares:
        shares.append(1.0)  # the reference: every position scored
    in_one_thread("chat_step")
    torch.manual_seed(args.seed)
    model = GPT(GPTConfig(block_size=args.block_size, dropout=0.0))
    T, V = args.block_size, model.config.vocab_size
    g = torch.Generator().manual_seed(args.seed)
    idx = torch.randint(0, V, (1, T), generator=g)
    full = torch.randint(0, V, (1, T), generator=g)
    batches = {}
    for share in shares:
        targets = full.clone()
        targets[torch.rand((1, T), generator=g) >= share] = -1  # not a target: a prompt's token
        batches[share] = targets
    for share in shares:  # warm-up: allocations, the first backward
        step_seconds(model, idx, batches[share])
    best = {share: float("inf") for share in shares}
    for _ in range(args.steps):
        for share in shares:
            best[share] = min(best[share], step_seconds(model, idx, batches[share]))
    table = Table(f"Chat training step, GPT-2 124M's shape, batch 1 x {T}, float32, one thread, CPU",
                  ["targets", "scored positions", "CPU s a step", "vs every position scored"],
                  note=f"Best of {args.steps} alternating steps (forward, loss, backward) after a warm-up; "
                  "share 100%: the step's cost before the output layer ran on targets only.")
    for share in shares:
        n = int((batches[share] >= 0).sum())
        table.add_row(f"{100 * share:.0f}%", n, round(best[share], 3), f"{best[share] / best[1.0]:.2f}x")
    return [table]
