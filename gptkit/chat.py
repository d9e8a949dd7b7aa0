"""Chat conversations as tokens: the template (and its Jinja form for exports), the target
mask, the reader of jsonl conversations (a trained model grows room for the turn tokens
with model.py's GPT.grow_vocab).

A conversation is a list of messages `{"role": "system"|"user"|"assistant", "content": "..."}`.
Each message becomes its role's turn token, its content encoded as plain text, and the
end-of-turn token:

    <|system|> You are terse. <|end|> <|user|> 2+2? <|end|> <|assistant|> 4 <|end|>

The turn tokens are real ids, never strings: for GPT-2 BPE they are added after its
50,257 ids (50257..50260), for our own BPE and characters after the vocabulary. Content
is encoded as ordinary text, so a message that contains the text "<|user|>" stays text
and cannot open a turn. The targets (mask 1) are an assistant's content and its <|end|>;
everything else (the turn tokens, system and user content) is context (mask 0).

    python prepare.py talks --input talks.jsonl --format chat
"""

import json
from pathlib import Path

from gptkit.errors import UserError

ROLES = ("system", "user", "assistant")
TURN_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
TEMPLATE = "gptkit-chat-1"


# The template as Jinja, for exports (transformers' apply_chat_template, llama.cpp's
# tokenizer.chat_template): the turn tokens' text around each message's content, and
# <|assistant|> to ask for a reply. Both tokenize its text with the turn tokens as
# special tokens, which gives exactly encode_conversation's / prompt_ids's ids; unlike
# ours, they would also read a marker typed inside a message as a turn (docs/chat.md).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def chat_vocabulary(model_vocab_size, base_vocab_size):
    """The turn ids of a chat model, whose vocabulary is its tokenizer's and then the
    turn tokens (what train.py makes of a chat dataset); None for any other model."""
    return turn_ids(base_vocab_size) if model_vocab_size == base_vocab_size + len(TURN_TOKENS) else None


def turn_ids(base_vocab_size):
    """The ids of <|system|>, <|user|>, <|assistant|>, <|end|>: the first ids after the base vocabulary."""
    return {name: base_vocab_size + i for i, name in enumerate(TURN_TOKENS)}


def check_chat_meta(meta, base_vocab_size, source):
    """The number of turn tokens a chat meta.json (or checkpoint) adds to its tokenizer's
    vocabulary, after checking its "chat" entry: a UserError naming `source` otherwise."""
    chat = meta.get("chat")
    if not isinstance(chat, dict) or chat.get("template") != TEMPLATE:
        raise UserError(f"{source}: its \"chat\" entry is not this code's template {TEMPLATE}: run prepare.py again")
    if chat.get("turn_ids") != turn_ids(base_vocab_size):
        raise UserError(f"{source}: its turn ids {chat.get('turn_ids')} are not the {len(TURN_TOKENS)} ids after "
                        f"its {base_vocab_size}-token vocabulary: run prepare.py again")
    return len(TURN_TOKENS)


def encode_conversation(messages, encode, base_vocab_size):
    """(ids, mask) of one conversation: lists of equal length, mask 1 on the targets."""
    ids_of = turn_ids(base_vocab_size)
    ids, mask = [], []
    for m in messages:
        content = encode(m["content"])
        target = 1 if m["role"] == "assistant" else 0
        ids += [ids_of[f"<|{m['role']}|>"], *content, ids_of["<|end|>"]]
        mask += [0, *[target] * len(content), target]
    return ids, mask


def prompt_ids(messages, encode, base_vocab_size):
    """The tokens a model is given to write the next assistant turn: the history, then <|assistant|>."""
    ids, _ = encode_conversation(messages, encode, base_vocab_size)
    return ids + [turn_ids(base_vocab_size)["<|assistant|>"]]


def check_conversation(record):
    """The messages of one parsed jsonl line, or a UserError saying what is wrong with it."""
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list) or not record["messages"]:
        raise UserError('no "messages" list (expected {"messages": [{"role": ..., "content": ...}]})')
    for i, m in enumerate(record["messages"], 1):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise UserError(f"message {i} has unknown role {role!r} (expected one of {', '.join(ROLES)})")
        if not isinstance(m.get("content"), str):
            raise UserError(f"message {i} has no text content")
        if m["role"] == "assistant" and not m["content"].strip():
            raise UserError(f"message {i} is an empty assistant turn (it would have nothing to learn)")
    if not any(m["role"] == "assistant" for m in record["messages"]):
        raise UserError("no assistant turn (it would have nothing to learn)")
    return record["messages"]


def chat_files(path):
    """The jsonl files of `path`: the file itself, or a folder's *.jsonl (Hugging Face style), sorted."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
        if not files:
            raise UserError(f"{path} holds no .jsonl files of conversations")
        return files
    if not path.is_file():
        raise UserError(f"{path} is not a file or folder")
    return [path]


def read_messages(paths, errors="raise"):
    """Every conversation's messages under `paths` (files or folders), as a list of
    (where, messages) with where = "file:line", and the number of lines skipped.

    A bad line (not JSON, no messages, an unknown role, an empty assistant turn) is a
    UserError naming its file and line, or skipped and counted with errors="skip"."""
    paths = [paths] if isinstance(paths, (str, Path)) else paths
    records, skipped = [], 0
    for file in [f for path in paths for f in chat_files(path)]:
        try:
            lines = file.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise UserError(f"{file}: not UTF-8 text ({e.reason} at byte {e.start})")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise UserError(f"not JSON ({e.msg})")
                records.append((f"{file}:{number}", check_conversation(record)))
            except UserError as e:
                if errors != "skip":
                    raise UserError(f"{file}:{number}: {e}") from None
                skipped += 1
    return records, skipped


def encode_records(records, encode, base_vocab_size, block_size=None, errors="raise"):
    """(ids, mask) of each (where, messages) record, and how many were too long: with a
    block_size, a conversation must fit one window of block_size + 1 tokens."""
    conversations, skipped = [], 0
    for where, messages in records:
        ids, mask = encode_conversation(messages, encode, base_vocab_size)
        if block_size is not None and len(ids) > block_size + 1:
            if errors == "skip":
                skipped += 1
                continue
            raise UserError(f"{where}: {len(ids)} tokens, longer than block_size + 1 = {block_size + 1} "
                            "(use a larger --block_size, or --errors skip to leave such conversations out)")
        conversations.append((ids, mask))
    return conversations, skipped
