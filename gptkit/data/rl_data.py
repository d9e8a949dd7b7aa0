"""rl.py's inputs: prompts with a checkable answer and their rewards (GRPO), pairs of a
chosen and a rejected reply (DPO), each read whole and checked before any work.

    python rl.py configs/rl_arithmetic.py                       # prompts made here, offline
    python rl.py --method=dpo --pairs=pairs.jsonl --init_from=out-chat/ckpt.pt

Prompts: `arithmetic` (the held-out sums of data/arithmetic_chat's val split are the
evaluation's, the others the training's), `gsm8k` (GSM8K's train and test files,
downloaded once into $GPTKIT_CACHE_DIR/gsm8k or ~/.cache/gptkit/gsm8k), or a jsonl file,
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
import re
from dataclasses import dataclass
from pathlib import Path

from gptkit.data.chat import check_conversation
from gptkit.ops.errors import UserError
from gptkit.ops.paths import cache_dir
from gptkit.prepare.download import fetch_whole
from gptkit.prepare.arithmetic import SEED, held_out_sums

MAX_FILE_BYTES = 1 << 30


@dataclass
class Prompt:
    messages: list  # the conversation so far; the model writes the next assistant turn
    answer: str  # what a right reply says (exact) or ends with (final_number)


@dataclass
class Pair:
    messages: list  # the conversation before the two replies
    chosen: str
    rejected: str


def arithmetic_prompts(split):
    """The sums of arithmetic_chat as prompts: split "train" (those its training
    conversations ask) or "val" (the held-out ones, in a fixed order)."""
    held, seen = held_out_sums(random.Random(SEED))
    return [Prompt([{"role": "user", "content": f"What is {a}+{b}?"}], str(a + b))
            for a, b in (held if split == "val" else seen)]


# GSM8K as its authors publish it (the grade-school-math repository): one jsonl per split.
GSM8K_URL = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/{split}.jsonl"
GSM8K_BYTES = 100 << 20  # the most a download may bring (train.jsonl has about 4 MB)


def gsm8k_file(split):
    """GSM8K's `split` (train or test) file, downloaded once into the cache folder."""
    folder = cache_dir("gsm8k")
    path = folder / f"{split}.jsonl"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    fetch_whole(GSM8K_URL.format(split=split), path, GSM8K_BYTES, "GSM8K", hint=(
        f". Offline? Fetch {split}.jsonl elsewhere and pass it as --task (train) or --eval_task (test)"))
    return path


def named_prompts(name, split):
    """The prompts of a named task's split ("train" or "val"), else of the jsonl file `name`."""
    if name == "arithmetic":
        return arithmetic_prompts(split)
    if name == "gsm8k":
        return read_prompts(gsm8k_file("train" if split == "train" else "test"))
    return read_prompts(name)


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
            items.append(parse(obj))
        except UserError as e:
            raise UserError(f"{path}:{n}: {e}")
    return items


def read_prompts(path):
    """Prompts of a jsonl file (see the module's docstring)."""
    return read_items(path, "prompts", parse_prompt)


GSM8K_MARK = "####"  # GSM8K's answers end with "#### 72"


def parse_prompt(obj):
    if not isinstance(obj, dict):
        raise UserError("not a JSON object")
    answer = obj.get("answer")
    if not isinstance(answer, (str, int, float)) or isinstance(answer, bool) or not str(answer).strip():
        raise UserError('no "answer" (the text a right reply must give)')
    answer = str(answer)
    if GSM8K_MARK in answer:
        answer = answer.rsplit(GSM8K_MARK, 1)[1]
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
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def exact(reply, answer):
    """The reply is the answer (surrounding spaces aside): the arithmetic task."""
    return float(reply.strip() == answer)


def final_number(reply, answer):
    """The reply's last number (after "####" if it writes one, GSM8K's own way) is the
    answer's: how nanochat and GSM8K's paper score a worked solution."""
    if GSM8K_MARK in reply:
        reply = reply.rsplit(GSM8K_MARK, 1)[1]
    numbers = NUMBER.findall(reply)
    want = NUMBER.findall(answer)
    if not numbers or not want:
        return 0.0
    return float(numbers[-1].replace(",", "") == want[-1].replace(",", ""))


REWARDS = {"exact": exact, "final_number": final_number}
