"""rl.py's inputs: prompts with a checkable answer and their rewards (GRPO), pairs of a
chosen and a rejected reply (DPO), each read whole and checked before any work.

    python rl.py configs/rl_arithmetic.py                       # prompts made here, offline
    python rl.py --method=dpo --pairs=pairs.jsonl --init_from=out-chat/ckpt.pt

Prompts: `arithmetic` (the held-out sums of data/arithmetic_chat's val split are the
evaluation's, the others the training's), `gsm8k` (GSM8K's train and test files,
read and downloaded as eval.py --tasks gsm8k reads them, gptkit/tasks.py), or a jsonl file,
one prompt a line, as
`{"prompt": "What is 2+2?", "answer": "4"}` or `{"messages": [...], "answer": "4"}`;
GSM8K's own layout `{"question": ..., "answer": "... #### 72"}` is read too (the
answer is the number after ####).

Pairs, in the layouts TRL and the Hugging Face datasets use:
    {"prompt": "2+2?", "chosen": "4", "rejected": "5"}                          # plain text
    {"prompt": [messages], "chosen": [{"role": "assistant", ...}], "rejected": [...]}
    {"chosen": [conversation], "rejected": [conversation]}                      # the same but the last reply
"""

import json
import random
from dataclasses import dataclass
from pathlib import Path

from gptkit.data.chat import check_conversation
from gptkit.evals import tasks
from gptkit.ops.errors import UserError
from gptkit.prepare.arithmetic import SEED, held_out_sums

MAX_FILE_BYTES = 1 << 30


@dataclass
class Prompt:
    messages: list  # the conversation so far; the model writes the next assistant turn
    answer: str  # what a right reply says (exact) or ends with (final_number)
    where: str = ""  # "FILE:LINE" (or the task's item) for an error to name


@dataclass
class Pair:
    messages: list  # the conversation before the two replies
    chosen: str
    rejected: str
    where: str = ""


def arithmetic_prompts(split):
    """The sums of arithmetic_chat as prompts: split "train" (those its training
    conversations ask) or "val" (the held-out ones, in a fixed order)."""
    held, seen = held_out_sums(random.Random(SEED))
    return [Prompt([{"role": "user", "content": f"What is {a}+{b}?"}], str(a + b),
                   f"arithmetic's {split} sum {n}") for n, (a, b) in enumerate(held if split == "val" else seen, 1)]


def multiply_prompts(split):
    """The products of multiply_tools (gptkit/prepare/arithmetic.py) as prompts: split "train"
    (its training conversations' questions) or "val" (the held-out ones, in their order)."""
    from gptkit.prepare.arithmetic import VAL_FRACTION, multiplication_conversations
    from gptkit.prepare.chat import split_conversations

    conversations = multiplication_conversations(tools=False)
    held = split_conversations(len(conversations), VAL_FRACTION)
    return [Prompt(c["messages"][:1], c["messages"][-1]["content"], f"multiply's {split} product {n}")
            for n, c in enumerate((c for i, c in enumerate(conversations) if (i in held) == (split == "val")), 1)]


def arithmetic_pairs(split, seed):
    """Right vs wrong replies to the sums of arithmetic_chat's split (train or val): the
    wrong one off by 1 or 10, a near miss as a small model makes."""
    rng = random.Random(seed)
    pairs = []
    for p in arithmetic_prompts(split):
        right = int(p.answer)
        wrong = right + rng.choice([d for d in (-10, -1, 1, 10) if right + d >= 0])
        pairs.append(Pair(p.messages, p.answer, str(wrong), p.where))
    return pairs


def named_prompts(name, split):
    """The prompts of a named task's split ("train" or "val"), else of the jsonl file `name`.
    GSM8K's come from eval.py's reader and download (gptkit/evals/tasks.py): one copy, one rule."""
    if name == "arithmetic":
        return arithmetic_prompts(split)
    if name == "multiply":
        return multiply_prompts(split)
    if name == "gsm8k":
        split = "train" if split == "train" else "test"
        return [Prompt([{"role": "user", "content": item.question}], item.gold, item.where)
                for item in tasks.read_task(tasks.gsm8k_split(split), gsm8k_path(split))]
    return read_prompts(name)


def gsm8k_path(split):
    """GSM8K's `split` file ("train" or "test") in eval.py's cache, downloaded there once."""
    where = "--task" if split == "train" else "--eval_task"
    return tasks.resolve_file(tasks.gsm8k_split(split), instead=f"pass a .jsonl of its rows as {where}")


def read_jsonl(path, what):
    """[(line number, parsed object)] of a jsonl file, or a UserError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} file {path} does not exist")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise UserError(f"{what} file {path} is over {MAX_FILE_BYTES >> 20} MiB")
    out = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                out.append((n, json.loads(raw.decode("utf-8"))))
            except (UnicodeDecodeError, ValueError, RecursionError) as e:
                raise UserError(f"{path}:{n}: not a JSON line ({type(e).__name__})")
    if not out:
        raise UserError(f"{what} file {path} holds no lines")
    return out


def read_items(path, what, parse):
    """parse(obj) of every line of a jsonl file; a line it refuses is named by file and line."""
    items = []
    for n, obj in read_jsonl(path, what):
        try:
            item = parse(obj)
        except UserError as e:
            raise UserError(f"{path}:{n}: {e}")
        item.where = f"{path}:{n}"
        items.append(item)
    return items


def read_prompts(path):
    """Prompts of a jsonl file (see the module's docstring)."""
    return read_items(path, "prompts", parse_prompt)


def parse_prompt(obj):
    if not isinstance(obj, dict):
        raise UserError("not a JSON object")
    answer = obj.get("answer")
    if not isinstance(answer, (str, int, float)) or isinstance(answer, bool) or not str(answer).strip():
        raise UserError('no "answer" (the text a right reply must give)')
    answer = str(answer)
    if tasks.ANSWER_MARK in answer:  # GSM8K's layout: the number after "####", as eval.py reads it
        answer = tasks.gsm8k_gold(answer)
    text = obj.get("prompt", obj.get("question"))
    if isinstance(text, str) and text.strip():
        messages = [{"role": "user", "content": text}]
    elif isinstance(obj.get("messages"), list):
        messages = check_turns(obj["messages"])
    else:
        raise UserError('no "prompt" (text), "question" or "messages" list')
    if messages[-1]["role"] == "assistant":
        raise UserError("its messages end with an assistant turn: the reply is the model's to write")
    return Prompt(messages, answer.strip())


def check_turns(messages):
    """Messages checked as a chat line's (gptkit/data/chat.py), an assistant turn not required."""
    check_conversation({"messages": messages + [{"role": "assistant", "content": "-"}]})
    return messages


def read_pairs(path):
    """Pairs of a jsonl file (see the module's docstring)."""
    return read_items(path, "preference", parse_pair)


def parse_pair(obj):
    if not isinstance(obj, dict):
        raise UserError("not a JSON object")
    for field in ("chosen", "rejected"):
        if field not in obj:
            raise UserError(f'no "{field}" field (expected "prompt", "chosen", "rejected")')
    prompt, chosen, rejected = obj.get("prompt"), obj["chosen"], obj["rejected"]
    if isinstance(chosen, list) and isinstance(rejected, list):  # conversations
        head = [] if prompt is None else (check_turns(prompt) if isinstance(prompt, list) else
                                           [{"role": "user", "content": text_of(prompt, "prompt")}])
        chosen, rejected = head + chosen, head + rejected
        for name, turns in (("chosen", chosen), ("rejected", rejected)):
            check_conversation({"messages": turns})
            if turns[-1]["role"] != "assistant":
                raise UserError(f'"{name}" does not end with an assistant reply')
        if chosen[:-1] != rejected[:-1]:
            raise UserError('"chosen" and "rejected" differ before their last reply')
        messages, chosen, rejected = chosen[:-1], chosen[-1]["content"], rejected[-1]["content"]
    else:
        if prompt is None:
            raise UserError('no "prompt" field (plain-text "chosen" and "rejected" need one)')
        messages = check_turns(prompt) if isinstance(prompt, list) else [
            {"role": "user", "content": text_of(prompt, "prompt")}]
        chosen, rejected = text_of(chosen, "chosen"), text_of(rejected, "rejected")
    if chosen == rejected:
        raise UserError('"chosen" equals "rejected": the pair prefers nothing')
    return Pair(messages, chosen, rejected)


def text_of(value, field):
    if not isinstance(value, str) or not value.strip():
        raise UserError(f'"{field}" is not a non-empty text')
    return value


# Rewards: a function of the reply's text and the prompt's answer, 1.0 right, 0.0 wrong.
def exact(reply, answer):
    """The reply is the answer (surrounding spaces aside): the arithmetic task."""
    return float(reply.strip() == answer)


def final_number(reply, answer):
    """The reply's last number (after "####" if it writes one) is the answer's: GSM8K's
    scoring, the very function eval.py --tasks gsm8k scores with (tasks.number_is_right)."""
    return float(tasks.number_is_right(reply, answer))


REWARDS = {"exact": exact, "final_number": final_number}
