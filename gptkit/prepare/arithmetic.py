"""A chat dataset made here, offline: conversations of two-digit sums.

    python prepare.py arithmetic_chat        # data/arithmetic_chat, character-level
    python train.py configs/chat_arithmetic.py
    python eval.py out-chat-arithmetic --dataset arithmetic_chat --exact_match

Each conversation is one to three questions "What is 37+45?" answered "82". Of the
10,000 sums a + b (0 <= a, b <= 99), a tenth, chosen at random, is held out: the
validation conversations ask only those, the training ones never, so the exact-match
rate on the val split measures sums the model has never seen answered.
"""

import json
import random
from pathlib import Path

from gptkit.ops.errors import UserError
from gptkit.ops.paths import claim_output
from gptkit.prepare.chat import prepare_chat, split_conversations

N_CONVERSATIONS = 20_000
VAL_FRACTION = 0.1
SEED = 1234


def exchange(a, b):
    return [{"role": "user", "content": f"What is {a}+{b}?"}, {"role": "assistant", "content": str(a + b)}]


def held_out_sums(rng, val_fraction=VAL_FRACTION):
    """(held, seen): every sum (a, b) shuffled by `rng`, the first val_fraction held out
    (rl.py's arithmetic task asks the same held-out sums as this dataset's val split)."""
    sums = [(a, b) for a in range(100) for b in range(100)]
    rng.shuffle(sums)
    n_held = int(len(sums) * val_fraction)
    return sums[:n_held], sums[n_held:]


def arithmetic_conversations(n=N_CONVERSATIONS, val_fraction=VAL_FRACTION, seed=SEED):
    """n conversations (dicts with "messages"), those at the val split's places
    (gptkit.prepare.chat.split_conversations) made of held-out sums only."""
    rng = random.Random(seed)
    held, seen = held_out_sums(rng, val_fraction)
    val = split_conversations(n, val_fraction)
    out = []
    for i in range(n):
        pool = held if i in val else seen
        messages = [m for _ in range(rng.randint(1, 3)) for m in exchange(*rng.choice(pool))]
        out.append({"messages": messages})
    return out


def write_arithmetic_jsonl(path, n=N_CONVERSATIONS):
    with open(path, "w", encoding="utf-8") as f:
        for conversation in arithmetic_conversations(n):
            f.write(json.dumps(conversation) + "\n")
    return path


def prepare_arithmetic_chat(out_dir="data", input_path=None, progress=True):
    """data/arithmetic_chat: the conversations written to conversations.jsonl there, then
    prepared as any chat input (character-level); returns the folder."""
    if input_path is not None:
        raise UserError("arithmetic_chat is generated here: it takes no --input")
    folder = claim_output(Path(out_dir) / "arithmetic_chat", "folder", overwrite=True, what="the dataset folder (--data_dir)")
    folder.mkdir(parents=True, exist_ok=True)
    source = write_arithmetic_jsonl(folder / "conversations.jsonl")
    return prepare_chat([source], "char", "arithmetic_chat", out_dir, progress=progress)
