"""Chat datasets made here, offline: conversations of two-digit sums, and of four-digit
products answered with the calculator or by heart.

    python prepare.py arithmetic_chat        # data/arithmetic_chat, character-level
    python train.py configs/chat_arithmetic.py
    python eval.py out-chat-arithmetic --dataset arithmetic_chat --exact_match
    python prepare.py multiply_tools         # "What is 1234*5678?", the reply calls the calculator
    python prepare.py multiply_plain         # the same questions, answered by heart

arithmetic_chat: each conversation is one to three questions "What is 37+45?" answered
"82". Of the 10,000 sums a + b (0 <= a, b <= 99), a tenth, chosen at random, is held
out: the validation conversations ask only those, the training ones never, so the
exact-match rate on the val split measures sums the model has never seen answered.

multiply_tools and multiply_plain: one question "What is a*b?" (1000 <= a, b <= 9999) a
conversation, the same questions in both; the val split's products are never asked in
training. multiply_tools's reply is a calculator call, its output, then the product
(docs/chat.md's layout); multiply_plain's is the product alone. A product of two
four-digit numbers cannot be learned by heart from 18,000 examples: the tool is what
makes the task learnable (configs/chat_multiply_tools.py, benchmarks/LOG.md).
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


def calculator_call(expression):
    """An assistant message calling the calculator, in OpenAI's messages form (docs/chat.md)."""
    arguments = json.dumps({"expression": expression})
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "calculator", "arguments": arguments}}]}


def product_exchange(a, b, tools):
    """The question a*b and its reply: with `tools`, a calculator call, its output, the product."""
    question, answer = {"role": "user", "content": f"What is {a}*{b}?"}, str(a * b)
    if not tools:
        return [question, {"role": "assistant", "content": answer}]
    return [question, calculator_call(f"{a}*{b}"), {"role": "tool", "content": answer},
            {"role": "assistant", "content": answer}]


def multiplication_conversations(n=N_CONVERSATIONS, tools=True, val_fraction=VAL_FRACTION, seed=SEED):
    """n one-question conversations of four-digit products, those at the val split's
    places asking products that no training conversation asks (the same for both `tools`)."""
    rng = random.Random(seed)
    val = split_conversations(n, val_fraction)

    def pair():
        return rng.randint(1000, 9999), rng.randint(1000, 9999)

    held = {}  # distinct held-out products, in the order they were drawn (a dict keeps it)
    while len(held) < len(val):
        held[pair()] = None
    asked_in_val, held = set(held), list(held)
    out = []
    for i in range(n):
        question = held.pop() if i in val else pair()
        while i not in val and question in asked_in_val:
            question = pair()
        out.append({"messages": product_exchange(*question, tools)})
    return out


GENERATED = {  # name: its conversations
    "arithmetic_chat": arithmetic_conversations,
    "multiply_tools": lambda: multiplication_conversations(tools=True),
    "multiply_plain": lambda: multiplication_conversations(tools=False),
}


def write_jsonl(path, conversations):
    with open(path, "w", encoding="utf-8") as f:
        for conversation in conversations:
            f.write(json.dumps(conversation) + "\n")
    return path


def prepare_generated(name, out_dir="data", input_path=None, progress=True):
    """data/NAME for a dataset of GENERATED: the conversations written to conversations.jsonl
    there, then prepared as any chat input (character-level); returns the folder."""
    if input_path is not None:
        raise UserError(f"{name} is generated here: it takes no --input")
    folder = claim_output(Path(out_dir) / name, "folder", overwrite=True, what="the dataset folder (--data_dir)")
    folder.mkdir(parents=True, exist_ok=True)
    source = write_jsonl(folder / "conversations.jsonl", GENERATED[name]())
    return prepare_chat([source], "char", name, out_dir, progress=progress)
