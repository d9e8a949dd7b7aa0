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
import re
import stat
import sys
from pathlib import Path

from gptkit.ops.errors import UserError

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
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise UserError(f"message {i} has unknown role {str(role)[:40]!r} (expected one of {', '.join(ROLES)})")
        if not isinstance(m.get("content"), str):
            raise UserError(f"message {i} has no text content")
        bad = LONE_SURROGATE.search(m["content"])
        if bad is not None:  # JSON can spell "\ud800", which is no character: no tokenizer or file can hold it
            raise UserError(f"message {i} holds a lone surrogate U+{ord(bad.group()):04X} at character {bad.start()} "
                            "(half of a UTF-16 pair, not a character)")
        if m["role"] == "assistant" and not m["content"].strip():
            raise UserError(f"message {i} is an empty assistant turn (it would have nothing to learn)")
    if not any(m["role"] == "assistant" for m in record["messages"]):
        raise UserError("no assistant turn (it would have nothing to learn)")
    return record["messages"]


LONE_SURROGATE = re.compile("[\ud800-\udfff]")
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which some editors put at the start of a file
STDIN = "-"
CHAT_SUFFIXES = (".jsonl", ".json")  # Hugging Face's to_json() writes jsonl under either name


def parse_line(raw):
    """The messages of one raw line (bytes, without its \\n), or a UserError saying why not:
    invalid UTF-8, not JSON (nesting too deep or a number too long to read included), or
    not a conversation (check_conversation)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"not UTF-8 text ({e.reason} at byte {e.start + 1} of the line)") from None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"not JSON ({e.msg}, column {e.colno})") from None
    except RecursionError:
        raise UserError("not JSON this reader takes: nested too deeply") from None
    except ValueError as e:  # an integer of over 4,300 digits (Python's limit on int("..."))
        why = "a number of over 4,300 digits" if "digits" in str(e) else str(e).splitlines()[0][:120]
        raise UserError(f"not JSON this reader takes ({why})") from None
    return check_conversation(record)


def chat_files(path):
    """The inputs of `path`: the file itself (a pipe, /dev/fd/N or - for standard input
    included), or a folder's *.jsonl and *.json files (Hugging Face style), sorted."""
    if str(path) == STDIN:
        return [STDIN]
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError:
        raise UserError(f"{path} is not a file or folder")
    if stat.S_ISDIR(mode):
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in CHAT_SUFFIXES and p.is_file())
        if not files:
            raise UserError(f"{path} holds no .jsonl or .json files of conversations")
        return files
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        raise UserError(f"{path} is a device, not a file of conversations, a pipe or -")
    return [path]


def read_lines(file):
    """(line number, raw bytes) of every line of `file` (- is standard input, read once):
    lines end at \\n only, as jsonl's do (U+2028 or U+0085 inside a message is text), a
    \\r before it is dropped (a Windows file), and a byte order mark at the start is skipped."""
    try:
        if file == STDIN:
            data = sys.stdin.buffer.read()
        else:
            with open(file, "rb") as f:
                data = f.read()
    except OSError as e:
        raise UserError(f"cannot read {file}: {e.strerror}")
    if data.startswith(BOM):
        data = data[len(BOM):]
    for number, raw in enumerate(data.split(b"\n"), 1):
        yield number, raw.removesuffix(b"\r")


def read_messages(paths, errors="raise"):
    """Every conversation's messages under `paths` (files or folders), as a list of
    (where, messages) with where = "file:line", and the number of lines skipped.

    A bad line (invalid UTF-8, not JSON, no messages, an unknown role, an empty
    assistant turn, a lone surrogate) is a UserError naming its file and line, or
    skipped and counted with errors="skip"."""
    paths = [paths] if isinstance(paths, (str, Path)) else paths
    if [str(p) for p in paths].count(STDIN) > 1:
        raise UserError("--input names - (standard input) twice: it can be read only once")
    records, skipped = [], 0
    for file in [f for path in paths for f in chat_files(path)]:
        for number, raw in read_lines(file):
            if not raw.strip():
                continue
            try:
                records.append((f"{file}:{number}", parse_line(raw)))
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
